// The failure view: failure patterns across traces and runs, and the correlation analysis of
// `rewind failures --by ...` (GET /api/traces/failures?by=...): per dimension, each group's
// failures over its count, its failure rate against the dimension's overall rate, example traces,
// and the groups where failures concentrate. Every figure says what it counts.
import { useEffect, useState } from "react";
import { api, ApiError, fmtInt, shortId } from "../api";
import type { Correlation, FailureDimension, FailuresResponse } from "../types";

type Kind = "trace" | "run" | "any";

const DIMENSIONS: { key: FailureDimension; label: string }[] = [
  { key: "input_length", label: "input length" },
  { key: "step_type", label: "step type" },
  { key: "model", label: "model" },
  { key: "params", label: "parameters" },
];

const TITLES: Record<FailureDimension, string> = {
  input_length: "Failure rate by input length",
  step_type: "Failure rate by step type",
  model: "Failure rate by model",
  params: "Failure rate by request parameter",
};

function pct(rate: number): string {
  return `${(rate * 100).toFixed(rate > 0 && rate < 0.1 ? 1 : 0)} %`;
}

function bucketText(edges: number[]): string {
  const f = (n: number) => n.toLocaleString("en-US");
  return edges
    .map((lo, i) => (i + 1 < edges.length ? `${f(lo)}–${f(edges[i + 1] - 1)}` : `${f(lo)} and more`))
    .join(" · ");
}

/** What one dimension counts: its unit, its denominator, and (input length) its bucket edges. */
function Meaning({ c }: { c: Correlation }) {
  const common = "A unit fails when its status is failed.";
  switch (c.dimension) {
    case "input_length":
      return (
        <p data-testid="meaning-input_length">
          Unit: one <b>trace</b>. Its input length is the largest prompt of any of its LLM steps, in prompt tokens as
          recorded (never estimated from characters). Buckets, in tokens:{" "}
          <span data-testid="bucket-edges">{bucketText(c.edges ?? [])}</span>; <i>unknown</i>: no LLM step of the trace
          recorded a token count. A trace counts as failed when the trace failed. Each row: failed traces / traces in
          the bucket.
        </p>
      );
    case "step_type":
      return (
        <p data-testid="meaning-step_type">
          Unit: one <b>step</b> of the analysed traces, grouped by its type. {common} Each row: failed steps / steps of
          that type.
        </p>
      );
    case "model":
      return (
        <p data-testid="meaning-model">
          Unit: one <b>LLM step</b>, grouped by the model it called (<i>unknown</i>: not recorded). {common} Each row:
          failed LLM steps / LLM steps that called the model.
        </p>
      );
    case "params":
      return (
        <p data-testid="meaning-params">
          Unit: one <b>LLM step</b>, counted once under every request parameter it sent (<code>name=value</code>, from
          its recorded calls and the params it read), so a step appears in several rows and the rows do not add up to
          the total. Each row: failed LLM steps / LLM steps that sent that value.
        </p>
      );
  }
}

