// The jobs list's filters <-> the page's query string <-> the API's (pure).
import {STATES} from './format.js';

const SORTS = ['id', 'submit_time', 'name', 'user', 'state', 'priority'];
export const PAGE = 100;

export function readJobsParams(search) {
  const q = new URLSearchParams(search);
  const asked = new Set((q.get('state') || '').split(','));
  const states = STATES.filter((s) => asked.has(s));
  const sort = SORTS.includes(q.get('sort')) ? q.get('sort') : 'id';
  const order = q.get('order') === 'asc' ? 'asc' : 'desc';
  const offset = Math.max(0, parseInt(q.get('offset') || '0', 10) || 0);
  return {states, q: q.get('q') || '', user: q.get('user') || '', sort, order,
          offset, limit: PAGE};
}

function entries(p) {
  const out = [];
  if (p.states.length) out.push(['state', p.states.join(',')]);
  if (p.q) out.push(['q', p.q]);
  if (p.user) out.push(['user', p.user]);
  if (p.sort !== 'id') out.push(['sort', p.sort]);
  if (p.order !== 'desc') out.push(['order', p.order]);
  if (p.offset) out.push(['offset', String(p.offset)]);
  return out;
}

// The page's own query string ('' for the defaults).
export function writeJobsParams(p) {
  const s = new URLSearchParams(entries(p)).toString();
  return s ? '?' + s : '';
}

// The API's: GET /api/v1/jobs + this.
export function jobsQuery(p) {
  const q = new URLSearchParams(entries(p));
  q.set('sort', p.sort);
  q.set('order', p.order);
  q.set('limit', String(p.limit));
  q.set('offset', String(p.offset));
  return '?' + q.toString();
}
