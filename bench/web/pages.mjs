// The dashboard in headless Debian chromium (puppeteer-core), for
// web_bench: one measurement per run, its figures as one JSON object on
// stdout (progress on stderr). Exits 0, 1 when the measurement failed, 77
// when it cannot run here (no browser, no puppeteer-core).
//
//   node pages.mjs paint  LOADS            the jobs page: navigation start to
//                                          its table's first rows painted
//   node pages.mjs diary  LOADS JOB LINES  an ended job's page: navigation
//                                          start to its diary's last line
//                                          painted (the page scrolled to the
//                                          end as soon as the diary shows)
//   node pages.mjs chart  SECONDS JOB      a running job's page for SECONDS:
//                                          each progress point's report
//                                          (its own `wall_ms` metric) to the
//                                          chart's drawing of it
//
// Environment: DLBATCH_WEB_URL (https://127.0.0.1:PORT, any certificate),
// DLBATCH_TOKEN (a user's token: the page logs in by cookie before any
// measured load), DLBATCH_CHROMIUM (default /usr/bin/chromium),
// DLBATCH_WEB_TEST_MODULES (the node_modules holding puppeteer-core).
//
// "Painted": the element is in the DOM, then the frame after it (a
// requestAnimationFrame callback, then a task after that frame).
import {existsSync} from 'node:fs';
import {createRequire} from 'node:module';
import path from 'node:path';
import {pathToFileURL} from 'node:url';

const env = process.env;
const base = (env.DLBATCH_WEB_URL || '').replace(/\/$/, '');
const chromium = env.DLBATCH_CHROMIUM || '/usr/bin/chromium';
const [mode, ...rest] = process.argv.slice(2);
if (!base || !env.DLBATCH_TOKEN || !['paint', 'diary', 'chart'].includes(mode)) {
  console.error('usage: DLBATCH_WEB_URL=.. DLBATCH_TOKEN=.. node pages.mjs paint|diary|chart ...');
  process.exit(2);
}
if (!existsSync(chromium)) {
  console.error(`no browser at ${chromium} (apt-get install chromium)`);
  process.exit(77);
}
let puppeteer;
try {
  const modules = env.DLBATCH_WEB_TEST_MODULES || 'node_modules';
  const entry = createRequire(path.join(path.resolve(modules), 'noop.js')).resolve('puppeteer-core');
  puppeteer = (await import(pathToFileURL(entry).href)).default;
} catch (e) {
  console.error(`no puppeteer-core (npm ci in tests/web, or set DLBATCH_WEB_TEST_MODULES): ${e.message}`);
  process.exit(77);
}

// Installed before any of the page's scripts: notes when `selector` first
// matches (window.__bench.dom) and the frame after (window.__bench.painted),
// in ms since navigation start; `then` runs once it matches.
function watchFor(selector, thenScript) {
  return `(() => {
    const b = window.__bench = {dom: 0, painted: 0};
    const after = ${thenScript || 'null'};
    const seen = () => {
      if (b.dom || !document.querySelector(${JSON.stringify(selector)})) return;
      b.dom = performance.now();
      requestAnimationFrame(() => {
        const ch = new MessageChannel();
        ch.port1.onmessage = () => { b.painted = performance.now(); };
        ch.port2.postMessage(0);
      });
    };
    new MutationObserver(() => { seen(); if (after) after(); }).observe(document,
        {subtree: true, childList: true, attributes: true});
  })();`;
}

