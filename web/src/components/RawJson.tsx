// A node's state snapshot, inputs, outputs and their hashes, each copyable.
import type { NodeDetail } from "../types";
import { CopyButton, JsonBlock, toText } from "./TextBlock";

function Section({ title, value, hash, testId }: { title: string; value: unknown; hash?: string | null; testId: string }) {
  const text = toText(value);
  return (
    <section className="rounded border border-slate-200 bg-white p-3" data-testid={testId}>
      <div className="mb-1 flex items-center gap-2">
        <h4 className="text-sm font-semibold">{title}</h4>
        {hash !== undefined && (
          <span className="font-mono text-xs text-slate-500" title="sha256 of the canonical JSON">
            sha256 {hash ?? "—"}
          </span>
        )}
        <span className="ml-auto flex gap-1">
          {hash && <CopyButton text={hash} label="copy hash" />}
          <CopyButton text={text} label="copy JSON" />
        </span>
      </div>
      <JsonBlock value={value} />
    </section>
  );
}

export function RawJson({ detail }: { detail: NodeDetail }) {
  const n = detail.node;
  const hashes = { input_hash: n.input_hash, output_hash: n.output_hash, state_hash: n.state_hash };
  return (
    <div className="space-y-3" data-testid="raw-json">
      <Section title={`Hashes · node ${n.number} ${n.name}`} value={hashes} testId="raw-hashes" />
      <Section title="Outputs" value={detail.output} hash={n.output_hash} testId="raw-output" />
      <Section title="Inputs" value={detail.input} hash={n.input_hash} testId="raw-input" />
      <Section title="State after the node" value={detail.state} hash={n.state_hash} testId="raw-state" />
      <Section title="Node row" value={n} testId="raw-node" />
    </div>
  );
}
