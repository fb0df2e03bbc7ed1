// A job's diary as a virtual scroll: fixed row height, only the lines in
// view are drawn, and only their blocks are fetched (GET /diary?offset=&
// limit=); the count comes from the replies. Follow mode sticks to the
// tail and takes new lines from /diary/events (after the newest line
// number seen). Row i is the i-th stored line, by position, not line
// number: a capped diary's numbers jump where it was cut. So a
// 1,000,000-line diary costs what 60 lines cost.
import {useEffect, useRef, useState} from 'preact/hooks';
import {getJson, openSource} from '../api.js';
import {formatClock, visibleText} from '../format.js';
import {diaryPageQuery, leadingDebounce, missingBlocks, scrollTopFor, visibleRange} from
    '../vscroll.js';
import {html} from '../ui.js';

export const ROW_HEIGHT = 18;
const BLOCK = 200;
const KEEP = 20000;  // lines kept in memory; those far from the view go
const FETCH_DELAY_MS = 60;

export function Diary({jobId, ended}) {
  const view = useRef(null);
  const st = useRef({lines: new Map(), total: 0, pending: new Set(), fetcher: null,
                     source: null, lastN: 0, follow: false, gone: false,
                     autoTop: 0});
  const [, redraw] = useState(0);
  const [range, setRange] = useState({first: 0, last: 0, topPx: 0, spacerPx: 0});
  const [follow, setFollowState] = useState(!ended);
  const [done, setDone] = useState(ended);
  const bump = () => redraw((x) => x + 1);

  const measure = () => {
    const el = view.current;
    if (!el) return;
    const s = st.current;
    const r = visibleRange({scrollTop: el.scrollTop, viewport: el.clientHeight,
                            rowHeight: ROW_HEIGHT, total: s.total});
    setRange(r);
    return r;
  };

  const place = (start, lines) => {
    const s = st.current;
    lines.forEach((l, i) => s.lines.set(start + i, l));
    if (lines.length) s.lastN = Math.max(s.lastN, lines[lines.length - 1].n);
    if (s.lines.size > KEEP) {
      const el = view.current;
      const r = visibleRange({scrollTop: el ? el.scrollTop : 0,
                              viewport: el ? el.clientHeight : 400,
                              rowHeight: ROW_HEIGHT, total: s.total});
      for (const k of s.lines.keys()) {
        if (k < r.first - KEEP / 4 || k > r.last + KEEP / 4) s.lines.delete(k);
      }
    }
  };

  const fetchVisible = () => {
    const s = st.current;
    const r = measure();
    if (!r) return;
    for (const b of missingBlocks(r.first, r.last, BLOCK, (i) => s.lines.has(i))) {
      if (s.pending.has(b)) continue;
      s.pending.add(b);
      getJson(`/api/v1/jobs/${jobId}/diary?${diaryPageQuery(b, BLOCK)}`).then((reply) => {
        s.pending.delete(b);
        if (typeof reply.total === 'number' && reply.total > s.total) s.total = reply.total;
        place(b, reply.lines || []);
        measure();
        bump();
      }, () => s.pending.delete(b));
    }
  };

  // The first scroll from rest (the jump to the end as the page opens, a
  // drag of the scrollbar) fetches its rows at once; a scroll going on
  // fetches when it pauses.
  const scheduleFetch = () => {
    const s = st.current;
    s.fetchVisible = fetchVisible;  // this render's (the debounce outlives it)
    if (!s.fetcher) s.fetcher = leadingDebounce(() => s.fetchVisible(), FETCH_DELAY_MS);
    s.fetcher.call();
  };

  const toBottom = () => {
    const el = view.current;
    if (!el) return;
    el.scrollTop = scrollTopFor({index: st.current.total, viewport: el.clientHeight,
                                 rowHeight: ROW_HEIGHT, total: st.current.total});
    st.current.autoTop = el.scrollTop;  // where follow put it (see onScroll)
    measure();
  };

  const closeStream = () => {
    const s = st.current;
    if (s.source) s.source.close();
    s.source = null;
  };

  const openStream = () => {
    const s = st.current;
    closeStream();
    const es = openSource(`/api/v1/jobs/${jobId}/diary/events?after=${s.lastN}`);
    es.addEventListener('lines', (e) => {
      let data;
      try {
        data = JSON.parse(e.data);
      } catch (err) {
        return;
      }
      const lines = (data.lines || []).filter((l) => l.n > s.lastN);
      if (lines.length === 0) return;
      const start = s.total;
      s.total += lines.length;
      place(start, lines);
      if (s.follow) requestAnimationFrame(toBottom);
      bump();
    });
    es.addEventListener('end', () => {
      closeStream();
      setDone(true);
    });
    s.source = es;
  };

  // Follow: the tail now, then the stream; leaving it closes the stream.
  const setFollow = async (on) => {
    const s = st.current;
    s.follow = on;
    setFollowState(on);
    if (!on) { closeStream(); return; }
    try {
      const reply = await getJson(`/api/v1/jobs/${jobId}/diary?tail=${BLOCK}`);
      const lines = reply.lines || [];
      s.total = Math.max(reply.total || 0, lines.length);
      place(s.total - lines.length, lines);
      if (reply.ended) setDone(true);
      requestAnimationFrame(toBottom);
      bump();
      // The page may have gone meanwhile: a stream opened now would stay.
      if (!reply.ended && s.follow && !s.gone) openStream();
    } catch (e) { /* shown as an empty diary */ }
  };

  useEffect(() => {
    const s = st.current;
    if (follow) {
      setFollow(true);
    } else {
      getJson(`/api/v1/jobs/${jobId}/diary?${diaryPageQuery(0, BLOCK)}`).then((reply) => {
        s.total = reply.total || 0;
        place(0, reply.lines || []);
        measure();
        bump();
      }, () => {});
    }
    return () => { s.gone = true; closeStream(); if (s.fetcher) s.fetcher.cancel(); };
  }, [jobId]);

  const onScroll = () => {
    const el = view.current;
    const s = st.current;
    // Scrolling up away from the tail leaves follow mode: up from where
    // follow last put the view, not a view left behind by lines that came
    // meanwhile (their rows grow the diary before follow scrolls again).
    if (s.follow && el.scrollTop < (s.autoTop || 0) - ROW_HEIGHT &&
        el.scrollTop + el.clientHeight < el.scrollHeight - 2 * ROW_HEIGHT) {
      setFollow(false);
    }
    measure();
    scheduleFetch();
  };

  const s = st.current;
  const rows = [];
  for (let i = range.first; i < range.last; i++) {
    const l = s.lines.get(i);
    rows.push(l ? html`<div class=${'line stream-' + l.stream} key=${i} data-n=${l.n}>
        <span class="n">${l.n}</span><span class="t">${formatClock(l.time)}</span>${
        l.rank !== null && l.rank !== undefined ? html`<span class="r">${l.rank}</span>` : ''}<span
        class="text">${visibleText(l.text)}</span></div>`
      : html`<div class="line loading" key=${i}><span class="n"></span></div>`);
  }
  return html`
    <div class="diary-bar">
      <label><input type="checkbox" id="diary-follow" checked=${follow}
          onChange=${(e) => setFollow(e.target.checked)} /> follow</label>
      <span class="muted" id="diary-total">${s.total} lines${done ? '' : ', running'}</span>
    </div>
    <div id="diary" class="diary" ref=${view} onScroll=${onScroll} tabindex="0">
      <div class="spacer" ref=${(el) => el && (el.style.height = `${range.spacerPx}px`)}></div>
      <div class="rows" ref=${(el) => el && (el.style.transform = `translateY(${range.topPx}px)`)}>${rows}</div>
    </div>`;
}
