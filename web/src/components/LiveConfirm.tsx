// Live side effects are re-executed for real: name the resources a live fork (or each variant of a
// live grid) would touch, from GET /api/runs/{id}/live-fork-resources, and wait for a confirmation.
import { useEffect, useState } from "react";
import { api } from "../api";
// A resource a live fork would re-execute a side-effecting call against.
import type { LiveForkResource as LiveResource } from "../types";

export function LiveConfirm({
  runId,
  at,
  what,
  confirmed,
  onConfirmed,
}: {
  runId: string;
  at: number;
  what: string; // "a live fork", "each live variant"
  confirmed: boolean;
  onConfirmed: (confirmed: boolean) => void;
}) {
  const [resources, setResources] = useState<LiveResource[] | null>(null);

  useEffect(() => {
    onConfirmed(false);
    setResources(null);
    let cancelled = false;
    api<LiveResource[]>(`/api/runs/${runId}/live-fork-resources?at=${at}`)
      .then((rows) => !cancelled && setResources(rows))
      .catch(() => !cancelled && setResources([]));
    return () => {
      cancelled = true;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [runId, at]);

  return (
    <div className="rounded border border-amber-300 bg-amber-50 p-2 text-xs text-amber-900" data-testid="live-confirm">
      {resources === null ? (
        <div>listing the resources {what} would touch…</div>
      ) : resources.length === 0 ? (
        <div>No side-effecting call at or after this node: {what} touches nothing.</div>
      ) : (
        <>
          <div>{what[0].toUpperCase() + what.slice(1)} re-executes these side effects for real (pre-state verified or restored first):</div>
          <ul className="ml-4 list-disc" data-testid="live-resources">
            {resources.map((r) => (
              <li key={`${r.number}/${r.call_index}/${r.resource}`}>
                node {r.number} {r.node} · {r.tool} → <code className="break-all">{r.resource ?? "no declared resource"}</code>
              </li>
            ))}
          </ul>
        </>
      )}
      <label className="mt-1 block">
        <input
          type="checkbox"
          data-testid="live-confirm-check"
          checked={confirmed}
          onChange={(e) => onConfirmed(e.target.checked)}
        />{" "}
        I confirm: run these side effects live
      </label>
    </div>
  );
}
