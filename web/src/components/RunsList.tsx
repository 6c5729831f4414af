// Runs as a tree, newest first: a fork nests under its parent, grid variants and stability samples
// under their job (collapsed), sub-runs under the run that spawned them (collapsed); a filter bar
// (text, pipeline, status, dates) and a form to start a run.
import { useEffect, useState, type RefObject } from "react";
import { api, ApiError, fmtInt, shortId } from "../api";
import type { PipelineInfo, Run, RunFilters, TreeItem } from "../types";
import { RunBadge } from "./Status";
import { VirtualList } from "./VirtualList";

export const NO_FILTERS: RunFilters = { q: "", pipeline: "", status: "", since: "", until: "" };

const STATUSES = ["queued", "running", "completed", "failed", "interrupted", "cancelled"];

/** Query string of GET /api/runs for the filters (dates are local days; until is inclusive). */
export function filterQuery(f: RunFilters): string {
  const q = new URLSearchParams();
  if (f.q.trim()) q.set("q", f.q.trim());
  if (f.pipeline) q.set("pipeline", f.pipeline);
  if (f.status) q.set("status", f.status);
  const day = (value: string, plusDays: number) => {
    const [y, m, d] = value.split("-").map(Number);
    return String(new Date(y, m - 1, d + plusDays).getTime() / 1000);
  };
  if (f.since) q.set("since", day(f.since, 0));
  if (f.until) q.set("until", day(f.until, 1));
  const text = q.toString();
  return text ? `?${text}` : "";
}

interface ItemProps {
  item: TreeItem;
  byId: Map<string, Run>;
  selected: string | null;
  onSelect: (id: string) => void;
  depth: number;
}

function Toggle({ open, onClick, testId, children }: { open: boolean; onClick: () => void; testId: string; children: React.ReactNode }) {
  return (
    <button
      type="button"
      data-testid={testId}
      aria-expanded={open}
      onClick={onClick}
      className="w-full rounded px-2 py-0.5 text-left text-xs text-slate-600 hover:bg-slate-100"
    >
      <span className="inline-block w-3">{open ? "▾" : "▸"}</span>
      {children}
    </button>
  );
}

function JobGroup({ item, byId, selected, onSelect, depth, as: Tag = "li" }: ItemProps & { as?: "li" | "div" }) {
  const job = item.job!;
  const hasSelected = item.children.some((c) => c.run_id === selected);
  const [open, setOpen] = useState(hasSelected);
  const noun = job.kind === "grid" ? "variant" : "sample";
  const summary = Object.entries(job.statuses)
    .map(([status, n]) => `${n} ${status}`)
    .join(", ");
  return (
    <Tag data-testid={`job-${job.kind}`} data-job-id={job.id} style={{ paddingLeft: `${depth * 0.9}rem` }}>
      <Toggle open={open || hasSelected} onClick={() => setOpen(!open)} testId={`job-toggle-${job.kind}`}>
        {job.kind === "grid" ? "what-if grid" : "stability"} · {job.count} {noun}
        {job.count === 1 ? "" : "s"} · {summary}
      </Toggle>
      {(open || hasSelected) && (
        <ul>
          {item.children.map((c) => (
            <Item key={c.run_id} item={c} byId={byId} selected={selected} onSelect={onSelect} depth={1} />
          ))}
        </ul>
      )}
    </Tag>
  );
}

