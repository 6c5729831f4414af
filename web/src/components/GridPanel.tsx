// What-if grid: fork the run at one node N ways (several values of one param), concurrently, and
// show the N-way matrix — rows nodes, columns variants, cells a short output hash and the number
// of fields changed vs the parent, the first divergence per variant, which variants change the
// artifact.
import { useEffect, useMemo, useState } from "react";
import { fmtInt, fmtMs, shortId } from "../api";
import { isDone, useJob } from "../jobs";
import type { Execution, GridCell, GridReport, GridVariant, Job, Run } from "../types";
import { JobPicker, JobProgress, RequestError } from "./JobStatus";
import { LiveConfirm } from "./LiveConfirm";

type Effects = "live" | "recorded" | "dry-run";

function parseJson(text: string): { ok: true; value: unknown } | { ok: false; error: string } {
  if (!text.trim()) return { ok: false, error: "enter a JSON value (strings in double quotes)" };
  try {
    return { ok: true, value: JSON.parse(text) };
  } catch (e) {
    return { ok: false, error: `not valid JSON: ${(e as Error).message}` };
  }
}

interface Target {
  key: string;
  node: string;
  param: string;
  recorded: unknown;
}

/** Params of the nodes from the fork node on, one entry per node.param. */
function targets(executions: Execution[], at: number): Target[] {
  const out: Target[] = [];
  for (const e of executions) {
    if (e.number < at) continue;
    for (const [param, recorded] of Object.entries(e.params ?? {})) {
      const key = `${e.name}.${param}`;
      if (!out.some((t) => t.key === key)) out.push({ key, node: e.name, param, recorded });
    }
  }
  return out;
}

/** A second value to try: the other option of a known pair, or nothing. */
function suggestion(recorded: unknown): string {
  if (typeof recorded === "number") return JSON.stringify(recorded === 0 ? 0.7 : 0);
  if (typeof recorded === "boolean") return JSON.stringify(!recorded);
  if (recorded === "season") return '"month"';
  if (recorded === "month") return '"season"';
  return "";
}

function cellText(cell: GridCell): string {
  if (cell.status === "failed") return `failed`;
  if (cell.status === "equal") return `${cell.short} =`;
  if (cell.status === "only_b") return `${cell.short} new`;
  return `${cell.short} Δ${cell.changed_fields ?? "?"}`;
}

function cellClass(cell: GridCell | null): string {
  if (!cell) return "bg-white text-slate-400";
  if (cell.status === "failed") return "bg-red-100 text-red-800";
  if (cell.status === "equal") return cell.outcome === "inherited" ? "bg-slate-100 text-slate-600" : "bg-emerald-50 text-emerald-800";
  if (cell.status === "only_b") return "bg-sky-100 text-sky-800";
  return "bg-orange-100 text-orange-900";
}

function artifactText(v: GridVariant): string {
  if (v.changes_artifact === null) return "no artifact";
  return v.changes_artifact ? "changes the artifact" : "same artifact";
}

