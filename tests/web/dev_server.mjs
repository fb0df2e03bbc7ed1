// A stand-in for dlbatch-scheduler's HTTPS face, for working on the
// dashboard without a cluster (plain HTTP on loopback): the built pages
// under the same CSP, and canned API replies in the shapes of
// docs/user-guide.md "JSON output" (two users, a job whose name and diary
// hold markup, a 1,000,000-line diary). Not a test of the server: the
// integration harness runs dashboard_test.mjs against the real one.
//   node dev_server.mjs WEB_DIR PORT     (tokens: alice-token, bob-token)
import {readFileSync} from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const [webDir, port = '8787'] = process.argv.slice(2);
const users = {'alice-token': 'alice', 'bob-token': 'bob'};
const sessions = new Map();
const now = '2026-11-25T11:22:33.456Z';
const job = (id, name, user, state, extra = {}) => ({
  id, name, user, state, attempt: 1, profile: 'local', pool: 1, priority: 0, sweep_id: 0,
  held: false, after: [], submit_time: now, start_time: state === 'queued' ? null : now,
  end_time: null, exit_code: 0, reason: '', wait_reason: state === 'queued' ? 'no free slot' : '',
  diary_lines: 0, placement: state === 'running' ? [{worker_id: 1, worker_name: 'w1', devices: [0]}] : [],
  progress: {iteration: 40, iterations: 100, epoch: 1, epochs: 3, loss: 0.4, accuracy: 0.8,
             metrics: {}}, history: [{state: 'queued', time: now, attempt: 1, reason: ''}],
  array_id: 0, array_index: 0, array_limit: 0, ...extra});
const jobs = [job(1, '<img src=x onerror=alert(1)>', 'alice', 'running'),
              job(2, 'resnet', 'alice', 'queued'), job(3, 'bob-job', 'bob', 'running')];
const DIARY = 1_000_000;
const line = (n) => ({n, time: now, stream: 1, attempt: 1, seq: n, part: 0, rank: 0,
                      text: n === 3 ? '<script>window.pwned=1</script>' : `line ${n}`,
                      ending: '\n'});
const types = {'.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css'};

function send(res, status, body, headers = {}) {
  res.writeHead(status, {'Content-Type': 'application/json', ...headers});
  res.end(body === null ? '' : JSON.stringify(body));
}
function caller(req) {
  const m = /dlbatch_session=([^;]+)/.exec(req.headers.cookie || '');
  return m && sessions.get(m[1]);
}

http.createServer((req, res) => {
  const url = new URL(req.url, 'http://x');
  const p = url.pathname;
  res.setHeader('Content-Security-Policy', "default-src 'self'");
  const who = caller(req);
  if (p === '/api/v1/login' && req.method === 'POST') {
    let body = '';
    req.on('data', (c) => { body += c; });
    req.on('end', () => {
      const user = users[JSON.parse(body || '{}').token];
      if (!user) return send(res, 401, {error: {code: 'UNAUTHENTICATED', message: 'bad token'}});
      const id = Math.random().toString(36).slice(2);
      const s = {user, admin: false, csrf: 'c' + id, expires: now};
      sessions.set(id, s);
      send(res, 200, s, {'Set-Cookie': `dlbatch_session=${id}; Path=/; HttpOnly; SameSite=Strict`});
    });
    return;
  }
  if (p.startsWith('/assets/')) {
    try {
      const f = readFileSync(path.join(webDir, 'assets', path.basename(p)));
      res.writeHead(200, {'Content-Type': types[path.extname(p)] || 'application/octet-stream'});
      return res.end(f);
    } catch (e) { return send(res, 404, {error: {code: 'NOT_FOUND', message: p}}); }
  }
  if (!p.startsWith('/api/')) {
    res.writeHead(200, {'Content-Type': 'text/html'});
    return res.end(readFileSync(path.join(webDir, who ? 'index.html' : 'login.html')));
  }
  if (!who) return send(res, 401, {error: {code: 'UNAUTHENTICATED', message: 'sign in'}});
  if (p === '/api/v1/session') return send(res, 200, who);
  if (p === '/api/v1/logout') {
    for (const [k, v] of sessions) if (v === who) sessions.delete(k);
    return send(res, 204, null);
  }
  if (p === '/api/v1/jobs') {
    const q = url.searchParams.get('q') || '';
    const list = jobs.filter((j) => j.name.includes(q));
    return send(res, 200, {jobs: list, total: list.length, offset: 0, limit: 100});
  }
  if (p === '/api/v1/events' || /diary\/events$/.test(p)) {
    res.writeHead(200, {'Content-Type': 'text/event-stream'});
    res.write('event: ready\ndata: {}\n\n');
    return;  // held open
  }
  let m;
  if ((m = /^\/api\/v1\/jobs\/(\d+)$/.exec(p))) {
    const j = jobs.find((x) => x.id === Number(m[1]));
    return j ? send(res, 200, j) : send(res, 404, {error: {code: 'NOT_FOUND', message: 'no job'}});
  }
  if (/\/progress$/.test(p)) {
    const after = Number(url.searchParams.get('after') || 0);
    const points = after ? [] : Array.from({length: 50}, (_, i) => ({seq: i + 1, time: now,
      iteration: i * 10, epoch: 0, loss: 2 / (i + 1), accuracy: 1 - 1 / (i + 2), validation_loss: null,
      validation_accuracy: null, learn_rate: 0.01, images_per_s: 100, metrics: {}}));
    return send(res, 200, {points, next: 50});
  }
  if (/\/diary$/.test(p)) {
    const tail = Number(url.searchParams.get('tail') || 0);
    const after = tail ? DIARY - tail : Number(url.searchParams.get('after') || 0);
    const limit = tail || Number(url.searchParams.get('limit') || 100);
    const lines = [];
    for (let n = after + 1; n <= Math.min(DIARY, after + limit); n++) lines.push(line(n));
    return send(res, 200, {lines, total: DIARY, ended: false});
  }
  if (/\/outputs$/.test(p)) return send(res, 200, {files: [{path: 'model/best.onnx', size: 12345,
    sha256: 'ab'.repeat(32), mode: 420, symlink: ''}]});
  if (p === '/api/v1/queue') return send(res, 200, {jobs: [{...jobs[1], position: 1}]});
  if (p === '/api/v1/workers') return send(res, 200, {workers: [{id: 1, name: 'w1', host: 'h1',
    profile: 'local', online: true, draining: false, drain_reason: '', version: '1', slots: 2,
    free_slots: 1, devices: [], running_jobs: [1], last_seen: now}]});
  if (p === '/api/v1/profiles') return send(res, 200, {profiles: []});
  send(res, 404, {error: {code: 'NOT_FOUND', message: p}});
}).listen(Number(port), '127.0.0.1', () => console.log(`dev_server on http://127.0.0.1:${port}`));
