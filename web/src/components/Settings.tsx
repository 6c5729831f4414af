// What the server runs with: model endpoint, model, temperature default, store location, auth.
import { useEffect, useState } from "react";
import { api, ApiError, getToken, setToken } from "../api";
import type { Settings as SettingsData } from "../types";

export function Settings() {
  const [s, setS] = useState<SettingsData | null>(null);
  const [error, setError] = useState<ApiError | null>(null);
  const [token, setTok] = useState(getToken() ?? "");
  const saved = getToken();
  useEffect(() => {
    api<SettingsData>("/api/settings")
      .then(setS)
      .catch((e: unknown) => setError(e instanceof ApiError ? e : new ApiError(0, String(e))));
  }, []);
  const rejected = error?.status === 401 && saved !== null;
  const missing = error?.status === 401 && saved === null;
  const rows: [string, string][] = s
    ? [
        ["model endpoint", `${s.model_endpoint.kind}${s.model_endpoint.base_url ? ` · ${s.model_endpoint.base_url}` : ""}`],
        ["endpoint", s.model_endpoint.description],
        ["endpoint started", s.model_endpoint.started ? "yes" : "no (starts on the first cache miss)"],
        ["API key set", s.model_endpoint.api_key_set ? "yes (not shown)" : "no"],
        ["model", s.model],
        ["temperature default", String(s.temperature_default)],
        ["store", s.store.root],
        ["database", s.store.database],
        ["workers", String(s.workers)],
        ["token required", s.auth.token_required ? "yes" : "no (loopback only)"],
        ...(s.auth.user ? ([["signed in as", `${s.auth.user}${s.auth.admin ? " (admin)" : ""}`]] as [string, string][]) : []),
        ["pipelines", s.pipelines.join(", ")],
        ["version", s.version],
      ]
    : [];
  return (
    <section className="max-w-3xl space-y-4" data-testid="settings">
      <h2 className="text-lg font-semibold">Settings</h2>
      {rejected && (
        <p className="rounded border border-red-300 bg-red-50 p-2 text-sm text-red-800" data-testid="token-rejected" role="alert">
          The server rejected the access token saved in this tab ({error.message}). It may be mistyped, revoked or
          rotated: enter a current one below (an admin gives it with <code>rewind user add</code> or{" "}
          <code>rewind user rotate</code>).
        </p>
      )}
      {missing && (
        <p className="rounded border border-amber-300 bg-amber-50 p-2 text-sm text-amber-900" data-testid="token-missing" role="alert">
          This server needs an access token: enter it below.
        </p>
      )}
      {error && error.status !== 401 && <p className="text-sm text-red-700">{error.message}</p>}
      {s && saved && (
        <p className="text-xs text-emerald-700" data-testid="token-accepted">
          The access token of this tab is accepted{s.auth.user ? ` (user ${s.auth.user})` : ""}.
        </p>
      )}
      <table className="w-full text-sm">
        <tbody>
          {rows.map(([k, v]) => (
            <tr key={k} className="border-t border-slate-200">
              <th className="w-32 py-1 pr-2 text-left align-top font-medium text-slate-600 sm:w-48">{k}</th>
              <td className="py-1 font-mono text-xs [overflow-wrap:anywhere]" data-testid={`setting-${k.replace(/ /g, "-")}`}>
                {v}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {s?.effective && (
        <div className="space-y-1">
          <h3 className="text-sm font-semibold">Effective configuration</h3>
          <div className="overflow-x-auto">
            <table className="w-full text-xs" data-testid="effective-config">
              <thead className="text-left text-slate-500">
                <tr>
                  <th className="py-1 pr-2">setting</th>
                  <th className="pr-2">value in force</th>
                  <th className="pr-2">from</th>
                </tr>
              </thead>
              <tbody>
                {s.effective.map((row) => (
                  <tr key={row.name} className="border-t border-slate-200 align-top" data-testid={`effective-${row.name.replace(/ /g, "-")}`}>
                    <th className="py-1 pr-2 text-left font-medium text-slate-600">{row.name}</th>
                    <td className="pr-2 font-mono [overflow-wrap:anywhere]">
                      {String(row.value)}
                      {row.note && <div className="font-sans text-slate-500">{row.note}</div>}
                    </td>
                    <td className="pr-2">
                      <span
                        className={`rounded px-1.5 py-0.5 ${row.source === "default" ? "bg-slate-100 text-slate-600" : "bg-sky-100 text-sky-800"}`}
                        data-testid="effective-source"
                      >
                        {row.source}
                      </span>
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
        </div>
      )}
      <p className="text-xs text-slate-500">
        The model endpoint is set on the server: REWIND_BASE_URL, REWIND_API_KEY and REWIND_MODEL (unset: the embedded
        SmolLM2 model). A fork can change a node's temperature as a param (e.g. plan.temperature).
      </p>
      <div className="space-y-1">
        <h3 className="text-sm font-semibold">Access token (this browser tab)</h3>
        <div className="flex flex-wrap gap-2">
          <input
            type="password"
            aria-label="access token"
            className="w-full rounded sm:w-80 border border-slate-300 px-2 py-1 text-sm"
            value={token}
            onChange={(e) => setTok(e.target.value)}
            placeholder="a user's token (rewind user add) or rewind serve --token"
            data-testid="token-input"
          />
          <button
            type="button"
            data-testid="token-save"
            className="rounded bg-slate-800 px-3 py-1 text-sm text-white"
            onClick={() => {
              setToken(token || null);
              window.location.reload();
            }}
          >
            Save
          </button>
        </div>
      </div>
    </section>
  );
}
