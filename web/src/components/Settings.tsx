// What the server runs with: model endpoint, model, temperature default, store location, auth.
import { useEffect, useState } from "react";
import { api, getToken, setToken } from "../api";
import type { Settings as SettingsData } from "../types";

export function Settings() {
  const [s, setS] = useState<SettingsData | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [token, setTok] = useState(getToken() ?? "");
  useEffect(() => {
    api<SettingsData>("/api/settings")
      .then(setS)
      .catch((e: Error) => setError(e.message));
  }, []);
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
      {error && <p className="text-sm text-red-700">{error}</p>}
      <table className="w-full text-sm">
        <tbody>
          {rows.map(([k, v]) => (
            <tr key={k} className="border-t border-slate-200">
              <th className="w-48 py-1 text-left font-medium text-slate-600">{k}</th>
              <td className="py-1 font-mono text-xs" data-testid={`setting-${k.replace(/ /g, "-")}`}>
                {v}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <p className="text-xs text-slate-500">
        The model endpoint is set on the server: REWIND_BASE_URL, REWIND_API_KEY and REWIND_MODEL (unset: the embedded
        SmolLM2 model). A fork can change a node's temperature as a param (e.g. plan.temperature).
      </p>
      <div className="space-y-1">
        <h3 className="text-sm font-semibold">Access token (this browser tab)</h3>
        <div className="flex gap-2">
          <input
            type="password"
            className="w-80 rounded border border-slate-300 px-2 py-1 text-sm"
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
