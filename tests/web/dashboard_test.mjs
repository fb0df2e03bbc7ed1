// Browser checks of the dashboard against a running dlbatch-scheduler:
// headless Debian chromium driven by puppeteer-core. Exits 0 when every
// check passes, 1 naming each failed one, 77 when it cannot run here.
// tests/integration/web_dashboard_test.cc prepares a real cluster and runs
// this; run by hand, point it at any scheduler holding such jobs.
//
// Environment:
//   DLBATCH_WEB_URL      the dashboard, e.g. https://127.0.0.1:8443 (any certificate)
//   DLBATCH_TOKEN        a user's (not an admin) token; that user owns the jobs below
//   DLBATCH_OTHER_TOKEN  another user's (not an admin) token
//   DLBATCH_XSS_ID       a running command job named `<img src=x onerror=alert(1)>`
//                        whose diary has the line `<script>window.pwned=1</script>`
//   DLBATCH_TRAIN_ID     a running train job that reports progress and diary
//                        lines every few seconds; the owner cancels it here
//   DLBATCH_SWEEP_ID, DLBATCH_ARRAY_ID  a sweep's and an array's id
//   DLBATCH_MIN_TOTAL    (optional) the least number of jobs the list must count
//   DLBATCH_SCREENSHOTS  a folder for a PNG of every page (optional)
//   DLBATCH_CHROMIUM     the browser (default /usr/bin/chromium)
//   DLBATCH_WEB_TEST_MODULES  the node_modules that `npm ci` of this folder's
//                        package.json filled (default: the one beside this file)
// The event streams stay open, so pages are waited for by their elements,
// never by network idleness.
import {existsSync, mkdirSync} from 'node:fs';
import https from 'node:https';
import {createRequire} from 'node:module';
import path from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';

const XSS_NAME = '<img src=x onerror=alert(1)>';
const XSS_LINE = '<script>window.pwned=1</script>';
const env = process.env;
const base = (env.DLBATCH_WEB_URL || '').replace(/\/$/, '');
const chromium = env.DLBATCH_CHROMIUM || '/usr/bin/chromium';
const shots = env.DLBATCH_SCREENSHOTS || '';
const needed = ['DLBATCH_WEB_URL', 'DLBATCH_TOKEN', 'DLBATCH_OTHER_TOKEN', 'DLBATCH_XSS_ID',
                'DLBATCH_TRAIN_ID', 'DLBATCH_SWEEP_ID', 'DLBATCH_ARRAY_ID'];
const unset = needed.filter((k) => !env[k]);
if (unset.length) {
  console.error(`dashboard_test: set ${unset.join(', ')}`);
  process.exit(2);
}
if (!existsSync(chromium)) {
  console.log(`SKIP: no browser at ${chromium} (apt-get install chromium)`);
  process.exit(77);
}
if (shots) mkdirSync(shots, {recursive: true});
const modules = env.DLBATCH_WEB_TEST_MODULES ||
    path.join(path.dirname(fileURLToPath(import.meta.url)), 'node_modules');
let puppeteer;
try {
  const entry = createRequire(path.join(modules, 'noop.js')).resolve('puppeteer-core');
  puppeteer = (await import(pathToFileURL(entry).href)).default;
} catch (e) {
  console.log(`SKIP: no puppeteer-core in ${modules} (npm ci in tests/web, or build the ` +
              `web-test-modules target, or set DLBATCH_WEB_TEST_MODULES)`);
  process.exit(77);
}
const xssId = env.DLBATCH_XSS_ID;
const trainId = env.DLBATCH_TRAIN_ID;
const minTotal = Number(env.DLBATCH_MIN_TOTAL || 1);

