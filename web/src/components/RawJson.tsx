// A node's state snapshot, inputs, outputs and their hashes, each copyable, as a collapsible
// JSON tree (react-json-view-lite) or as text. Fetched with exact numbers: an integer beyond
// 2^53 is a BigInt and shows every digit. A very large section opens as text (truncated, with
// "show all") so a megabyte value stays responsive.
import { useEffect, useState } from "react";
import { JsonView, defaultStyles } from "react-json-view-lite";
import "react-json-view-lite/dist/index.css";
import { apiExact, ApiError } from "../api";
import type { NodeDetail } from "../types";
import { CopyButton, JsonBlock, toText } from "./TextBlock";

const TREE_MAX_CHARS = 100_000;
const expandTop = (level: number) => level < 3; // stable: a new function would reset the tree
const TREE_STYLES = { ...defaultStyles, container: "rewind-json-tree font-mono text-xs leading-5" };

function Section({ title, value, hash, testId }: { title: string; value: unknown; hash?: string | null; testId: string }) {
  const text = toText(value);
  const canTree = value !== null && typeof value === "object";
  const [view, setView] = useState<"tree" | "text">(canTree && text.length <= TREE_MAX_CHARS ? "tree" : "text");
  return (
    <section className="min-w-0 rounded border border-slate-200 bg-white p-3" data-testid={testId} data-view={view}>
      <div className="mb-1 flex flex-wrap items-center gap-2">
        <h4 className="text-sm font-semibold">{title}</h4>
        {hash !== undefined && (
          <span className="break-all font-mono text-xs text-slate-500" title="sha256 of the canonical JSON">
            sha256 {hash ?? "—"}
          </span>
        )}
        <span className="ml-auto flex gap-1">
          {canTree && (
            <button
              type="button"
              className="rounded border border-slate-300 bg-white px-2 py-0.5 text-xs text-slate-600 hover:bg-slate-100"
              data-testid={`${testId}-view`}
              onClick={() => setView(view === "tree" ? "text" : "tree")}
            >
              {view === "tree" ? "as text" : "as tree"}
            </button>
          )}
          {hash && <CopyButton text={hash} label="copy hash" />}
          <CopyButton text={text} label="copy JSON" />
        </span>
      </div>
      {view === "tree" && canTree ? (
        <div className="overflow-x-auto" data-testid={`${testId}-tree`}>
          <JsonView data={value as object} style={TREE_STYLES} shouldExpandNode={expandTop} />
        </div>
      ) : (
        <JsonBlock value={value} />
      )}
    </section>
  );
}

export function RawJson({ runId, detail }: { runId: string; detail: NodeDetail }) {
  const [exact, setExact] = useState<NodeDetail | null>(null);
  const [error, setError] = useState<string | null>(null);
  const number = detail.node.number;
  useEffect(() => {
    let cancelled = false;
    setExact(null);
    setError(null);
    apiExact<NodeDetail>(`/api/runs/${encodeURIComponent(runId)}/nodes/${number}`)
      .then((d) => !cancelled && setExact(d))
      .catch((e: ApiError) => !cancelled && setError(e.message));
    return () => {
      cancelled = true;
    };
  }, [runId, number, detail.node.output_hash]);
  // Rendered once the exact copy is here (the plain one only if that fetch failed): swapping one
  // for the other would reset what the reader opened.
  const shown = exact ?? (error ? detail : null);
  if (!shown) return <p className="text-sm text-slate-500" data-testid="raw-json-loading">Loading node {number}…</p>;
  const n = shown.node;
  const hashes = { input_hash: n.input_hash, output_hash: n.output_hash, state_hash: n.state_hash };
  return (
    <div className="space-y-3" data-testid="raw-json" data-exact={exact ? "yes" : "no"}>
      {error && <p className="text-xs text-red-700">{error}</p>}
      <Section title={`Hashes · node ${n.number} ${n.name}`} value={hashes} testId="raw-hashes" />
      <Section title="Outputs" value={shown.output} hash={n.output_hash} testId="raw-output" />
      <Section title="Inputs" value={shown.input} hash={n.input_hash} testId="raw-input" />
      <Section title="State after the node" value={shown.state} hash={n.state_hash} testId="raw-state" />
      <Section title="Node row" value={n} testId="raw-node" />
    </div>
  );
}
