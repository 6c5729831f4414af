// The prompts and responses of a node's calls: per call its cache outcome and key, latency,
// tokens, and (opened) the request — messages with roles, params, tools, response schema, or a
// tool's args — and the response — content, tool calls, finish reason, usage, or a tool's result.
// Long messages are collapsed; a body the server cut links to the whole recorded blob (fetched
// with the bearer token). Everything renders as text, never as HTML.
import { useCallback, useMemo, useRef, useState } from "react";
import { api, ApiError, downloadFile, fmtBytes, fmtInt, fmtMs } from "../api";
import type { CallDetail, ChatMessage, LlmRequest, LlmResponse } from "../types";
import { Hash, TextBlock, toText } from "./TextBlock";
import { VirtualList } from "./VirtualList";
import { WordDiff } from "./WordDiff";

const MESSAGE_PREVIEW = 400;
const ROLE_COLOUR: Record<string, string> = {
  system: "bg-violet-100 text-violet-800",
  user: "bg-sky-100 text-sky-800",
  assistant: "bg-emerald-100 text-emerald-800",
  tool: "bg-amber-100 text-amber-800",
};

function Message({ m, index }: { m: ChatMessage; index: number }) {
  const text = toText(m.content);
  return (
    <li className="rounded border border-slate-200 bg-white p-1.5" data-testid="call-message" data-role={m.role}>
      <div className="mb-0.5 flex items-center gap-2 text-[11px]">
        <span className={`rounded px-1.5 font-semibold ${ROLE_COLOUR[m.role] ?? "bg-slate-100 text-slate-700"}`}>{m.role}</span>
        {m.name && <span className="text-slate-500">{m.name}</span>}
        <span className="text-slate-400">#{index + 1} · {fmtInt(text.length)} chars</span>
      </div>
      <TextBlock text={text} limit={MESSAGE_PREVIEW} />
      {m.tool_calls !== undefined && <TextBlock text={toText(m.tool_calls)} limit={MESSAGE_PREVIEW} />}
    </li>
  );
}

function Field({ label, value, testId }: { label: string; value: unknown; testId?: string }) {
  if (value === null || value === undefined) return null;
  return (
    <div data-testid={testId}>
      <div className="text-[11px] font-semibold text-slate-500">{label}</div>
      <TextBlock text={toText(value)} limit={600} className="rounded bg-slate-50 p-1" />
    </div>
  );
}

function WholeBody({ url, bytes, truncated, name }: { url: string | null; bytes: number | null; truncated: boolean; name: string }) {
  const [error, setError] = useState<string | null>(null);
  if (!url) return null;
  return (
    <span className="text-[11px] text-slate-500">
      {truncated && <span data-testid="call-truncated">cut for display · </span>}
      <button
        type="button"
        className="text-sky-700 underline"
        data-testid={`call-whole-${name}`}
        onClick={() => {
          setError(null);
          downloadFile(url, `${name}.json`).catch((e: ApiError) => setError(e.message));
        }}
      >
        whole {name} ({fmtBytes(bytes)})
      </button>
      {error && <span className="ml-1 text-red-700">{error}</span>}
    </span>
  );
}

export function CallRequest({ call }: { call: CallDetail }) {
  if (call.kind !== "llm") {
    return <Field label="args" value={(call.request as { args: unknown }).args} testId="call-args" />;
  }
  const r = call.request as LlmRequest;
  return (
    <div className="space-y-1" data-testid="call-request">
      {r.endpoint && <div className="font-mono text-[11px] text-slate-500">{r.endpoint}</div>}
      <ol className="space-y-1">
        {r.messages.map((m, i) =>
          typeof m === "string" ? (
            <li key={i} className="text-slate-500" data-testid="call-messages-cut">
              {m}
            </li>
          ) : (
            <Message key={i} m={m} index={i} />
          ),
        )}
      </ol>
      <Field label="params" value={r.params} testId="call-params" />
      <Field label="tools" value={r.tools} testId="call-tools" />
      <Field label="response schema" value={r.response_schema} testId="call-schema" />
      {r.body !== undefined && <Field label="body" value={r.body} />}
    </div>
  );
}