const failures = [];
let passed = 0;
async function check(name, fn) {
  const t0 = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok: ${name} (${Date.now() - t0} ms)`);
  } catch (e) {
    failures.push(name);
    console.log(`FAIL: ${name}: ${e && e.message ? e.message : e}`);
  }
}
function expect(cond, message) { if (!cond) throw new Error(message); }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function shot(page, name) {
  if (shots) await page.screenshot({path: path.join(shots, `${name}.png`)});
}

// A page that records what must never happen: a dialog (alert), an error
// thrown by the page, a request for the image `x`, a refusal by the
// Content-Security-Policy (the page's own securitypolicyviolation events
// and the console's reports of them).
async function watchedPage(browser, who) {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  await page.setViewport({width: 1280, height: 800});
  page.incidents = [];
  page.on('dialog', async (d) => {
    page.incidents.push(`${who}: a dialog opened: ${d.message()}`);
    await d.dismiss();
  });
  page.on('pageerror', (e) => page.incidents.push(`${who}: page error: ${e.message}`));
  // The API requests asked and not answered yet, for the failures' messages.
  page.pending = new Map();
  page.on('request', (r) => {
    if (/\/x$/.test(new URL(r.url()).pathname)) page.incidents.push(`${who}: requested ${r.url()}`);
    if (r.url().includes('/api/')) page.pending.set(r, Date.now());
  });
  page.progressLog = [];
  page.on('requestfinished', (r) => {
    if (r.url().includes('/progress')) page.progressLog.push(`${new URL(r.url()).search}:${Date.now() - page.pending.get(r)}ms`);
    page.pending.delete(r);
  });
  page.on('requestfailed', (r) => page.pending.delete(r));
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content.Security.Policy/i.test(m.text())) {
      page.incidents.push(`${who}: CSP refused something: ${m.text()}`);
    }
  });
  await page.exposeFunction('reportCspViolation', (what) =>
    page.incidents.push(`${who}: CSP violation: ${what}`));
  // The page's event streams, for the failures' messages: each one's URL,
  // state, and how many events of each kind it has had.
  await page.evaluateOnNewDocument(() => {
    const Original = window.EventSource;
    window.streams = [];
    window.EventSource = class extends Original {
      constructor(url, init) {
        super(url, init);
        const record = {url, counts: {}, opened: Date.now(), source: this};
        window.streams.push(record);
        for (const kind of ['job', 'worker', 'ready', 'lines', 'end']) {
          this.addEventListener(kind, () => { record.counts[kind] = (record.counts[kind] || 0) + 1; });
        }
      }
    };
  });
  await page.evaluateOnNewDocument(() => {
    document.addEventListener('securitypolicyviolation', (e) =>
      window.reportCspViolation(`${e.violatedDirective} ${e.blockedURI}`));
  });
  return page;
}

async function login(page, token) {
  await page.goto(`${base}/jobs`, {waitUntil: 'load'});
  await page.waitForSelector('#login-token', {timeout: 10000});
  await page.$eval('#login-token', (el) => { el.value = ''; });
  await page.type('#login-token', token);
  await Promise.all([page.waitForNavigation({waitUntil: 'load'}),
                     page.click('#login-submit')]);
  await page.waitForSelector('#jobs-table', {timeout: 20000});
}

// The API from inside the signed-in page (its cookie, its certificate).
function api(page, p, {method = 'GET', csrf} = {}) {
  return page.evaluate(async (url, method, csrf) => {
    const headers = {'Content-Type': 'application/json'};
    if (csrf) headers['X-CSRF-Token'] = csrf;
    const r = await fetch(url, {method, credentials: 'same-origin', headers,
                                body: method === 'GET' ? undefined : '{}'});
    return {status: r.status, body: await r.json().catch(() => null)};
  }, p, method, csrf || '');
}

// A request from outside any browser with just this cookie header.
function rawGet(p, cookie) {
  return new Promise((resolve, reject) => {
    const req = https.request(`${base}${p}`, {headers: {Cookie: cookie}, rejectUnauthorized: false},
                              (res) => { res.resume(); resolve(res.statusCode); });
    req.on('error', reject);
    req.end();
  });
}

async function jobPage(page, id) {
  await page.goto(`${base}/jobs/${id}`, {waitUntil: 'load'});
  await page.waitForSelector('#job-state', {timeout: 15000});
}
const pointsOf = (page) => page.$eval('#loss-chart', (el) => Number(el.dataset.points || 0));
const lastDiaryLine = (page) => page.$$eval('#diary .line[data-n]',
    (l) => l.reduce((m, el) => Math.max(m, Number(el.dataset.n)), 0));

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  acceptInsecureCerts: true,
  args: ['--no-sandbox', '--ignore-certificate-errors', '--disable-gpu',
         '--disable-dev-shm-usage'],
});
let exitCode = 1;
try {
  const page = await watchedPage(browser, 'owner');
  await check('a wrong token is refused with a message', async () => {
    await page.goto(`${base}/`, {waitUntil: 'load'});
    await page.waitForSelector('#login-token', {timeout: 10000});
    await shot(page, 'login');
    await page.type('#login-token', 'not-a-token');
    await page.click('#login-submit');
    await page.waitForSelector('#login-error:not([hidden])', {timeout: 10000});
  });
  await check('login with a token on the login page works', async () => {
    await login(page, env.DLBATCH_TOKEN);
    const who = await page.$eval('#session-user', (el) => el.textContent);
    expect(who.length > 0, 'no user shown in the header');
  });
  await check('the session cookie is HttpOnly, Secure and SameSite=Strict', async () => {
    const cookie = (await page.cookies()).find((c) => c.name === 'dlbatch_session');
    expect(cookie, 'no dlbatch_session cookie');
    expect(cookie.httpOnly, 'not HttpOnly');
    expect(cookie.secure, 'not Secure');
    expect(cookie.sameSite === 'Strict', `SameSite=${cookie.sameSite}`);
    expect(await page.evaluate(() => document.cookie) === '', 'the page script can read it');
  });
  await check(`the jobs list shows a page of 100 and the total (at least ${minTotal})`, async () => {
    await page.waitForSelector('#jobs-table tbody tr[data-job-id]', {timeout: 20000});
    const n = await page.$$eval('#jobs-table tbody tr[data-job-id]', (rows) => rows.length);
    expect(n === 100, `${n} rows`);
    const range = await page.$eval('#jobs-range', (el) => el.textContent);
    const m = range.match(/^1–100 of (\d+)$/);
    expect(m && Number(m[1]) >= minTotal, `the range reads "${range}"`);
    await shot(page, 'jobs');
  });
  await check('a job name with markup is text in the list', async () => {
    await page.goto(`${base}/jobs?q=${encodeURIComponent('<img')}`, {waitUntil: 'load'});
    await page.waitForSelector(`#jobs-table tr[data-job-id="${xssId}"]`, {timeout: 15000});
    const cell = await page.$eval(`#jobs-table tr[data-job-id="${xssId}"] td.name`,
                                  (el) => ({text: el.textContent, imgs: el.querySelectorAll('img').length}));
    expect(cell.text.includes(XSS_NAME), `the cell reads "${cell.text}"`);
    expect(await page.$$eval('img', (l) => l.length) === 0, 'the page holds an <img>');
  });
  await check('a job name and diary lines with markup are text on its page', async () => {
    await jobPage(page, xssId);
    const name = await page.$eval('#job-name', (el) => el.textContent);
    expect(name === XSS_NAME, `the heading reads "${name}"`);
    // It reports no progress: a note, not an empty chart.
    await page.waitForSelector('#no-progress', {timeout: 10000});
    expect(await page.$('#loss-chart') === null, 'an empty loss chart is drawn');
    await page.waitForFunction((line) => [...document.querySelectorAll('#diary .text')]
        .some((el) => el.textContent.includes(line)), {timeout: 15000}, XSS_LINE);
    const texts = await page.$$eval('#diary .text', (l) => l.map((el) => el.textContent));
    expect(texts.some((t) => t.includes('<img src=x onerror=alert(2)>')), 'no <img> line as text');
    expect(texts.some((t) => t.includes('\u241b[31mred')), `escapes not shown: ${JSON.stringify(texts)}`);
    expect(texts.some((t) => t.includes('bad utf-8:') && t.includes('end')),
           `the line of bad bytes is gone: ${JSON.stringify(texts)}`);
    expect(await page.evaluate(() => window.pwned) === undefined, 'window.pwned is set');
    expect(await page.$$eval('img, #diary script', (l) => l.length) === 0, 'an <img> or <script> was made');
    await shot(page, 'job-markup');
  });
  await check('a POST without the CSRF token is refused 403', async () => {
    const r = await api(page, `/api/v1/jobs/${xssId}/cancel`, {method: 'POST'});
    expect(r.status === 403, `answered ${r.status}`);
    const j = await api(page, `/api/v1/jobs/${xssId}`);
    expect(j.body && j.body.state === 'running', `the job is ${j.body && j.body.state}`);
  });
  await check("a running train job's loss curve grows while the page is open", async () => {
    await jobPage(page, trainId);
    await page.waitForSelector('#loss-chart', {timeout: 15000});
    const seen = [];
    for (let t0 = Date.now(); Date.now() - t0 < 30000;) {
      seen.push(await pointsOf(page));
      if (seen[0] > 0 && seen[seen.length - 1] > seen[0]) break;
      await sleep(500);
    }
    const first = seen[0], last = seen[seen.length - 1];
    if (!(first > 0 && last > first)) {
      const r = await api(page, `/api/v1/jobs/${trainId}/progress`);
      const diary = await api(page, `/api/v1/jobs/${trainId}/diary?tail=3`);
      const cookie = (await page.cookies()).find((c) => c.name === 'dlbatch_session');
      const sse = await new Promise((resolve) => {
        let text = '';
        const req = https.request(`${base}/api/v1/events`, {headers: {Cookie: `dlbatch_session=${cookie.value}`},
                                                              rejectUnauthorized: false}, (res) => {
          res.on('data', (d) => { text += d; });
        });
        req.on('error', (e) => resolve(`error ${e}`));
        req.end();
        setTimeout(() => { req.destroy(); resolve(`${(text.match(/event: job/g) || []).length} job events, ` +
            `${(text.match(new RegExp(`"id":${trainId},`, 'g')) || []).length} of the train job, ready: ${text.includes('event: ready')}`); }, 4000);
      });
      const streams = await page.evaluate(() => JSON.stringify(window.streams.map((r) => ({
        url: r.url, state: r.source.readyState, counts: r.counts, age: Date.now() - r.opened}))));
      const open = [...page.pending].map(([r, t]) =>
        `${new URL(r.url()).pathname}${new URL(r.url()).search} (${Date.now() - t} ms)`);
      throw new Error(`the chart's points over 30 s: ${seen.join(' ')}; progress requests: ${page.progressLog.length} ${page.progressLog.slice(-8).join(' ')}; the page's streams: ${streams}; a new event stream in 4 s: ${sse}; open requests: ${open.join(', ')}; the API has ` +
                      `${r.body && r.body.points && r.body.points.length} points; the diary ends ` +
                      JSON.stringify(diary.body && diary.body.lines.map((l) => l.text)));
    }
    await shot(page, 'job');
  });
  await check("its diary follows: a new line appears without a reload", async () => {
    await page.waitForFunction(() => document.querySelectorAll('#diary .line[data-n]').length > 0,
                               {timeout: 20000});
    expect(await page.$eval('#diary-follow', (el) => el.checked), 'follow is off');
    const before = await lastDiaryLine(page);
    await page.waitForFunction((n) => [...document.querySelectorAll('#diary .line[data-n]')]
        .some((el) => Number(el.dataset.n) > n), {timeout: 30000}, before);
  });
  await check('the owner cancels it with its button', async () => {
    await page.waitForSelector('button[data-action="cancel"]', {timeout: 10000});
    await page.click('button[data-action="cancel"]');
    await page.waitForSelector('#job-state[data-state="cancelled"]', {timeout: 60000});
  });
  // The sweep's and the array's command jobs report no progress: a note,
  // not an empty chart, and no metric column of zeros.
  for (const [name, p, sel] of [['sweep', `/sweeps/${env.DLBATCH_SWEEP_ID}`, '#group-no-curves'],
                                ['array', `/arrays/${env.DLBATCH_ARRAY_ID}`, '#group-no-curves'],
                                ['queue', '/queue', '#queue-table tbody tr'],
                                ['cluster', '/cluster', '#workers-table tbody tr']]) {
    await check(`the ${name} page renders`, async () => {
      await page.goto(`${base}${p}`, {waitUntil: 'load'});
      await page.waitForSelector(sel, {timeout: 20000});
      if (name === 'sweep' || name === 'array') {
        await page.waitForSelector('#group-table tbody tr', {timeout: 20000});
        const values = await page.$$eval('#group-table tbody tr td:nth-child(6)', (l) => l.map((td) => td.textContent));
        expect(values.every((v) => v === ''), `the loss column reads ${values.join(', ')}`);
        const facts = await page.$eval('#group-summary', (el) => el.textContent);
        expect(/states\s*finished \d+/.test(facts), `the summary reads "${facts}"`);
      }
      await sleep(300);  // the chart and the rows settle
      await shot(page, name);
    });
  }

  await check("the list filtered to the owner's jobs shows them with their states", async () => {
    const who = await page.$eval('#session-user', (el) => el.textContent.replace(/ \(admin\)$/, ''));
    await page.goto(`${base}/jobs?user=${encodeURIComponent(who)}`, {waitUntil: 'load'});
    await page.waitForSelector(`#jobs-table tr[data-job-id="${trainId}"] [data-state="cancelled"]`,
                               {timeout: 20000});
    const users = await page.$$eval('#jobs-table tbody tr[data-user]', (l) => l.map((r) => r.dataset.user));
    expect(users.length > 0 && users.every((u) => u === who), `rows of ${[...new Set(users)].join(', ')}`);
    await shot(page, 'jobs-user');
  });

  const other = await watchedPage(browser, 'other user');
  await check('the other user logs in', () => login(other, env.DLBATCH_OTHER_TOKEN));
  await check("another user's job has no cancel button and no select box", async () => {
    await jobPage(other, xssId);
    const n = await other.$$eval('button[data-action]', (b) => b.length);
    expect(n === 0, `${n} action button(s) shown`);
    await shot(other, 'job-other-user');
    await other.goto(`${base}/jobs?q=${encodeURIComponent('<img')}`, {waitUntil: 'load'});
    await other.waitForSelector(`#jobs-table tr[data-job-id="${xssId}"]`, {timeout: 15000});
    const boxes = await other.$$eval(`#jobs-table tr[data-job-id="${xssId}"] input[data-select]`,
                                     (l) => l.length);
    expect(boxes === 0, 'the row can be selected');
  });
  await check("the other user's cancel, with their session and CSRF token, is refused 403", async () => {
    const s = await api(other, '/api/v1/session');
    expect(s.status === 200 && s.body.csrf, `GET /api/v1/session answered ${s.status}`);
    const r = await api(other, `/api/v1/jobs/${xssId}/cancel`, {method: 'POST', csrf: s.body.csrf});
    expect(r.status === 403, `answered ${r.status} ${JSON.stringify(r.body)}`);
    const j = await api(page, `/api/v1/jobs/${xssId}`);  // the owner's view
    expect(j.body && j.body.state === 'running', `the job is ${j.body && j.body.state}`);
  });
  await check('log out revokes the session: its old cookie gets 401', async () => {
    const cookie = (await other.cookies()).find((c) => c.name === 'dlbatch_session');
    expect(cookie, 'no cookie');
    const jar = `dlbatch_session=${cookie.value}`;
    expect(await rawGet('/api/v1/session', jar) === 200, 'the cookie did not work before');
    await Promise.all([other.waitForNavigation({waitUntil: 'load'}), other.click('#logout')]);
    await other.waitForSelector('#login-token', {timeout: 10000});
    const after = await rawGet('/api/v1/session', jar);
    expect(after === 401, `GET /api/v1/session with the old cookie answers ${after}`);
    expect(await rawGet('/api/v1/jobs', jar) === 401, 'GET /api/v1/jobs still answers');
  });
  await check('nothing ran that should not (no dialog, no page error, no CSP violation)', async () => {
    expect(await page.evaluate(() => window.pwned) === undefined, 'window.pwned is set');
    const all = [...page.incidents, ...other.incidents];
    expect(all.length === 0, all.join('; '));
  });
  exitCode = failures.length ? 1 : 0;
} catch (e) {
  console.log(`FAIL: the checks stopped: ${e && e.stack ? e.stack : e}`);
  failures.push('stopped');
} finally {
  await browser.close();
}
console.log(`${passed} passed, ${failures.length} failed`);
if (failures.length) console.log(`dashboard_test: failed: ${failures.join(' | ')}`);
process.exit(exitCode);
