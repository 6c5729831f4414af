// Runs as a fork tree (a fork nests under its parent), newest first, with a form to start one.
import { useEffect, useState } from "react";
import { api, ApiError, fmtInt, shortId } from "../api";
import type { PipelineInfo, Run, TreeItem } from "../types";
import { RunBadge } from "./Status";

function Item({
  item,
  byId,
  selected,
  onSelect,
  depth,
}: {
  item: TreeItem;
  byId: Map<string, Run>;
  selected: string | null;
  onSelect: (id: string) => void;
  depth: number;
}) {
  const run = byId.get(item.run_id);
  if (!run) return null;
  return (
    <li>
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
          {run.pipeline}
          {run.change ? ` · ${run.fork_number}: ${run.change}` : ""}
          {run.parent_run_id ? ` · parent ${shortId(run.parent_run_id)}` : ""}
        </div>
      </button>
      {item.children.length > 0 && (
        <ul>
          {item.children.map((c) => (
            <Item key={c.run_id} item={c} byId={byId} selected={selected} onSelect={onSelect} depth={depth + 1} />
          ))}
        </ul>
      )}
    </li>
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
  tree,
  selected,
  onSelect,
}: {
  runs: Run[];
  tree: TreeItem[];
  selected: string | null;
  onSelect: (id: string) => void;
}) {
  const byId = new Map(runs.map((r) => [r.run_id, r]));
  return (
    <nav className="space-y-2" data-testid="runs-list">
      <NewRun onStarted={onSelect} />
      <h2 className="px-1 text-xs font-semibold uppercase tracking-wide text-slate-500">Runs · fork tree</h2>
      {runs.length === 0 && <p className="px-1 text-xs text-slate-500">No runs yet.</p>}
      <ul className="space-y-0.5">
        {tree.map((item) => (
          <Item key={item.run_id} item={item} byId={byId} selected={selected} onSelect={onSelect} depth={0} />
        ))}
      </ul>
    </nav>
  );
}