export function CallResponse({ call }: { call: CallDetail }) {
  if (call.kind !== "llm") {
    return <Field label="result" value={(call.response as { result: unknown }).result} testId="call-result" />;
  }
  const r = call.response as LlmResponse;
  return (
    <div className="space-y-1" data-testid="call-response">
      <div className="flex flex-wrap gap-3 text-[11px] text-slate-600">
        {r.status !== null && <span>HTTP {r.status}</span>}
        <span data-testid="call-finish">finish: {r.finish_reason ?? "—"}</span>
        {r.streamed_events !== null && <span>{r.streamed_events} streamed events</span>}
      </div>
      <div className="rounded border border-emerald-200 bg-emerald-50/40 p-1.5" data-testid="call-content">
        <TextBlock text={toText(r.content)} limit={MESSAGE_PREVIEW * 2} />
      </div>
      <Field label="tool calls" value={r.tool_calls} testId="call-tool-calls" />
      <Field label="usage" value={r.usage} testId="call-usage" />
    </div>
  );
}

function CallMeta({ call }: { call: CallDetail }) {
  return (
    <div className="flex flex-wrap gap-x-3 text-[11px] text-slate-600">
      <span data-testid="call-outcome">cache {call.label}</span>
      <span title={call.key}>
        key <Hash value={call.key} />
      </span>
      <span data-testid="call-latency">{fmtMs(call.latency_ms)}</span>
      <span>
        {fmtInt(call.tokens)} tokens ({fmtInt(call.prompt_tokens)} + {fmtInt(call.completion_tokens)})
      </span>
      {call.determinism && call.determinism !== "deterministic" && <span>{call.determinism}</span>}
    </div>
  );
}

function CallItem({ call }: { call: CallDetail }) {
  const [open, setOpen] = useState(false);
  return (
    <div className="rounded border border-slate-200" data-testid={`call-${call.index}`}>
      <button
        type="button"
        aria-expanded={open}
        className="flex w-full flex-wrap items-center gap-2 px-2 py-1 text-left text-xs hover:bg-slate-50"
        onClick={() => setOpen(!open)}
        data-testid={`call-toggle-${call.index}`}
      >
        <span className="text-slate-400">{open ? "▾" : "▸"}</span>
        <span className="font-medium">
          {call.kind} {call.name}
        </span>
        <span className={call.outcome === "hit" ? "text-emerald-700" : "text-orange-700"}>{call.label}</span>
        <span className="ml-auto tabular-nums text-slate-500">
          {fmtInt(call.tokens)} tok · {fmtMs(call.latency_ms)}
        </span>
      </button>
      {open && (
        <div className="space-y-2 border-t border-slate-100 p-2" data-testid={`call-detail-${call.index}`}>
          <CallMeta call={call} />
          <div className="space-y-2">
            <div>
              <div className="mb-1 flex items-center gap-2 text-xs font-semibold text-slate-600">
                {call.kind === "llm" ? "request" : "args"}
                <WholeBody url={call.request_url} bytes={call.request_bytes} truncated={call.request_truncated} name="request" />
              </div>
              <CallRequest call={call} />
            </div>
            <div>
              <div className="mb-1 flex items-center gap-2 text-xs font-semibold text-slate-600">
                {call.kind === "llm" ? "response" : "result"}
                <WholeBody url={call.response_url} bytes={call.response_bytes} truncated={call.response_truncated} name="response" />
              </div>
              <CallResponse call={call} />
            </div>
          </div>
        </div>
      )}
    </div>
  );
}

