// The diary's fetch delay: a scroll from rest fetches at once (the page's
// jump to the end as it opens waited 60 ms before), a scroll going on
// fetches once when it pauses.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {leadingDebounce} from '../../../scheduler/web/ui/src/vscroll.js';

// setTimeout/clearTimeout on a clock the test moves.
function fakeTimers() {
  let now = 0, next = 1;
  const pending = new Map();
  return {
    setTimeout(fn, ms) { pending.set(next, {at: now + ms, fn}); return next++; },
    clearTimeout(id) { pending.delete(id); },
    advance(ms) {
      now += ms;
      for (const [id, t] of [...pending]) {
        if (t.at <= now) { pending.delete(id); t.fn(); }
      }
    },
  };
}

test('the first call from rest runs at once', () => {
  const timers = fakeTimers();
  let runs = 0;
  const d = leadingDebounce(() => runs++, 60, timers);
  d.call();
  assert.equal(runs, 1);
  timers.advance(60);  // the trailing run: a no-op fetch where nothing moved
  assert.equal(runs, 2);
  d.call();  // from rest again
  assert.equal(runs, 3);
});

test('a stream of calls runs once more when it pauses', () => {
  const timers = fakeTimers();
  let runs = 0;
  const d = leadingDebounce(() => runs++, 60, timers);
  for (let i = 0; i < 10; i++) { d.call(); timers.advance(16); }
  assert.equal(runs, 1);
  timers.advance(60);
  assert.equal(runs, 2);
});

test('cancel drops the pending run', () => {
  const timers = fakeTimers();
  let runs = 0;
  const d = leadingDebounce(() => runs++, 60, timers);
  d.call();
  d.cancel();
  timers.advance(100);
  assert.equal(runs, 1);
});
