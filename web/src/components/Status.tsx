// Colours of node and run statuses, shared by the graph, tables and legends.
import type { NodeStatus, RunStatus } from "../types";

export const NODE_COLOURS: Record<NodeStatus, { fill: string; stroke: string; text: string; label: string }> = {
  inherited: { fill: "#d1d5db", stroke: "#6b7280", text: "#111827", label: "inherited (not executed)" },
  hit: { fill: "#22c55e", stroke: "#15803d", text: "#052e16", label: "cache hit" },
  executed: { fill: "#fb923c", stroke: "#c2410c", text: "#431407", label: "executed / re-executed" },
  override: { fill: "#c084fc", stroke: "#7e22ce", text: "#3b0764", label: "output overridden" },
  failed: { fill: "#ef4444", stroke: "#991b1b", text: "#ffffff", label: "failed" },
  running: { fill: "#60a5fa", stroke: "#1d4ed8", text: "#172554", label: "running" },
  pending: { fill: "#ffffff", stroke: "#94a3b8", text: "#64748b", label: "not reached yet" },
  skipped: { fill: "#f8fafc", stroke: "#cbd5e1", text: "#94a3b8", label: "not executed (other branch)" },
};

const RUN_BADGE: Record<RunStatus, string> = {
  queued: "bg-slate-200 text-slate-700",
  running: "bg-blue-100 text-blue-800 animate-pulse",
  completed: "bg-emerald-100 text-emerald-800",
  failed: "bg-red-100 text-red-800",
  interrupted: "bg-amber-100 text-amber-800",
  cancelled: "bg-zinc-200 text-zinc-800",
};

export function RunBadge({ status }: { status: RunStatus }) {
  return (
    <span data-testid="run-status" className={`rounded px-1.5 py-0.5 text-xs font-medium ${RUN_BADGE[status] ?? ""}`}>
      {status}
    </span>
  );
}

export function NodeBadge({ status }: { status: NodeStatus }) {
  const c = NODE_COLOURS[status];
  return (
    <span
      className="rounded px-1.5 py-0.5 text-xs font-medium"
      style={{ background: c.fill, color: c.text, border: `1px solid ${c.stroke}` }}
    >
      {status}
    </span>
  );
}

export function Legend() {
  const order: NodeStatus[] = ["inherited", "hit", "executed", "override", "failed", "running", "pending", "skipped"];
  return (
    <div className="flex flex-wrap gap-3 text-xs text-slate-600">
      {order.map((s) => (
        <span key={s} className="flex items-center gap-1">
          <span
            className="inline-block h-3 w-3 rounded-sm"
            style={{ background: NODE_COLOURS[s].fill, border: `1px solid ${NODE_COLOURS[s].stroke}` }}
          />
          {NODE_COLOURS[s].label}
        </span>
      ))}
    </div>
  );
}

const TRACE_BADGE: Record<string, string> = {
  success: "bg-emerald-100 text-emerald-800",
  failed: "bg-red-100 text-red-800",
  running: "bg-blue-100 text-blue-800",
};

/** A trace's or step's status (success / failed / running; anything else in grey). */
export function TraceBadge({ status, testId = "trace-status" }: { status: string; testId?: string }) {
  return (
    <span data-testid={testId} className={`rounded px-1.5 py-0.5 text-xs font-medium ${TRACE_BADGE[status] ?? "bg-slate-200 text-slate-700"}`}>
      {status}
    </span>
  );
}
