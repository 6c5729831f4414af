// The pipeline's nodes and edges as an SVG, each node coloured by its latest execution in the run.
import { useMemo } from "react";
import type { Graph as GraphData, GraphNode } from "../types";
import { NODE_COLOURS, Legend } from "./Status";
import { fmtInt, fmtMs } from "../api";

const W = 190;
const H = 56;
const GAP_X = 40;
const GAP_Y = 42;

interface Placed {
  node: GraphNode;
  x: number;
  y: number;
  layer: number;
}

function layout(nodes: GraphNode[], edges: GraphData["edges"]): { placed: Placed[]; width: number; height: number } {
  const names = nodes.map((n) => n.name);
  const incoming = new Map<string, number>(names.map((n) => [n, 0]));
  const out = new Map<string, string[]>();
  for (const e of edges) {
    if (!out.has(e.src)) out.set(e.src, []);
    out.get(e.src)!.push(e.dst);
    incoming.set(e.dst, (incoming.get(e.dst) ?? 0) + 1);
  }
  // Longest-path layering from the entry, ignoring edges that close a cycle.
  const layer = new Map<string, number>();
  const entry = names.find((n) => (incoming.get(n) ?? 0) === 0) ?? names[0];
  const visit = (name: string, depth: number, stack: Set<string>) => {
    if (stack.has(name)) return;
    if ((layer.get(name) ?? -1) >= depth) return;
    layer.set(name, depth);
    stack.add(name);
    for (const next of out.get(name) ?? []) visit(next, depth + 1, stack);
    stack.delete(name);
  };
  if (entry) visit(entry, 0, new Set());
  let extra = Math.max(0, ...Array.from(layer.values())) + 1;
  for (const n of names) if (!layer.has(n)) layer.set(n, extra++);
  const rows = new Map<number, string[]>();
  for (const n of names) {
    const l = layer.get(n)!;
    if (!rows.has(l)) rows.set(l, []);
    rows.get(l)!.push(n);
  }
  const widest = Math.max(1, ...Array.from(rows.values()).map((r) => r.length));
  const width = widest * W + (widest - 1) * GAP_X + 40;
  const byName = new Map(nodes.map((n) => [n.name, n]));
  const placed: Placed[] = [];
  for (const [l, row] of rows) {
    const rowWidth = row.length * W + (row.length - 1) * GAP_X;
    const start = (width - rowWidth) / 2;
    row.forEach((name, i) => {
      placed.push({ node: byName.get(name)!, x: start + i * (W + GAP_X), y: 20 + l * (H + GAP_Y), layer: l });
    });
  }
  const layers = Math.max(1, rows.size);
  return { placed, width, height: 40 + layers * H + (layers - 1) * GAP_Y };
}

export function GraphView({
  graph,
  selected,
  onSelect,
  onKeyboardSelect,
}: {
  graph: GraphData;
  selected: number | null;
  onSelect: (number: number) => void;
  /** a node chosen with Enter or Space (default: onSelect) */
  onKeyboardSelect?: (number: number) => void;
}) {
  const { placed, width, height } = useMemo(() => layout(graph.nodes, graph.edges), [graph.nodes, graph.edges]);
  const at = new Map(placed.map((p) => [p.node.name, p]));
  const execByNumber = new Map(graph.executions.map((e) => [e.number, e]));
  return (
    <div className="space-y-2">
      <Legend />
      <div className="overflow-auto rounded border border-slate-200 bg-white" data-testid="graph">
        <svg width={width} height={height} role="group" aria-label={`graph of run ${graph.run.run_id}`}>
          <defs>
            <marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" markerHeight="7" orient="auto-start-reverse">
              <path d="M 0 0 L 10 5 L 0 10 z" fill="#64748b" />
            </marker>
          </defs>
          {graph.edges.map((e) => {
            const a = at.get(e.src);
            const b = at.get(e.dst);
            if (!a || !b) return null;
            const x1 = a.x + W / 2;
            const y1 = a.y + H;
            const x2 = b.x + W / 2;
            const y2 = b.y;
            const back = b.layer <= a.layer;
            const d = back
              ? `M ${a.x + W} ${a.y + H / 2} C ${a.x + W + 60} ${a.y + H / 2}, ${b.x + W + 60} ${b.y + H / 2}, ${b.x + W} ${b.y + H / 2}`
              : `M ${x1} ${y1} C ${x1} ${(y1 + y2) / 2}, ${x2} ${(y1 + y2) / 2}, ${x2} ${y2}`;
            return (
              <g key={`${e.src}->${e.dst}`} data-testid={`graph-edge-${e.src}-${e.dst}`}>
                <path d={d} fill="none" stroke="#94a3b8" strokeWidth={1.5} markerEnd="url(#arrow)" />
                {e.condition !== "default" && (
                  <text x={(x1 + x2) / 2 + 6} y={(y1 + y2) / 2} fontSize={10} fill="#475569">
                    {e.condition}
                  </text>
                )}
              </g>
            );
          })}
          {placed.map(({ node, x, y }) => {
            const c = NODE_COLOURS[node.status];
            const last = node.numbers[node.numbers.length - 1];
            const exec = last !== undefined ? execByNumber.get(last) : undefined;
            const isSelected = last !== undefined && node.numbers.includes(selected ?? -1);
            const sub =
              node.status === "running"
                ? "running…"
                : exec
                  ? `${exec.cache_outcome}${exec.cache_reason && exec.cache_reason !== exec.cache_outcome ? `:${exec.cache_reason}` : ""} · ${fmtInt(exec.tokens)} tok · ${fmtMs(exec.latency_ms)}`
                  : node.status === "pending"
                    ? "not reached yet"
                    : "not executed";
            return (
              <g
                key={node.name}
                data-testid={`graph-node-${node.name}`}
                data-status={node.status}
                data-number={last ?? ""}
                className={`graph-node ${node.status === "running" ? "node-running" : ""} ${last !== undefined ? "cursor-pointer" : ""}`}
                onClick={() => last !== undefined && onSelect(last)}
                tabIndex={last !== undefined ? 0 : -1}
                role="button"
                aria-pressed={isSelected}
                aria-disabled={last === undefined}
                aria-label={`node ${last !== undefined ? `${last} ` : ""}${node.name}: ${node.status}; ${sub}`}
                onKeyDown={(e) => {
                  if (last !== undefined && (e.key === "Enter" || e.key === " ")) {
                    e.preventDefault();
                    (onKeyboardSelect ?? onSelect)(last);
                  }
                }}
              >
                <title>{`${node.name}${last !== undefined ? ` (node ${last})` : ""}: ${sub}`}</title>
                <rect
                  x={x}
                  y={y}
                  width={W}
                  height={H}
                  rx={8}
                  fill={c.fill}
                  stroke={isSelected ? "#0f172a" : c.stroke}
                  strokeWidth={isSelected ? 3 : 1.5}
                  strokeDasharray={node.status === "pending" || node.status === "skipped" ? "5 4" : undefined}
                />
                <text x={x + 10} y={y + 22} fontSize={13} fontWeight={600} fill={c.text}>
                  {last !== undefined ? `${last} · ` : ""}
                  {node.name}
                  {node.executions > 1 ? ` ×${node.executions}` : ""}
                </text>
                <text x={x + 10} y={y + 41} fontSize={10.5} fill={c.text}>
                  {sub.length > 34 ? `${sub.slice(0, 33)}…` : sub}
                </text>
              </g>
            );
          })}
        </svg>
      </div>
    </div>
  );
}
