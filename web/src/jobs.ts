// Background report jobs (what-if grid, stability): start one, poll it until it is done, and
// reopen the latest job of the run when the view is shown again.
import { useCallback, useEffect, useRef, useState } from "react";
import { api, ApiError } from "./api";
import type { Job } from "./types";

export type JobKind = "grid" | "stability";

const LIST_PATH: Record<JobKind, string> = { grid: "/api/grids", stability: "/api/stability" };
const POLL_MS = 400;

export interface JobState<R> {
  job: Job<R> | null;
  jobs: Job<R>[];
  error: ApiError | null;
  submitting: boolean;
  start: (body: unknown) => Promise<void>;
  select: (id: string) => void;
}

export function isDone(job: Job<unknown> | null): boolean {
  return job !== null && !["queued", "running"].includes(job.status);
}

export function useJob<R>(kind: JobKind, runId: string): JobState<R> {
  const [job, setJob] = useState<Job<R> | null>(null);
  const [jobs, setJobs] = useState<Job<R>[]>([]);
  const [jobId, setJobId] = useState<string | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [submitting, setSubmitting] = useState(false);
  const alive = useRef(true);

  const loadList = useCallback(async (): Promise<Job<R>[]> => {
    const res = await api<{ jobs: Job<R>[] }>(`${LIST_PATH[kind]}?run_id=${encodeURIComponent(runId)}`);
    if (alive.current) setJobs(res.jobs);
    return res.jobs;
  }, [kind, runId]);

  // The run's latest job, if there is one.
  useEffect(() => {
    alive.current = true;
    setJob(null);
    setJobId(null);
    setError(null);
    loadList()
      .then((list) => {
        if (alive.current && list.length > 0) setJobId((current) => current ?? list[0].id);
      })
      .catch(() => undefined);
    return () => {
      alive.current = false;
    };
  }, [loadList]);

  // Follow the selected job until it is done.
  useEffect(() => {
    if (!jobId) return;
    let stopped = false;
    let timer: number | undefined;
    const poll = async () => {
      try {
        const j = await api<Job<R>>(`${LIST_PATH[kind]}/${jobId}`);
        if (stopped) return;
        setJob(j);
        if (!isDone(j)) timer = window.setTimeout(poll, POLL_MS);
        else void loadList().catch(() => undefined);
      } catch (e) {
        if (!stopped) setError(e instanceof ApiError ? e : new ApiError(0, String(e)));
      }
    };
    void poll();
    return () => {
      stopped = true;
      window.clearTimeout(timer);
    };
  }, [jobId, kind, loadList]);

  const start = useCallback(
    async (body: unknown) => {
      setSubmitting(true);
      setError(null);
      try {
        const accepted = await api<Job<R>>(`/api/runs/${runId}/${kind}`, { method: "POST", body });
        setJob(accepted);
        setJobId(accepted.id);
        void loadList().catch(() => undefined);
      } catch (e) {
        setError(e instanceof ApiError ? e : new ApiError(0, String(e)));
      } finally {
        setSubmitting(false);
      }
    },
    [kind, runId, loadList],
  );

  const select = useCallback((id: string) => {
    setError(null);
    setJobId(id);
  }, []);

  return { job, jobs, error, submitting, start, select };
}
