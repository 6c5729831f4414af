// A long list that keeps only the rows in (and just around) view in the DOM (@tanstack/react-virtual).
// Rows may differ in height and change it (an opened call, an expanded job): each is measured.
import { useEffect, useLayoutEffect, useRef, useState, type ReactNode, type RefObject } from "react";
import { useVirtualizer } from "@tanstack/react-virtual";

export interface VirtualListProps<T> {
  items: T[];
  /** a stable key per item (React key and the virtualiser's measurement cache) */
  getKey: (item: T, index: number) => string | number;
  renderItem: (item: T, index: number) => ReactNode;
  /** a first guess of a row's height, px (rows are measured once drawn) */
  estimateSize: number;
  /** the box that scrolls: this list's own (default, at most `maxHeight` tall) or an ancestor */
  scrollParent?: RefObject<HTMLElement | null>;
  /** CSS max-height of the list's own scroll box */
  maxHeight?: string;
  /** rows drawn beyond each edge of the view */
  overscan?: number;
  /** px between rows */
  gap?: number;
  /** called when the last rows come into view (load the next page) */
  onNearEnd?: () => void;
  testId?: string;
  className?: string;
  /** accessible name of the list */
  label?: string;
}

/** The list: a `<ul>` whose `<li>` rows are positioned by the virtualiser; `data-count` on the
 * scroll box says how many items the list has (the DOM holds only a window of them). */
export function VirtualList<T>({
  items,
  getKey,
  renderItem,
  estimateSize,
  scrollParent,
  maxHeight = "28rem",
  overscan = 6,
  gap = 0,
  onNearEnd,
  testId,
  className = "",
  label,
}: VirtualListProps<T>) {
  const own = useRef<HTMLDivElement>(null);
  const list = useRef<HTMLUListElement>(null);
  // With an ancestor scrolling, the list starts `margin` px into it (whatever sits above it).
  const [margin, setMargin] = useState(0);
  useLayoutEffect(() => {
    const parent = scrollParent?.current;
    const el = list.current;
    if (!parent || !el) return;
    const measure = () => {
      const offset = el.getBoundingClientRect().top - parent.getBoundingClientRect().top + parent.scrollTop;
      setMargin((m) => (Math.abs(m - offset) < 1 ? m : offset));
    };
    measure();
    const observer = new ResizeObserver(measure);
    if (el.parentElement) observer.observe(el.parentElement);
    observer.observe(parent);
    return () => observer.disconnect();
  }, [scrollParent]);
  const virtualizer = useVirtualizer({
    count: items.length,
    getScrollElement: () => (scrollParent ? scrollParent.current : own.current),
    estimateSize: () => estimateSize,
    getItemKey: (i) => getKey(items[i], i),
    overscan,
    gap,
    scrollMargin: scrollParent ? margin : 0,
  });
  const rows = virtualizer.getVirtualItems();
  const lastShown = rows.length ? rows[rows.length - 1].index : -1;
  useEffect(() => {
    if (onNearEnd && items.length > 0 && lastShown >= items.length - 1 - overscan) onNearEnd();
  }, [lastShown, items.length, overscan, onNearEnd]);
  const offset = scrollParent ? margin : 0;
  const body = (
    <ul ref={list} className="relative" style={{ height: virtualizer.getTotalSize() }} aria-label={label}>
      {rows.map((row) => (
        <li
          key={row.key}
          data-index={row.index}
          ref={virtualizer.measureElement}
          className="absolute left-0 top-0 w-full"
          style={{ transform: `translateY(${row.start - offset}px)` }}
        >
          {renderItem(items[row.index], row.index)}
        </li>
      ))}
    </ul>
  );
  if (scrollParent)
    return (
      <div className={className} data-testid={testId} data-count={items.length}>
        {body}
      </div>
    );
  return (
    <div ref={own} className={`overflow-y-auto ${className}`} style={{ maxHeight }} data-testid={testId} data-count={items.length}>
      {body}
    </div>
  );
}

/**
 * Virtual rows of a table (rows may not be positioned absolutely): the rows to draw, and the
 * padding (px) above and below them that stands for the rows left out. `scroller` goes on the
 * box that scrolls; `measure` on each drawn row's element (with `data-index`).
 */
export function useVirtualRows(count: number, estimateSize: number, getKey: (index: number) => string | number, overscan = 8) {
  const scroller = useRef<HTMLDivElement>(null);
  const virtualizer = useVirtualizer({
    count,
    getScrollElement: () => scroller.current,
    estimateSize: () => estimateSize,
    getItemKey: getKey,
    overscan,
  });
  const rows = virtualizer.getVirtualItems();
  const padTop = rows.length ? rows[0].start : 0;
  const padBottom = rows.length ? virtualizer.getTotalSize() - rows[rows.length - 1].end : 0;
  return { scroller, rows, padTop, padBottom, measure: virtualizer.measureElement, scrollToIndex: virtualizer.scrollToIndex };
}

/** The space (px) of a virtual table's rows left out above or below the drawn ones: a row, or
 * with `group` a `<tbody>` holding it (for tables whose items are one `<tbody>` each). */
export function PadRows({ height, colSpan, group = false }: { height: number; colSpan: number; group?: boolean }) {
  if (height <= 0) return null;
  const row = (
    <tr aria-hidden="true">
      <td colSpan={colSpan} style={{ height, padding: 0 }} />
    </tr>
  );
  return group ? <tbody aria-hidden="true">{row}</tbody> : row;
}
