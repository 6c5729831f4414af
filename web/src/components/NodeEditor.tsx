// Pick a node, change one param, one Burr runtime input or one output field (JSON checked before
// submit), fork there.
import { useEffect, useMemo, useState } from "react";
import { api, ApiError, parseExact } from "../api";
import type { NodeDetail, ParamHint, Run } from "../types";
import { LiveConfirm } from "./LiveConfirm";
import { exactJson, toText, visible } from "./TextBlock";

type Mode = "param" | "input" | "output" | "replay";
type ChangeMode = Exclude<Mode, "replay">;
type Effects = "recorded" | "dry-run" | "live";

const EFFECTS_HELP: Record<Effects, string> = {
  live: "re-execute side-effecting tools (e.g. publish) against a verified pre-state",
  recorded: "serve side effects from the record; a call with new arguments fails the fork",
  "dry-run": "log side-effecting calls and execute nothing",
};

const BIG_PREFILL = 200_000;

function parseJson(text: string): { ok: true; value: unknown } | { ok: false; error: string } {
  if (!text.trim()) return { ok: false, error: "enter a JSON value (strings in double quotes)" };
  try {
    return { ok: true, value: parseExact(text) };
  } catch (e) {
    return { ok: false, error: `not valid JSON: ${(e as Error).message}` };
  }
}

/** The values the pipeline allows for a param: clickable choices, or a number range. */
function ParamHintView({ hint, text, onPick }: { hint: ParamHint; text: string; onPick: (json: string) => void }) {
  const range =
    hint.type !== undefined
      ? `${hint.type === "integer" ? "an integer" : "a number"}${hint.min !== undefined || hint.max !== undefined ? ` from ${hint.min ?? "−∞"} to ${hint.max ?? "∞"}` : ""}`
      : null;
  return (
    <div className="space-y-1 text-xs text-slate-600" data-testid="param-hint">
      {hint.description && <div className="text-slate-500">{hint.description}</div>}
      {hint.choices && hint.choices.length > 0 && (
        <div className="flex flex-wrap items-center gap-1">
          allowed:
          {hint.choices.map((c) => {
            const json = exactJson(c) ?? "";
            return (
              <button
                key={json}
                type="button"
                data-testid="param-choice"
                onClick={() => onPick(json)}
                className={`rounded border px-1.5 py-0.5 font-mono ${text.trim() === json ? "border-orange-500 bg-orange-50" : "border-slate-300 bg-slate-50 hover:bg-slate-100"}`}
              >
                {toText(c)}
              </button>
            );
          })}
        </div>
      )}
      {range && <div data-testid="param-range">allowed: {range}</div>}
    </div>
  );
}

