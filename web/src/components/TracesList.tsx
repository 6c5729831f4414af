// Traces (recorded by the tracer, posted to the trace service or imported from OpenTelemetry),
// newest first, with filters; a row opens the trace (and its replay panel).
import { useEffect, useState } from "react";
import { api, ApiError, fmtInt, fmtMs, shortId } from "../api";
import type { TracesResponse } from "../types";
import { TraceBadge } from "./Status";

type Kind = "trace" | "run" | "any";

export function fmtTime(unixS: number | null | undefined): string {
  if (unixS === null || unixS === undefined) return "—";
  return new Date(unixS * 1000).toISOString().replace("T", " ").slice(0, 19) + " UTC";
}

export function TracesList() {
  const [name, setName] = useState("");
  const [status, setStatus] = useState("");
  const [kind, setKind] = useState<Kind>("trace");
  const [page, setPage] = useState<TracesResponse | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [offset, setOffset] = useState(0);

  useEffect(() => {
    const q = new URLSearchParams({ kind, limit: "50", offset: String(offset) });
    if (name.trim()) q.set("name", name.trim());
    if (status) q.set("status", status);
    let cancelled = false;
    api<TracesResponse>(`/api/traces?${q.toString()}`)
      .then((r) => {
        if (cancelled) return;
        setPage(r);
        setError(null);
      })
      .catch((e) => !cancelled && setError(e instanceof ApiError ? e : new ApiError(0, String(e))));
    return () => {
      cancelled = true;
    };
  }, [name, status, kind, offset]);

  return (
    <div className="max-w-5xl space-y-3" data-testid="traces-list">
      <h2 className="text-lg font-semibold">Traces</h2>
      <p className="text-sm text-slate-600">
        Chains recorded by Rewind's tracer, posted to <code>/api/traces</code> or imported from OpenTelemetry
        (<code>rewind otel import</code> or the OTLP receiver at <code>/api/otlp/v1/traces</code>). Open one to replay it
        with one change and the replay switches.
      </p>
      <div className="flex flex-wrap items-end gap-3 text-xs text-slate-600">
        <label>
          chain name
          <input
            data-testid="traces-name"
            className="ml-1 rounded border border-slate-300 px-1 py-0.5"
            value={name}
            onChange={(e) => {
              setName(e.target.value);
              setOffset(0);
            }}
          />
        </label>
        <label>
          status
          <select
            data-testid="traces-status"
            className="ml-1 rounded border border-slate-300 px-1 py-0.5"
            value={status}
            onChange={(e) => {
              setStatus(e.target.value);
              setOffset(0);
            }}
          >
            <option value="">any</option>
            <option value="success">success</option>
            <option value="failed">failed</option>
            <option value="running">running</option>
          </select>
        </label>
        <label>
          kind
          <select
            data-testid="traces-kind"
            className="ml-1 rounded border border-slate-300 px-1 py-0.5"
            value={kind}
            onChange={(e) => {
              setKind(e.target.value as Kind);
              setOffset(0);
            }}
          >
            <option value="trace">traces</option>
            <option value="run">Burr runs</option>
            <option value="any">both</option>
          </select>
        </label>
      </div>
      {error && (
        <div className="rounded border border-red-300 bg-red-50 p-2 text-sm text-red-800">
          {error.message} {error.hint}
        </div>
      )}
      {page && (
        <>
          <table className="w-full text-left text-xs">
            <thead className="border-b border-slate-200 text-slate-500">
              <tr>
                <th className="py-1 pr-2">trace</th>
                <th className="pr-2">chain</th>
                <th className="pr-2">status</th>
                <th className="pr-2 text-right">steps</th>
                <th className="pr-2 text-right">tokens</th>
                <th className="pr-2 text-right">duration</th>
                <th className="pr-2">started</th>
                <th>replay of</th>
              </tr>
            </thead>
            <tbody>
              {page.traces.map((t) => (
                <tr key={t.trace_id} className="border-b border-slate-100 hover:bg-slate-50" data-testid="trace-row" data-trace-id={t.trace_id}>
                  <td className="py-1 pr-2">
                    <a className="font-mono text-sky-700 underline" href={`#/traces/${t.trace_id}`}>
                      {shortId(t.trace_id)}
                    </a>
                  </td>
                  <td className="pr-2">{t.name}</td>
                  <td className="pr-2">
                    <TraceBadge status={t.status} />
                  </td>
                  <td className="pr-2 text-right tabular-nums">
                    {t.steps}
                    {t.failed_steps > 0 && <span className="text-red-700"> ({t.failed_steps} failed)</span>}
                  </td>
                  <td className="pr-2 text-right tabular-nums">{fmtInt(t.tokens)}</td>
                  <td className="pr-2 text-right tabular-nums">{fmtMs(t.duration_ms)}</td>
                  <td className="pr-2 whitespace-nowrap">{fmtTime(t.started_at)}</td>
                  <td>
                    {t.parent_trace_id && (
                      <a className="font-mono text-sky-700 underline" href={`#/traces/${t.parent_trace_id}`}>
                        {shortId(t.parent_trace_id)}
                      </a>
                    )}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <div className="flex items-center gap-2 text-xs text-slate-600">
            <span data-testid="traces-count">
              {page.total === 0
                ? "no traces match"
                : `${page.offset + 1}–${page.offset + page.traces.length} of ${fmtInt(page.total)}`}
            </span>
            <button
              type="button"
              disabled={offset === 0}
              className="rounded border border-slate-300 px-2 py-0.5 disabled:opacity-40"
              onClick={() => setOffset(Math.max(0, offset - page.limit))}
            >
              newer
            </button>
            <button
              type="button"
              disabled={page.next_offset === null}
              className="rounded border border-slate-300 px-2 py-0.5 disabled:opacity-40"
              onClick={() => page.next_offset !== null && setOffset(page.next_offset)}
            >
              older
            </button>
          </div>
        </>
      )}
    </div>
  );
}
