// Fetch wrapper for Rewind's API: bearer token (when the server needs one), JSON errors, and a
// server-sent-events reader built on fetch (EventSource cannot send an Authorization header).
import { isInteger, isSafeNumber, LosslessNumber, parse as parseLossless, stringify as stringifyExact } from "lossless-json";
import type { RunEvent } from "./types";

const TOKEN_KEY = "rewind-token";

/** Keep a `#token=…` from the address as the bearer token and drop it from the address;
 * returns whether there was one (on load, and on a hash change in an open tab). */
export function takeTokenFromHash(): boolean {
  const m = window.location.hash.match(/^#token=([^&]+)/);
  if (!m) return false;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
  window.history.replaceState(null, "", window.location.pathname + "#/");
  return true;
}

export function getToken(): string | null {
  return sessionStorage.getItem(TOKEN_KEY);
}

export function setToken(token: string | null): void {
  if (token) sessionStorage.setItem(TOKEN_KEY, token);
  else sessionStorage.removeItem(TOKEN_KEY);
}

export class ApiError extends Error {
  status: number;
  hint: string;
  field: string | null;
  constructor(status: number, message: string, hint = "", field: string | null = null) {
    super(message);
    this.status = status;
    this.hint = hint;
    this.field = field;
  }
}

function headers(extra: Record<string, string> = {}): Record<string, string> {
  const h: Record<string, string> = { Accept: "application/json", ...extra };
  const token = getToken();
  if (token) h.Authorization = `Bearer ${token}`;
  return h;
}

/** A JSON number without loss: a plain number when float64 holds it exactly, a BigInt for a
 * larger integer (beyond 2^53), a LosslessNumber (its digits kept) for a long decimal. */
function exactNumber(text: string): number | bigint | LosslessNumber {
  if (isSafeNumber(text)) return Number(text);
  if (isInteger(text)) return BigInt(text);
  return new LosslessNumber(text);
}

/** JSON.parse that keeps every number exact (see exactNumber). */
export function parseExact(text: string): unknown {
  return parseLossless(text, null, exactNumber);
}

/** Like api() for a GET, but numbers stay exact (big integers as BigInt): for views that show
 * recorded values (raw JSON, the diff) rather than compute with them. */
export function apiExact<T>(path: string): Promise<T> {
  return api<T>(path, {}, parseExact);
}

export async function api<T>(
  path: string,
  init: { method?: string; body?: unknown } = {},
  parseJson: (text: string) => unknown = JSON.parse,
): Promise<T> {
  const response = await fetch(path, {
    method: init.method ?? "GET",
    headers: headers(init.body !== undefined ? { "Content-Type": "application/json" } : {}),
    // lossless: a BigInt read by parseExact (a recorded integer beyond 2^53) is sent with every digit
    body: init.body !== undefined ? stringifyExact(init.body) : undefined,
  });
  const text = await response.text();
  let data: unknown = null;
  try {
    data = text ? parseJson(text) : null;
  } catch {
    data = text;
  }
  if (!response.ok) {
    const body = (data && typeof data === "object" ? data : {}) as Record<string, unknown>;
    throw new ApiError(
      response.status,
      String(body.message ?? `HTTP ${response.status}`),
      String(body.hint ?? ""),
      (body.field as string | null) ?? null,
    );
  }
  return data as T;
}

/** Follow a run's events; returns a function that stops following. */
export function followEvents(
  runId: string,
  onEvent: (event: RunEvent) => void,
  onEnd: (failed: boolean) => void,
): () => void {
  const controller = new AbortController();
  (async () => {
    try {
      const response = await fetch(`/api/runs/${encodeURIComponent(runId)}/events`, {
        headers: headers({ Accept: "text/event-stream" }),
        signal: controller.signal,
      });
      if (!response.ok || !response.body) throw new Error(`HTTP ${response.status}`);
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        // Normalise line ends over the whole buffer: a chunk may end between "\r" and "\n".
        buffer = (buffer + value).replace(/\r\n/g, "\n");
        let cut: number;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          const data = block
            .split("\n")
            .filter((line) => line.startsWith("data:"))
            .map((line) => line.slice(5).trimStart())
            .join("\n");
          if (data) onEvent(JSON.parse(data) as RunEvent);
        }
      }
      onEnd(false);
    } catch {
      if (!controller.signal.aborted) onEnd(true);
    }
  })();
  return () => controller.abort();
}

/** Fetch a file with the bearer token (a plain link cannot send it) and save it under
 * ``filename`` through a Blob URL. Throws ApiError with the server's message on a refusal. */
export async function downloadFile(path: string, filename: string): Promise<number> {
  const response = await fetch(path, { headers: headers({ Accept: "*/*" }) });
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    let hint = "";
    try {
      const body = (await response.json()) as Record<string, unknown>;
      message = String(body.message ?? message);
      hint = String(body.hint ?? "");
    } catch {
      /* not JSON */
    }
    throw new ApiError(response.status, message, hint);
  }
  const blob = await response.blob();
  const url = URL.createObjectURL(blob);
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  a.rel = "noopener";
  document.body.appendChild(a);
  a.click();
  a.remove();
  window.setTimeout(() => URL.revokeObjectURL(url), 10_000);
  return blob.size;
}

export function fmtBytes(n: number | null | undefined): string {
  if (n === null || n === undefined) return "—";
  if (n >= 1_000_000) return `${(n / 1_000_000).toFixed(1)} MB`;
  if (n >= 1_000) return `${(n / 1_000).toFixed(1)} kB`;
  return `${n} bytes`;
}

export function shortId(id: string): string {
  return id.slice(0, 8);
}

export function fmtInt(n: number | null | undefined): string {
  return n === null || n === undefined ? "—" : n.toLocaleString("en-US");
}

export function fmtMs(ms: number | null | undefined): string {
  if (ms === null || ms === undefined) return "—";
  if (Math.abs(ms) >= 1000) return `${(ms / 1000).toFixed(2)} s`;
  return `${ms.toFixed(1)} ms`;
}

export function signed(n: number, fmt: (n: number) => string = fmtInt): string {
  return n > 0 ? `+${fmt(n)}` : n < 0 ? `−${fmt(-n)}` : fmt(0);
}
