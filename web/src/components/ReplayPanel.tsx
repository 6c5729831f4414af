// Replay a trace with at most one change and the three replay switches (seed 003), then show what
// the replay did: the mode, whether it stopped at the first divergence, cache hits and misses,
// tokens against the original, and the step-by-step comparison.
import { useState } from "react";
import { api, ApiError, fmtInt, shortId, signed } from "../api";
import type { ReplaySwitches, TraceDetail, TraceReplayResult } from "../types";
import { TraceBadge } from "./Status";

// Defaults as `rewind replay-trace` and POST /api/traces/{id}/replay: both caches on, no stop.
export const DEFAULT_SWITCHES: ReplaySwitches = { cached_llm: true, cached_tools: true, stop_at_divergence: false };

const SWITCHES: { key: keyof ReplaySwitches; label: string; on: string; off: string }[] = [
  {
    key: "cached_llm",
    label: "use cached LLM answers",
    on: "unchanged model calls are answered from the record: 0 tokens",
    off: "every model call is sent to the model again (spends tokens; shows how much its answers vary)",
  },
  {
    key: "cached_tools",
    label: "use cached tool results",
    on: "unchanged tool calls are answered from their recorded results",
    off: "every tool runs again; a tool whose code is not here fails its step, saying so",
  },
  {
    key: "stop_at_divergence",
    label: "stop at the first divergence",
    on: "the replay ends after the first step whose status or output differs from the recorded step",
    off: "every step is replayed, whatever diverges",
  },
];

const MODE_TEXT: Record<string, string> = {
  chain: "chain: the trace's chain code ran again (it was recorded here)",
  "recorded-calls":
    "recorded calls: the recorded steps were replayed as a chain of their calls (model calls re-sent where the change reaches them, tools served or refused per their determinism)",
};

function outcomes(detail: TraceDetail): { hits: number; misses: Record<string, number> } {
  let hits = 0;
  const misses: Record<string, number> = {};
  for (const s of detail.steps) {
    if (s.cache_outcome === "hit") hits += 1;
    else if (s.cache_outcome === "miss") misses[s.cache_reason] = (misses[s.cache_reason] ?? 0) + 1;
  }
  return { hits, misses };
}

export function ReplayPanel({ trace }: { trace: TraceDetail }) {
  const [change, setChange] = useState("");
  const [switches, setSwitches] = useState<ReplaySwitches>(DEFAULT_SWITCHES);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);
  const [result, setResult] = useState<TraceReplayResult | null>(null);

  const submit = async () => {
    setBusy(true);
    setError(null);
    setResult(null);
    try {
      const body = { ...switches, change: change.trim() || null };
      setResult(await api<TraceReplayResult>(`/api/traces/${trace.trace_id}/replay`, { method: "POST", body }));
    } catch (e) {
      setError(e instanceof ApiError ? e : new ApiError(0, String(e)));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section className="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="replay-panel">
      <h3 className="text-sm font-semibold">Replay this trace</h3>
      <label className="block text-xs text-slate-600">
        one change (optional; empty: an unchanged replay). <code>input.FIELD=TEXT</code> or{" "}
        <code>STEP.PARAM=VALUE</code>; STEP may be <code>name#k</code>, the k-th step of that name
        <input
          data-testid="replay-change"
          spellCheck={false}
          className="mt-1 block w-full rounded border border-slate-300 px-2 py-1 font-mono text-xs"
          value={change}
          placeholder="input.question=Why?"
          onChange={(e) => setChange(e.target.value)}
        />
      </label>
      <fieldset className="space-y-1 text-xs" data-testid="replay-switches">
        <legend className="text-slate-600">replay switches (defaults as <code>rewind replay-trace</code>)</legend>
        {SWITCHES.map((s) => (
          <label key={s.key} className="flex items-start gap-2">
            <input
              type="checkbox"
              className="mt-0.5"
              data-testid={`switch-${s.key}`}
              checked={switches[s.key]}
              onChange={(e) => setSwitches({ ...switches, [s.key]: e.target.checked })}
            />
            <span>
              <span className="font-medium text-slate-800">{s.label}</span>
              <span className="block text-slate-500">{switches[s.key] ? s.on : s.off}</span>
            </span>
          </label>
        ))}
      </fieldset>
      <button
        type="button"
        data-testid="replay-button"
        disabled={busy}
        onClick={submit}
        className="rounded bg-orange-600 px-3 py-1.5 text-sm font-medium text-white hover:bg-orange-700 disabled:opacity-40"
      >
        {busy ? "replaying…" : "Replay trace"}
      </button>
      {error && (
        <div className="rounded border border-red-300 bg-red-50 p-2 text-xs text-red-800" data-testid="replay-error">
          <div>{error.message}</div>
          {error.hint && <div className="text-red-600">{error.hint}</div>}
        </div>
      )}
      {result && <ReplayResult original={trace} result={result} />}
    </section>
  );
}

