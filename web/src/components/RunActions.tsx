// Cancel a queued or running run; delete a finished one (with gc's rules: the server refuses a
// run that has forks, a sub-run, a running run — its message is shown as text).
import { useState } from "react";
import { api, ApiError, shortId } from "../api";
import type { RunDeleted as Deleted, RunDetail } from "../types";

export function RunActions({ run, onDeleted, onChanged }: { run: RunDetail; onDeleted: () => void; onChanged: () => void }) {
  const [confirming, setConfirming] = useState(false);
  const [busy, setBusy] = useState(false);
  const [message, setMessage] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const active = run.status === "queued" || run.status === "running";
  const fail = (e: unknown) => setError(e instanceof ApiError ? `${e.message}${e.hint ? ` — ${e.hint}` : ""}` : String(e));

  const cancel = async () => {
    setError(null);
    setBusy(true);
    try {
      const r = await api<{ status: string }>(`/api/runs/${run.run_id}/cancel`, { method: "POST" });
      setMessage(
        r.status === "cancelling"
          ? "Cancel requested: the run stops before its next node (a node already executing finishes first)."
          : `The run's process is gone: marked ${r.status}.`,
      );
      onChanged();
    } catch (e) {
      fail(e);
    } finally {
      setBusy(false);
    }
  };

  const remove = async () => {
    setError(null);
    setBusy(true);
    try {
      const r = await api<Deleted>(`/api/runs/${run.run_id}`, { method: "DELETE" });
      setConfirming(false);
      setMessage(`Deleted run ${shortId(r.run_id)} (${r.rows} rows${r.sub_runs.length ? `, ${r.sub_runs.length} sub-runs` : ""}).`);
      onDeleted();
    } catch (e) {
      setConfirming(false);
      fail(e);
    } finally {
      setBusy(false);
    }
  };

  return (
    <div className="flex flex-wrap items-center gap-2 text-xs" data-testid="run-actions">
      {active && (
        <button
          type="button"
          data-testid="cancel-run"
          disabled={busy || Boolean(message)}
          onClick={cancel}
          className="rounded border border-amber-500 px-2 py-0.5 text-amber-800 hover:bg-amber-50 disabled:opacity-50"
        >
          Cancel run
        </button>
      )}
      {!active && !confirming && (
        <button
          type="button"
          data-testid="delete-run"
          disabled={busy}
          onClick={() => setConfirming(true)}
          className="rounded border border-red-400 px-2 py-0.5 text-red-700 hover:bg-red-50 disabled:opacity-50"
        >
          Delete…
        </button>
      )}
      {confirming && (
        <span className="flex items-center gap-1 rounded bg-red-50 px-2 py-0.5 text-red-800" data-testid="delete-confirm">
          Delete run {shortId(run.run_id)} and its sub-runs for good? Forks must be deleted first.
          <button type="button" data-testid="delete-confirm-yes" disabled={busy} onClick={remove} className="rounded bg-red-600 px-2 py-0.5 text-white">
            Delete
          </button>
          <button type="button" onClick={() => setConfirming(false)} className="rounded border border-slate-300 px-2 py-0.5 text-slate-700">
            Keep
          </button>
        </span>
      )}
      {message && (
        <span className="text-slate-600" data-testid="run-action-message">
          {message}
        </span>
      )}
      {error && (
        <span className="text-red-700" data-testid="run-action-error">
          {error}
        </span>
      )}
    </div>
  );
}
