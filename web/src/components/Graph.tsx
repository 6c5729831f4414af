// The pipeline's nodes and edges, each node coloured by its latest execution in the run: React
// Flow draws (pan, zoom, fit to view), ELK lays out (graphLayout.ts). Nodes are sized to their
// wrapped names and measured before the layout, so no box overlaps another and no edge label
// sits on a node; a loop's back edge is drawn in its own colour, and a node that ran more than
// once carries a ×N badge and the numbers of its executions.
import { memo, useCallback, useEffect, useMemo, useRef, useState, type MouseEvent as ReactMouseEvent, type PointerEvent as ReactPointerEvent, type ReactNode } from "react";
import {
  Handle,
  Position,
  ReactFlow,
  ReactFlowProvider,
  EdgeLabelRenderer,
  MarkerType,
  useReactFlow,
  useStore,
  type Edge as FlowEdge,
  type EdgeProps,
  type Node as FlowNode,
  type NodeChange,
  type NodeProps,
} from "@xyflow/react";
import "@xyflow/react/dist/base.css";
import type { Execution, Graph as GraphData, GraphNode } from "../types";
import { NODE_COLOURS, Legend } from "./Status";
import { fmtInt, fmtMs } from "../api";
import { layoutGraph, roundedPath, textWidth, type Layout, type LayoutInput } from "../graphLayout";

const LABEL_FONT = "500 11px ui-sans-serif, system-ui, sans-serif";
const LABEL_MAX = 220;
const LABEL_H = 18;
const BACK = "#4f46e5"; // a loop's back edge
const TAKEN = "#475569"; // an edge this run went along
const NOT_TAKEN = "#cbd5e1";

interface NodeData extends Record<string, unknown> {
  node: GraphNode;
  last: number | undefined;
  sub: string;
  selected: number | null;
  onSelect: (n: number) => void;
  onKeyboardSelect: (n: number) => void;
}

interface EdgeData extends Record<string, unknown> {
  src: string;
  dst: string;
  text: string;
  title: string;
  back: boolean;
  taken: number;
  route: Layout["routes"][string] | undefined;
}

function subLabel(node: GraphNode, exec: Execution | undefined): string {
  if (node.status === "running") return "running…";
  if (exec) {
    const reason = exec.cache_reason && exec.cache_reason !== exec.cache_outcome ? `:${exec.cache_reason}` : "";
    return `${exec.cache_outcome}${reason} · ${fmtInt(exec.tokens)} tok · ${fmtMs(exec.latency_ms)}`;
  }
  return node.status === "pending" ? "not reached yet" : "not executed";
}

/** The execution numbers a node shows: all of a few, else the first two and last three with a
 * gap (null) between. */
function chips(numbers: number[]): (number | null)[] {
  return numbers.length <= 6 ? numbers : [...numbers.slice(0, 2), null, ...numbers.slice(-3)];
}

/** "2, 4, 6" — or, for many, "2, 4, …, 396, 398, 400". */
function listed(numbers: number[]): string {
  return chips(numbers)
    .map((n) => (n === null ? "…" : String(n)))
    .join(", ");
}

/** A break opportunity after each _ . - / so snake_case names wrap at their words. */
function breakable(name: string) {
  const parts = name.split(/(?<=[_./-])/);
  return parts.map((p, i) => (
    <span key={i}>
      {p}
      {i < parts.length - 1 && <wbr />}
    </span>
  ));
}

// How far (CSS px) a mouse or pen may move between press and release and still select a node.
const PRESS_SLOP_PX = 5;

