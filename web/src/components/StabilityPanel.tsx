// Hash-stability: run the branch from one node K times live and show, per node, how the output
// hashes spread — distinct hashes, the modal hash's share as a small distribution bar, the first
// node where hashes spread — and the overall stable share.
import { useMemo, useState } from "react";
import { fmtInt, fmtMs, shortId } from "../api";
import { isDone, useJob } from "../jobs";
import type { Execution, Job, Run, StabilityNode, StabilityReport } from "../types";
import { JobPicker, JobProgress, RequestError } from "./JobStatus";

type Change = "none" | "temperature" | "param";

const SPREAD_COLOURS = ["#fb923c", "#f472b6", "#a78bfa", "#facc15", "#38bdf8", "#f87171"];

interface Segment {
  hash: string | null;
  count: number;
  colour: string;
}

/** The node's K hashes as bar segments: the modal hash first, then the others by count, then
 * the samples that produced no output. */
export function segments(node: StabilityNode): Segment[] {
  const counts = new Map<string, number>();
  let missing = 0;
  for (const h of node.hashes) {
    if (h === null) missing += 1;
    else counts.set(h, (counts.get(h) ?? 0) + 1);
  }
  const ordered = [...counts.entries()].sort((a, b) => {
    if (a[0] === node.modal_hash) return -1;
    if (b[0] === node.modal_hash) return 1;
    return b[1] - a[1];
  });
  const out: Segment[] = ordered.map(([hash, count], i) => ({
    hash,
    count,
    colour: i === 0 ? (node.stable ? "#22c55e" : "#0d9488") : SPREAD_COLOURS[(i - 1) % SPREAD_COLOURS.length],
  }));
  if (missing) out.push({ hash: null, count: missing, colour: "#cbd5e1" });
  return out;
}

function Distribution({ node, k }: { node: StabilityNode; k: number }) {
  const parts = segments(node);
  return (
    <div className="flex items-center gap-2" data-testid="hash-distribution">
      <div className="flex h-3 w-40 overflow-hidden rounded border border-slate-300 bg-slate-50" role="img" aria-label="output hash distribution">
        {parts.map((s, i) => (
          <div
            key={`${s.hash ?? "none"}-${i}`}
            data-testid="hash-segment"
            title={`${s.hash ? s.hash.slice(0, 12) : "no output"} × ${s.count}`}
            style={{ width: `${(s.count / Math.max(k, 1)) * 100}%`, background: s.colour }}
            className="h-full border-r border-white last:border-r-0"
          />
        ))}
      </div>
      <span className="tabular-nums text-slate-700" data-testid="modal-share">
        {node.modal_count}/{k} ({Math.round(node.modal_share * 100)}%)
      </span>
    </div>
  );
}

