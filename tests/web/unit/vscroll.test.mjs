// The diary's virtual scroll: the rows in view, end to end, for a small
// diary and for a 1,000,000-line one (whose spacer is capped).
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {missingBlocks, scrollTopFor, visibleRange} from
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