function CorrelationTable({ c }: { c: Correlation }) {
  const unit = c.unit === "traces" ? "traces" : c.dimension === "step_type" ? "steps" : "LLM steps";
  return (
    <section className="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid={`correlation-${c.dimension}`}>
      <h3 className="text-sm font-semibold">{TITLES[c.dimension]}</h3>
      <div className="space-y-1 text-xs text-slate-600">
        <Meaning c={c} />
        <p data-testid={`overall-${c.dimension}`}>
          Overall: {fmtInt(c.failed)} of {fmtInt(c.total)} {unit} failed ({pct(c.rate)}).{" "}
          {c.finding_rate === null ? (
            <>No group is flagged: {c.failed === 0 ? "nothing failed" : "everything failed"}.</>
          ) : (
            <>
              A group is flagged (highlighted) when it holds at least {c.min_failures} failures and its rate is at least{" "}
              {pct(c.finding_rate)}, halfway from the overall rate to 100 %.
            </>
          )}
        </p>
      </div>
      {c.groups.length === 0 ? (
        <p className="text-xs text-slate-500">No {unit} to count.</p>
      ) : (
        <table className="w-full text-left text-xs">
          <thead className="border-b border-slate-200 text-slate-500">
            <tr>
              <th className="py-1 pr-2">{c.dimension === "input_length" ? "input length" : "group"}</th>
              <th className="pr-2 text-right" title={`failed ${unit} / ${unit} in the group`}>
                failed / {unit}
              </th>
              <th className="pr-2">failure rate</th>
              <th>example failed traces</th>
            </tr>
          </thead>
          <tbody>
            {c.groups.map((g) => (
              <tr
                key={g.key}
                data-testid="corr-group"
                data-key={g.key}
                data-finding={String(g.finding)}
                className={`border-b border-slate-100 ${g.finding ? "bg-red-50" : ""}`}
              >
                <td className="py-1 pr-2 font-mono">
                  {g.key}
                  {g.finding && (
                    <span className="ml-1 rounded bg-red-600 px-1 font-sans text-[10px] font-semibold text-white" data-testid="finding-badge">
                      failures concentrate
                    </span>
                  )}
                </td>
                <td className="pr-2 text-right tabular-nums" data-testid="group-count">
                  {fmtInt(g.failed)} / {fmtInt(g.total)}
                </td>
                <td className="pr-2">
                  <div className="flex items-center gap-2">
                    <div className="relative h-2 w-32 rounded bg-slate-100" title={`overall ${pct(c.rate)}`}>
                      <div className={`h-2 rounded ${g.finding ? "bg-red-500" : "bg-slate-400"}`} style={{ width: `${g.rate * 100}%` }} />
                      <div className="absolute top-[-2px] h-3 w-px bg-slate-700" style={{ left: `${c.rate * 100}%` }} />
                    </div>
                    <span className="tabular-nums" data-testid="group-rate">
                      {pct(g.rate)}
                    </span>
                  </div>
                </td>
                <td>
                  {g.examples.map((id) => (
                    <a key={id} className="mr-2 font-mono text-sky-700 underline" href={`#/traces/${id}`} title={id} data-testid="group-example">
                      {shortId(id)}
                    </a>
                  ))}
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {c.findings.length > 0 && (
        <ul className="list-disc pl-5 text-xs text-red-800" data-testid={`findings-${c.dimension}`}>
          {c.findings.map((f) => (
            <li key={f}>{f}</li>
          ))}
        </ul>
      )}
      <p className="text-[11px] text-slate-500">The dark tick on each bar marks the overall rate.</p>
    </section>
  );
}

export function FailuresView() {
  const [name, setName] = useState("");
  const [since, setSince] = useState("");
  const [kind, setKind] = useState<Kind>("any");
  const [by, setBy] = useState<FailureDimension[]>(DIMENSIONS.map((d) => d.key));
  const [report, setReport] = useState<FailuresResponse | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [busy, setBusy] = useState(false);
  const [asked, setAsked] = useState(0);

  useEffect(() => {
    const q = new URLSearchParams({ kind, examples: "5" });
    if (name.trim()) q.set("name", name.trim());
    if (since.trim()) q.set("since", since.trim());
    for (const d of by) q.append("by", d);
    let cancelled = false;
    setBusy(true);
    api<FailuresResponse>(`/api/traces/failures?${q.toString()}`)
      .then((r) => {
        if (cancelled) return;
        setReport(r);
        setError(null);
      })
      .catch((e) => {
        if (cancelled) return;
        setReport(null); // never show the figures of other filters next to the error
        setError(e instanceof ApiError ? e : new ApiError(0, String(e)));
      })
      .finally(() => !cancelled && setBusy(false));
    return () => {
      cancelled = true;
    };
    // Text filters apply on "Analyse"; switches and dimensions at once.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [asked, kind, by]);

  const toggle = (d: FailureDimension) =>
    setBy(by.includes(d) ? by.filter((x) => x !== d) : DIMENSIONS.map((x) => x.key).filter((x) => x === d || by.includes(x)));

  return (
    <div className="max-w-5xl space-y-3" data-testid="failures-view">
      <h2 className="text-lg font-semibold">Failures</h2>
      <p className="text-sm text-slate-600">
        Where do failures concentrate? The newest traces and runs matching the filters (at most 1,000), as{" "}
        <code>rewind failures --by …</code> shows them.
      </p>
      <form
        className="flex flex-wrap items-end gap-3 text-xs text-slate-600"
        onSubmit={(e) => {
          e.preventDefault();
          setAsked(asked + 1);
        }}
      >
        <label>
          chain name
          <input data-testid="failures-name" className="ml-1 rounded border border-slate-300 px-1 py-0.5" value={name} onChange={(e) => setName(e.target.value)} />
        </label>
        <label>
          since
          <input
            data-testid="failures-since"
            className="ml-1 w-36 rounded border border-slate-300 px-1 py-0.5"
            placeholder="24h, 7d or a date"
            value={since}
            onChange={(e) => setSince(e.target.value)}
          />
        </label>
        <label>
          kind
          <select data-testid="failures-kind" className="ml-1 rounded border border-slate-300 px-1 py-0.5" value={kind} onChange={(e) => setKind(e.target.value as Kind)}>
            <option value="any">traces and runs</option>
            <option value="trace">traces</option>
            <option value="run">Burr runs</option>
          </select>
        </label>
        <fieldset className="flex gap-2">
          <legend className="sr-only">group failures by</legend>
          <span>group by</span>
          {DIMENSIONS.map((d) => (
            <label key={d.key} className="flex items-center gap-1">
              <input type="checkbox" data-testid={`by-${d.key}`} checked={by.includes(d.key)} onChange={() => toggle(d.key)} />
              {d.label}
            </label>
          ))}
        </fieldset>
        <button type="submit" data-testid="failures-analyse" className="rounded bg-slate-800 px-2 py-1 text-white">
          Analyse
        </button>
        {busy && <span className="text-slate-500">analysing…</span>}
      </form>
      {error && (
        <div className="rounded border border-red-300 bg-red-50 p-2 text-sm text-red-800" data-testid="failures-error">
          <div>{error.message}</div>
          {error.hint && <div className="text-red-600">{error.hint}</div>}
        </div>
      )}
      {report && (
        <>
          <p className="text-sm" data-testid="failures-summary">
            {fmtInt(report.failed_traces)} of {fmtInt(report.total_traces)} traces failed
            {report.total_traces > 0 ? ` (${pct(report.failed_traces / report.total_traces)})` : ""}.
          </p>
          {report.patterns.length > 0 && (
            <section className="space-y-1 rounded border border-slate-200 bg-white p-3" data-testid="failure-patterns">
              <h3 className="text-sm font-semibold">Failure patterns</h3>
              <p className="text-xs text-slate-600">
                Each failed trace is classified once, so the counts add up to the {fmtInt(report.failed_traces)} failed
                traces; the share is of the failed traces.
              </p>
              <table className="w-full text-left text-xs">
                <thead className="border-b border-slate-200 text-slate-500">
                  <tr>
                    <th className="py-1 pr-2">pattern</th>
                    <th className="pr-2 text-right">failed traces</th>
                    <th className="pr-2 text-right">share</th>
                    <th className="pr-2">what it means · suggested fix</th>
                    <th>examples</th>
                  </tr>
                </thead>
                <tbody>
                  {report.patterns.map((p) => (
                    <tr key={`${p.pattern}/${p.signature ?? ""}`} className="border-b border-slate-100 align-top" data-testid="failure-pattern">
                      <td className="py-1 pr-2 font-mono">
                        {p.pattern}
                        {p.signature && <div className="break-all text-slate-500">{p.signature}</div>}
                      </td>
                      <td className="pr-2 text-right tabular-nums">{fmtInt(p.count)}</td>
                      <td className="pr-2 text-right tabular-nums">{pct(p.share)}</td>
                      <td className="pr-2">
                        {p.description}
                        <div className="text-slate-500">{p.suggested_fix}</div>
                      </td>
                      <td>
                        {p.example_trace_ids.map((id) => (
                          <a key={id} className="mr-2 font-mono text-sky-700 underline" href={`#/traces/${id}`} title={id}>
                            {shortId(id)}
                          </a>
                        ))}
                      </td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </section>
          )}
          {(report.correlations ?? []).map((c) => (
            <CorrelationTable key={c.dimension} c={c} />
          ))}
        </>
      )}
    </div>
  );
}
