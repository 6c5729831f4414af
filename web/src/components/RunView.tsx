// One run: header, cost bar, and the Graph / Diff / Raw JSON / Audit / What-if grid / Stability
// tabs with the node editor.
import { useEffect, useRef, useState } from "react";
import { apiExact, fmtInt, fmtMs, shortId } from "../api";
import type { NodeDetail, Run } from "../types";
import { useLiveRun } from "../live";
import { ArtifactLink } from "./ArtifactLink";
import { AuditPanel } from "./AuditPanel";
import { CostBar } from "./CostBar";
import { DiffPanel } from "./DiffPanel";
import { Executions } from "./Executions";
import { GraphView } from "./Graph";
import { GridPanel } from "./GridPanel";
import { NodeEditor } from "./NodeEditor";
import { NodeInfo } from "./NodeInfo";
import { RawJson } from "./RawJson";
import { RunActions } from "./RunActions";
import { StabilityPanel } from "./StabilityPanel";
import { RunBadge } from "./Status";
import { CopyButton, exactJson, visible } from "./TextBlock";

export const TABS = ["graph", "diff", "raw", "audit", "grid", "stability"] as const;
export type Tab = (typeof TABS)[number];

export function RunView({
  runId,
  tab,
  node,
  runs,
  navigate,
  onRunsChanged,
}: {
  runId: string;
  tab: Tab;
  node: number | null;
  runs: Run[];
  navigate: (runId: string, tab: Tab, node: number | null) => void;
  onRunsChanged: () => void;
}) {
  const live = useLiveRun(runId, onRunsChanged);
  const [detail, setDetail] = useState<NodeDetail | null>(null);
  const [nodeError, setNodeError] = useState<string | null>(null);
  // A node chosen from the keyboard moves focus to its panel (editor first), so a fork needs
  // no mouse: Tab from there reaches the editor's controls and "Fork here".
  const panel = useRef<HTMLDivElement>(null);
  const focusPanel = useRef(false);
  useEffect(() => {
    if (detail && focusPanel.current) {
      focusPanel.current = false;
      panel.current?.focus();
    }
  }, [detail]);
  const graph = live.graph;
  const run = live.detail;
  const exec = graph?.executions.find((e) => e.number === node) ?? null;
  const execKey = exec ? `${exec.number}:${exec.output_hash}:${exec.live}` : "";

  useEffect(() => {
    setDetail(null);
    setNodeError(null);
    if (!exec || exec.live) return;
    let cancelled = false;
    apiExact<NodeDetail>(`/api/runs/${runId}/nodes/${exec.number}`)
      .then((d) => !cancelled && setDetail(d))
      .catch((e: Error) => !cancelled && setNodeError(e.message));
    return () => {
      cancelled = true;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [runId, execKey]);

  useEffect(() => {
    if (live.version > 0) onRunsChanged();
    // Refresh the list when this run appears or changes status.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [run?.status]);

  if (live.error && !graph)
    return (
      <div className="rounded border border-red-300 bg-red-50 p-3 text-sm text-red-800" data-testid="run-error">
        {live.error.message} {live.error.hint}
      </div>
    );
  if (!graph || !run) return <p className="text-sm text-slate-500">Loading run {shortId(runId)}…</p>;

  const select = (n: number) => navigate(runId, tab, n);
  const tabButton = (t: Tab, label: string) => (
    <button
      type="button"
      data-testid={`tab-${t}`}
      onClick={() => navigate(runId, t, node)}
      className={`shrink-0 whitespace-nowrap rounded-t border-b-2 px-3 py-1 text-sm ${tab === t ? "border-orange-600 font-semibold" : "border-transparent text-slate-600"}`}
    >
      {label}
    </button>
  );

  return (
    <div className="space-y-3" data-testid="run-view" data-run-id={run.run_id} data-run-status={run.status}>
      <header className="space-y-1">
        <div className="flex flex-wrap items-center gap-2">
          <h2 className="break-all font-mono text-base font-semibold">{run.run_id}</h2>
          <CopyButton text={run.run_id} label="copy id" />
          <RunBadge status={run.status} />
          <span className="text-sm text-slate-600">{run.pipeline}</span>
          <span className="text-sm text-slate-600" data-testid="run-tokens">
            {fmtInt(run.tokens)} tokens · {fmtMs(run.latency_ms)}
          </span>
          {live.mode !== "idle" && <span className="text-xs text-blue-700">live ({live.mode})</span>}
          {run.config?.kind === "trace" && (
            <a className="text-sm text-sky-700 underline" href={`#/traces/${run.run_id}`} data-testid="open-as-trace">
              open as a trace (replay with switches)
            </a>
          )}
        </div>
        {run.parent_run_id && (
          <div className="text-sm text-slate-700">
            fork of{" "}
            <button type="button" className="font-mono text-sky-700 underline" onClick={() => navigate(run.parent_run_id!, "graph", null)}>
              {shortId(run.parent_run_id)}
            </button>{" "}
            at node {run.fork_number} {run.fork_node}: <span data-testid="run-change">{run.change}</span>
            {run.override && (
              <code className="ml-1 rounded bg-slate-100 px-1 text-xs">= {visible(exactJson(run.override.value) ?? "null").slice(0, 120)}</code>
            )}
          </div>
        )}
        <RunActions
          key={`${run.run_id}:${run.status}`}
          run={run}
          onChanged={onRunsChanged}
          onDeleted={() => {
            onRunsChanged();
            window.location.hash = "#/";
          }}
        />
        {run.error && <div className="rounded bg-red-50 p-2 text-sm text-red-800">{run.error}</div>}
        {run.artifacts.length > 0 && (
          <div className="text-xs text-slate-600">
            artifacts:{" "}
            {run.artifacts.map((a) => (
              <span key={a.name} className="mr-2">
                <ArtifactLink url={a.url} name={a.name} />{" "}
                <span className="font-mono">{a.sha256.slice(0, 12)}</span> ({fmtInt(a.size)} B)
              </span>
            ))}
          </div>
        )}
      </header>
      {live.cost && <CostBar cost={live.cost} status={run.status} />}
      <div className="flex gap-1 overflow-x-auto border-b border-slate-200" role="tablist">
        {tabButton("graph", "Graph")}
        {tabButton("diff", "Diff")}
        {tabButton("raw", "Raw JSON")}
        {tabButton("audit", "Audit")}
        {tabButton("grid", "What-if grid")}
        {tabButton("stability", "Stability")}
      </div>
      {tab === "graph" && (
        <div className="grid grid-cols-1 gap-3 xl:grid-cols-[minmax(0,1fr)_26rem]">
          <div className="space-y-3">
            <GraphView
              graph={graph}
              selected={node}
              onSelect={select}
              onKeyboardSelect={(n) => {
                focusPanel.current = true;
                select(n);
              }}
            />
            <Executions executions={graph.executions} selected={node} onSelect={select} />
          </div>
          <div
            className="min-w-0 space-y-3 outline-none"
            ref={panel}
            tabIndex={-1}
            aria-label="selected node"
            data-testid="node-panel"
          >
            {!exec && <p className="text-sm text-slate-500">Click a node (or Tab to it and press Enter) to inspect it and fork there.</p>}
            {exec?.live && <p className="text-sm text-slate-500">Node {exec.number} is being written…</p>}
            {nodeError && <p className="text-sm text-red-700">{nodeError}</p>}
            {detail && <NodeEditor run={run} detail={detail} onForked={(id) => navigate(id, "graph", null)} />}
            {detail && <NodeInfo detail={detail} />}
          </div>
        </div>
      )}
      {tab === "diff" && <DiffPanel run={run} runs={runs} version={live.version} />}
      {tab === "audit" && <AuditPanel run={run} runs={runs} version={live.version} />}
      {tab === "grid" && (
        <GridPanel run={run} executions={graph.executions} node={node} onOpenRun={(id) => navigate(id, "graph", null)} />
      )}
      {tab === "stability" && (
        <StabilityPanel run={run} executions={graph.executions} node={node} onOpenRun={(id) => navigate(id, "graph", null)} />
      )}
      {tab === "raw" && (
        <div className="flex flex-wrap gap-1" data-testid="raw-node-picker">
          {graph.executions.map((e) => (
            <button
              key={e.number}
              type="button"
              className={`rounded border px-2 py-0.5 text-xs ${e.number === node ? "bg-slate-800 text-white" : "border-slate-300"}`}
              onClick={() => select(e.number)}
            >
              {e.number} {e.name}
            </button>
          ))}
        </div>
      )}
      {tab === "raw" &&
        (detail ? (
          <RawJson runId={runId} detail={detail} />
        ) : (
          <p className="text-sm text-slate-500">Select a node in the Graph tab (or below) to see its raw JSON.</p>
        ))}
    </div>
  );
}
