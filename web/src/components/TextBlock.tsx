// Renders model/tool output as plain text (React text nodes only — never as HTML), truncated
// so a 1 MB value stays responsive; "show all" renders the rest on demand.
import { stringify as stringifyExact } from "lossless-json";
import { useState } from "react";

export const DEFAULT_LIMIT = 2000;

// Controls, formatting characters (bidi overrides/isolates, zero-width space, BOM), lone
// surrogates and line/paragraph separators; tab, newline and the zero-width (non-)joiners stay.
const INVISIBLE = /[^\t\n\u200c\u200d\P{Cc}]|[^\u200c\u200d\P{Cf}]|\p{Cs}|\p{Zl}|\p{Zp}/gu;

/** ``text`` with every invisible or text-reordering character written as a visible JSON-style
 * escape (``\u202e``), as ``rewind.terminal.visible`` does for the CLI: a bidi override in a
 * recorded value cannot reorder what the page shows after it. For display only. */
export function visible(text: string): string {
  return text.replace(INVISIBLE, (ch) => `\\u${(ch.codePointAt(0) ?? 0).toString(16).padStart(4, "0")}`);
}

export function toText(value: unknown): string {
  if (typeof value === "string") return value;
  if (value === undefined) return "undefined";
  try {
    // lossless-json writes BigInt and LosslessNumber values with all their digits
    return stringifyExact(value, null, 2) ?? String(value);
  } catch {
    return String(value);
  }
}

/** JSON text of ``value`` with every number exact (BigInt and LosslessNumber digits kept, as
 * parseExact reads them); undefined for undefined, like JSON.stringify. */
export function exactJson(value: unknown, indent?: number): string | undefined {
  return stringifyExact(value, null, indent);
}

function sizeLabel(chars: number): string {
  if (chars >= 1_000_000) return `${(chars / 1_000_000).toFixed(1)} M characters`;
  if (chars >= 1_000) return `${(chars / 1_000).toFixed(1)} k characters`;
  return `${chars} characters`;
}

export function TextBlock({
  text,
  limit = DEFAULT_LIMIT,
  className = "",
  testId,
}: {
  text: string;
  limit?: number;
  className?: string;
  testId?: string;
}) {
  const [all, setAll] = useState(false);
  const long = text.length > limit;
  const shown = long && !all ? text.slice(0, limit) : text;
  return (
    <div className={className} data-testid={testId}>
      <pre className="whitespace-pre-wrap font-mono text-xs leading-5 [overflow-wrap:anywhere]">{visible(shown)}</pre>
      {long && (
        <div className="mt-1 flex items-center gap-2 text-xs text-slate-500">
          <span data-testid="truncated-note">
            {all ? `showing all ${sizeLabel(text.length)}` : `… ${sizeLabel(text.length - limit)} more (${sizeLabel(text.length)} in all)`}
          </span>
          <button
            type="button"
            className="rounded border border-slate-300 px-2 py-0.5 hover:bg-slate-100"
            onClick={() => setAll(!all)}
          >
            {all ? "show less" : "show all"}
          </button>
        </div>
      )}
    </div>
  );
}

export function JsonBlock({ value, limit, testId }: { value: unknown; limit?: number; testId?: string }) {
  return <TextBlock text={toText(value)} limit={limit} testId={testId} />;
}

export function CopyButton({ text, label = "copy" }: { text: string; label?: string }) {
  const [done, setDone] = useState(false);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      const area = document.createElement("textarea");
      area.value = text;
      document.body.appendChild(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    setDone(true);
    window.setTimeout(() => setDone(false), 1200);
  };
  return (
    <button
      type="button"
      onClick={copy}
      className="rounded border border-slate-300 bg-white px-2 py-0.5 text-xs text-slate-600 hover:bg-slate-100"
    >
      {done ? "copied" : label}
    </button>
  );
}

export function Hash({ value }: { value: string | null | undefined }) {
  if (!value) return <span className="text-slate-400">—</span>;
  return (
    <span className="font-mono text-xs" title={value}>
      {value.slice(0, 12)}
    </span>
  );
}