const RunNode = memo(function RunNode({ data }: NodeProps<FlowNode<NodeData>>) {
  const { node, last, sub, selected, onSelect, onKeyboardSelect } = data;
  // A mouse or pen press selects when its button comes up with the pointer still where it was
  // pressed (within PRESS_SLOP_PX), wherever the release lands: the drawing can move under a
  // still pointer (something loading above the graph shifts it, a re-fit or a new layout moves
  // it), and the release then lands on the pane, so a click selected nothing. A press that moves
  // further is a pan and selects nothing. Touch keeps selecting on click (a press there may
  // start a pan); a click with no press before it (assistive technology: detail 0) selects.
  // `selectedByPress`: the number a press selected, so that its own click does not select again.
  const selectedByPress = useRef<number | null>(null);
  const press = (e: ReactPointerEvent, n: number) => {
    selectedByPress.current = null;
    if (e.button !== 0 || e.pointerType === "touch") return;
    const { clientX: x, clientY: y, pointerId } = e;
    const end = (u: PointerEvent) => {
      if (u.pointerId !== pointerId) return;
      window.removeEventListener("pointerup", end, true);
      window.removeEventListener("pointercancel", end, true);
      if (u.type === "pointerup" && Math.hypot(u.clientX - x, u.clientY - y) < PRESS_SLOP_PX) {
        selectedByPress.current = n;
        onSelect(n);
      }
    };
    window.addEventListener("pointerup", end, true);
    window.addEventListener("pointercancel", end, true);
  };
  const release = (e: ReactMouseEvent, n: number) => {
    const selected = e.detail !== 0 && selectedByPress.current === n;
    selectedByPress.current = null;
    if (!selected) onSelect(n);
  };
  const c = NODE_COLOURS[node.status];
  const isSelected = last !== undefined && node.numbers.includes(selected ?? -1);
  const heading = `${last !== undefined ? `${last} · ` : ""}${node.name}`;
  return (
    <div
      data-testid={`graph-node-${node.name}`}
      data-status={node.status}
      data-number={last ?? ""}
      data-executions={node.executions}
      className={`graph-node relative w-max min-w-[9rem] max-w-[15rem] ${node.status === "running" ? "node-running" : ""} ${last !== undefined ? "cursor-pointer" : "cursor-default"}`}
      onPointerDown={(e) => last !== undefined && press(e, last)}
      onClick={(e) => last !== undefined && release(e, last)}
      tabIndex={last !== undefined ? 0 : -1}
      role="button"
      aria-pressed={isSelected}
      aria-disabled={last === undefined}
      aria-label={`node ${last !== undefined ? `${last} ` : ""}${node.name}: ${node.status}; ${sub}${node.executions > 1 ? `; executed ${node.executions} times (nodes ${listed(node.numbers)})` : ""}`}
      title={`${node.name}${last !== undefined ? ` (node ${last})` : ""}: ${sub}${node.executions > 1 ? `\nexecuted ${node.executions} times: nodes ${listed(node.numbers)}` : ""}`}
      onKeyDown={(e) => {
        if (last !== undefined && (e.key === "Enter" || e.key === " ")) {
          e.preventDefault();
          e.stopPropagation();
          onKeyboardSelect(last);
        }
      }}
    >
      <Handle type="target" position={Position.Top} isConnectable={false} className="!invisible" />
      <svg className="absolute inset-0 h-full w-full overflow-visible" aria-hidden="true">
        <rect
          x={0}
          y={0}
          width="100%"
          height="100%"
          rx={8}
          fill={c.fill}
          stroke={isSelected ? "#0f172a" : c.stroke}
          strokeWidth={isSelected ? 3 : 1.5}
          strokeDasharray={node.status === "pending" || node.status === "skipped" ? "5 4" : undefined}
        />
      </svg>
      <div className="relative px-2.5 py-1.5" style={{ color: c.text }}>
        <div className="flex items-start gap-1.5">
          <span className="min-w-0 flex-1 text-[13px] font-semibold leading-snug [overflow-wrap:anywhere]" data-testid="graph-name">
            {last !== undefined ? `${last} · ` : ""}
            {breakable(node.name)}
          </span>
          {node.executions > 1 && (
            <span
              className="mt-px shrink-0 rounded-full bg-slate-900 px-1.5 text-[11px] font-semibold leading-4 text-white"
              data-testid={`graph-count-${node.name}`}
              title={`${heading}: executed ${node.executions} times`}
            >
              ×{node.executions}
            </span>
          )}
        </div>
        <div className="text-[10.5px] leading-snug [overflow-wrap:anywhere]" data-testid="graph-sub">
          {sub}
        </div>
        {node.executions > 1 && (
          <div className="mt-0.5 flex flex-wrap gap-1 text-[10.5px]" data-testid={`graph-execs-${node.name}`}>
            {chips(node.numbers).map((n, i) =>
              n === null ? (
                <span key={`gap-${i}`} title={`nodes ${node.numbers.join(", ")}`}>
                  …
                </span>
              ) : (
                <span
                  key={n}
                  className={`rounded px-1 ${n === selected ? "bg-slate-900 text-white" : "bg-white/70"}`}
                  title={`open node ${n} (${node.name})`}
                  onPointerDown={(e) => {
                    e.stopPropagation();
                    press(e, n);
                  }}
                  onClick={(e) => {
                    e.stopPropagation();
                    release(e, n);
                  }}
                >
                  #{n}
                </span>
              ),
            )}
          </div>
        )}
      </div>
      <Handle type="source" position={Position.Bottom} isConnectable={false} className="!invisible" />
    </div>
  );
});

