// Original vs fork, node by node: status, hash match, first divergence, changed field paths with
// old/new values, unified text diffs for long strings, and both outputs side by side.
import { useEffect, useState } from "react";
import { api, apiExact, ApiError, fmtInt, signed } from "../api";
import type { CallDetail, Diff, DiffChange, DiffRow, Run } from "../types";
import { CallPair } from "./Calls";
import { PadRows, useVirtualRows, VirtualList } from "./VirtualList";
import { WordDiff } from "./WordDiff";
import { JsonBlock, TextBlock, toText } from "./TextBlock";

const ROW_COLOUR: Record<DiffRow["status"], string> = {
  equal: "bg-emerald-100 text-emerald-800",
  changed: "bg-orange-100 text-orange-800",
  only_a: "bg-red-100 text-red-800",
  only_b: "bg-sky-100 text-sky-800",
};

function TextDiff({ diff }: { diff: string }) {
  const lines = diff.split("\n");
  const page = 400;
  const [limit, setLimit] = useState(page); // paged: a huge diff never renders at once
  const shown = lines.slice(0, limit);
  return (
    <div className="rounded border border-slate-200 bg-slate-50 p-2" data-testid="text-diff">
      <pre className="whitespace-pre-wrap break-all font-mono text-xs leading-5">
        {shown.map((line, i) => (
          <div
            key={i}
            className={
              line.startsWith("+") && !line.startsWith("+++")
                ? "bg-emerald-100 text-emerald-900"
                : line.startsWith("-") && !line.startsWith("---")
                  ? "bg-red-100 text-red-900"
                  : line.startsWith("@@")
                    ? "text-sky-700"
                    : ""
            }
          >
            {line.length > 4000 ? `${line.slice(0, 4000)} …` : line || " "}
          </div>
        ))}
      </pre>
      {lines.length > page && (
        <div className="mt-1 flex gap-2 text-xs text-slate-500">
          <span>
            lines 1–{Math.min(limit, lines.length)} of {lines.length}
          </span>
          {lines.length > limit && (
            <button type="button" className="underline" onClick={() => setLimit(limit + page)}>
              show {Math.min(page, lines.length - limit)} more
            </button>
          )}
          {limit > page && (
            <button type="button" className="underline" onClick={() => setLimit(page)}>
              show less
            </button>
          )}
        </div>
      )}
    </div>
  );
}

function StringChange({ c }: { c: DiffChange }) {
  const [lines, setLines] = useState(false);
  const words = !lines ? <WordDiff old={c.old as string} next={c.new as string} /> : null;
  return (
    <div>
      {c.text_diff && (
        <button type="button" className="mb-1 text-xs text-sky-700 underline" onClick={() => setLines(!lines)} data-testid="diff-view-toggle">
          {lines ? "word diff" : "line diff"}
        </button>
      )}
      {words ?? (c.text_diff ? <TextDiff diff={c.text_diff} /> : null)}
    </div>
  );
}

function Change({ c }: { c: DiffChange }) {
  if (c.kind === "changed" && typeof c.old === "string" && typeof c.new === "string") {
    return (
      <div className="space-y-1 rounded border border-orange-200 bg-orange-50/40 p-2" data-testid="diff-change">
        <div className="flex items-center gap-2 text-xs">
          <code className="rounded bg-orange-200 px-1 font-semibold text-orange-900" data-testid="diff-path">
            {c.path || "(whole value)"}
          </code>
          {c.old_path && <span className="text-slate-500">(was {c.old_path})</span>}
          <span className="text-slate-500">text changed</span>
        </div>
        <StringChange c={c} />
      </div>
    );
  }
  return <ValueChange c={c} />;
}

