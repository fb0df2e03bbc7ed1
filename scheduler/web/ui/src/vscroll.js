// The diary's virtual-scroll arithmetic (pure; unit-tested). Rows have one
// fixed height. Browsers cap an element's height (Firefox near 17.9M px,
// Chrome near 33.5M px), so past `maxPx` the spacer is capped and the
// scroll position maps to a line proportionally: a 1,000,000-line diary
// scrolls end to end, and only the lines in view are ever drawn or fetched.

export const DEFAULT_MAX_PX = 8_000_000;

// {scrollTop, viewport, rowHeight, total, overscan, maxPx} ->
// {first, last (exclusive), topPx (where row `first` is drawn), spacerPx}.
export function visibleRange({scrollTop, viewport, rowHeight, total,
                              overscan = 10, maxPx = DEFAULT_MAX_PX}) {
  total = Math.max(0, Math.floor(total));
  const contentPx = total * rowHeight;
  const spacerPx = Math.min(contentPx, maxPx);
  const rowsInView = viewport / rowHeight;
  const maxScroll = Math.max(0, spacerPx - viewport);
  const top = Math.min(Math.max(0, scrollTop), maxScroll);
  let pos;  // the fractional line index at the top of the view
  if (contentPx <= maxPx) {
    pos = top / rowHeight;
  } else {
    pos = maxScroll > 0 ? (top / maxScroll) * Math.max(0, total - rowsInView) : 0;
  }
  const first = Math.max(0, Math.floor(pos) - overscan);
  const last = Math.min(total, Math.ceil(pos + rowsInView) + overscan);
  const topPx = top - (pos - first) * rowHeight;
  return {first, last, topPx, spacerPx};
}

// The scrollTop that shows line `index` at the top (the inverse of the
// above), e.g. to stick to the tail in follow mode.
export function scrollTopFor({index, viewport, rowHeight, total,
                              maxPx = DEFAULT_MAX_PX}) {
  const contentPx = total * rowHeight;
  const spacerPx = Math.min(contentPx, maxPx);
  const maxScroll = Math.max(0, spacerPx - viewport);
  if (contentPx <= maxPx) return Math.min(maxScroll, Math.max(0, index * rowHeight));
  const span = Math.max(1, total - viewport / rowHeight);
  return Math.min(maxScroll, Math.max(0, (index / span) * maxScroll));
}

// The blocks of `block` lines (block starts, ascending) that hold the
// indexes in [first, last) for which `have(i)` is false: what to fetch.
export function missingBlocks(first, last, block, have) {
  const out = [];
  for (let b = Math.floor(first / block) * block; b < last; b += block) {
    for (let i = Math.max(b, first); i < Math.min(b + block, last); i++) {
      if (!have(i)) { out.push(b); break; }
    }
  }
  return out;
}

// The query for the diary rows at positions [start, start + limit): by
// offset among the stored lines (GET /diary?offset=&limit=). Line numbers
// would not do: a capped diary was cut in the middle, so its numbers jump
// there, and row i is not line i + 1.
export function diaryPageQuery(start, limit) {
  return `offset=${Math.max(0, Math.floor(start))}&limit=${Math.max(1, Math.floor(limit))}`;
}

// `fn` run at once when called from rest (the view just opened or jumped:
// its rows are fetched without waiting), then again only once the calls
// have paused for `delayMs` (a scroll's stream of events costs one fetch
// at its end). `timers` is setTimeout/clearTimeout's owner (tests pass
// their own). Returns {call, cancel}.
export function leadingDebounce(fn, delayMs, timers = globalThis) {
  let timer = 0;
  return {
    call() {
      const resting = timer === 0;
      if (!resting) timers.clearTimeout(timer);
      timer = timers.setTimeout(() => { timer = 0; fn(); }, delayMs);
      if (resting) fn();
    },
    cancel() {
      if (timer !== 0) timers.clearTimeout(timer);
      timer = 0;
    },
  };
}