const browser = await puppeteer.launch({
  executablePath: chromium,
  headless: true,
  acceptInsecureCerts: true,
  args: ['--no-sandbox', '--ignore-certificate-errors', '--disable-gpu',
         '--disable-dev-shm-usage', '--no-first-run'],
});
let code = 1;
try {
  const page = await browser.newPage();
  await page.setViewport({width: 1280, height: 900});
  // Log in by cookie: the API's login from the login page itself.
  await page.goto(`${base}/login`, {waitUntil: 'load'});
  const login = await page.evaluate(async (token) => {
    const r = await fetch('/api/v1/login', {method: 'POST', credentials: 'same-origin',
      headers: {'Content-Type': 'application/json'}, body: JSON.stringify({token})});
    return r.status;
  }, env.DLBATCH_TOKEN);
  if (login !== 200) throw new Error(`POST /api/v1/login answered ${login}`);
  await page.goto('about:blank');

  // One load of `url`: ms from navigation start to `selector` in the DOM and
  // painted; `then` (a page function) runs at each DOM change once it is in.
  const load = async (url, selector, then, timeout = 60000) => {
    const hook = await page.evaluateOnNewDocument(watchFor(selector, then));
    // A navigation the previous page's scripts start (the login page's
    // return, say) can abort this one: go again.
    for (let tries = 1; ; tries++) {
      try {
        await page.goto(url, {waitUntil: 'domcontentloaded'});
        break;
      } catch (e) {
        if (tries >= 3 || !/ERR_ABORTED/.test(String(e && e.message))) throw e;
      }
    }
    await page.waitForFunction(() => window.__bench && window.__bench.painted > 0,
                               {timeout, polling: 50});
    const r = await page.evaluate(() => {
      const nav = performance.getEntriesByType('navigation')[0];
      const fcp = performance.getEntriesByName('first-contentful-paint')[0];
      return {dom: window.__bench.dom, painted: window.__bench.painted,
              response_end: nav ? nav.responseEnd : 0,
              dom_content_loaded: nav ? nav.domContentLoadedEventEnd : 0,
              first_contentful_paint: fcp ? fcp.startTime : 0};
    });
    await page.removeScriptToEvaluateOnNewDocument(hook.identifier);
    return r;
  };

  let out;
  if (mode === 'paint') {
    const loads = Number(rest[0] || 10);
    const runs = [];
    // The first load fills the browser's cache; it is reported apart.
    for (let i = 0; i <= loads; i++) {
      runs.push(await load(`${base}/jobs`, '#jobs-table tbody tr[data-job-id]'));
      console.error(`paint ${i}: ${runs[runs.length - 1].painted.toFixed(1)} ms`);
    }
    out = {first: runs[0], loads: runs.slice(1)};
  } else if (mode === 'diary') {
    const [loadsText, job, lines] = rest;
    const loads = Number(loadsText || 10);
    const last = `#diary .line[data-n="${Number(lines)}"]`;
    // As soon as the diary shows a line, the page goes to its end (what the
    // End key does), once per load.
    const toEnd = `() => {
      const d = document.getElementById('diary');
      if (!d || d.dataset.benchEnd || !d.querySelector('.line[data-n]')) return;
      d.dataset.benchEnd = '1';
      window.__bench.first_lines = performance.now();
      d.scrollTop = d.scrollHeight;
    }`;
    const runs = [];
    for (let i = 0; i <= loads; i++) {
      const r = await load(`${base}/jobs/${job}`, last, toEnd);
      r.first_lines = await page.evaluate(() => window.__bench.first_lines || 0);
      runs.push(r);
      console.error(`diary ${i}: first lines ${r.first_lines.toFixed(1)} ms, ` +
                    `last line ${r.painted.toFixed(1)} ms`);
    }
    out = {first: runs[0], loads: runs.slice(1)};
  } else {
    const [secondsText, job] = rest;
    const seconds = Number(secondsText || 15);
    await page.evaluateOnNewDocument(`(() => {
      const d = window.__draws = [];
      new MutationObserver((records) => {
        for (const r of records) {
          if (r.type !== 'attributes' || r.target.id !== 'metrics-chart') continue;
          const e = {n: Number(r.target.dataset.drawn), drawn: performance.timeOrigin + performance.now(), frame: 0};
          d.push(e);
          requestAnimationFrame(() => {
            const ch = new MessageChannel();
            ch.port1.onmessage = () => { e.frame = performance.timeOrigin + performance.now(); };
            ch.port2.postMessage(0);
          });
        }
      }).observe(document, {subtree: true, attributes: true, attributeFilter: ['data-drawn']});
    })();`);
    await page.goto(`${base}/jobs/${job}`, {waitUntil: 'domcontentloaded'});
    await page.waitForSelector('#metrics-chart[data-drawn]', {timeout: 30000});
    const opened = Date.now();
    await new Promise((r) => setTimeout(r, seconds * 1000));
    const {draws, points} = await page.evaluate(async (id) => {
      const r = await fetch(`/api/v1/jobs/${id}/progress`, {credentials: 'same-origin'});
      return {draws: window.__draws, points: (await r.json()).points || []};
    }, job);
    // Point i (0-based, in the history's order) is drawn by the first draw
    // holding more than i points. Points reported before the page was up
    // came with its first load and are left out.
    const lat = [];
    points.forEach((p, i) => {
      const wall = p.metrics && p.metrics.wall_ms;
      if (typeof wall !== 'number' || wall < opened + 500) return;
      const d = draws.find((x) => x.n > i);
      if (d) lat.push({wall, drawn: d.drawn - wall, frame: d.frame ? d.frame - wall : 0});
    });
    out = {points: points.length, draws: draws.length, latencies: lat};
  }
  console.log(JSON.stringify(out));
  code = 0;
} catch (e) {
  console.error(`pages.mjs ${mode}: ${e && e.stack ? e.stack : e}`);
} finally {
  await browser.close();
}
process.exit(code);