function RouteEdge({ id, data, markerEnd }: EdgeProps<FlowEdge<EdgeData>>) {
  const route = data?.route;
  if (!data || !route || route.points.length < 2) return null;
  const colour = data.back ? BACK : data.taken ? TAKEN : NOT_TAKEN;
  const label = route.label;
  return (
    <>
      <path
        id={id}
        d={roundedPath(route.points)}
        fill="none"
        stroke={colour}
        strokeWidth={data.taken ? 2 : 1.5}
        strokeDasharray={data.back ? "6 4" : undefined}
        markerEnd={markerEnd}
        data-testid={`graph-edge-${data.src}-${data.dst}`}
        data-back={data.back ? "yes" : "no"}
        data-taken={data.taken}
      />
      {label && data.text && (
        <EdgeLabelRenderer>
          <div
            className="nodrag nopan absolute truncate rounded border bg-white px-1.5 text-center"
            data-testid={`graph-edge-label-${data.src}-${data.dst}`}
            title={data.title}
            style={{
              transform: `translate(${label.x}px, ${label.y}px)`,
              width: label.width,
              height: label.height,
              lineHeight: `${label.height - 2}px`,
              font: LABEL_FONT,
              color: data.back ? BACK : "#334155",
              borderColor: data.back ? "#c7d2fe" : "#e2e8f0",
              pointerEvents: "all",
            }}
          >
            {data.text}
          </div>
        </EdgeLabelRenderer>
      )}
    </>
  );
}

const NODE_TYPES = { run: RunNode };
const EDGE_TYPES = { route: RouteEdge };

/** How many times the run went along each edge (consecutive executions), by "src\u0000dst". */
function traversals(executions: Execution[]): Map<string, number> {
  const ordered = [...executions].sort((a, b) => a.position - b.position);
  const taken = new Map<string, number>();
  for (let i = 1; i < ordered.length; i++) {
    const k = `${ordered[i - 1].name}\u0000${ordered[i].name}`;
    taken.set(k, (taken.get(k) ?? 0) + 1);
  }
  return taken;
}

/**
 * Indexes (into `edges`) of the edges that close a loop: those reaching a node still on the
 * depth-first path from the first node (then from each node not reached yet), in edge order.
 */
function backEdges(names: string[], edges: { src: string; dst: string }[]): Set<number> {
  const out = new Map<string, number[]>();
  edges.forEach((e, i) => out.set(e.src, [...(out.get(e.src) ?? []), i]));
  const state = new Map<string, "open" | "done">();
  const back = new Set<number>();
  const visit = (start: string) => {
    // iterative DFS: a long chain must not overflow the call stack
    const stack: { name: string; next: number }[] = [{ name: start, next: 0 }];
    state.set(start, "open");
    while (stack.length) {
      const top = stack[stack.length - 1];
      const outgoing = out.get(top.name) ?? [];
      if (top.next >= outgoing.length) {
        state.set(top.name, "done");
        stack.pop();
        continue;
      }
      const i = outgoing[top.next++];
      const dst = edges[i].dst;
      if (state.get(dst) === "open") back.add(i);
      else if (!state.has(dst)) {
        state.set(dst, "open");
        stack.push({ name: dst, next: 0 });
      }
    }
  };
  for (const n of names) if (!state.has(n)) visit(n);
  return back;
}

interface GraphProps {
  graph: GraphData;
  /** the selected node's number (1-based), if any */
  selected: number | null;
  onSelect: (number: number) => void;
  /** a node chosen with Enter or Space (default: onSelect) */
  onKeyboardSelect?: (number: number) => void;
}

