// A sweep's or an array's jobs: ranked by a chosen metric, their curves on
// one chart (a series per job), their options side by side.
import {useEffect, useState} from 'preact/hooks';
import {getJson, subscribe} from '../api.js';
import {Chart, overlay} from '../chart.js';
import {formatNumber, lowerIsBetter, metricValue, rankJobs, visibleText} from '../format.js';
import {ErrorNote, html, Link, ProgressBar, StateBadge} from '../ui.js';

const BASE_METRICS = ['loss', 'accuracy', 'validation_loss', 'validation_accuracy'];
const MAX_CURVES = 20;

function optionKeys(jobs) {
  const keys = new Set();
  for (const j of jobs) for (const k of Object.keys((j.spec && j.spec.sweep_point) || {})) keys.add(k);
  return [...keys].sort();
}

function metricNames(jobs) {
  const names = new Set(BASE_METRICS);
  for (const j of jobs) for (const k of Object.keys((j.progress && j.progress.metrics) || {})) names.add(k);
  return [...names];
}

function optionText(v) {
  return typeof v === 'string' ? v : JSON.stringify(v);
}

// A summary's value: counts by state read "finished 3, running 1".
function summaryText(v) {
  if (typeof v === 'number') return formatNumber(v);
  if (v && typeof v === 'object' && !Array.isArray(v)) {
    return Object.entries(v).map(([k, n]) => `${k} ${optionText(n)}`).join(', ');
  }
  return optionText(v);
}

export function GroupPage({kind, id}) {
  const [metric, setMetric] = useState('loss');
  const [reply, setReply] = useState(null);
  const [error, setError] = useState(null);
  const [curves, setCurves] = useState([]);
  const [tick, setTick] = useState(0);
  const [lowerBetter, setLowerBetter] = useState(true);

  useEffect(() => {
    const q = kind === 'sweeps' ? `?metric=${encodeURIComponent(metric)}` : '';
    getJson(`/api/v1/${kind}/${id}${q}`).then((r) => { setReply(r); setError(null); }, setError);
  }, [kind, id, metric, tick]);

  useEffect(() => {
    let pending = 0;
    return subscribe('job', (ev) => {
      if ((kind === 'sweeps' ? ev.sweep_id : ev.array_id) !== Number(id)) return;
      clearTimeout(pending);
      pending = setTimeout(() => setTick((t) => t + 1), 2000);
    });
  }, [kind, id]);

  const jobs = reply ? rankJobs(reply.jobs || [], metric, lowerBetter) : [];
  const shown = jobs.slice(0, MAX_CURVES);
  const shownIds = shown.map((j) => j.id).join(',');
  useEffect(() => {
    let live = true;
    Promise.all(shown.map((j) => getJson(`/api/v1/jobs/${j.id}/progress`)
        .then((r) => r.points || [], () => []))).then((all) => live && setCurves(all));
    return () => { live = false; };
  }, [shownIds, tick]);

  if (error && !reply) return html`<${ErrorNote} error=${error} />`;
  if (!reply) return html`<p class="muted">Loading…</p>`;
  const options = optionKeys(jobs);
  const summary = Object.entries(reply.summary || {});
  const what = kind === 'sweeps' ? 'Sweep' : 'Array';
  return html`
    <section id="group-page" data-kind=${kind}>
      <h1>${what} ${id}</h1>
      <div class="toolbar">
        <label>Rank by <select id="rank-metric" value=${metric}
            onChange=${(e) => { setMetric(e.target.value); setLowerBetter(lowerIsBetter(e.target.value)); }}>
          ${metricNames(reply.jobs || []).map((m) => html`<option value=${m}>${visibleText(m)}</option>`)}
        </select></label>
        <label><input type="checkbox" id="lower-better" checked=${lowerBetter}
            onChange=${(e) => setLowerBetter(e.target.checked)} /> lower is better</label>
      </div>
      ${summary.length > 0 && html`<dl class="facts" id="group-summary">${summary.map(([k, v]) => html`
        <dt>${visibleText(k)}</dt><dd>${visibleText(summaryText(v))}</dd>`)}</dl>`}
      ${curves.some((pts) => pts.some((pt) => typeof (pt[metric] ?? (pt.metrics || {})[metric]) === 'number'))
        ? html`<${Chart} id="group-chart" key=${shownIds + metric} title=${metric}
            series=${shown.map((j) => `job ${j.id}`)} data=${overlay(curves, metric)} />`
        : html`<p class="muted" id="group-no-curves">No job here reported ${visibleText(metric)}.</p>`}
      <table class="grid" id="group-table">
        <thead><tr><th>Rank</th><th>Job</th><th>Name</th><th>State</th><th>Progress</th>
          <th>${visibleText(metric)}</th>${kind === 'arrays' ? html`<th>Index</th>` : ''}
          ${options.map((o) => html`<th class="option">${visibleText(o)}</th>`)}</tr></thead>
        <tbody>${jobs.map((j, i) => html`<tr key=${j.id} data-job-id=${j.id}>
          <td>${i + 1}</td><td><${Link} href=${`/jobs/${j.id}`}>${j.id}<//></td>
          <td>${visibleText(j.name)}</td><td><${StateBadge} job=${j} /></td>
          <td><${ProgressBar} job=${j} /></td><td>${formatNumber(metricValue(j, metric))}</td>
          ${kind === 'arrays' ? html`<td>${j.array_index}</td>` : ''}
          ${options.map((o) => html`<td class="option">${
              visibleText(optionText(((j.spec && j.spec.sweep_point) || {})[o] ?? ''))}</td>`)}
        </tr>`)}</tbody>
      </table>
    </section>`;
}
