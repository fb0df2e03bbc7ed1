// Browser checks of the dashboard against a running dlbatch-scheduler:
// headless Debian chromium driven by puppeteer-core. Exits 0 when every
// check passes, 1 naming each failed one, 77 when it cannot run here.
//
// Environment:
//   DLBATCH_WEB_URL      the dashboard, e.g. https://127.0.0.1:8443 (any certificate)
//   DLBATCH_TOKEN        a user's token; that user owns a job named
//                        `<img src=x onerror=alert(1)>` whose diary has the
//                        line `<script>window.pwned=1</script>`
//   DLBATCH_OTHER_TOKEN  another user's (not an admin) token; that user sees
//                        the job above as someone else's
//   DLBATCH_SCREENSHOTS  a folder for a PNG of every page (optional)
//   DLBATCH_SWEEP_ID, DLBATCH_ARRAY_ID  (optional) pages to open too
//   DLBATCH_CHROMIUM     the browser (default /usr/bin/chromium)
//   DLBATCH_WEB_TEST_MODULES  the node_modules that `npm ci` of this folder's
//                        package.json filled (default: the one beside this file)
// The event streams stay open, so pages are waited for by their elements,
// never by network idleness.
import {existsSync, mkdirSync} from 'node:fs';
import {createRequire} from 'node:module';
import path from 'node:path';
import {fileURLToPath, pathToFileURL} from 'node:url';

const XSS_NAME = '<img src=x onerror=alert(1)>';
const XSS_LINE = '<script>window.pwned=1</script>';
const env = process.env;
const base = (env.DLBATCH_WEB_URL || '').replace(/\/$/, '');
const chromium = env.DLBATCH_CHROMIUM || '/usr/bin/chromium';
const shots = env.DLBATCH_SCREENSHOTS || '';
if (!base || !env.DLBATCH_TOKEN || !env.DLBATCH_OTHER_TOKEN) {
  console.error('dashboard_test: set DLBATCH_WEB_URL, DLBATCH_TOKEN and DLBATCH_OTHER_TOKEN');
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
  console.log(`SKIP: no puppeteer-core in ${modules} (npm ci in tests/web, or set ` +
              `DLBATCH_WEB_TEST_MODULES)`);
  process.exit(77);
}

const failures = [];
let passed = 0;
async function check(name, fn) {
  try {
    await fn();
    passed++;
    console.log(`ok: ${name}`);
  } catch (e) {
    failures.push(name);
    console.log(`FAIL: ${name}: ${e && e.message ? e.message : e}`);
  }
}
function expect(cond, message) { if (!cond) throw new Error(message); }

async function shot(page, name) {
  if (shots) await page.screenshot({path: path.join(shots, `${name}.png`), fullPage: true});
}

// A page that records what must never happen: a dialog (alert), an error
// thrown by the page, a request for the image `x`.
async function watchedPage(browser, who) {
  const context = await browser.createBrowserContext();
  const page = await context.newPage();
  await page.setViewport({width: 1280, height: 900});
  page.incidents = [];
  page.on('dialog', async (d) => {
    page.incidents.push(`${who}: a dialog opened: ${d.message()}`);
    await d.dismiss();
  });
  page.on('pageerror', (e) => page.incidents.push(`${who}: page error: ${e.message}`));
  page.on('request', (r) => {
    if (/\/x$/.test(new URL(r.url()).pathname)) page.incidents.push(`${who}: requested ${r.url()}`);
  });
  page.on('console', (m) => {
    if (m.type() === 'error' && /Content.Security.Policy/i.test(m.text())) {
      page.incidents.push(`${who}: CSP refused something: ${m.text()}`);
    }
  });
  return page;
}

async function login(page, token) {
  await page.goto(`${base}/jobs`, {waitUntil: 'load'});
  await page.waitForSelector('#login-token', {timeout: 10000});
  await page.type('#login-token', token);
  await Promise.all([page.waitForNavigation({waitUntil: 'load'}),
                     page.click('#login-submit')]);
  await page.waitForSelector('#jobs-table', {timeout: 10000});
}