function Flow({ graph, selected, onSelect, onKeyboardSelect }: GraphProps & { onKeyboardSelect: (number: number) => void }) {
  const [sizes, setSizes] = useState<Record<string, { width: number; height: number }>>({});
  const [layout, setLayout] = useState<Layout | null>(null);
  const [layoutError, setLayoutError] = useState<string | null>(null);
  const flow = useReactFlow();
  const paneWidth = useStore((s) => s.width);
  const paneHeight = useStore((s) => s.height);
  const userMoved = useRef(false);

  const taken = useMemo(() => traversals(graph.executions), [graph.executions]);
  const edgeInfo = useMemo(() => {
    const names = new Set(graph.nodes.map((n) => n.name));
    const edges = graph.edges.filter((e) => names.has(e.src) && names.has(e.dst));
    const back = backEdges(
      graph.nodes.map((n) => n.name),
      edges,
    );
    return edges.map((e, i) => {
      const isBack = back.has(i);
      const count = taken.get(`${e.src}\u0000${e.dst}`) ?? 0;
      const cond = e.condition === "default" ? "" : e.condition;
      const parts = [isBack ? `↺ ${cond || "loop"}` : cond, count > 1 ? `×${count}` : ""].filter(Boolean);
      const text = parts.join(" · ");
      const title = `${e.src} → ${e.dst}${isBack ? " (loops back)" : ""}: ${e.condition}; taken ${count} time${count === 1 ? "" : "s"} in this run`;
      return { id: `e${i}`, src: e.src, dst: e.dst, text, title, back: isBack, count };
    });
  }, [graph.nodes, graph.edges, taken]);

  // The layout's input as JSON: a new layout whenever a node's measured box or an edge changes.
  const allMeasured = graph.nodes.every((n) => sizes[n.name]);
  const layoutKey = useMemo(() => {
    if (!allMeasured) return "";
    const input: LayoutInput = {
      nodes: graph.nodes.map((n) => ({ id: n.name, width: Math.ceil(sizes[n.name].width), height: Math.ceil(sizes[n.name].height) })),
      edges: edgeInfo.map((e) => ({
        id: e.id,
        src: e.src,
        dst: e.dst,
        back: e.back,
        label: e.text ? { text: e.text, width: Math.min(LABEL_MAX, Math.ceil(textWidth(e.text, LABEL_FONT)) + 14), height: LABEL_H } : null,
      })),
    };
    return JSON.stringify(input);
  }, [allMeasured, graph.nodes, sizes, edgeInfo]);

  useEffect(() => {
    if (!layoutKey) return;
    let cancelled = false;
    layoutGraph(layoutKey)
      .then((l) => {
        if (!cancelled) {
          setLayout(l);
          setLayoutError(null);
        }
      })
      .catch((e: Error) => !cancelled && setLayoutError(e.message));
    return () => {
      cancelled = true;
    };
  }, [layoutKey]);

  // Fit the drawing to the pane when it is laid out or the pane resizes — until the user pans or
  // zooms (then only the fit button does).
  // The drawing's bounds are ELK's (edges and labels included, not only the nodes).
  const drawnWidth = layout?.width ?? 0;
  const drawnHeight = layout?.height ?? 0;
  const fit = useCallback(() => {
    if (!drawnWidth || !paneWidth || !paneHeight) return;
    const pad = 8;
    const zoom = Math.max(0.05, Math.min(1, (paneWidth - 2 * pad) / drawnWidth, (paneHeight - 2 * pad) / drawnHeight));
    void flow.setViewport({ x: (paneWidth - drawnWidth * zoom) / 2, y: (paneHeight - drawnHeight * zoom) / 2, zoom });
  }, [flow, drawnWidth, drawnHeight, paneWidth, paneHeight]);
  const laidOut = layout?.key ?? "";
  useEffect(() => {
    if (laidOut && !userMoved.current) fit();
  }, [laidOut, fit]);

  const nodes = useMemo<FlowNode<NodeData>[]>(
    () =>
      graph.nodes.map((n) => {
        const last = n.numbers[n.numbers.length - 1];
        const exec = last !== undefined ? graph.executions.find((e) => e.number === last) : undefined;
        return {
          id: n.name,
          type: "run",
          position: layout?.positions[n.name] ?? { x: 0, y: 0 },
          data: { node: n, last, sub: subLabel(n, exec), selected, onSelect, onKeyboardSelect },
          measured: sizes[n.name],
          draggable: false,
          selectable: false,
          focusable: false,
          connectable: false,
          // not selectable or draggable, yet clickable and hoverable (title)
          style: { pointerEvents: "all" },
        };
      }),
    [graph.nodes, graph.executions, layout, sizes, selected, onSelect, onKeyboardSelect],
  );

  const edges = useMemo<FlowEdge<EdgeData>[]>(
    () =>
      edgeInfo.map((e) => {
        const colour = e.back ? BACK : e.count ? TAKEN : NOT_TAKEN;
        return {
          id: e.id,
          source: e.src,
          target: e.dst,
          type: "route",
          markerEnd: { type: MarkerType.ArrowClosed, color: colour, width: 16, height: 16 },
          focusable: false,
          selectable: false,
          ariaLabel: e.title,
          data: { src: e.src, dst: e.dst, text: e.text, title: e.title, back: e.back, taken: e.count, route: layout?.routes[e.id] },
        };
      }),
    [edgeInfo, layout],
  );

  const onNodesChange = useCallback((changes: NodeChange<FlowNode<NodeData>>[]) => {
    const measured: Record<string, { width: number; height: number }> = {};
    for (const c of changes) if (c.type === "dimensions" && c.dimensions) measured[c.id] = c.dimensions;
    if (Object.keys(measured).length === 0) return;
    setSizes((prev) => {
      const same = Object.entries(measured).every(
        ([id, d]) => prev[id] && Math.abs(prev[id].width - d.width) < 0.5 && Math.abs(prev[id].height - d.height) < 0.5,
      );
      return same ? prev : { ...prev, ...measured };
    });
  }, []);

  const ready = layout !== null;
  const current = ready && layout.key === layoutKey;
  // As tall as the drawing at its fitted zoom (at most 1), between 240 and 640 px.
  const frame = ready
    ? { aspectRatio: `${Math.max(layout.width, 1)} / ${Math.max(layout.height, 1)}`, minHeight: 240, maxHeight: `min(640px, ${Math.ceil(layout.height) + 32}px)` }
    : { height: 320 };
  return (
    <div
      className="w-full overflow-hidden rounded border border-slate-200 bg-white"
      data-testid="graph"
      data-layout={current ? "done" : "pending"}
      role="group"
      aria-label={`graph of run ${graph.run.run_id}`}
    >
      <div className="flex items-center justify-end gap-1 border-b border-slate-100 px-1.5 py-1" data-testid="graph-controls">
          <ZoomButton testId="graph-zoom-in" label="zoom in" onClick={() => void flow.zoomIn()}>
            +
          </ZoomButton>
          <ZoomButton testId="graph-zoom-out" label="zoom out" onClick={() => void flow.zoomOut()}>
            −
          </ZoomButton>
          <ZoomButton
            testId="graph-fit"
            label="fit to view"
            onClick={() => {
              userMoved.current = false;
              fit();
            }}
          >
            fit
          </ZoomButton>
      </div>
      {layoutError && <p className="p-2 text-sm text-red-700">Graph layout failed: {layoutError}</p>}
      <div className="relative w-full" style={frame} data-testid="graph-canvas">
      <ReactFlow
        nodes={nodes}
        edges={edges}
        nodeTypes={NODE_TYPES}
        edgeTypes={EDGE_TYPES}
        onNodesChange={onNodesChange}
        onMoveStart={(event) => {
          if (event) userMoved.current = true;
        }}
        nodesDraggable={false}
        nodesConnectable={false}
        nodesFocusable={false}
        edgesFocusable={false}
        elementsSelectable={false}
        zoomOnScroll={false}
        zoomOnPinch
        panOnScroll={false}
        preventScrolling={false}
        zoomOnDoubleClick={false}
        deleteKeyCode={null}
        selectionKeyCode={null}
        multiSelectionKeyCode={null}
        minZoom={0.05}
        maxZoom={2.5}
        proOptions={{ hideAttribution: true }}
        style={{ visibility: ready ? "visible" : "hidden" }}
      />
      </div>
    </div>
  );
}

function ZoomButton({ testId, label, onClick, children }: { testId: string; label: string; onClick: () => void; children: ReactNode }) {
  return (
    <button
      type="button"
      data-testid={testId}
      aria-label={label}
      title={label}
      onClick={onClick}
      className="min-w-7 rounded border border-slate-300 bg-white/90 px-1.5 text-sm leading-6 text-slate-700 shadow-sm hover:bg-slate-100"
    >
      {children}
    </button>
  );
}

/** The run's graph with its legend; a node click (or Enter/Space on a focused node) selects it. */
export function GraphView({ graph, selected, onSelect, onKeyboardSelect }: GraphProps) {
  return (
    <div className="space-y-2">
      <Legend />
      <p className="text-xs text-slate-500">
        Drag to pan; + / − to zoom, “fit” to see it all. <span style={{ color: BACK }}>↺ dashed</span>: a loop back to an earlier
        node; ×N: how often a node (or edge) ran.
      </p>
      <ReactFlowProvider key={graph.run.run_id}>
        <Flow graph={graph} selected={selected} onSelect={onSelect} onKeyboardSelect={onKeyboardSelect ?? onSelect} />
      </ReactFlowProvider>
    </div>
  );
}
