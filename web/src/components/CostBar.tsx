// Tokens and latency of the original run vs this replay: both, the delta, and what was saved.
import type { Cost } from "../types";
import { fmtInt, fmtMs, signed } from "../api";

function Bar({ value, max, colour }: { value: number; max: number; colour: string }) {
  const pct = max > 0 ? Math.max(0, Math.min(100, (value / max) * 100)) : 0;
  return (
    <div className="h-2 w-full rounded bg-slate-100">
      <div className={`h-2 rounded ${colour}`} style={{ width: `${pct}%` }} />
    </div>
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
  saved: number;
  fmt: (n: number) => string;
}) {
  const max = Math.max(original, replay, 1);
  return (
    <div className="grid grid-cols-[5rem_1fr_1fr_6rem_6rem] items-center gap-3 text-xs">
      <div className="font-semibold text-slate-700">{label}</div>
      <div>
        <div className="flex justify-between">
          <span className="text-slate-500">original</span>
          <span className="tabular-nums" data-testid={`cost-original-${unit}`}>
            {fmt(original)}
          </span>
        </div>
        <Bar value={original} max={max} colour="bg-slate-400" />
      </div>
      <div>
        <div className="flex justify-between">
          <span className="text-slate-500">replay</span>
          <span className="tabular-nums" data-testid={`cost-replay-${unit}`}>
            {fmt(replay)}
          </span>
        </div>
        <Bar value={replay} max={max} colour="bg-orange-500" />
      </div>
      <div className="text-right">
        <div className="text-slate-500">delta</div>
        <div className={`tabular-nums ${delta <= 0 ? "text-emerald-700" : "text-red-700"}`} data-testid={`cost-delta-${unit}`}>
          {signed(delta, fmt)}
        </div>
      </div>
      <div className="text-right">
        <div className="text-slate-500">saved</div>
        <div className="tabular-nums text-emerald-700" data-testid={`cost-saved-${unit}`}>
          {fmt(saved)}
        </div>
      </div>
    </div>
  );
}

export function CostBar({ cost }: { cost: Cost }) {
  return (
    <section className="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="cost-bar">
      <div className="text-xs text-slate-500">
        cost of this run vs <span className="font-mono">{cost.original.run_id.slice(0, 8)}</span> (original: its whole
        trajectory; replay: what this run spent)
      </div>
      <Row
        label="tokens"
        unit="tokens"
        original={cost.original.tokens}
        replay={cost.replay.tokens}
        delta={cost.delta.tokens}
        saved={cost.saved.tokens}
        fmt={fmtInt}
      />
      <Row
        label="latency"
        unit="latency"
        original={cost.original.latency_ms}
        replay={cost.replay.latency_ms}
        delta={cost.delta.latency_ms}
        saved={cost.saved.latency_ms}
        fmt={fmtMs}
      />
    </section>
  );
}