// The API from inside the signed-in page (its cookie, its certificate).
function api(page, p) {
  return page.evaluate(async (url) => {
    const r = await fetch(url, {credentials: 'same-origin'});
    return {status: r.status, body: await r.json().catch(() => null)};
  }, p);
}

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
  await check('login works', async () => {
    await page.goto(`${base}/jobs`, {waitUntil: 'load'});
    await page.$eval('#login-token', (el) => { el.value = ''; });
    await page.type('#login-token', env.DLBATCH_TOKEN);
    await Promise.all([page.waitForNavigation({waitUntil: 'load'}),
                       page.click('#login-submit')]);
    await page.waitForSelector('#jobs-table', {timeout: 10000});
    const who = await page.$eval('#session-user', (el) => el.textContent);
    expect(who.length > 0, 'no user shown in the header');
  });
  await check('the jobs list renders rows', async () => {
    await page.waitForSelector('#jobs-table tbody tr[data-job-id]', {timeout: 10000});
    const n = await page.$$eval('#jobs-table tbody tr[data-job-id]', (rows) => rows.length);
    expect(n > 0, 'no rows');
    const range = await page.$eval('#jobs-range', (el) => el.textContent);
    expect(/of \d+/.test(range), `range reads "${range}"`);
    await shot(page, 'jobs');
  });

  const found = await api(page, `/api/v1/jobs?q=${encodeURIComponent(XSS_NAME)}&limit=10`);
  const xss = found.body && found.body.jobs && found.body.jobs.find((j) => j.name === XSS_NAME);
  await check(`a job named ${XSS_NAME} exists (the harness submits it)`, async () => {
    expect(xss, `GET /api/v1/jobs?q= answered ${found.status} without it`);
  });
  await check('a job name with markup is text in the list', async () => {
    expect(xss, 'no such job');
    const cell = await page.$eval(`#jobs-table tr[data-job-id="${xss.id}"] td.name`,
                                  (el) => ({text: el.textContent, imgs: el.querySelectorAll('img').length}));
    expect(cell.text.includes(XSS_NAME), `the cell reads "${cell.text}"`);
    expect(cell.imgs === 0, 'an <img> element was made');
    expect(await page.$$eval('img', (l) => l.length) === 0, 'the page holds an <img>');
  });
  if (xss) {
    await check("a job's page shows its state and a chart", async () => {
      await page.goto(`${base}/jobs/${xss.id}`, {waitUntil: 'load'});
      await page.waitForSelector('#job-state', {timeout: 10000});
      await page.waitForSelector('#loss-chart canvas', {timeout: 10000});
      const name = await page.$eval('#job-name', (el) => el.textContent);
      expect(name === XSS_NAME, `the heading reads "${name}"`);
      expect(await page.$$eval('img', (l) => l.length) === 0, 'the page holds an <img>');
    });
    await check('a diary line with a script is text and never runs', async () => {
      // Leave follow mode and go to the diary's top, where the line is.
      await page.waitForSelector('#diary', {timeout: 10000});
      if (await page.$eval('#diary-follow', (el) => el.checked)) await page.click('#diary-follow');
      await page.$eval('#diary', (el) => { el.scrollTop = 0; el.dispatchEvent(new Event('scroll')); });
      await page.waitForFunction((line) => [...document.querySelectorAll('#diary .text')]
          .some((el) => el.textContent.includes(line)), {timeout: 15000}, XSS_LINE);
      expect(await page.evaluate(() => window.pwned) === undefined, 'window.pwned is set');
      expect(await page.$$eval('#diary script', (l) => l.length) === 0, 'a <script> in the diary');
      await shot(page, 'job');
    });
    await check('the owner gets the buttons of the job\'s state', async () => {
      const actions = await page.$$eval('button[data-action]', (b) => b.map((x) => x.dataset.action));
      if (!['finished', 'failed', 'cancelled'].includes(xss.state)) {
        expect(actions.includes('cancel'), `buttons: ${actions.join(',') || 'none'}`);
      }
    });
  }
  for (const [name, p, sel] of [['queue', '/queue', '#queue-table'],
                                ['cluster', '/cluster', '#workers-table'],
                                ...(env.DLBATCH_SWEEP_ID ? [['sweep', `/sweeps/${env.DLBATCH_SWEEP_ID}`, '#group-table']] : []),
                                ...(env.DLBATCH_ARRAY_ID ? [['array', `/arrays/${env.DLBATCH_ARRAY_ID}`, '#group-table']] : [])]) {
    await check(`the ${name} page renders`, async () => {
      await page.goto(`${base}${p}`, {waitUntil: 'load'});
      await page.waitForSelector(sel, {timeout: 10000});
      await shot(page, name);
    });
  }

  const other = await watchedPage(browser, 'other user');
  await check('the other user logs in', () => login(other, env.DLBATCH_OTHER_TOKEN));
  if (xss) {
    await check("another user's job has no cancel button and no select box", async () => {
      await other.goto(`${base}/jobs/${xss.id}`, {waitUntil: 'load'});
      await other.waitForSelector('#job-state', {timeout: 10000});
      const n = await other.$$eval('button[data-action]', (b) => b.length);
      expect(n === 0, `${n} action button(s) shown`);
      await shot(other, 'job-other-user');
      await other.goto(`${base}/jobs`, {waitUntil: 'load'});
      await other.waitForSelector(`#jobs-table tr[data-job-id="${xss.id}"]`, {timeout: 10000});
      const boxes = await other.$$eval(`#jobs-table tr[data-job-id="${xss.id}"] input[data-select]`,
                                       (l) => l.length);
      expect(boxes === 0, 'the row can be selected');
    });
  }
  await check('log out ends the session', async () => {
    await Promise.all([other.waitForNavigation({waitUntil: 'load'}), other.click('#logout')]);
    const r = await api(other, '/api/v1/session');
    expect(r.status === 401, `GET /api/v1/session answers ${r.status} after logout`);
  });
  await check('nothing ran that should not (no dialog, no page error, no CSP refusal)', async () => {
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
