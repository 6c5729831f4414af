// What the server runs with, in one table: each setting in force and where it came from (an
// environment variable, the server's options or the default); and this tab's access token (said
// when the server rejected it).
import { useEffect, useState } from "react";
import { api, ApiError, getToken, setToken } from "../api";
import type { Settings as SettingsData } from "../types";

type ConfigRow = NonNullable<SettingsData["effective"]>[number];

/**
 * One table of the configuration in force: the server's effective rows (value and where it came
 * from) with what only the settings document says merged in — the endpoint's state as a note,
 * the temperature default, the signed-in user, the pipelines and the version.
 */
function configRows(s: SettingsData): ConfigRow[] {
  const ep = s.model_endpoint;
  const started = ep.started ? "running now" : "not started yet";
  const base: ConfigRow[] = s.effective ?? [
    { name: "model endpoint", value: ep.base_url ?? ep.description, source: "server", note: "" },
    { name: "model", value: s.model, source: "server", note: "" },
    { name: "store folder", value: s.store.root, source: "server", note: "" },
    { name: "database", value: s.store.database, source: "server", note: s.store.dialect },
    { name: "authentication", value: s.auth.token_required ? "token required" : "none: loopback only", source: "server", note: "" },
    { name: "workers", value: s.workers, source: "server", note: "runs that may execute at once" },
  ];
  const out: ConfigRow[] = [];
  for (const row of base) {
    if (row.name === "model endpoint") {
      const about = row.value === ep.description ? started : `${ep.description}; ${started}`;
      out.push({ ...row, note: [row.note, about].filter(Boolean).join(" · ") });
    } else out.push(row);
    if (row.name === "model")
      out.push({
        name: "temperature default",
        value: s.temperature_default,
        source: "default",
        note: "a fork can change a node's temperature as a param (e.g. plan.temperature)",
      });
    if (row.name === "authentication" && s.auth.user)
      out.push({ name: "signed in as", value: `${s.auth.user}${s.auth.admin ? " (admin)" : ""}`, source: "token", note: "" });
  }
  out.push({ name: "pipelines", value: s.pipelines.join(", "), source: "server", note: "" });
  out.push({ name: "version", value: s.version, source: "server", note: "" });
  return out;
}

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
  const rows = s ? configRows(s) : [];
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
      {s && (
        <div className="space-y-1">
          <h3 className="text-sm font-semibold">Configuration in force</h3>
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
                {rows.map((row) => (
                  <tr key={row.name} className="border-t border-slate-200 align-top" data-testid={`effective-${row.name.replace(/ /g, "-")}`}>
                    <th className="w-32 py-1 pr-2 text-left font-medium text-slate-600 sm:w-44">{row.name}</th>
                    <td className="pr-2 font-mono [overflow-wrap:anywhere]">
                      <span data-testid="effective-value">{String(row.value)}</span>
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
        SmolLM2 model).
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