export function CallsList({
  calls,
  total,
  runId,
  number,
}: {
  calls: CallDetail[];
  total: number;
  runId: string;
  number: number;
}) {
  const [more, setMore] = useState<CallDetail[]>([]);
  const [error, setError] = useState<string | null>(null);
  const loading = useRef(false);
  const shown = useMemo(() => [...calls, ...more], [calls, more]);
  // The next page (50 calls) loads as the list scrolls near its end; only the rows in view
  // are in the DOM however many calls the node made.
  const loadMore = useCallback(() => {
    if (loading.current || error || shown.length >= total) return;
    loading.current = true;
    api<{ calls: CallDetail[] }>(`/api/runs/${encodeURIComponent(runId)}/nodes/${number}/calls?offset=${shown.length}&limit=50`)
      .then((r) => setMore((m) => [...m, ...r.calls]))
      .catch((e: ApiError) => setError(e.message))
      .finally(() => {
        loading.current = false;
      });
  }, [error, shown.length, total, runId, number]);
  if (shown.length === 0) return null;
  return (
    <div data-testid="calls-list">
      <h4 className="mb-1 text-xs font-semibold text-slate-600">
        calls ({total}) · prompts and responses
        {shown.length < total && (
          <span className="ml-1 font-normal text-slate-500" data-testid="calls-loaded">
            · {shown.length} loaded, more as you scroll
          </span>
        )}
      </h4>
      <VirtualList
        items={shown}
        getKey={(c) => c.index}
        renderItem={(c) => <CallItem call={c} />}
        estimateSize={30}
        gap={4}
        maxHeight="36rem"
        onNearEnd={loadMore}
        testId="calls-scroll"
        label="calls"
      />
      {error && <p className="text-xs text-red-700">{error}</p>}
    </div>
  );
}

/** A changed call of a diff row: the original's and the fork's prompt and response side by side. */
export function CallPair({ a, b }: { a: CallDetail | undefined; b: CallDetail | undefined }) {
  const changed = a?.request_hash !== b?.request_hash || a?.result_hash !== b?.result_hash;
  const side = (c: CallDetail | undefined, label: string) => (
    <div className="min-w-0 space-y-1 rounded border border-slate-200 p-2" data-testid={`call-side-${label}`}>
      <div className="text-xs font-semibold text-slate-600">
        {label} {c ? `· ${c.kind} ${c.name}` : "· (no such call)"}
      </div>
      {c && (
        <>
          <CallMeta call={c} />
          <div className="text-[11px] font-semibold text-slate-500">{c.kind === "llm" ? "prompt" : "args"}</div>
          <CallRequest call={c} />
          <div className="text-[11px] font-semibold text-slate-500">{c.kind === "llm" ? "response" : "result"}</div>
          <CallResponse call={c} />
        </>
      )}
    </div>
  );
  const promptChanges: { index: number; role: string; old: string; next: string }[] = [];
  if (a?.kind === "llm" && b?.kind === "llm") {
    // a cut list ends with a string saying how many messages were left out
    const ma = (a.request as LlmRequest).messages.filter((m) => typeof m !== "string");
    const mb = (b.request as LlmRequest).messages.filter((m) => typeof m !== "string");
    for (let i = 0; i < Math.min(ma.length, mb.length); i++) {
      const x = toText(ma[i].content);
      const y = toText(mb[i].content);
      if (x !== y) promptChanges.push({ index: i, role: mb[i].role, old: x, next: y });
    }
  }
  return (
    <div data-testid="call-pair" data-changed={changed ? "yes" : "no"}>
      <div className="mb-1 text-xs text-slate-600">
        call {((a ?? b)?.index ?? 0) + 1} {changed ? <b className="text-orange-700">changed</b> : <span className="text-emerald-700">same request and response</span>}
        {a && b && a.request_hash !== b.request_hash && <span className="ml-2">prompt differs</span>}
        {a && b && a.result_hash !== b.result_hash && <span className="ml-2">response differs</span>}
      </div>
      {promptChanges.length > 0 && (
        <div className="mb-2 space-y-1" data-testid="prompt-word-diff">
          {promptChanges.map((p) => (
            <div key={p.index}>
              <div className="text-[11px] text-slate-500">
                message #{p.index + 1} ({p.role}) changed, word by word:
              </div>
              <WordDiff old={p.old} next={p.next} />
            </div>
          ))}
        </div>
      )}
      <div className="grid gap-2 md:grid-cols-2">
        {side(a, "original")}
        {side(b, "fork")}
      </div>
    </div>
  );
}