function GridMatrix({ report, onOpenRun }: { report: GridReport; onOpenRun: (id: string) => void }) {
  return (
    <div className="space-y-2" data-testid="grid-matrix">
      <div className="text-sm text-slate-700" data-testid="grid-summary">
        {report.variants.length} variants forked at node {report.at_number} {report.at} · effects {report.effects} ·{" "}
        {fmtInt(report.tokens)} tokens · {report.llm_requests} LLM requests for {report.new_llm_inputs} new inputs ·{" "}
        {fmtMs(report.wall_ms)}
        <div data-testid="grid-artifact-summary" className="font-medium">
          {report.changes_artifact.length
            ? `changes the artifact: ${report.changes_artifact.join(", ")}`
            : "no variant changes the artifact"}
        </div>
      </div>
      <div className="overflow-x-auto">
        <table className="border-collapse text-left text-xs">
          <thead>
            <tr className="align-bottom text-slate-600">
              <th className="py-1 pr-2">#</th>
              <th className="pr-2">node</th>
              <th className="pr-3">parent</th>
              {report.variants.map((v) => (
                <th key={v.index} className="min-w-[9rem] px-2 pb-1" data-testid={`grid-variant-${v.index + 1}`}>
                  <div className="font-semibold text-slate-900">
                    {v.index + 1}: <span className="font-mono">{v.label}</span>
                  </div>
                  <div className="font-normal">
                    {v.status}
                    {v.run_id && (
                      <>
                        {" · "}
                        <button type="button" className="font-mono text-sky-700 underline" onClick={() => onOpenRun(v.run_id!)}>
                          {shortId(v.run_id)}
                        </button>
                      </>
                    )}
                  </div>
                </th>
              ))}
            </tr>
          </thead>
          <tbody>
            {report.rows.map((row) => (
              <tr key={row.index} className="border-t border-slate-200" data-testid={`grid-row-${row.index + 1}`}>
                <td className="py-1 pr-2 text-slate-500">{row.index + 1}</td>
                <td className="pr-2 font-medium">{row.label}</td>
                <td className="pr-3 font-mono text-slate-500" title={row.parent_hash ?? ""}>
                  {row.parent_hash ? row.parent_hash.slice(0, 8) : "—"}
                </td>
                {report.variants.map((v, i) => {
                  const cell = row.cells[i] ?? null;
                  const first = v.first_divergence?.index === row.index;
                  return (
                    <td
                      key={v.index}
                      data-testid={`grid-cell-${row.index + 1}-${v.index + 1}`}
                      data-status={cell?.status ?? "absent"}
                      title={cell ? `${cell.outcome} · ${cell.tokens} tokens · ${cell.output_hash ?? ""}` : "not run"}
                      className={`border border-white px-2 py-1 font-mono ${cellClass(cell)} ${first ? "outline outline-2 -outline-offset-2 outline-orange-600" : ""}`}
                    >
                      {cell ? cellText(cell) : "—"}
                      {cell?.status === "failed" && <span className="ml-1 font-sans text-[10px]">{cell.outcome}</span>}
                      {first && (
                        <span className="ml-1 font-sans font-semibold text-orange-700" data-testid="first-divergence">
                          ◀ first
                        </span>
                      )}
                    </td>
                  );
                })}
              </tr>
            ))}
            <tr className="border-t-2 border-slate-300">
              <td />
              <td className="py-1 pr-2 font-medium">artifact</td>
              <td className="pr-3 text-slate-500">{Object.keys(report.parent.artifacts).join(", ") || "—"}</td>
              {report.variants.map((v) => (
                <td
                  key={v.index}
                  className={`px-2 ${v.changes_artifact ? "font-semibold text-fuchsia-700" : "text-slate-600"}`}
                  data-testid={`grid-artifact-${v.index + 1}`}
                  data-changes={String(v.changes_artifact)}
                >
                  {artifactText(v)}
                </td>
              ))}
            </tr>
            <tr>
              <td />
              <td className="py-1 pr-2 font-medium">first divergence</td>
              <td />
              {report.variants.map((v) => (
                <td key={v.index} className="px-2 text-slate-700">
                  {v.first_divergence ? `node ${v.first_divergence.index + 1} ${v.first_divergence.node ?? ""}` : "none"}
                </td>
              ))}
            </tr>
            <tr>
              <td />
              <td className="py-1 pr-2 font-medium">tokens</td>
              <td className="pr-3 text-slate-500">{fmtInt(report.parent.tokens)}</td>
              {report.variants.map((v) => (
                <td key={v.index} className="px-2 tabular-nums">
                  {fmtInt(v.tokens)} · {v.llm_requests} req{v.llm_shared ? ` (+${v.llm_shared} shared)` : ""}
                </td>
              ))}
            </tr>
          </tbody>
        </table>
      </div>
      <p className="text-xs text-slate-500">
        cell: output sha256 prefix · “=” equal to the parent (grey: inherited) · “Δn” n fields changed · outlined: the
        variant's first divergence
      </p>
      {report.variants
        .filter((v) => v.error)
        .map((v) => (
          <div key={v.index} className="rounded bg-red-50 p-2 text-xs text-red-800">
            variant {v.index + 1} ({v.label}): {v.error}
          </div>
        ))}
    </div>
  );
}

function describe(job: Job<GridReport>): string {
  const overrides = (job.request.overrides as { node: string; param?: string; field?: string }[] | undefined) ?? [];
  const o = overrides[0];
  return `at ${String(job.request.at)} · ${overrides.length} × ${o ? `${o.node}.${o.param ?? o.field}` : "?"}`;
}