function Item({ item, byId, selected, onSelect, depth, as: Tag = "li" }: ItemProps & { as?: "li" | "div" }) {
  const [subsOpen, setSubsOpen] = useState(false);
  if (item.job) return <JobGroup item={item} byId={byId} selected={selected} onSelect={onSelect} depth={depth} as={Tag} />;
  const run = item.run_id ? byId.get(item.run_id) : undefined;
  if (!run) return null;
  const subs = item.sub_runs ?? [];
  const jobs = item.jobs ?? [];
  const subSelected = subs.some((c) => c.run_id === selected);
  return (
    <Tag>
      <button
        type="button"
        data-testid={`run-item-${run.run_id}`}
        onClick={() => onSelect(run.run_id)}
        className={`w-full rounded px-2 py-1 text-left text-xs hover:bg-slate-100 ${selected === run.run_id ? "bg-sky-100" : ""}`}
        style={{ paddingLeft: `${0.5 + depth * 0.9}rem` }}
      >
        <div className="flex items-center gap-1.5">
          {depth > 0 && <span className="text-slate-400">↳</span>}
          <span className="font-mono">{shortId(run.run_id)}</span>
          <RunBadge status={run.status} />
          <span className="ml-auto tabular-nums text-slate-500" title="tokens spent by this run">
            {fmtInt(run.tokens)} tok
          </span>
        </div>
        <div className="truncate text-slate-500">
          {run.spawning_run_id ? `sub-run of node ${run.spawning_number} · ` : ""}
          {run.pipeline}
          {run.change ? ` · ${run.fork_number}: ${run.change}` : ""}
          {run.parent_run_id ? ` · parent ${shortId(run.parent_run_id)}` : ""}
        </div>
      </button>
      {subs.length > 0 && (
        <div style={{ paddingLeft: `${(depth + 1) * 0.9}rem` }}>
          <Toggle open={subsOpen || subSelected} onClick={() => setSubsOpen(!subsOpen)} testId={`subruns-toggle-${run.run_id}`}>
            {subs.length} sub-run{subs.length === 1 ? "" : "s"}
          </Toggle>
          {(subsOpen || subSelected) && (
            <ul data-testid={`subruns-${run.run_id}`}>
              {subs.map((c) => (
                <Item key={c.run_id} item={c} byId={byId} selected={selected} onSelect={onSelect} depth={1} />
              ))}
            </ul>
          )}
        </div>
      )}
      {(item.children.length > 0 || jobs.length > 0) && (
        <ul>
          {jobs.map((j) => (
            <Item key={j.job!.id} item={j} byId={byId} selected={selected} onSelect={onSelect} depth={depth + 1} />
          ))}
          {item.children.map((c) => (
            <Item key={c.run_id} item={c} byId={byId} selected={selected} onSelect={onSelect} depth={depth + 1} />
          ))}
        </ul>
      )}
    </Tag>
  );
}

function FilterBar({ filters, onChange, pipelines }: { filters: RunFilters; onChange: (f: RunFilters) => void; pipelines: string[] }) {
  const [text, setText] = useState(filters.q);
  useEffect(() => {
    const t = window.setTimeout(() => {
      if (text !== filters.q) onChange({ ...filters, q: text });
    }, 250);
    return () => window.clearTimeout(t);
  }, [text, filters, onChange]);
  const active = filters.q || filters.pipeline || filters.status || filters.since || filters.until;
  const field = "w-full rounded border border-slate-300 bg-white px-1 py-0.5";
  return (
    <div className="space-y-1 text-xs" data-testid="runs-filters">
      <input
        className={field}
        placeholder="search: run id, pipeline, change, error"
        aria-label="search runs"
        data-testid="filter-q"
        value={text}
        onChange={(e) => setText(e.target.value)}
      />
      <div className="grid grid-cols-2 gap-1">
        <select
          className={field}
          aria-label="pipeline"
          data-testid="filter-pipeline"
          value={filters.pipeline}
          onChange={(e) => onChange({ ...filters, pipeline: e.target.value })}
        >
          <option value="">all pipelines</option>
          {pipelines.map((p) => (
            <option key={p} value={p}>
              {p}
            </option>
          ))}
        </select>
        <select
          className={field}
          aria-label="status"
          data-testid="filter-status"
          value={filters.status}
          onChange={(e) => onChange({ ...filters, status: e.target.value })}
        >
          <option value="">all statuses</option>
          {STATUSES.map((s) => (
            <option key={s} value={s}>
              {s}
            </option>
          ))}
        </select>
        <label className="text-slate-500">
          from
          <input
            type="date"
            className={field}
            data-testid="filter-since"
            value={filters.since}
            onChange={(e) => onChange({ ...filters, since: e.target.value })}
          />
        </label>
        <label className="text-slate-500">
          to
          <input
            type="date"
            className={field}
            data-testid="filter-until"
            value={filters.until}
            onChange={(e) => onChange({ ...filters, until: e.target.value })}
          />
        </label>
      </div>
      {active && (
        <button
          type="button"
          data-testid="filter-clear"
          className="text-sky-700 underline"
          onClick={() => {
            setText("");
            onChange(NO_FILTERS);
          }}
        >
          clear filters
        </button>
      )}
    </div>
  );
}