function ValueChange({ c }: { c: DiffChange }) {
  return (
    <div className="space-y-1 rounded border border-orange-200 bg-orange-50/40 p-2" data-testid="diff-change">
      <div className="flex items-center gap-2 text-xs">
        <code className="rounded bg-orange-200 px-1 font-semibold text-orange-900" data-testid="diff-path">
          {c.path || "(whole value)"}
        </code>
        {c.old_path && <span className="text-slate-500">(was {c.old_path})</span>}
        <span className="text-slate-500">{c.kind.replace("_", " ")}</span>
      </div>
      {c.text_diff ? (
        <TextDiff diff={c.text_diff} />
      ) : (
        <div className="grid grid-cols-2 gap-2 text-xs">
          <div>
            <div className="text-slate-500">old</div>
            <div className="rounded bg-red-50 p-1 text-red-900">
              {c.kind === "added" ? <span className="italic">(absent)</span> : <TextBlock text={toText(c.old)} limit={600} />}
            </div>
          </div>
          <div>
            <div className="text-slate-500">new</div>
            <div className="rounded bg-emerald-50 p-1 text-emerald-900">
              {c.kind === "removed" ? <span className="italic">(absent)</span> : <TextBlock text={toText(c.new)} limit={600} />}
            </div>
          </div>
        </div>
      )}
    </div>
  );
}

function CallsSideBySide({ runA, runB, row }: { runA: string; runB: string; row: DiffRow }) {
  const [pairs, setPairs] = useState<[CallDetail[], CallDetail[]] | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => {
    let cancelled = false;
    const calls = (run: string, side: DiffRow["a"]) =>
      side
        ? api<{ calls: CallDetail[] }>(`/api/runs/${encodeURIComponent(run)}/nodes/${side.position + 1}/calls`).then((r) => r.calls)
        : Promise.resolve([] as CallDetail[]);
    Promise.all([calls(runA, row.a), calls(runB, row.b)])
      .then((p) => !cancelled && setPairs(p))
      .catch((e: ApiError) => !cancelled && setError(e.message));
    return () => {
      cancelled = true;
    };
  }, [runA, runB, row.a, row.b]);
  if (error) return <div className="text-xs text-red-700">{error}</div>;
  if (!pairs) return <div className="text-xs text-slate-500">loading calls…</div>;
  const [a, b] = pairs;
  const count = Math.max(a.length, b.length);
  if (count === 0) return <div className="text-xs text-slate-500">this node made no LLM or tool call</div>;
  const indexes = Array.from(new Set([...a.map((c) => c.index), ...b.map((c) => c.index)])).sort((x, y) => x - y);
  return (
    <div className="mt-1 space-y-2" data-testid="calls-side-by-side">
      {indexes.map((i) => (
        <CallPair key={i} a={a.find((c) => c.index === i)} b={b.find((c) => c.index === i)} />
      ))}
    </div>
  );
}

/** Beyond this many changes a row's list is virtual (only the changes in view are drawn). */
const LONG_CHANGES = 50;

function summary(row: DiffRow): string {
  if (row.changes.length === 0) return row.status === "equal" ? "" : row.status.replace("_", " ");
  const paths = row.changes.slice(0, 3).map((c) => c.path || "(whole value)");
  const more = row.changes.length - paths.length;
  return `${row.changes.length} field${row.changes.length === 1 ? "" : "s"}: ${paths.join(", ")}${more > 0 ? ` +${more} more` : ""}`;
}

