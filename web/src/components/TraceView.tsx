// One trace: its steps (type, status, model, tokens, cache outcome), input and output, and the
// replay panel. A Burr run read as a trace links back to its run view, where it is forked.
import { useEffect, useState } from "react";
import { api, ApiError, fmtInt, fmtMs, shortId } from "../api";
import type { TraceDetail } from "../types";
import { ReplayPanel } from "./ReplayPanel";
import { TraceBadge } from "./Status";
import { CopyButton, JsonBlock } from "./TextBlock";
import { fmtTime } from "./TracesList";
import { PadRows, useVirtualRows } from "./VirtualList";

export function TraceView({ traceId }: { traceId: string }) {
  const [trace, setTrace] = useState<TraceDetail | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [open, setOpen] = useState<number | null>(null);

  useEffect(() => {
    let cancelled = false;
    setTrace(null);
    setError(null);
    api<TraceDetail>(`/api/traces/${encodeURIComponent(traceId)}`)
      .then((t) => !cancelled && setTrace(t))
      .catch((e) => !cancelled && setError(e instanceof ApiError ? e : new ApiError(0, String(e))));
    return () => {
      cancelled = true;
    };
  }, [traceId]);
  // A long trace's spans: only the steps in view are in the DOM.
  const stepList = trace?.steps ?? [];
  const steps = useVirtualRows(stepList.length, 27, (i) => stepList[i].position);

  if (error)
    return (
      <div className="rounded border border-red-300 bg-red-50 p-3 text-sm text-red-800" data-testid="trace-error">
        {error.message} {error.hint}
      </div>
    );
  if (!trace) return <p className="text-sm text-slate-500">Loading trace {shortId(traceId)}…</p>;

  const replayOf = trace.config.replay_mode ? (trace.config.switches as Record<string, boolean> | undefined) : undefined;
  return (
    <div className="space-y-3" data-testid="trace-view" data-trace-id={trace.trace_id} data-kind={trace.kind}>
      <header className="space-y-1">
        <div className="flex flex-wrap items-center gap-2">
          <h2 className="font-mono text-base font-semibold">{trace.trace_id}</h2>
          <CopyButton text={trace.trace_id} label="copy id" />
          <TraceBadge status={trace.status} />
          <span className="text-sm text-slate-600">{trace.name}</span>
          <span className="text-sm text-slate-600">
            {fmtInt(trace.tokens)} tokens · {fmtMs(trace.duration_ms)} · {fmtTime(trace.started_at)}
          </span>
          {trace.kind === "run" && (
            <a className="text-sm text-sky-700 underline" href={`#/runs/${trace.trace_id}?tab=graph`}>
              open as a Burr run (fork there)
            </a>
          )}
        </div>
        {trace.parent_trace_id && (
          <div className="text-sm text-slate-700">
            replay of{" "}
            <a className="font-mono text-sky-700 underline" href={`#/traces/${trace.parent_trace_id}`}>
              {shortId(trace.parent_trace_id)}
            </a>
            {typeof trace.config.replay_mode === "string" && <> · mode {String(trace.config.replay_mode)}</>}
            {replayOf && (
              <>
                {" "}
                · switches: cached LLM answers {replayOf.cached_llm ? "on" : "off"}, cached tool results{" "}
                {replayOf.cached_tools ? "on" : "off"}, stop at the first divergence {replayOf.stop_at_divergence ? "on" : "off"}
              </>
            )}
            {trace.override && (
              <code className="ml-1 rounded bg-slate-100 px-1 text-xs">
                {trace.override.node}.{trace.override.param ?? trace.override.field ?? trace.override.name} ={" "}
                {JSON.stringify(trace.override.value).slice(0, 120)}
              </code>
            )}
          </div>
        )}
        {trace.error && <div className="rounded bg-red-50 p-2 text-sm text-red-800">{trace.error}</div>}
      </header>
      <div className="grid grid-cols-1 gap-3 xl:grid-cols-[minmax(0,1fr)_28rem]">
        <div className="space-y-3">
          <div className="max-h-[36rem] overflow-auto" ref={steps.scroller} data-testid="trace-steps-scroll" data-count={trace.steps.length}>
          <table className="w-full text-left text-xs" data-testid="trace-steps">
            <thead className="sticky top-0 z-10 border-b border-slate-200 bg-white text-slate-500">
              <tr>
                <th className="py-1 pr-2">#</th>
                <th className="pr-2">step</th>
                <th className="pr-2">type</th>
                <th className="pr-2">status</th>
                <th className="pr-2">model</th>
                <th className="pr-2 text-right" title="prompt + completion tokens">
                  tokens
                </th>
                <th className="pr-2 text-right">duration</th>
                <th>cache</th>
              </tr>
            </thead>
            <PadRows height={steps.padTop} colSpan={8} group />
            {steps.rows.map((row) => {
              const s = trace.steps[row.index];
              return (
                <tbody key={row.key} data-index={row.index} ref={steps.measure}>
                  <tr
                    className={`cursor-pointer border-b border-slate-100 hover:bg-slate-50 ${open === s.position ? "bg-sky-50" : ""}`}
                    data-testid="trace-step"
                    onClick={() => setOpen(open === s.position ? null : s.position)}
                  >
                    <td className="py-1 pr-2 tabular-nums">{s.number}</td>
                    <td className="pr-2" style={{ paddingLeft: s.parent ? "1rem" : undefined }}>
                      {s.name}
                      {s.error && (
                        <div className="break-all text-red-800" data-testid="trace-step-error">
                          {s.error}
                        </div>
                      )}
                    </td>
                    <td className="pr-2">{s.type}</td>
                    <td className="pr-2">
                      <TraceBadge status={s.status} testId="trace-step-status" />
                    </td>
                    <td className="pr-2">{s.model ?? ""}</td>
                    <td className="pr-2 text-right tabular-nums">{fmtInt(s.tokens)}</td>
                    <td className="pr-2 text-right tabular-nums">{fmtMs(s.duration_ms)}</td>
                    <td>
                      {s.cache_outcome}
                      {s.cache_reason ? ` (${s.cache_reason})` : ""}
                    </td>
                  </tr>
                  {open === s.position && (
                    <tr className="border-b border-slate-200">
                      <td colSpan={8} className="space-y-1 bg-slate-50 p-2">
                        <div className="text-slate-500">input</div>
                        <JsonBlock value={s.input} />
                        <div className="text-slate-500">output</div>
                        <JsonBlock value={s.output} />
                        {Object.keys(s.params).length > 0 && (
                          <>
                            <div className="text-slate-500">params</div>
                            <JsonBlock value={s.params} />
                          </>
                        )}
                      </td>
                    </tr>
                  )}
                </tbody>
              );
            })}
            <PadRows height={steps.padBottom} colSpan={8} group />
          </table>
          </div>
          <div className="text-xs text-slate-500">Click a step to see its input and output.</div>
          <div className="grid grid-cols-1 gap-3 lg:grid-cols-2">
            <div>
              <div className="text-xs font-semibold text-slate-600">chain input</div>
              <JsonBlock value={trace.input} testId="trace-input" />
            </div>
            <div>
              <div className="text-xs font-semibold text-slate-600">chain output</div>
              <JsonBlock value={trace.output} testId="trace-output" />
            </div>
          </div>
        </div>
        <div>
          {trace.kind === "trace" ? (
            <ReplayPanel key={trace.trace_id} trace={trace} />
          ) : (
            <p className="text-sm text-slate-600">
              A Burr run is replayed by forking it: <a className="text-sky-700 underline" href={`#/runs/${trace.trace_id}?tab=graph`}>open the run</a>,
              pick a node and press Fork here.
            </p>
          )}
        </div>
      </div>
    </div>
  );
}