export function NodeEditor({
  run,
  detail,
  onForked,
}: {
  run: Run;
  detail: NodeDetail;
  onForked: (runId: string) => void;
}) {
  const node = detail.node;
  const recordedInputs = (detail.input?.inputs ?? {}) as Record<string, unknown>;
  const values: Record<ChangeMode, Record<string, unknown>> = {
    param: node.params ?? {},
    input: recordedInputs,
    output: detail.output ?? {},
  };
  const names = (m: Mode): string[] => (m === "replay" ? [] : Object.keys(values[m]));
  const firstMode = (): Mode => (["param", "input", "output"] as const).find((m) => names(m).length > 0) ?? "replay";
  const [mode, setMode] = useState<Mode>(firstMode());
  const [name, setName] = useState<string>(names(firstMode())[0] ?? "");
  const [text, setText] = useState("");
  const [tooBig, setTooBig] = useState(0);
  // Forks default to recorded (as the CLI does); live re-executes side effects for real, so it
  // names the resources it would touch and waits for a confirmation.
  const [effects, setEffects] = useState<Effects>("recorded");
  const [liveConfirmed, setLiveConfirmed] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<ApiError | null>(null);

  // Reset when another node is picked.
  useEffect(() => {
    const m = firstMode();
    setMode(m);
    setName(names(m)[0] ?? "");
    setEffects("recorded");
    setError(null);
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [run.run_id, node.number]);

  const current = mode === "replay" ? undefined : values[mode][name];
  useEffect(() => {
    if (mode === "replay" || !name) {
      setText("");
      return;
    }
    const t = mode === "output" ? exactJson(current, 2) : exactJson(current);
    setTooBig(t !== undefined && t.length > BIG_PREFILL ? t.length : 0);
    setText(t === undefined ? "" : t.length > BIG_PREFILL ? "" : t);
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [mode, name, node.number, run.run_id]);

  const parsed = useMemo(() => (mode === "replay" ? null : parseJson(text)), [mode, text]);
  const unchanged = parsed?.ok && exactJson(parsed.value) === exactJson(current);
  const finished = run.status !== "running" && run.status !== "queued";
  const canFork =
    finished && !busy && (effects !== "live" || liveConfirmed) && (mode === "replay" || (parsed?.ok && !!name));

  const submit = async () => {
    if (!canFork) return;
    setBusy(true);
    setError(null);
    let override: Record<string, unknown> | null = null;
    if (mode !== "replay" && parsed?.ok) {
      const key = { param: "param", input: "name", output: "field" }[mode];
      override = { kind: mode, node: node.name, [key]: name, value: parsed.value };
    }
    try {
      const res = await api<{ run_id: string }>(`/api/runs/${run.run_id}/fork`, {
        method: "POST",
        body: { at: node.number, override, effects },
      });
      onForked(res.run_id);
    } catch (e) {
      setError(e instanceof ApiError ? e : new ApiError(0, String(e)));
    } finally {
      setBusy(false);
    }
  };

  const tab = (m: Mode, label: string, disabled: boolean) => (
    <button
      type="button"
      data-testid={`editor-mode-${m}`}
      disabled={disabled}
      onClick={() => {
        setMode(m);
        setName(names(m)[0] ?? "");
      }}
      className={`rounded px-2 py-1 text-xs ${mode === m ? "bg-slate-800 text-white" : "bg-slate-100 text-slate-700"} disabled:opacity-40`}
    >
      {label}
    </button>
  );

  return (
    <section className="space-y-2 rounded border border-slate-200 bg-white p-3" data-testid="node-editor">
      <h3 className="text-sm font-semibold">
        Fork at node {node.number} · {node.name}
      </h3>
      <div className="flex gap-1">
        {tab("param", "change a param", names("param").length === 0)}
        {tab("input", "change an input", names("input").length === 0)}
        {tab("output", "replace output", names("output").length === 0)}
        {tab("replay", "unchanged replay", false)}
      </div>
      {mode === "param" && names("param").length === 0 && (
        <p className="text-xs text-slate-500">This node read no params.</p>
      )}
      {mode !== "replay" && (
        <>
          <label className="block text-xs text-slate-600">
            {{ param: "param", input: "runtime input", output: "output field" }[mode]}
            <select
              data-testid="editor-name"
              className="ml-2 rounded border border-slate-300 px-1 py-0.5 text-xs"
              value={name}
              onChange={(e) => setName(e.target.value)}
            >
              {names(mode).map((p) => (
                <option key={p} value={p}>
                  {p}
                </option>
              ))}
            </select>
          </label>
          <div className="text-xs text-slate-500">
            current: <code className="break-all">{visible(toText(current).slice(0, 200))}</code>
          </div>
          {mode === "param" && detail.param_hints?.[name] && (
            <ParamHintView hint={detail.param_hints[name]} text={text} onPick={setText} />
          )}
          <textarea
            data-testid="editor-value"
            spellCheck={false}
            className={`h-28 w-full rounded border p-2 font-mono text-xs ${parsed && !parsed.ok ? "border-red-400" : "border-slate-300"}`}
            value={text}
            onChange={(e) => setText(e.target.value)}
            placeholder={mode === "param" ? '"season"' : mode === "input" ? '"a new prompt"' : "JSON value"}
          />
          {tooBig > 0 && !text && (
            <p className="text-xs text-slate-500">
              The recorded value is {tooBig.toLocaleString("en-US")} characters: too large to edit here. Type or paste
              the replacement value.
            </p>
          )}
          {parsed && !parsed.ok && (
            <p className="text-xs text-red-600" data-testid="editor-json-error">
              {parsed.error}
            </p>
          )}
          {parsed?.ok && unchanged && (
            <p className="text-xs text-amber-700">Same value as recorded: the fork will replay unchanged from the cache.</p>
          )}
        </>
      )}
      {mode === "replay" && (
        <p className="text-xs text-slate-600">
          Replays from this node with no change: expect every node a cache hit, 0 tokens and identical hashes.
        </p>
      )}
      <label className="block text-xs text-slate-600">
        side effects
        <select
          data-testid="editor-effects"
          className="ml-2 rounded border border-slate-300 px-1 py-0.5 text-xs"
          value={effects}
          onChange={(e) => setEffects(e.target.value as Effects)}
        >
          <option value="recorded">recorded</option>
          <option value="dry-run">dry-run</option>
          <option value="live">live</option>
        </select>
        <span className="ml-2 text-slate-500">{EFFECTS_HELP[effects]}</span>
      </label>
      {effects === "live" && (
        <LiveConfirm runId={run.run_id} at={node.number} what="a live fork" confirmed={liveConfirmed} onConfirmed={setLiveConfirmed} />
      )}
      {!finished && <p className="text-xs text-amber-700">This run is still {run.status}; fork it once it finishes.</p>}
      <button
        type="button"
        data-testid="fork-button"
        disabled={!canFork}
        onClick={submit}
        className="rounded bg-orange-600 px-3 py-1.5 text-sm font-medium text-white hover:bg-orange-700 disabled:opacity-40"
      >
        {busy ? "forking…" : "Fork here"}
      </button>
      {error && (
        <div className="rounded border border-red-300 bg-red-50 p-2 text-xs text-red-800" data-testid="editor-error">
          <div>{error.message}</div>
          {error.hint && <div className="text-red-600">{error.hint}</div>}
        </div>
      )}
    </section>
  );
}
