// Summary of the selected node execution: outcome and reason, tokens, latency, calls, outputs.
import type { NodeDetail } from "../types";
import { NodeBadge } from "./Status";
import { exactJson, Hash, JsonBlock } from "./TextBlock";
import { fmtInt, fmtMs } from "../api";
import { CallsList } from "./Calls";

export function NodeInfo({ detail }: { detail: NodeDetail }) {
  const n = detail.node;
  return (
    <section className="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="node-info">
      <div className="flex items-center gap-2">
        <h3 className="text-sm font-semibold">
          Node {n.number} · {n.name}
        </h3>
        <NodeBadge status={n.status} />
      </div>
      <dl className="grid grid-cols-[auto_minmax(0,1fr)] gap-x-3 gap-y-0.5 text-xs [overflow-wrap:anywhere]">
        <dt className="text-slate-500">cache</dt>
        <dd>
          {n.cache_outcome} ({n.cache_reason})
        </dd>
        <dt className="text-slate-500">tokens</dt>
        <dd>
          {fmtInt(n.tokens)} ({fmtInt(n.prompt_tokens)} prompt + {fmtInt(n.completion_tokens)} completion)
        </dd>
        <dt className="text-slate-500">latency</dt>
        <dd>{fmtMs(n.latency_ms)}</dd>
        <dt className="text-slate-500">input</dt>
        <dd>
          <Hash value={n.input_hash} />
        </dd>
        <dt className="text-slate-500">output</dt>
        <dd>
          <Hash value={n.output_hash} />
        </dd>
        <dt className="text-slate-500">state</dt>
        <dd>
          <Hash value={n.state_hash} />
        </dd>
        {Object.keys(n.params).length > 0 && (
          <>
            <dt className="text-slate-500">params</dt>
            <dd className="font-mono">{exactJson(n.params)}</dd>
          </>
        )}
      </dl>
      {n.error && <div className="rounded bg-red-50 p-2 text-xs text-red-800">{n.error}</div>}
      {detail.calls && (
        <CallsList
          key={`${detail.run_id}-${n.number}`}
          calls={detail.calls}
          total={detail.calls_total ?? detail.calls.length}
          runId={detail.run_id}
          number={n.number}
        />
      )}
      {!detail.calls && n.calls.length > 0 && (
        <table className="w-full text-left text-xs">
          <thead className="text-slate-500">
            <tr>
              <th>call</th>
              <th>outcome</th>
              <th className="text-right">tokens</th>
            </tr>
          </thead>
          <tbody>
            {n.calls.map((c) => (
              <tr key={c.index} className="border-t border-slate-100">
                <td>
                  {c.kind} {c.name}
                </td>
                <td>
                  {c.outcome}:{c.reason}
                </td>
                <td className="text-right">{fmtInt(c.tokens)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <div>
        <h4 className="text-xs font-semibold text-slate-600">output</h4>
        <JsonBlock value={detail.output} limit={1500} testId="node-output" />
      </div>
    </section>
  );
}