function Row({
  row,
  first,
  runA,
  runB,
  open,
  setOpen,
}: {
  row: DiffRow;
  first: boolean;
  runA: string;
  runB: string;
  /** opened (the parent keeps it: a virtual row scrolled away and back stays as it was) */
  open: boolean;
  setOpen: (open: boolean) => void;
}) {
  const [sideBySide, setSideBySide] = useState(false);
  const [showCalls, setShowCalls] = useState(false);
  return (
    <>
      <tr
        data-testid={`diff-row-${row.index + 1}`}
        data-status={row.status}
        data-open={open ? "yes" : "no"}
        className={`cursor-pointer border-t border-slate-100 ${first ? "bg-orange-50" : ""}`}
        onClick={() => setOpen(!open)}
        tabIndex={0}
        aria-expanded={open}
        onKeyDown={(e) => {
          if (e.key === "Enter" || e.key === " ") {
            e.preventDefault();
            setOpen(!open);
          }
        }}
      >
        <td className="py-1 pr-2">{row.index + 1}</td>
        <td className="pr-2 font-medium">{row.name}</td>
        <td className="pr-2">
          <span className={`rounded px-1.5 py-0.5 ${ROW_COLOUR[row.status]}`}>{row.status.replace("_", " ")}</span>
          {row.code_changed && (
            <span
              className="ml-2 rounded bg-fuchsia-100 px-1.5 py-0.5 text-fuchsia-800"
              data-testid={`code-changed-${row.index + 1}`}
              title="this node ran other code than in the original: its changes are not the override's alone"
            >
              code changed
            </span>
          )}
          {first && (
            <span className="ml-2 font-semibold text-orange-700" data-testid="first-divergence">
              ◀ first divergence
            </span>
          )}
        </td>
        <td className="pr-2" data-testid={`hash-match-${row.index + 1}`}>
          {row.a && row.b ? (
            row.hash_equal ? (
              <span className="text-emerald-700" title="output sha256 equal">
                = hash
              </span>
            ) : (
              <span className="text-red-700" title="output sha256 differs">
                ≠ hash
              </span>
            )
          ) : (
            "—"
          )}
        </td>
        <td className="pr-2 text-slate-600">
          {row.a?.outcome ?? "—"} → {row.b?.outcome ?? "—"}
        </td>
        <td className="pr-2 text-right tabular-nums">{signed(row.token_delta)}</td>
        <td className="max-w-[28rem] truncate pr-2 text-slate-600" data-testid={`diff-summary-${row.index + 1}`} title={summary(row)}>
          <span className="mr-1 text-slate-400">{open ? "▾" : "▸"}</span>
          {summary(row)}
        </td>
      </tr>
      {open && (
        <tr>
          <td />
          <td colSpan={6} className="pb-3">
            {row.changes.length > LONG_CHANGES ? (
              <>
                <div className="mb-1 text-xs text-slate-500" data-testid={`diff-count-${row.index + 1}`}>
                  {fmtInt(row.changes.length)} changes · scroll the list
                </div>
                <VirtualList
                  items={row.changes}
                  getKey={(c, i) => `${c.path}-${i}`}
                  renderItem={(c) => <Change c={c} />}
                  estimateSize={72}
                  gap={4}
                  maxHeight="32rem"
                  testId={`diff-changes-${row.index + 1}`}
                  label={`changes of node ${row.index + 1}`}
                />
              </>
            ) : (
              row.changes.length > 0 && (
                <ul className="space-y-1">
                  {row.changes.map((c, i) => (
                    <li key={`${c.path}-${i}`}>
                      <Change c={c} />
                    </li>
                  ))}
                </ul>
              )
            )}
            <button
              type="button"
              className="mt-1 text-xs text-sky-700 underline"
              onClick={(e) => {
                e.stopPropagation();
                setSideBySide(!sideBySide);
              }}
            >
              {sideBySide ? "hide outputs" : "original vs fork side by side"}
            </button>
            {row.a && row.b && (
              <button
                type="button"
                className="ml-3 mt-1 text-xs text-sky-700 underline"
                data-testid={`diff-calls-${row.index + 1}`}
                onClick={(e) => {
                  e.stopPropagation();
                  setShowCalls(!showCalls);
                }}
              >
                {showCalls ? "hide prompts" : "prompts and responses side by side"}
              </button>
            )}
            {showCalls && <CallsSideBySide runA={runA} runB={runB} row={row} />}
            {sideBySide && (
              <div className="mt-1 grid grid-cols-2 gap-2" data-testid="side-by-side">
                <div className="rounded border border-slate-200 p-2">
                  <div className="mb-1 text-xs text-slate-500">original · {row.a?.output_hash.slice(0, 12) ?? "absent"}</div>
                  <JsonBlock value={row.a?.output ?? null} limit={3000} />
                </div>
                <div className="rounded border border-slate-200 p-2">
                  <div className="mb-1 text-xs text-slate-500">fork · {row.b?.output_hash.slice(0, 12) ?? "absent"}</div>
                  <JsonBlock value={row.b?.output ?? null} limit={3000} />
                </div>
              </div>
            )}
          </td>
        </tr>
      )}
    </>
  );
}

