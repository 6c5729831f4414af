// Layered layout of a run's graph with ELK (elkjs): node positions, orthogonal edge routes that
// go around nodes, and edge-label boxes placed between layers (never on a node).
import type { ElkExtendedEdge, ElkNode } from "elkjs/lib/elk-api";

/** What the layout needs: measured node boxes (px) and edges with an optional label box. */
export interface LayoutInput {
  nodes: { id: string; width: number; height: number }[];
  /** `back`: the edge closes a loop (laid out reversed, so the rest stays top-down) */
  edges: {
    id: string;
    src: string;
    dst: string;
    back: boolean;
    label: { text: string; width: number; height: number } | null;
  }[];
}

export interface Box {
  x: number;
  y: number;
  width: number;
  height: number;
}

export interface EdgeRoute {
  /** start, bends and end of the edge's orthogonal route (px, graph coordinates) */
  points: { x: number; y: number }[];
  label: Box | null;
}

export interface Layout {
  /** the LayoutInput (as JSON) this layout was computed for */
  key: string;
  positions: Record<string, { x: number; y: number }>;
  routes: Record<string, EdgeRoute>;
  width: number;
  height: number;
}

type Elk = import("elkjs/lib/elk-api").ELK;
let elk: Promise<Elk> | null = null;

/** ELK is large (~1.5 MB) and a big graph takes it a while: it is loaded on first use and runs
 * in a web worker of its own (a same-origin script, as the page's CSP allows), so laying out
 * never blocks the page. */
function loadElk(): Promise<Elk> {
  if (!elk)
    elk = Promise.all([import("elkjs/lib/elk-api.js"), import("elkjs/lib/elk-worker.min.js?worker")]).then(
      ([api, worker]) => new api.default({ workerFactory: () => new worker.default() }),
    );
  return elk;
}

const OPTIONS: Record<string, string> = {
  "elk.algorithm": "layered",
  "elk.direction": "DOWN",
  "elk.edgeRouting": "ORTHOGONAL",
  "elk.padding": "[top=16,left=16,bottom=16,right=16]",
  "elk.spacing.nodeNode": "36",
  "elk.spacing.edgeNode": "18",
  "elk.spacing.edgeEdge": "12",
  "elk.spacing.edgeLabel": "4",
  "elk.spacing.labelNode": "8",
  "elk.layered.spacing.nodeNodeBetweenLayers": "44",
  "elk.layered.spacing.edgeNodeBetweenLayers": "18",
  "elk.layered.spacing.edgeEdgeBetweenLayers": "12",
  // Back edges come reversed (a DAG), so ELK's cycle breaking has nothing to do; the model
  // order (execution order, then the rest) keeps the layout stable between live updates.
  "elk.layered.considerModelOrder.strategy": "NODES_AND_EDGES",
  "elk.layered.nodePlacement.strategy": "NETWORK_SIMPLEX",
  "elk.layered.crossingMinimization.forceNodeModelOrder": "false",
  "elk.edgeLabels.inline": "false",
};

/**
 * Lay the graph out top-down.
 *
 * Args: `key` — the JSON text of a {@link LayoutInput} (node ids, sizes in px, edges).
 * Returns positions (top-left, px) per node id, a route per edge id, and the drawing's size.
 * Raises: whatever ELK raises on a malformed graph (the caller shows it).
 */
export async function layoutGraph(key: string): Promise<Layout> {
  const input = JSON.parse(key) as LayoutInput;
  const ids = new Set(input.nodes.map((n) => n.id));
  const graph: ElkNode = {
    id: "root",
    layoutOptions: OPTIONS,
    children: input.nodes.map((n, i) => ({
      id: n.id,
      width: n.width,
      height: n.height,
      // the run's first node on top, whatever loops back into it
      layoutOptions: i === 0 ? ({ "elk.layered.layering.layerConstraint": "FIRST" } as Record<string, string>) : {},
    })),
    edges: input.edges
      .filter((e) => ids.has(e.src) && ids.has(e.dst))
      .map(
        (e): ElkExtendedEdge => ({
          id: e.id,
          sources: [e.back && e.src !== e.dst ? e.dst : e.src],
          targets: [e.back && e.src !== e.dst ? e.src : e.dst],
          labels: e.label
            ? [
                {
                  id: `${e.id}:label`,
                  text: e.label.text,
                  width: e.label.width,
                  height: e.label.height,
                  layoutOptions: { "elk.edgeLabels.placement": "CENTER" },
                },
              ]
            : [],
        }),
      ),
  };
  const out: ElkNode = await (await loadElk()).layout(graph);
  const positions: Layout["positions"] = {};
  for (const c of out.children ?? []) positions[c.id] = { x: c.x ?? 0, y: c.y ?? 0 };
  const routes: Layout["routes"] = {};
  const reversed = new Set(input.edges.filter((e) => e.back && e.src !== e.dst).map((e) => e.id));
  for (const e of (out.edges ?? []) as ElkExtendedEdge[]) {
    const points: EdgeRoute["points"] = [];
    for (const s of e.sections ?? []) {
      points.push(s.startPoint, ...(s.bendPoints ?? []), s.endPoint);
    }
    if (reversed.has(e.id)) points.reverse();
    const l = e.labels?.[0];
    routes[e.id] = {
      points,
      label: l ? { x: l.x ?? 0, y: l.y ?? 0, width: l.width ?? 0, height: l.height ?? 0 } : null,
    };
  }
  return { key, positions, routes, width: out.width ?? 0, height: out.height ?? 0 };
}

/** An SVG path through `points` with corners rounded by up to `radius` px. */
export function roundedPath(points: { x: number; y: number }[], radius = 8): string {
  if (points.length === 0) return "";
  let d = `M ${points[0].x} ${points[0].y}`;
  for (let i = 1; i < points.length - 1; i++) {
    const [p, c, n] = [points[i - 1], points[i], points[i + 1]];
    const r = Math.min(radius, Math.hypot(c.x - p.x, c.y - p.y) / 2, Math.hypot(n.x - c.x, n.y - c.y) / 2);
    const toward = (a: { x: number; y: number }, b: { x: number; y: number }) => {
      const len = Math.hypot(b.x - a.x, b.y - a.y) || 1;
      return { x: a.x + ((b.x - a.x) / len) * r, y: a.y + ((b.y - a.y) / len) * r };
    };
    const a = toward(c, p);
    const b = toward(c, n);
    d += ` L ${a.x} ${a.y} Q ${c.x} ${c.y} ${b.x} ${b.y}`;
  }
  const last = points[points.length - 1];
  return `${d} L ${last.x} ${last.y}`;
}

let canvas: CanvasRenderingContext2D | null = null;

/** Width in px of `text` drawn in the CSS `font` (canvas text metrics). */
export function textWidth(text: string, font: string): number {
  if (!canvas) canvas = document.createElement("canvas").getContext("2d");
  if (!canvas) return text.length * 7;
  canvas.font = font;
  return canvas.measureText(text).width;
}
