// Tokens and latency of the original run vs this replay, each figure defined on screen:
//   original  what the compared run's whole trajectory cost
//   replay    what this run spent (inherited nodes and cache hits cost nothing)
//   delta     replay − original (negative: this run was cheaper)
//   saved     what the original spent on the nodes this run reused (inherited or cache hit)
// and the identity that ties them: delta = re-executed change − saved − not re-run (nodes of the
// original this run did not reach). "saved" is shown only for a completed run: a running run
// has not decided yet and a failed one saved nothing it can vouch for.
import type { Cost, RunStatus } from "../types";
import { fmtInt, fmtMs, signed } from "../api";

const DEFINITIONS = {
  original: "what the compared run's whole trajectory cost (its inherited nodes at what they cost where they ran)",
  replay: "what this run spent: nodes it executed; inherited nodes and cache hits cost nothing",
  delta: "replay − original: negative means this run cost less",
  saved: "what the original spent on the nodes this run reused (inherited or served from the cache)",
} as const;

function Bar({ value, max, colour }: { value: number; max: number; colour: string }) {
  const pct = max > 0 ? Math.max(0, Math.min(100, (value / max) * 100)) : 0;
  return (
    <div className="h-2 w-full rounded bg-slate-100">
      <div className={`h-2 rounded ${colour}`} style={{ width: `${pct}%` }} />
    </div>
  );
}

function Label({ name }: { name: keyof typeof DEFINITIONS }) {
  return (
    <abbr className="cursor-help text-slate-500 no-underline" title={DEFINITIONS[name]} data-testid={`cost-label-${name}`}>
      {name}
    </abbr>
  );
}

function Row({
  label,
  unit,
  original,
  replay,
  delta,
  saved,
  fmt,
}: {
  label: string;
  unit: string;
  original: number;
  replay: number;
  delta: number;
  saved: number | null;
  fmt: (n: number) => string;
}) {
  const max = Math.max(original, replay, 1);
  return (
    <div className="grid grid-cols-2 items-center gap-x-3 gap-y-1 text-xs sm:grid-cols-[5rem_1fr_1fr_6rem_6rem]">
      <div className="col-span-2 font-semibold text-slate-700 sm:col-span-1">{label}</div>
      <div>
        <div className="flex justify-between">
          <Label name="original" />
          <span className="tabular-nums" data-testid={`cost-original-${unit}`}>
            {fmt(original)}
          </span>
        </div>
        <Bar value={original} max={max} colour="bg-slate-400" />
      </div>
      <div>
        <div className="flex justify-between">
          <Label name="replay" />
          <span className="tabular-nums" data-testid={`cost-replay-${unit}`}>
            {fmt(replay)}
          </span>
        </div>
        <Bar value={replay} max={max} colour="bg-orange-500" />
      </div>
      <div className="sm:text-right">
        <Label name="delta" />
        <div className={`tabular-nums ${delta <= 0 ? "text-emerald-700" : "text-red-700"}`} data-testid={`cost-delta-${unit}`}>
          {signed(delta, fmt)}
        </div>
      </div>
      <div className="sm:text-right">
        <Label name="saved" />
        {saved === null ? (
          <div className="text-slate-400" data-testid={`cost-saved-${unit}`} data-shown="no">
            —
          </div>
        ) : (
          <div className="tabular-nums text-emerald-700" data-testid={`cost-saved-${unit}`} data-shown="yes">
            {fmt(saved)}
          </div>
        )}
      </div>
    </div>
  );
}

/** Tokens of the nodes this run executed, and what the original spent on those same nodes. */
function reexecuted(cost: Cost): { spent: number; before: number } {
  let spent = 0;
  let before = 0;
  for (const n of cost.nodes) {
    if (n.status === "inherited" || n.status === "hit") continue;
    spent += n.replay_tokens;
    before += n.original_tokens ?? 0;
  }
  return { spent, before };
}

export function CostBar({ cost, status }: { cost: Cost; status?: RunStatus }) {
  const done = status === undefined || status === "completed";
  const why =
    status === "failed"
      ? "the run failed: nothing saved is claimed for it"
      : status === "queued" || status === "running"
        ? "shown when the run completes"
        : status && !done
          ? `the run is ${status}: nothing saved is claimed for it`
          : "";
  const rerun = reexecuted(cost);
  const change = rerun.spent - rerun.before;
  const notRerun = change - cost.saved.tokens - cost.delta.tokens;
  return (
    <section className="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="cost-bar" data-run-status={status ?? ""}>
      <div className="text-xs text-slate-500">
        cost of this run vs <span className="font-mono">{cost.original.run_id.slice(0, 8)}</span>
        {!done && <span className="ml-1 text-amber-700">({status}: figures so far)</span>}
      </div>
      <Row
        label="tokens"
        unit="tokens"
        original={cost.original.tokens}
        replay={cost.replay.tokens}
        delta={cost.delta.tokens}
        saved={done ? cost.saved.tokens : null}
        fmt={fmtInt}
      />
      <Row
        label="latency"
        unit="latency"
        original={cost.original.latency_ms}
        replay={cost.replay.latency_ms}
        delta={cost.delta.latency_ms}
        saved={done ? cost.saved.latency_ms : null}
        fmt={fmtMs}
      />
      <details className="text-xs text-slate-600" data-testid="cost-legend">
        <summary className="cursor-pointer text-slate-500">what these figures mean</summary>
        <dl className="mt-1 grid grid-cols-[5rem_1fr] gap-x-2 gap-y-0.5">
          {(Object.keys(DEFINITIONS) as (keyof typeof DEFINITIONS)[]).map((k) => (
            <div key={k} className="contents">
              <dt className="font-semibold">{k}</dt>
              <dd data-testid={`cost-define-${k}`}>{DEFINITIONS[k]}</dd>
            </div>
          ))}
        </dl>
        {done ? (
          <p className="mt-1" data-testid="cost-identity">
            tokens: delta {signed(cost.delta.tokens)} = re-executed nodes {signed(change)} (now {fmtInt(rerun.spent)}, were{" "}
            {fmtInt(rerun.before)}) − saved {fmtInt(cost.saved.tokens)}
            {notRerun !== 0 && <> − not re-run {fmtInt(notRerun)} (nodes of the original this run did not reach)</>}
          </p>
        ) : (
          <p className="mt-1" data-testid="cost-saved-why">
            saved: {why}
          </p>
        )}
      </details>
    </section>
  );
}
