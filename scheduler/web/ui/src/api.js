// The dashboard's only way to the server: JSON over fetch (the session
// cookie; X-CSRF-Token on every POST) and the scheduler's event stream.

let session = null;

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.status = status;
    this.code = code;
  }
}

// Back to the login page, which returns here once signed in.
export function toLogin() {
  const next = location.pathname + location.search;
  location.replace('/login?next=' + encodeURIComponent(next));
}

async function parse(res) {
  if (res.status === 204) return null;
  let body = null;
  try {
    body = await res.json();
  } catch (e) {
    body = null;
  }
  if (res.ok) return body;
  if (res.status === 401) toLogin();
  const err = body && body.error ? body.error : {};
  throw new ApiError(res.status, err.code || String(res.status),
                     err.message || `${res.status} ${res.statusText}`);
}

export async function loadSession() {
  session = await parse(await fetch('/api/v1/session', {credentials: 'same-origin'}));
  return session;
}

export function currentSession() { return session; }

export async function getJson(path) {
  return parse(await fetch(path, {credentials: 'same-origin',
                                  headers: {Accept: 'application/json'}}));
}

export async function postJson(path, body) {
  return parse(await fetch(path, {
    method: 'POST',
    credentials: 'same-origin',
    headers: {'Content-Type': 'application/json',
              'X-CSRF-Token': session ? session.csrf : ''},
    body: body === undefined ? undefined : JSON.stringify(body),
  }));
}

export async function logout() {
  try {
    await postJson('/api/v1/logout');
  } finally {
    location.replace('/login');
  }
}

// Every event stream the app opens goes through here, so that leaving the
// page closes them all. A page the browser keeps in its back/forward cache
// keeps its connections open otherwise, and over HTTP/1.1 a browser opens
// at most six to one host: a few pages left behind (two streams each) and
// the current page's requests wait for a connection to free up, which can
// take until the server's next heartbeat finds the stream gone. A page
// brought back from that cache is loaded afresh, streams and all.
const sources = new Set();

export function openSource(url) {
  const es = new EventSource(url);
  sources.add(es);
  const close = es.close.bind(es);
  es.close = () => {
    sources.delete(es);
    close();
  };
  return es;
}

addEventListener('pagehide', () => {
  for (const es of [...sources]) es.close();
  events = null;
});
addEventListener('pageshow', (e) => { if (e.persisted) location.reload(); });

// One EventSource on /api/v1/events for the whole app; pages subscribe to
// its `job` and `worker` events and get the parsed JSON.
const listeners = {job: new Set(), worker: new Set()};
let events = null;

function openEvents() {
  if (events) return;
  events = openSource('/api/v1/events');
  for (const kind of Object.keys(listeners)) {
    events.addEventListener(kind, (e) => {
      let data;
      try {
        data = JSON.parse(e.data);
      } catch (err) {
        return;
      }
      for (const fn of listeners[kind]) fn(data);
    });
  }
}

export function subscribe(kind, fn) {
  openEvents();
  listeners[kind].add(fn);
  return () => listeners[kind].delete(fn);
}

// Bulk actions: {"results":[{"job","ok","message"}]}.
export function actOn(action, ids, reason) {
  const body = {ids};
  if (reason) body.reason = reason;
  return postJson(`/api/v1/jobs/${action}`, body);
}