export function DiffPanel({ run, runs, version }: { run: Run; runs: Run[]; version: number }) {
  const [against, setAgainst] = useState<string>(run.parent_run_id ?? "");
  const [diff, setDiff] = useState<Diff | null>(null);
  const [error, setError] = useState<string | null>(null);

  useEffect(() => setAgainst(run.parent_run_id ?? ""), [run.run_id, run.parent_run_id]);
  useEffect(() => {
    if (!against) {
      setDiff(null);
      return;
    }
    let cancelled = false;
    apiExact<Diff>(`/api/diff?a=${encodeURIComponent(against)}&b=${encodeURIComponent(run.run_id)}`)
      .then((d) => !cancelled && (setDiff(d), setError(null)))
      .catch((e: ApiError) => !cancelled && setError(e.message));
    return () => {
      cancelled = true;
    };
  }, [against, run.run_id, version]);

  // The node rows: a virtual table (a looping run has hundreds), each row one <tbody>.
  const nodes = diff?.nodes ?? [];
  const [opened, setOpened] = useState<Record<string, boolean>>({}); // by "against-index"
  const rows = useVirtualRows(nodes.length, 28, (i) => `${against}-${nodes[i].index}`);
  const others = runs.filter((r) => r.run_id !== run.run_id && r.pipeline === run.pipeline);
  return (
    <section className="space-y-3" data-testid="diff-panel">
      <div className="flex flex-wrap items-center gap-2 text-sm">
        <span className="text-slate-600">compare</span>
        <select
          data-testid="diff-against"
          className="min-w-0 max-w-full rounded border border-slate-300 px-1 py-0.5 text-xs"
          value={against}
          onChange={(e) => setAgainst(e.target.value)}
        >
          <option value="">(choose a run)</option>
          {others.map((r) => (
            <option key={r.run_id} value={r.run_id}>
              {r.run_id.slice(0, 8)} {r.run_id === run.parent_run_id ? "(parent)" : ""} {r.change ?? r.status}
            </option>
          ))}
        </select>
        <span className="text-slate-600">(original) → this run (fork)</span>
      </div>
      {error && <div className="text-sm text-red-700">{error}</div>}
      {!against && <p className="text-sm text-slate-500">This run has no parent: choose a run to compare with.</p>}
      {diff && (
        <>
          <div className="flex flex-wrap gap-4 text-xs text-slate-700" data-testid="diff-summary">
            <span>
              first divergence:{" "}
              <b>
                {diff.first_divergence === null
                  ? "none — every node output is equal"
                  : `node ${diff.first_divergence + 1} ${diff.nodes[diff.first_divergence].name}`}
              </b>
            </span>
            <span>
              {Object.entries(diff.counts)
                .filter(([, n]) => n > 0)
                .map(([s, n]) => `${n} ${s.replace("_", " ")}`)
                .join(" · ")}
            </span>
            <span>
              tokens {fmtInt(diff.tokens_a)} → {fmtInt(diff.tokens_b)} ({signed(diff.token_delta)})
            </span>
          </div>
          <div className="max-h-[80vh] overflow-auto" ref={rows.scroller} data-testid="diff-rows" data-count={nodes.length}>
          <table className="w-full text-left text-xs">
            <thead className="sticky top-0 z-10 bg-white text-slate-500">
              <tr>
                <th className="py-1 pr-2">#</th>
                <th className="pr-2">node</th>
                <th className="pr-2">status</th>
                <th className="pr-2">hash</th>
                <th className="pr-2">cache (original → fork)</th>
                <th className="pr-2 text-right">tokens Δ</th>
                <th className="pr-2">changes</th>
              </tr>
            </thead>
            <PadRows height={rows.padTop} colSpan={7} group />
            {rows.rows.map((v) => {
              const row = nodes[v.index];
              const first = row.index === diff.first_divergence;
              // Collapsed by default (the row shows a summary); the first divergence opens itself.
              const key = `${against}-${row.index}`;
              const open = opened[key] ?? first;
              return (
                <tbody key={v.key} data-index={v.index} ref={rows.measure}>
                  <Row
                    row={row}
                    first={first}
                    runA={diff.run_a}
                    runB={diff.run_b}
                    open={open}
                    setOpen={(o) => setOpened((m) => ({ ...m, [key]: o }))}
                  />
                </tbody>
              );
            })}
            <PadRows height={rows.padBottom} colSpan={7} group />
          </table>
          </div>
        </>
      )}
    </section>
  );
}
