// The effect-equivalence audit of a run: one verdict per side-effecting call, coloured, with
// the fingerprints compared, the epoch delta and the nodes whose conclusions depend on the call.
import { useEffect, useState } from "react";
import { api, ApiError, shortId } from "../api";
import type { AuditReport, AuditResource, Run, Verdict } from "../types";

export const VERDICT_STYLE: Record<Verdict, { className: string; label: string }> = {
  faithful: { className: "bg-emerald-100 text-emerald-800 border-emerald-300", label: "post-state matches" },
  divergent: { className: "bg-red-100 text-red-800 border-red-300", label: "post-state differs" },
  "audit-incomplete": {
    className: "bg-amber-100 text-amber-800 border-amber-300",
    label: "no post fingerprint to compare",
  },
  "not-re-executed": {
    className: "bg-slate-200 text-slate-700 border-slate-300",
    label: "served from record / idempotency cache",
  },
};

const VERDICTS: Verdict[] = ["faithful", "divergent", "audit-incomplete", "not-re-executed"];

export function VerdictBadge({ verdict }: { verdict: Verdict }) {
  const style = VERDICT_STYLE[verdict] ?? VERDICT_STYLE["audit-incomplete"];
  return (
    <span
      data-testid="verdict"
      data-verdict={verdict}
      title={style.label}
      className={`whitespace-nowrap rounded border px-1.5 py-0.5 text-xs font-semibold ${style.className}`}
    >
      {verdict}
    </span>
  );
}

function short(digest: string | null): string {
  return digest ? digest.slice(0, 12) : "—";
}

function Fingerprints({ r }: { r: AuditResource }) {
  return (
    <div className="space-y-0.5" data-testid="audit-resource">
      <div className="break-all text-slate-600" title={r.resource}>
        {r.kind}: {r.resource.length > 60 ? `…${r.resource.slice(-58)}` : r.resource}
      </div>
      <div className="font-mono">
        <span title={r.recorded.digest ?? "not captured"}>{short(r.recorded.digest)}</span>
        <span className={r.status === "match" ? "text-emerald-700" : r.status === "mismatch" ? "text-red-700" : "text-slate-400"}>
          {r.status === "match" ? " = " : r.status === "mismatch" ? " ≠ " : " ? "}
        </span>
        <span title={r.reference_post.digest ?? "nothing to compare"}>{short(r.reference_post.digest)}</span>
      </div>
      {r.reference && <div className="text-slate-500">vs {r.reference}</div>}
    </div>
  );
}

export function AuditPanel({ run, runs, version }: { run: Run; runs: Run[]; version: number }) {
  const [against, setAgainst] = useState<string>("");
  const [report, setReport] = useState<AuditReport | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [loading, setLoading] = useState(false);

  useEffect(() => {
    let cancelled = false;
    setLoading(true);
    const q = against ? `?against=${encodeURIComponent(against)}` : "";
    api<AuditReport>(`/api/runs/${run.run_id}/audit${q}`)
      .then((r) => !cancelled && (setReport(r), setError(null)))
      .catch((e: unknown) => !cancelled && setError(e instanceof ApiError ? e : new ApiError(0, String(e))))
      .finally(() => !cancelled && setLoading(false));
    return () => {
      cancelled = true;
    };
  }, [run.run_id, against, version]);

  const others = runs.filter((r) => r.run_id !== run.run_id && r.pipeline === run.pipeline);
  return (
    <section className="space-y-3" data-testid="audit-panel">
      <div className="flex flex-wrap items-center gap-2 text-sm">
        <span className="text-slate-600">audit side effects against</span>
        <select
          data-testid="audit-against"
          className="rounded border border-slate-300 px-1 py-0.5 text-xs"
          value={against}
          onChange={(e) => setAgainst(e.target.value)}
        >
          <option value="">{run.parent_run_id ? `its parent (${shortId(run.parent_run_id)})` : "the current state"}</option>
          <option value="current">the resources' current state</option>
          {others.map((r) => (
            <option key={r.run_id} value={r.run_id}>
              run {shortId(r.run_id)} {r.change ?? r.status}
            </option>
          ))}
        </select>
        {loading && <span className="text-xs text-slate-500">auditing…</span>}
      </div>
      {error && (
        <div className="rounded border border-red-300 bg-red-50 p-2 text-sm text-red-800" data-testid="audit-error">
          {error.message} {error.hint}
        </div>
      )}
      {report && (
        <>
          <div
            data-testid="audit-summary"
            data-passed={String(report.passed)}
            className={`rounded border p-2 text-sm ${report.passed ? "border-emerald-300 bg-emerald-50 text-emerald-900" : "border-red-300 bg-red-50 text-red-900"}`}
          >
            <b>{report.passed ? "passes" : "fails closed"}</b> · {report.note}
            {report.against && (
              <span className="ml-2 text-xs text-slate-600">
                reference: {report.against === "current" ? "current state" : `run ${shortId(report.against)}`}
              </span>
            )}
          </div>
          <div className="flex flex-wrap gap-3 text-xs text-slate-600">
            {VERDICTS.map((v) => (
              <span key={v} className="flex items-center gap-1">
                <VerdictBadge verdict={v} /> {report.counts[v] ?? 0} · {VERDICT_STYLE[v].label}
              </span>
            ))}
          </div>
          {report.verdicts.length === 0 ? (
            <p className="text-sm text-slate-500">This run made no side-effecting call of its own.</p>
          ) : (
            <table className="w-full text-left text-xs" data-testid="audit-table">
              <thead className="text-slate-500">
                <tr>
                  <th className="py-1 pr-2">#</th>
                  <th className="pr-2">node</th>
                  <th className="pr-2">tool</th>
                  <th className="pr-2">verdict</th>
                  <th className="pr-2">post fingerprint (this run vs reference)</th>
                  <th className="pr-2">epoch Δ</th>
                  <th className="pr-2">dependents</th>
                  <th className="pr-2">why</th>
                </tr>
              </thead>
              <tbody>
                {report.verdicts.map((v) => (
                  <tr
                    key={`${v.position}-${v.call_index}`}
                    className="border-t border-slate-100 align-top"
                    data-testid={`audit-row-${v.position + 1}`}
                    data-verdict={v.verdict}
                  >
                    <td className="py-1 pr-2">{v.position + 1}</td>
                    <td className="pr-2 font-medium">
                      {v.node}
                      {v.call_index > 0 && <span className="text-slate-500"> /{v.call_index}</span>}
                    </td>
                    <td className="pr-2 font-mono">{v.tool}</td>
                    <td className="pr-2">
                      <VerdictBadge verdict={v.verdict} />
                    </td>
                    <td className="pr-2">
                      {v.resources.length === 0 ? (
                        <span className="text-slate-400">no resource declared</span>
                      ) : (
                        v.resources.map((r) => <Fingerprints key={r.resource} r={r} />)
                      )}
                    </td>
                    <td className="pr-2 font-mono" data-testid="epoch-delta">
                      {v.resources.map((r) => r.epoch_delta || "—").join(", ") || "—"}
                    </td>
                    <td className="pr-2" data-testid="dependents">
                      {v.dependents.length ? v.dependents.join(", ") : <span className="text-slate-400">none</span>}
                    </td>
                    <td className="pr-2 text-slate-600">{v.reason}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
          {report.inherited_skipped.length > 0 && (
            <p className="text-xs text-slate-500">
              Inherited side-effecting nodes (audited with the run that executed them): {report.inherited_skipped.join(", ")}
            </p>
          )}
        </>
      )}
    </section>
  );
}