function ReplayResult({ original, result }: { original: TraceDetail; result: TraceReplayResult }) {
  const replay = result.trace;
  const { hits, misses } = outcomes(replay);
  const missCount = Object.values(misses).reduce((a, b) => a + b, 0);
  const d = result.diff;
  const first = d.first_divergence === null ? null : d.nodes[d.first_divergence];
  const failedSteps = replay.steps.filter((s) => s.status === "failed");
  const on = SWITCHES.filter((s) => result.switches[s.key]).map((s) => s.label);
  const off = SWITCHES.filter((s) => !result.switches[s.key]).map((s) => s.label);
  return (
    <div
      className="space-y-2 border-t border-slate-200 pt-2 text-xs"
      data-testid="replay-result"
      data-mode={result.mode}
      data-stopped={String(result.stopped)}
      data-status={replay.status}
    >
      <div className="flex flex-wrap items-center gap-2">
        <span>replay</span>
        <a className="font-mono text-sky-700 underline" href={`#/traces/${replay.trace_id}`} data-testid="replay-link">
          {shortId(replay.trace_id)}
        </a>
        <TraceBadge status={replay.status} testId="replay-status" />
      </div>
      <div data-testid="replay-mode">mode: {MODE_TEXT[result.mode] ?? result.mode}</div>
      <div data-testid="replay-switches-used" className="text-slate-600">
        switches on: {on.length ? on.join(", ") : "none"}; off: {off.length ? off.join(", ") : "none"}
      </div>
      {result.stopped && (
        <div className="rounded border border-amber-300 bg-amber-50 p-2 text-amber-900" data-testid="replay-stopped">
          Stopped at the first divergence: {(replay.error_message ?? "").split("\n")[0].replace(/^stopped at the first divergence:\s*/i, "")}
        </div>
      )}
      {!result.stopped && replay.error && (
        <div className="rounded bg-red-50 p-2 text-red-800" data-testid="replay-failure">
          {replay.error}
        </div>
      )}
      {failedSteps.length > 0 && (
        <div className="rounded bg-red-50 p-2 text-red-800" data-testid="replay-failed-steps">
          {failedSteps.length} step{failedSteps.length === 1 ? "" : "s"} failed in the replay:
          <ul className="ml-4 list-disc">
            {failedSteps.map((s) => (
              <li key={s.position}>
                step {s.number} {s.name}: {s.error}
              </li>
            ))}
          </ul>
        </div>
      )}
      <dl className="grid grid-cols-[auto_1fr] gap-x-3 gap-y-0.5">
        <dt className="text-slate-500">steps replayed</dt>
        <dd data-testid="replay-steps">
          {replay.steps.length} of {original.steps.length} recorded
        </dd>
        <dt className="text-slate-500">cache</dt>
        <dd data-testid="replay-cache" data-hits={hits} data-misses={missCount}>
          {hits} hit{hits === 1 ? "" : "s"}, {missCount} miss{missCount === 1 ? "" : "es"}
          {missCount > 0 &&
            ` (${Object.entries(misses)
              .map(([reason, n]) => `${n} ${reason}`)
              .join(", ")})`}
        </dd>
        <dt className="text-slate-500">tokens</dt>
        <dd data-testid="replay-tokens" data-tokens={replay.tokens}>
          {fmtInt(replay.tokens)} (original {fmtInt(d.tokens_a)}, {signed(d.token_delta)})
        </dd>
        <dt className="text-slate-500">vs original</dt>
        <dd data-testid="replay-compare">
          {d.counts.equal} equal, {d.counts.changed} changed, {d.counts.only_a} not replayed
          {d.counts.only_b > 0 ? `, ${d.counts.only_b} new` : ""}
          {first ? `; first divergence at step ${first.index + 1} ${first.name}` : "; no divergence"}
        </dd>
      </dl>
      <table className="w-full text-left">
        <thead className="border-b border-slate-200 text-slate-500">
          <tr>
            <th className="pr-2">#</th>
            <th className="pr-2">step</th>
            <th className="pr-2">status</th>
            <th className="pr-2">cache</th>
            <th className="pr-2 text-right">tokens</th>
            <th>vs recorded</th>
          </tr>
        </thead>
        <tbody>
          {replay.steps.map((s) => {
            const cmp = d.nodes.find((n) => n.b?.position === s.position);
            return (
              <tr key={s.position} className="border-b border-slate-100" data-testid="replay-step" data-outcome={s.cache_outcome}>
                <td className="pr-2 tabular-nums">{s.number}</td>
                <td className="pr-2">{s.name}</td>
                <td className="pr-2">
                  <TraceBadge status={s.status} testId="replay-step-status" />
                </td>
                <td className="pr-2">
                  {s.cache_outcome}
                  {s.cache_reason && s.cache_reason !== s.cache_outcome ? ` (${s.cache_reason})` : ""}
                </td>
                <td className="pr-2 text-right tabular-nums">{fmtInt(s.tokens)}</td>
                <td>{cmp ? cmp.status : "—"}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}
