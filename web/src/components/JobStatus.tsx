// Status line of a background report job: progress while it runs, its error if it failed, and a
// picker for the run's earlier jobs.
import { ApiError, shortId } from "../api";
import type { Job } from "../types";

export function JobProgress({ job, noun }: { job: Job<unknown>; noun: string }) {
  const { done, total } = job.progress;
  const pct = total ? Math.round((done / total) * 100) : 0;
  const running = job.status === "queued" || job.status === "running";
  return (
    <div className="space-y-1" data-testid="job-progress" data-status={job.status}>
      <div className="flex items-center gap-2 text-xs text-slate-700">
        <span className={`rounded px-1.5 py-0.5 font-medium ${STATUS_STYLE[job.status] ?? ""}`} data-testid="job-status">
          {job.status}
        </span>
        <span>
          {done}/{total} {noun} finished
        </span>
        <span className="font-mono text-slate-500">job {shortId(job.id)}</span>
      </div>
      {running && (
        <div className="h-2 w-64 overflow-hidden rounded bg-slate-200">
          <div className="h-2 bg-blue-500 transition-all" style={{ width: `${Math.max(pct, 4)}%` }} />
        </div>
      )}
      {job.error && (
        <div className="rounded border border-red-300 bg-red-50 p-2 text-xs text-red-800" data-testid="job-error">
          <div>
            {job.error.error}: {job.error.message}
          </div>
          {job.error.hint && <div className="text-red-600">{job.error.hint}</div>}
        </div>
      )}
    </div>
  );
}

const STATUS_STYLE: Record<string, string> = {
  queued: "bg-slate-200 text-slate-700",
  running: "bg-blue-100 text-blue-800 animate-pulse",
  completed: "bg-emerald-100 text-emerald-800",
  failed: "bg-red-100 text-red-800",
  interrupted: "bg-amber-100 text-amber-800",
};

export function RequestError({ error }: { error: ApiError | null }) {
  if (!error) return null;
  return (
    <div className="rounded border border-red-300 bg-red-50 p-2 text-xs text-red-800" data-testid="request-error">
      <div>
        {error.field ? <b>{error.field}: </b> : null}
        {error.message}
      </div>
      {error.hint && <div className="text-red-600">{error.hint}</div>}
    </div>
  );
}

export function JobPicker<R>({
  jobs,
  current,
  onSelect,
  describe,
}: {
  jobs: Job<R>[];
  current: string | null;
  onSelect: (id: string) => void;
  describe: (job: Job<R>) => string;
}) {
  if (jobs.length < 2) return null;
  return (
    <label className="block text-xs text-slate-600">
      earlier results
      <select
        data-testid="job-picker"
        className="ml-2 rounded border border-slate-300 px-1 py-0.5 text-xs"
        value={current ?? ""}
        onChange={(e) => onSelect(e.target.value)}
      >
        {jobs.map((j) => (
          <option key={j.id} value={j.id}>
            {new Date(j.submitted_at * 1000).toLocaleTimeString()} · {describe(j)} · {j.status}
          </option>
        ))}
      </select>
    </label>
  );
}