function StabilityTable({ report, onOpenRun }: { report: StabilityReport; onOpenRun: (id: string) => void }) {
  const first = report.first_spread;
  return (
    <div className="space-y-2" data-testid="stability-result">
      <div className="flex flex-wrap items-baseline gap-4 text-sm" data-testid="stability-summary">
        <span>
          stable share:{" "}
          <b data-testid="stable-share" className={report.stable_share === 1 ? "text-emerald-700" : "text-orange-700"}>
            {report.stable_nodes}/{report.node_count} nodes ({Math.round(report.stable_share * 100)}%)
          </b>
        </span>
        <span>
          first spread:{" "}
          <b data-testid="first-spread">
            {first ? `node ${report.from_number + first.index} ${first.label}` : "none — every node stable"}
          </b>
        </span>
        <span className="text-xs text-slate-600">
          K={report.k} from node {report.from_number} {report.from_node}
          {report.override && (
            <>
              {" · "}
              <code>
                {report.override.node}.{report.override.param ?? report.override.field}={JSON.stringify(report.override.value)?.slice(0, 60)}
              </code>
            </>
          )}
          {" · "}
          {fmtInt(report.tokens)} tokens · {fmtMs(report.wall_ms)}
        </span>
      </div>
      <table className="text-left text-xs">
        <thead className="text-slate-500">
          <tr>
            <th className="py-1 pr-2">#</th>
            <th className="pr-3">node</th>
            <th className="pr-3">stable</th>
            <th className="pr-3">distinct hashes</th>
            <th className="pr-3">modal share (hash distribution)</th>
            <th className="pr-3">modal sha256</th>
            <th className="pr-3">vs recorded</th>
            <th className="pr-3">determinism</th>
          </tr>
        </thead>
        <tbody>
          {report.nodes.map((n) => {
            const isFirst = first !== null && first.index === n.index;
            return (
              <tr
                key={n.index}
                data-testid={`stability-row-${n.index + 1}`}
                data-stable={String(n.stable)}
                className={`border-t border-slate-100 ${isFirst ? "bg-orange-50" : ""}`}
              >
                <td className="py-1 pr-2 text-slate-500">{report.from_number + n.index}</td>
                <td className="pr-3 font-medium">{n.label}</td>
                <td className="pr-3">
                  {n.stable ? <span className="text-emerald-700">yes</span> : <span className="font-semibold text-orange-700">no</span>}
                  {isFirst && (
                    <span className="ml-2 font-semibold text-orange-700" data-testid="first-spread-marker">
                      ◀ first spread
                    </span>
                  )}
                </td>
                <td className="pr-3 tabular-nums" data-testid="distinct">
                  {n.distinct}
                  {n.completed < report.k && <span className="text-slate-500"> ({report.k - n.completed} without output)</span>}
                </td>
                <td className="pr-3">
                  <Distribution node={n} k={report.k} />
                </td>
                <td className="pr-3 font-mono" title={n.modal_hash ?? ""}>
                  {n.modal_hash ? n.modal_hash.slice(0, 12) : "—"}
                </td>
                <td className="pr-3">{n.matches_parent ? "= recorded" : <span className="text-orange-700">≠ recorded</span>}</td>
                <td className="pr-3 text-slate-600">{n.determinism || "—"}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
      <div className="flex flex-wrap gap-2 text-xs text-slate-600">
        samples:
        {report.samples.map((s, i) => (
          <button
            key={s.run_id}
            type="button"
            className={`font-mono underline ${s.status === "completed" ? "text-sky-700" : "text-red-700"}`}
            title={s.error ?? s.status}
            onClick={() => onOpenRun(s.run_id)}
          >
            {i + 1}:{shortId(s.run_id)}
            {s.status !== "completed" ? ` (${s.status})` : ""}
          </button>
        ))}
      </div>
    </div>
  );
}

function parseJson(text: string): { ok: true; value: unknown } | { ok: false; error: string } {
  if (!text.trim()) return { ok: false, error: "enter a JSON value" };
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch (e) {
    return { ok: false, error: `not valid JSON: ${(e as Error).message}` };
  }
}

function describe(job: Job<StabilityReport>): string {
  return `K=${String(job.request.k)} from ${String(job.request.from_node)}`;
}

export function StabilityPanel({
  run,
  executions,
  node,
  onOpenRun,
}: {
  run: Run;
  executions: Execution[];
  node: number | null;
  onOpenRun: (runId: string) => void;
}) {
  const [k, setK] = useState(5);
  const [from, setFrom] = useState<number>(node ?? executions[0]?.number ?? 1);
  const [change, setChange] = useState<Change>("none");
  const [temperature, setTemperature] = useState("0.8");
  const params = useMemo(
    () =>
      executions
        .filter((e) => e.number >= from)
        .flatMap((e) => Object.keys(e.params ?? {}).map((p) => `${e.name}.${p}`))
        .filter((key, i, all) => all.indexOf(key) === i),
    [executions, from],
  );
  const [paramKey, setParamKey] = useState("");
  const [value, setValue] = useState("");
  const job = useJob<StabilityReport>("stability", run.run_id);

  const target = params.includes(paramKey) ? paramKey : (params[0] ?? "");
  const parsedValue = change === "param" ? parseJson(value) : null;
  const temp = Number(temperature);
  const kOk = Number.isInteger(k) && k >= 2 && k <= 50;
  const changeOk =
    change === "none" ||
    (change === "temperature" && temperature.trim() !== "" && Number.isFinite(temp) && temp >= 0 && temp <= 2) ||
    (change === "param" && !!target && parsedValue?.ok === true);
  const finished = run.status !== "running" && run.status !== "queued";
  const running = job.job !== null && !isDone(job.job);
  const canRun = finished && kOk && changeOk && !job.submitting && !running;

  const submit = () => {
    if (!canRun) return;
    const body: Record<string, unknown> = { k, from_node: from };
    if (change === "temperature") body.temperature = temp;
    if (change === "param" && parsedValue?.ok) {
      const dot = target.indexOf(".");
      body.override = { node: target.slice(0, dot), param: target.slice(dot + 1), value: parsedValue.value };
    }
    void job.start(body);
  };

  const report = job.job?.status === "completed" ? (job.job.report ?? null) : null;
  return (
    <section className="space-y-3" data-testid="stability-panel">
      <div className="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="stability-form">
        <h3 className="text-sm font-semibold">Hash stability: run the branch K times live and count what spreads</h3>
        <p className="text-xs text-slate-500">
          Caches are bypassed (every LLM and tool call executes), nothing becomes a cache entry; side effects are never
          repeated: served from the record, or logged as a dry run when their arguments spread. Samples run one after
          the other.
        </p>
        <div className="flex flex-wrap items-center gap-3 text-xs text-slate-600">
          <label>
            K
            <input
              data-testid="stability-k"
              type="number"
              min={2}
              max={50}
              className={`ml-2 w-16 rounded border px-1 py-0.5 ${kOk ? "border-slate-300" : "border-red-400"}`}
              value={Number.isNaN(k) ? "" : k}
              onChange={(e) => setK(Math.trunc(Number(e.target.value)))}
            />
          </label>
          <label>
            from node
            <select
              data-testid="stability-from"
              className="ml-2 rounded border border-slate-300 px-1 py-0.5"
              value={from}
              onChange={(e) => setFrom(Number(e.target.value))}
            >
              {executions.map((e) => (
                <option key={e.number} value={e.number}>
                  {e.number} {e.name}
                </option>
              ))}
            </select>
          </label>
          <label>
            change
            <select
              data-testid="stability-change"
              className="ml-2 rounded border border-slate-300 px-1 py-0.5"
              value={change}
              onChange={(e) => setChange(e.target.value as Change)}
            >
              <option value="none">none (as recorded)</option>
              <option value="temperature">temperature of the first LLM node</option>
              <option value="param">one param</option>
            </select>
          </label>
          {change === "temperature" && (
            <input
              data-testid="stability-temperature"
              className="w-16 rounded border border-slate-300 px-1 py-0.5 font-mono"
              value={temperature}
              onChange={(e) => setTemperature(e.target.value)}
            />
          )}
          {change === "param" && (
            <>
              <select
                data-testid="stability-param"
                className="rounded border border-slate-300 px-1 py-0.5"
                value={target}
                onChange={(e) => setParamKey(e.target.value)}
              >
                {params.map((p) => (
                  <option key={p} value={p}>
                    {p}
                  </option>
                ))}
              </select>
              <input
                data-testid="stability-value"
                placeholder="JSON value"
                className={`w-40 rounded border px-1 py-0.5 font-mono ${parsedValue && !parsedValue.ok ? "border-red-400" : "border-slate-300"}`}
                value={value}
                onChange={(e) => setValue(e.target.value)}
              />
            </>
          )}
        </div>
        {!kOk && <p className="text-xs text-red-600">K must be a whole number from 2 to 50.</p>}
        {!finished && <p className="text-xs text-amber-700">This run is still {run.status}; sample it once it finishes.</p>}
        <button
          type="button"
          data-testid="stability-run"
          disabled={!canRun}
          onClick={submit}
          className="rounded bg-orange-600 px-3 py-1.5 text-sm font-medium text-white hover:bg-orange-700 disabled:opacity-40"
        >
          {job.submitting ? "starting…" : running ? "sampling…" : `Run ${kOk ? k : "K"} samples`}
        </button>
        <RequestError error={job.error} />
      </div>
      <JobPicker jobs={job.jobs} current={job.job?.id ?? null} onSelect={job.select} describe={describe} />
      {job.job && <JobProgress job={job.job} noun="samples" />}
      {report && <StabilityTable report={report} onOpenRun={onOpenRun} />}
    </section>
  );
}
