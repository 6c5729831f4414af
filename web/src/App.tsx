// Rewind's UI shell: hash routes (#/runs/<id>?tab=graph&node=3, #/traces, #/traces/<id>,
// #/failures, #/settings), the runs sidebar, and the selected run or trace.
import { useCallback, useEffect, useRef, useState } from "react";
import { api, ApiError, getToken, takeTokenFromHash } from "./api";
import type { RunFilters, RunsResponse } from "./types";
import { filterQuery, NO_FILTERS, RunsList } from "./components/RunsList";
import { RunView, TABS, type Tab } from "./components/RunView";
import { Settings } from "./components/Settings";
import { FailuresView } from "./components/FailuresView";
import { TracesList } from "./components/TracesList";
import { TraceView } from "./components/TraceView";

interface Route {
  view: "runs" | "settings" | "traces" | "failures";
  runId: string | null;
  traceId: string | null;
  tab: Tab;
  node: number | null;
}

function parseRoute(hash: string): Route {
  const [path, query = ""] = hash.replace(/^#/, "").split("?");
  const params = new URLSearchParams(query);
  const tab = ((TABS as readonly string[]).includes(params.get("tab") ?? "") ? params.get("tab") : "graph") as Tab;
  const node = params.get("node") ? Number(params.get("node")) : null;
  const none = { runId: null, traceId: null, tab, node: null };
  if (path.startsWith("/settings")) return { view: "settings", ...none };
  if (path.startsWith("/failures")) return { view: "failures", ...none };
  const t = path.match(/^\/traces(?:\/([0-9a-zA-Z_-]+))?/);
  if (t) return { view: "traces", ...none, traceId: t[1] ?? null };
  const m = path.match(/^\/runs\/([0-9a-zA-Z_-]+)/);
  return { view: "runs", runId: m ? m[1] : null, traceId: null, tab, node };
}

function href(runId: string, tab: Tab, node: number | null): string {
  const q = new URLSearchParams({ tab });
  if (node !== null) q.set("node", String(node));
  return `#/runs/${runId}?${q.toString()}`;
}

export default function App() {
  const [route, setRoute] = useState<Route>(() => parseRoute(window.location.hash));
  const [runs, setRuns] = useState<RunsResponse>({ runs: [], tree: [] });
  const [error, setError] = useState<ApiError | null>(null);
  const [filters, setFilters] = useState<RunFilters>(NO_FILTERS);
  // the sidebar scrolls the runs list (a virtual list: only the runs in view are drawn)
  const sidebar = useRef<HTMLElement>(null);

  useEffect(() => {
    const onHash = () => {
      // a new `#token=…` typed into an open tab: keep it and reload, so every view asks again
      if (takeTokenFromHash()) window.location.reload();
      else setRoute(parseRoute(window.location.hash));
    };
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);

  const loadRuns = useCallback(() => {
    api<RunsResponse>(`/api/runs${filterQuery(filters)}`)
      .then((r) => {
        setRuns(r);
        setError(null);
      })
      .catch((e) => setError(e instanceof ApiError ? e : new ApiError(0, String(e))));
  }, [filters]);

  // Load now, then poll: every 1.5 s while a run is queued or running, else every 5 s. The
  // effect depends on whether any run is live, not on the list itself: each answer is a new
  // list, so with the list as a dependency every answer loaded the runs again at once (the
  // page asked for /api/runs ~60 times a second, for as long as it was open).
  const anyLive = runs.runs.some((r) => r.status === "running" || r.status === "queued");
  useEffect(() => {
    loadRuns();
    const timer = window.setInterval(loadRuns, anyLive ? 1500 : 5000);
    return () => window.clearInterval(timer);
  }, [loadRuns, anyLive]);

  const navigate = (runId: string, tab: Tab, node: number | null) => {
    window.location.hash = href(runId, tab, node);
    loadRuns();
  };

  return (
    <div className="flex h-screen flex-col">
      <header className="flex flex-wrap items-center gap-x-4 gap-y-1 border-b border-slate-200 bg-slate-900 px-4 py-2 text-white">
        <a href="#/" className="text-lg font-bold tracking-tight">
          <img src="/favicon.svg" alt="" className="mr-1 inline h-5 w-5 align-[-3px]" />
          Rewind
        </a>
        <span className="hidden text-xs text-slate-300 sm:inline">record · fork · replay · diff</span>
        <nav className="ml-auto flex gap-3 text-sm">
          <a href="#/" data-testid="nav-runs" className={route.view === "runs" ? "underline" : ""}>
            Runs
          </a>
          <a href="#/traces" data-testid="nav-traces" className={route.view === "traces" ? "underline" : ""}>
            Traces
          </a>
          <a href="#/failures" data-testid="nav-failures" className={route.view === "failures" ? "underline" : ""}>
            Failures
          </a>
          <a href="#/settings" data-testid="nav-settings" className={route.view === "settings" ? "underline" : ""}>
            Settings
          </a>
        </nav>
      </header>
      {error?.status === 401 && (
        <div className="bg-amber-100 px-4 py-2 text-sm text-amber-900">
          {getToken()
            ? "The server rejected this tab's access token: enter a current one under "
            : "This server needs an access token: enter it under "}
          <a className="underline" href="#/settings">
            Settings
          </a>
          .
        </div>
      )}
      <div className="flex min-h-0 flex-1 flex-col md:flex-row">
        <aside ref={sidebar} className="max-h-[30vh] w-full shrink-0 overflow-y-auto border-b border-slate-200 bg-slate-50 p-2 md:max-h-none md:w-80 md:border-b-0 md:border-r">
          <RunsList
            runs={runs.runs}
            subRuns={runs.sub_runs ?? []}
            tree={runs.tree}
            selected={route.runId}
            onSelect={(id) => navigate(id, "graph", null)}
            filters={filters}
            onFilters={setFilters}
            scrollParent={sidebar}
          />
        </aside>
        <main className="min-h-0 min-w-0 flex-1 overflow-y-auto p-2 sm:p-4">
          {route.view === "settings" && <Settings />}
          {route.view === "failures" && <FailuresView />}
          {route.view === "traces" && !route.traceId && <TracesList />}
          {route.view === "traces" && route.traceId && <TraceView key={route.traceId} traceId={route.traceId} />}
          {route.view === "runs" && route.runId && (
            <RunView
              key={route.runId}
              runId={route.runId}
              tab={route.tab}
              node={route.node}
              runs={runs.runs}
              navigate={navigate}
              onRunsChanged={loadRuns}
            />
          )}
          {route.view === "runs" && !route.runId && (
            <div className="max-w-2xl space-y-2 text-sm text-slate-600">
              <h2 className="text-lg font-semibold text-slate-900">Pick a run</h2>
              <p>
                Select a run on the left to see its graph. Click a node, change one param or its output, and press{" "}
                <b>Fork here</b>: the new run inherits the nodes before it (grey), replays the rest through the cache
                (green when nothing changed, orange when a node had to re-execute) and the Diff tab shows what changed.
              </p>
            </div>
          )}
        </main>
      </div>
    </div>
  );
}
