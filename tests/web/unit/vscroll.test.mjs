// The diary's virtual scroll: the rows in view, end to end, for a small
// diary and for a 1,000,000-line one (whose spacer is capped).
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {diaryPageQuery, missingBlocks, scrollTopFor, visibleRange} from
    '../../../scheduler/web/ui/src/vscroll.js';

const H = 18, VIEW = 480;

test('a short diary: rows at their own offsets', () => {
  const r = visibleRange({scrollTop: 0, viewport: VIEW, rowHeight: H, total: 5});
  assert.deepEqual(r, {first: 0, last: 5, topPx: 0, spacerPx: 90});
  const e = visibleRange({scrollTop: 0, viewport: VIEW, rowHeight: H, total: 0});
  assert.equal(e.last, 0);
});

test('an uncapped diary scrolled to line 1000', () => {
  const r = visibleRange({scrollTop: 1000 * H, viewport: VIEW, rowHeight: H, total: 10000,
                          overscan: 5});
  assert.equal(r.first, 995);
  assert.equal(r.last, 1000 + Math.ceil(VIEW / H) + 5);
  assert.equal(r.topPx, 995 * H);
  assert.equal(r.spacerPx, 10000 * H);
});

test('a 1,000,000-line diary: capped spacer, both ends reachable, few rows', () => {
  const total = 1_000_000, maxPx = 8_000_000;
  const top = visibleRange({scrollTop: 0, viewport: VIEW, rowHeight: H, total, maxPx});
  assert.equal(top.first, 0);
  assert.equal(top.spacerPx, maxPx);
  const end = visibleRange({scrollTop: maxPx, viewport: VIEW, rowHeight: H, total, maxPx});
  assert.equal(end.last, total);
  assert.ok(end.last - end.first < 60, `${end.last - end.first} rows drawn`);
  // The last row ends at the view's bottom edge.
  const lastRowBottom = end.topPx + (end.last - end.first) * H;
  assert.ok(Math.abs(lastRowBottom - (maxPx)) < H, `last row ends at ${lastRowBottom}`);
  const mid = visibleRange({scrollTop: (maxPx - VIEW) / 2, viewport: VIEW, rowHeight: H, total,
                            maxPx, overscan: 0});
  assert.ok(Math.abs(mid.first - (total - VIEW / H) / 2) <= 1, `middle at ${mid.first}`);
  // The drawn rows stay in the view.
  assert.ok(mid.topPx <= (maxPx - VIEW) / 2 && mid.topPx > (maxPx - VIEW) / 2 - H);
});

test('scrollTopFor inverts visibleRange', () => {
  for (const total of [100, 50_000, 1_000_000]) {
    for (const index of [0, Math.floor(total / 3), total - 30]) {
      const st = scrollTopFor({index, viewport: VIEW, rowHeight: H, total});
      const r = visibleRange({scrollTop: st, viewport: VIEW, rowHeight: H, total, overscan: 0});
      assert.ok(Math.abs(r.first - index) <= 1, `total ${total}: ${r.first} for ${index}`);
    }
  }
  const bottom = scrollTopFor({index: 1_000_000, viewport: VIEW, rowHeight: H, total: 1_000_000});
  assert.equal(visibleRange({scrollTop: bottom, viewport: VIEW, rowHeight: H,
                             total: 1_000_000}).last, 1_000_000);
});

test('missingBlocks names only the blocks with a hole', () => {
  const have = new Set([...Array(200).keys()]);  // block 0 is there
  assert.deepEqual(missingBlocks(150, 450, 200, (i) => have.has(i)), [200, 400]);
  assert.deepEqual(missingBlocks(0, 199, 200, (i) => have.has(i)), []);
  assert.deepEqual(missingBlocks(0, 0, 200, () => false), []);
});

// A capped diary as the store keeps it: lines 1..40 (the marker is 40),
// then the tail from line 913 on; served as GET /diary serves offset= and
// after= (the K-th stored line from 0; the lines numbered above N).
function cutDiary() {
  const stored = [];
  for (let n = 1; n <= 40; n++) stored.push({n, text: `head ${n}`});
  for (let n = 913; n <= 1200; n++) stored.push({n, text: `tail ${n}`});
  const serve = (query) => {
    const q = new URLSearchParams(query);
    const limit = Number(q.get('limit'));
    const from = q.has('offset') ? Number(q.get('offset'))
        : stored.findIndex((l) => l.n > Number(q.get('after')));
    return {lines: from < 0 ? [] : stored.slice(from, from + limit), total: stored.length};
  };
  return {stored, serve};
}

// Fills rows [first, last) the way the diary component does: the missing
// blocks, each fetched with its query and placed from its start.
function scroll(serve, query, first, last, block = 50) {
  const rows = new Map();
  for (const b of missingBlocks(first, last, block, (i) => rows.has(i))) {
    serve(query(b, block)).lines.forEach((l, i) => rows.set(b + i, l));
  }
  return rows;
}

test('diary rows by offset: each stored line once, in order, across the cut', () => {
  const {stored, serve} = cutDiary();
  assert.equal(diaryPageQuery(200, 50), 'offset=200&limit=50');
  assert.equal(diaryPageQuery(-3, 0), 'offset=0&limit=1');
  const total = serve(diaryPageQuery(0, 1)).total;
  const rows = scroll(serve, diaryPageQuery, 0, total);
  assert.equal(rows.size, stored.length);
  for (let i = 0; i < total; i++) assert.equal(rows.get(i).n, stored[i].n, `row ${i}`);
  // Scrolled to the rows around the cut only.
  const near = scroll(serve, diaryPageQuery, 30, 60, 20);
  assert.deepEqual([38, 39, 40, 41].map((i) => near.get(i).n), [39, 40, 913, 914]);
});

test('diary rows by line number repeat and lose lines at a cut', () => {
  // What the component did before (row i = the lines after number i): the
  // blocks past the cut all start at its first tail line again, and the
  // diary's end is never shown.
  const {stored, serve} = cutDiary();
  const rows = scroll(serve, (b, l) => `after=${b}&limit=${l}`, 0, stored.length);
  assert.equal(rows.get(40).n, 913);
  assert.equal(rows.get(50).n, 913, 'repeated');
  const shown = new Set([...rows.values()].map((l) => l.n));
  assert.ok(shown.size < stored.length, 'lines vanish by line number');
  assert.ok(!shown.has(1200));
});
