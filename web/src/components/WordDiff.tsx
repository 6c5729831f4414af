// Prose changes word by word (the `diff` package), rendered as React text: removed words struck
// through in red, added ones in green.
import { diffWords } from "diff";
import { useMemo } from "react";

const WORD_DIFF_MAX_CHARS = 50_000;

/** Prose changes word by word (the `diff` package): removed words struck through in red, added
 * ones in green, the rest as is. Null when the strings are too long or the diff gives up. */
export function WordDiff({ old, next }: { old: string; next: string }) {
  const parts = useMemo(
    () => (old.length + next.length > WORD_DIFF_MAX_CHARS ? undefined : diffWords(old, next, { timeout: 300 })),
    [old, next],
  );
  if (!parts) return null;
  return (
    <div className="rounded border border-slate-200 bg-slate-50 p-2" data-testid="word-diff">
      <p className="whitespace-pre-wrap font-mono text-xs leading-5 [overflow-wrap:anywhere]">
        {parts.map((p, i) =>
          p.removed ? (
            <del key={i} className="bg-red-100 text-red-900" data-testid="word-removed">
              {p.value}
            </del>
          ) : p.added ? (
            <ins key={i} className="bg-emerald-100 text-emerald-900 no-underline" data-testid="word-added">
              {p.value}
            </ins>
          ) : (
            <span key={i}>{p.value}</span>
          ),
        )}
      </p>
    </div>
  );
}