function NewRun({ onStarted }: { onStarted: (id: string) => void }) {
  const [pipelines, setPipelines] = useState<PipelineInfo[]>([]);
  const [pipeline, setPipeline] = useState("");
  const [question, setQuestion] = useState("");
  const [state, setState] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [open, setOpen] = useState(false);
  useEffect(() => {
    api<{ pipelines: PipelineInfo[] }>("/api/pipelines")
      .then((r) => {
        setPipelines(r.pipelines);
        setPipeline(r.pipelines[0]?.name ?? "");
      })
      .catch(() => setPipelines([]));
  }, []);
  const info = pipelines.find((p) => p.name === pipeline);
  const start = async () => {
    setError(null);
    const body: Record<string, unknown> = { pipeline };
    if (info?.inputs.question !== undefined && question.trim()) body.question = question.trim();
    if (info?.inputs.state !== undefined && state.trim()) {
      try {
        body.state = JSON.parse(state);
      } catch (e) {
        setError(`state is not valid JSON: ${(e as Error).message}`);
        return;
      }
    }
    try {
      const r = await api<{ run_id: string }>("/api/runs", { method: "POST", body });
      setOpen(false);
      onStarted(r.run_id);
    } catch (e) {
      setError(e instanceof ApiError ? `${e.message} ${e.hint}` : String(e));
    }
  };
  if (!open)
    return (
      <button
        type="button"
        data-testid="new-run"
        className="w-full rounded bg-slate-800 px-2 py-1 text-xs font-medium text-white hover:bg-slate-700"
        onClick={() => setOpen(true)}
      >
        New run…
      </button>
    );
  return (
    <div className="space-y-1 rounded border border-slate-300 bg-white p-2 text-xs">
      <select className="w-full rounded border border-slate-300" value={pipeline} onChange={(e) => setPipeline(e.target.value)}>
        {pipelines.map((p) => (
          <option key={p.name} value={p.name}>
            {p.name}
          </option>
        ))}
      </select>
      {info && <p className="text-slate-500">{info.description}</p>}
      {info?.inputs.question !== undefined && (
        <input
          className="w-full rounded border border-slate-300 px-1 py-0.5"
          placeholder="question (default: the demo's)"
          value={question}
          onChange={(e) => setQuestion(e.target.value)}
        />
      )}
      {info?.inputs.state !== undefined && (
        <textarea
          className="h-16 w-full rounded border border-slate-300 px-1 font-mono"
          placeholder='initial state JSON, e.g. {"x": 5}'
          value={state}
          onChange={(e) => setState(e.target.value)}
        />
      )}
      {error && <p className="text-red-700">{error}</p>}
      <div className="flex gap-1">
        <button type="button" className="rounded bg-orange-600 px-2 py-0.5 text-white" onClick={start}>
          Start
        </button>
        <button type="button" className="rounded border border-slate-300 px-2 py-0.5" onClick={() => setOpen(false)}>
          Cancel
        </button>
      </div>
    </div>
  );
}

export function RunsList({
  runs,
  subRuns,
  tree,
  selected,
  onSelect,
  filters,
  onFilters,
  scrollParent,
}: {
  runs: Run[];
  subRuns: Run[];
  tree: TreeItem[];
  selected: string | null;
  onSelect: (id: string) => void;
  filters: RunFilters;
  onFilters: (f: RunFilters) => void;
  /** the box the list scrolls in (only the runs in view are drawn) */
  scrollParent: RefObject<HTMLElement | null>;
}) {
  const byId = new Map([...runs, ...subRuns].map((r) => [r.run_id, r]));
  const [pipelines, setPipelines] = useState<string[]>([]);
  useEffect(() => {
    api<{ pipelines: PipelineInfo[] }>("/api/pipelines")
      .then((r) => setPipelines(r.pipelines.map((p) => p.name)))
      .catch(() => setPipelines([]));
  }, []);
  const names = [...new Set([...pipelines, ...runs.map((r) => r.pipeline)])].sort();
  const filtered = filters !== NO_FILTERS && Object.values(filters).some(Boolean);
  return (
    <nav className="space-y-2" data-testid="runs-list">
      <NewRun onStarted={onSelect} />
      <FilterBar filters={filters} onChange={onFilters} pipelines={names} />
      <h2 className="px-1 text-xs font-semibold uppercase tracking-wide text-slate-500">
        Runs · fork tree {filtered ? `· ${runs.length} match` : ""}
      </h2>
      {runs.length === 0 && (
        <p className="px-1 text-xs text-slate-500" data-testid="runs-empty">
          {filtered ? "No run matches these filters." : "No runs yet."}
        </p>
      )}
      <VirtualList
        items={tree}
        getKey={(item) => item.run_id ?? item.job?.id ?? ""}
        renderItem={(item) => <Item item={item} byId={byId} selected={selected} onSelect={onSelect} depth={0} as="div" />}
        estimateSize={44}
        gap={2}
        scrollParent={scrollParent}
        overscan={8}
        testId="runs-tree"
        label="runs"
      />
    </nav>
  );
}
