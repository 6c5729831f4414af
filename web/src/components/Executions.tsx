// The run's trajectory: one row per node execution, in order. A virtual table: however many
// executions a looping run has, only the rows in view are in the DOM.
import { useEffect } from "react";
import type { Execution } from "../types";
import { NodeBadge } from "./Status";
import { Hash } from "./TextBlock";
import { PadRows, useVirtualRows } from "./VirtualList";
import { fmtInt, fmtMs } from "../api";

export function Executions({
  executions,
  selected,
  onSelect,
}: {
  executions: Execution[];
  selected: number | null;
  onSelect: (n: number) => void;
}) {
  const { scroller, rows, padTop, padBottom, measure, scrollToIndex } = useVirtualRows(
    executions.length,
    25,
    (i) => executions[i].number,
  );
  const selectedIndex = executions.findIndex((e) => e.number === selected);
  useEffect(() => {
    if (selectedIndex >= 0) scrollToIndex(selectedIndex, { align: "auto" });
  }, [selectedIndex, scrollToIndex]);
  if (executions.length === 0) return <p className="text-sm text-slate-500">No node has finished yet.</p>;
  return (
    <div className="max-h-[24rem] overflow-auto" ref={scroller} data-testid="executions-scroll" data-count={executions.length}>
      <table className="w-full text-left text-xs" data-testid="executions">
        <thead className="sticky top-0 z-10 bg-white text-slate-500">
          <tr>
            <th className="py-1 pr-2">#</th>
            <th className="pr-2">node</th>
            <th className="pr-2">status</th>
            <th className="pr-2">cache</th>
            <th className="pr-2 text-right">tokens</th>
            <th className="pr-2 text-right">latency</th>
            <th className="pr-2">output sha256</th>
          </tr>
        </thead>
        <tbody>
          <PadRows height={padTop} colSpan={7} />
          {rows.map((row) => {
            const e = executions[row.index];
            return (
              <tr
                key={row.key}
                data-index={row.index}
                ref={measure}
                data-testid={`execution-${e.number}`}
                onClick={() => onSelect(e.number)}
                className={`cursor-pointer border-t border-slate-100 hover:bg-slate-50 ${selected === e.number ? "bg-sky-50" : ""}`}
              >
                <td className="py-1 pr-2">{e.number}</td>
                <td className="pr-2 font-medium">{e.name}</td>
                <td className="pr-2">
                  <NodeBadge status={e.status} />
                </td>
                <td className="pr-2 text-slate-600">
                  {e.cache_outcome}
                  {e.cache_reason && e.cache_reason !== e.cache_outcome ? `:${e.cache_reason}` : ""}
                </td>
                <td className="pr-2 text-right tabular-nums">{fmtInt(e.tokens)}</td>
                <td className="pr-2 text-right tabular-nums">{fmtMs(e.latency_ms)}</td>
                <td className="pr-2">
                  <Hash value={e.output_hash} />
                </td>
              </tr>
            );
          })}
          <PadRows height={padBottom} colSpan={7} />
        </tbody>
      </table>
    </div>
  );
}