export function GridPanel({
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
  const withParams = executions.filter((e) => Object.keys(e.params ?? {}).length > 0);
  const initialAt = node ?? withParams[0]?.number ?? executions[0]?.number ?? 1;
  const [at, setAt] = useState<number>(initialAt);
  const options = useMemo(() => targets(executions, at), [executions, at]);
  const [targetKey, setTargetKey] = useState<string>("");
  const target = options.find((t) => t.key === targetKey) ?? options[0] ?? null;
  const [values, setValues] = useState<string[]>([]);
  const [workers, setWorkers] = useState(4);
  // Variants default to dry-run (side-effecting calls logged, nothing executed): live re-executes
  // them for real, so it names the resources each variant would touch and waits for a confirmation.
  const [effects, setEffects] = useState<Effects>("dry-run");
  const [liveConfirmed, setLiveConfirmed] = useState(false);
  const grid = useJob<GridReport>("grid", run.run_id);

  // Prefill: the recorded value and one alternative.
  useEffect(() => {
    if (!target) {
      setValues([]);
      return;
    }
    setValues([JSON.stringify(target.recorded), suggestion(target.recorded)]);
  }, [target?.key]); // eslint-disable-line react-hooks/exhaustive-deps

  const parsed = values.map(parseJson);
  const finished = run.status !== "running" && run.status !== "queued";
  const running = grid.job !== null && !isDone(grid.job);
  const canRun =
    finished &&
    !!target &&
    values.length > 0 &&
    parsed.every((p) => p.ok) &&
    (effects !== "live" || liveConfirmed) &&
    !grid.submitting &&
    !running;

  const submit = () => {
    if (!canRun || !target) return;
    void grid.start({
      at,
      overrides: parsed.map((p) => ({ node: target.node, param: target.param, value: p.ok ? p.value : null })),
      workers,
      effects,
    });
  };

  const report = grid.job?.status === "completed" ? (grid.job.report ?? null) : null;
  return (
    <section className="space-y-3" data-testid="grid-panel">
      <div className="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="grid-form">
        <h3 className="text-sm font-semibold">What-if grid: fork at one node with several values of one param</h3>
        <div className="flex flex-wrap items-center gap-3 text-xs text-slate-600">
          <label>
            fork at
            <select
              data-testid="grid-at"
              className="ml-2 rounded border border-slate-300 px-1 py-0.5"
              value={at}
              onChange={(e) => setAt(Number(e.target.value))}
            >
              {executions.map((e) => (
                <option key={e.number} value={e.number}>
                  {e.number} {e.name}
                </option>
              ))}
            </select>
          </label>
          <label>
            param
            <select
              data-testid="grid-param"
              className="ml-2 rounded border border-slate-300 px-1 py-0.5"
              value={target?.key ?? ""}
              onChange={(e) => setTargetKey(e.target.value)}
              disabled={options.length === 0}
            >
              {options.map((t) => (
                <option key={t.key} value={t.key}>
                  {t.key}
                </option>
              ))}
            </select>
          </label>
          <label>
            workers
            <input
              data-testid="grid-workers"
              type="number"
              min={1}
              max={16}
              className="ml-2 w-14 rounded border border-slate-300 px-1 py-0.5"
              value={workers}
              onChange={(e) => setWorkers(Math.min(16, Math.max(1, Number(e.target.value) || 1)))}
            />
          </label>
          <label>
            side effects
            <select
              data-testid="grid-effects"
              className="ml-2 rounded border border-slate-300 px-1 py-0.5"
              value={effects}
              onChange={(e) => setEffects(e.target.value as Effects)}
            >
              <option value="dry-run">dry-run</option>
              <option value="recorded">recorded</option>
              <option value="live">live</option>
            </select>
          </label>
        </div>
        {effects === "live" && (
          <LiveConfirm runId={run.run_id} at={at} what="each live variant" confirmed={liveConfirmed} onConfirmed={setLiveConfirmed} />
        )}
        {options.length === 0 && (
          <p className="text-xs text-slate-500">No node from {at} on read a param: pick an earlier fork node.</p>
        )}
        {target && (
          <div className="space-y-1">
            <div className="text-xs text-slate-500">
              recorded {target.key} = <code className="break-all">{JSON.stringify(target.recorded)?.slice(0, 200)}</code> ·
              one variant (column) per value, JSON
            </div>
            {values.map((v, i) => (
              <div key={i} className="flex items-center gap-2">
                <span className="w-6 text-right text-xs text-slate-500">{i + 1}</span>
                <input
                  data-testid={`grid-value-${i + 1}`}
                  spellCheck={false}
                  className={`w-72 rounded border px-2 py-0.5 font-mono text-xs ${parsed[i].ok ? "border-slate-300" : "border-red-400"}`}
                  value={v}
                  onChange={(e) => setValues(values.map((x, j) => (j === i ? e.target.value : x)))}
                />
                <button
                  type="button"
                  className="text-xs text-slate-500 underline disabled:opacity-40"
                  disabled={values.length <= 1}
                  onClick={() => setValues(values.filter((_, j) => j !== i))}
                >
                  remove
                </button>
                {!parsed[i].ok && <span className="text-xs text-red-600">{(parsed[i] as { error: string }).error}</span>}
              </div>
            ))}
            <button
              type="button"
              data-testid="grid-add-value"
              className="text-xs text-sky-700 underline disabled:opacity-40"
              disabled={values.length >= 32}
              onClick={() => setValues([...values, ""])}
            >
              + add a value
            </button>
          </div>
        )}
        {!finished && <p className="text-xs text-amber-700">This run is still {run.status}; run a grid once it finishes.</p>}
        <button
          type="button"
          data-testid="grid-run"
          disabled={!canRun}
          onClick={submit}
          className="rounded bg-orange-600 px-3 py-1.5 text-sm font-medium text-white hover:bg-orange-700 disabled:opacity-40"
        >
          {grid.submitting ? "starting…" : running ? "grid running…" : `Run grid (${values.length} variants)`}
        </button>
        <RequestError error={grid.error} />
      </div>
      <JobPicker jobs={grid.jobs} current={grid.job?.id ?? null} onSelect={grid.select} describe={describe} />
      {grid.job && <JobProgress job={grid.job} noun="variants" />}
      {report && <GridMatrix report={report} onOpenRun={onOpenRun} />}
    </section>
  );
}
