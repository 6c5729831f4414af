// Keeps a run's graph, detail and cost fresh: server-sent events while the run is live, polling
// when the event stream is unavailable, and one final refresh when it finishes.
import { useCallback, useEffect, useRef, useState } from "react";
import { api, apiExact, ApiError, followEvents } from "./api";
import type { Cost, Graph, RunDetail } from "./types";

export interface LiveRun {
  graph: Graph | null;
  detail: RunDetail | null;
  cost: Cost | null;
  error: ApiError | null;
  version: number;
  mode: "sse" | "polling" | "idle";
}

export function useLiveRun(runId: string | null, onFinished: () => void): LiveRun {
  const [state, setState] = useState<LiveRun>({ graph: null, detail: null, cost: null, error: null, version: 0, mode: "idle" });
  const finishedRef = useRef(onFinished);
  finishedRef.current = onFinished;
  // Loads overlap while a run is live (a refresh per event, a final one when it finishes) and
  // their answers can arrive out of order: only the answer of a later request may replace the
  // state, so a slow answer from before the run finished never overwrites the final one.
  const issued = useRef(0);
  const applied = useRef(0);

  const load = useCallback(async (id: string): Promise<boolean> => {
    const n = ++issued.current;
    try {
      const [graph, detail] = await Promise.all([
        api<Graph>(`/api/runs/${id}/graph`),
        apiExact<RunDetail>(`/api/runs/${id}`),
      ]);
      // The two reads are concurrent: the run may finish between them (its answer says
      // "running", the graph's says done). It stays live while either answer says so, so the
      // next load settles on the final status instead of stopping at a stale "running".
      const live = graph.live || detail.live || detail.status === "queued" || detail.status === "running";
      let cost: Cost | null = null;
      if (detail.parent_run_id) cost = await api<Cost>(`/api/runs/${id}/cost`).catch(() => null);
      if (n < applied.current) return live;
      applied.current = n;
      setState((s) => ({ ...s, graph, detail, cost, error: null, version: s.version + 1 }));
      return live;
    } catch (e) {
      if (n >= applied.current)
        setState((s) => ({ ...s, error: e instanceof ApiError ? e : new ApiError(0, String(e)) }));
      return false;
    }
  }, []);

  useEffect(() => {
    if (!runId) return;
    let stopped = false;
    let stopEvents: (() => void) | null = null;
    let pollTimer: number | undefined;
    let pending: number | undefined;
    setState({ graph: null, detail: null, cost: null, error: null, version: 0, mode: "idle" });
    applied.current = issued.current + 1; // drop answers to loads of the previous run

    const refreshSoon = () => {
      if (pending !== undefined) return;
      pending = window.setTimeout(() => {
        pending = undefined;
        if (!stopped) void load(runId);
      }, 120);
    };
    const poll = async () => {
      if (stopped) return;
      const live = await load(runId);
      if (live && !stopped) pollTimer = window.setTimeout(poll, 1000);
      else {
        setState((s) => ({ ...s, mode: "idle" }));
        finishedRef.current();
      }
    };
    // While events stream, a slow check of the run itself: a run that finished between the
    // first load and the subscription (or whose last event was lost) still ends as finished.
    let safety: number | undefined;
    let done = false;
    const finish = () => {
      if (done) return;
      done = true;
      window.clearTimeout(safety);
      finishedRef.current();
    };
    const check = async () => {
      if (stopped || done) return;
      const still = await load(runId);
      if (stopped || done) return;
      if (!still) {
        stopEvents?.();
        setState((s) => ({ ...s, mode: "idle" }));
        finish();
        return;
      }
      safety = window.setTimeout(check, 2000);
    };
    (async () => {
      const live = await load(runId);
      if (!live || stopped) return;
      setState((s) => ({ ...s, mode: "sse" }));
      safety = window.setTimeout(check, 2000);
      stopEvents = followEvents(
        runId,
        (event) => {
          if (event.event === "hello") return;
          refreshSoon();
          if (event.event === "run_finished") {
            window.setTimeout(() => {
              void load(runId).then(finish);
            }, 150);
            setState((s) => ({ ...s, mode: "idle" }));
          }
        },
        (failed) => {
          if (stopped) return;
          if (failed) {
            setState((s) => ({ ...s, mode: "polling" }));
            void poll();
          } else {
            // The stream ended (the run finished): one last refresh, even if its
            // run_finished event was missed.
            setState((s) => ({ ...s, mode: "idle" }));
            void load(runId).then(finish);
          }
        },
      );
    })();
    return () => {
      stopped = true;
      stopEvents?.();
      window.clearTimeout(pollTimer);
      window.clearTimeout(pending);
      window.clearTimeout(safety);
    };
  }, [runId, load]);

  return state;
}
