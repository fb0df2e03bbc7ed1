// One job: state, placement, history, why it waits, live curves, metrics,
// the diary, outputs, and the actions this user may take.
import {useEffect, useRef, useState} from 'preact/hooks';
import {getJson, postJson, subscribe} from '../api.js';
import {Chart, columns} from '../chart.js';
import {actionsFor, formatBytes, formatDuration, formatNumber, formatPlacement,
        formatTime, isTerminal, mayAct, outputUrl, visibleText} from '../format.js';
import {Diary} from './diary.js';
import {ErrorNote, html, Link, ProgressBar, StateBadge} from '../ui.js';

const CURVES = [
  ['loss-chart', 'Loss', ['loss', 'validation_loss']],
  ['accuracy-chart', 'Accuracy', ['accuracy', 'validation_accuracy']],
  ['lr-chart', 'Learn rate', ['learn_rate']],
];

function hasAny(points, keys) {
  return points.some((p) => keys.some((k) => typeof p[k] === 'number'));
}

function metricKeys(points) {
  const keys = new Set();
  for (const p of points) for (const k of Object.keys(p.metrics || {})) keys.add(k);
  return [...keys].sort();
}

// The progress history, then the new points whenever an event says the job
// moved: one request in flight at a time, one more if events came meanwhile.
function useProgress(id) {
  const [points, setPoints] = useState([]);
  const state = useRef({next: 0, busy: false, again: false, points: []});
  const pull = async () => {
    const s = state.current;
    if (s.busy) { s.again = true; return; }
    s.busy = true;
    try {
      do {
        s.again = false;
        const r = await getJson(`/api/v1/jobs/${id}/progress` + (s.next ? `?after=${s.next}` : ''));
        if (r.points && r.points.length) {
          s.points = s.points.concat(r.points);
          setPoints(s.points);
        }
        if (typeof r.next === 'number') s.next = r.next;
      } while (s.again);
    } catch (e) { /* the next event tries again */ } finally {
      s.busy = false;
    }
  };
  return [points, pull];
}

export function JobPage({id, session}) {
  const [job, setJob] = useState(null);
  const [error, setError] = useState(null);
  const [outputs, setOutputs] = useState(null);
  const [results, setResults] = useState(null);
  const [points, pullProgress] = useProgress(id);
  const jobRef = useRef(null);

  const load = () => getJson(`/api/v1/jobs/${id}`).then((j) => {
    jobRef.current = j;
    setJob(j);
    setError(null);
    getJson(`/api/v1/jobs/${id}/outputs`).then((o) => setOutputs(o.files || []),
                                                 () => setOutputs(null));
  }, setError);

  useEffect(() => {
    load();
    pullProgress();
    return subscribe('job', (ev) => {
      if (String(ev.id) !== String(id)) return;
      const before = jobRef.current;
      const merged = {...(before || {}), ...ev};
      // Lists' shapes lack the history and the full spec: keep the page's.
      for (const k of ['history', 'spec', 'checkpoints', 'diary_lines']) {
        if (before && before[k] !== undefined) merged[k] = before[k];
      }
      jobRef.current = merged;
      setJob(merged);
      // A running job changes many times a second (each diary line); only
      // a change of its progress can bring new points.
      if (!before || JSON.stringify(before.progress) !== JSON.stringify(ev.progress)) pullProgress();
      if (before && (before.state !== ev.state || before.held !== ev.held ||
                     before.attempt !== ev.attempt)) load();
    });
  }, [id]);

  if (error && !job) return html`<${ErrorNote} error=${error} />`;
  if (!job) return html`<p class="muted">Loading job ${id}…</p>`;
  const may = mayAct(session, job);
  const act = async (action) => {
    try {
      const r = await postJson(`/api/v1/jobs/${id}/${action}`, {});
      setResults(r.results || []);
      load();
    } catch (e) {
      setError(e);
    }
  };
  const p = job.progress || {};
  const metrics = Object.entries(p.metrics || {});
  const custom = metricKeys(points);
  return html`
    <section id="job-page" data-job-id=${job.id}>
      <h1><span class="muted">job ${job.id}</span> <span id="job-name">${visibleText(job.name)}</span></h1>
      <div class="toolbar">
        <${StateBadge} job=${job} id="job-state" />
        <${ProgressBar} job=${job} />
        <span class="spacer"></span>
        ${may && actionsFor(job).map((a) => html`<button data-action=${a}
            onClick=${() => act(a)}>${a[0].toUpperCase() + a.slice(1)}</button>`)}
      </div>
      <${ErrorNote} error=${error} />
      ${results && html`<ul id="action-results">${results.map((r) => html`
        <li class=${r.ok ? 'ok' : 'error'}>${visibleText(r.message || (r.ok ? 'done' : 'refused'))}</li>`)}</ul>`}
      ${job.state === 'queued' && html`<p id="wait-reason" class="note">Waiting: ${
          visibleText(job.held ? 'held (release it to let it start)' : job.wait_reason || 'for a free slot')}${
          typeof job.queue_position === 'number'
            ? html` <span id="queue-position" class="muted">(number ${job.queue_position} in ${
                visibleText(job.profile)}'s queue)</span>` : ''}</p>`}
      ${job.reason && html`<p id="job-reason" class="note">${visibleText(job.reason)}</p>`}
      <dl class="facts" id="job-facts">
        <dt>User</dt><dd>${visibleText(job.user)}</dd>
        <dt>Profile</dt><dd>${visibleText(job.profile)}</dd>
        <dt>Pool</dt><dd>${job.pool}</dd>
        <dt>Priority</dt><dd>${job.priority}</dd>
        <dt>Attempt</dt><dd>${job.attempt}</dd>
        <dt>Placement</dt><dd id="job-placement">${formatPlacement(job.placement) || '—'}</dd>
        <dt>Submitted</dt><dd>${formatTime(job.submit_time)}</dd>
        <dt>Started</dt><dd>${formatTime(job.start_time) || '—'}</dd>
        <dt>Ended</dt><dd>${formatTime(job.end_time) || '—'}</dd>
        ${isTerminal(job.state) && html`<dt>Exit code</dt><dd>${job.exit_code}</dd>`}
        ${p.eta_s > 0 && !isTerminal(job.state) && html`<dt>Left</dt><dd>${formatDuration(p.eta_s)}</dd>`}
        ${(job.after || []).length > 0 && html`<dt>After</dt><dd>${job.after.map((a) => html`
            <${Link} href=${`/jobs/${a}`}>${a}<//> `)}</dd>`}
        ${job.sweep_id > 0 && html`<dt>Sweep</dt><dd><${Link} href=${`/sweeps/${job.sweep_id}`}>${job.sweep_id}<//></dd>`}
        ${job.array_id > 0 && html`<dt>Array</dt><dd><${Link} href=${`/arrays/${job.array_id}`}>${
            job.array_id}<//> [${job.array_index}]</dd>`}
        ${job.spec && job.spec.command && job.spec.command.length > 0 && html`<dt>Command</dt>
            <dd class="mono">${visibleText(job.spec.command.join(' '))}</dd>`}
      </dl>
      <h2>Progress</h2>
      <div class="charts" id="job-charts">
        ${points.length === 0 && html`<p class="muted" id="no-progress">No progress reported${
            isTerminal(job.state) ? '' : ' yet'}.</p>`}
        ${CURVES.filter(([, , keys]) => hasAny(points, keys)).map(
            ([cid, title, keys]) => html`<${Chart} key=${cid} id=${cid} title=${title}
                series=${keys} data=${columns(points, keys)} />`)}
        ${custom.length > 0 && html`<${Chart} id="metrics-chart" title="The job's metrics"
            series=${custom} data=${columns(points, custom)} />`}
      </div>
      ${(metrics.length > 0 || p.iteration > 0) && html`<table class="grid small" id="job-metrics">
        <tbody>
          ${p.iterations > 0 && html`<tr><th>iteration</th><td>${p.iteration} / ${p.iterations}</td></tr>`}
          ${['loss', 'accuracy', 'validation_loss', 'validation_accuracy', 'learn_rate', 'images_per_s']
              .filter((k) => typeof p[k] === 'number' && (k.startsWith('validation') ? p.has_validation : true))
              .map((k) => html`<tr><th>${k}</th><td>${formatNumber(p[k])}</td></tr>`)}
          ${metrics.map(([k, v]) => html`<tr><th>${visibleText(k)}</th><td>${formatNumber(v)}</td></tr>`)}
        </tbody></table>`}
      <h2>Diary</h2>
      <${Diary} jobId=${job.id} ended=${isTerminal(job.state)} />
      <h2>Outputs</h2>
      ${outputs === null ? html`<p class="muted">—</p>` : outputs.length === 0
        ? html`<p class="muted" id="outputs-empty">No outputs${isTerminal(job.state) ? '' : ' yet'}.</p>`
        : html`<table class="grid" id="outputs-table"><thead><tr><th>File</th><th>Size</th>
            <th>sha256</th></tr></thead><tbody>${outputs.map((f) => html`
            <tr data-path=${f.path}><td>${f.symlink ? html`${visibleText(f.path)} → ${visibleText(f.symlink)}`
              : html`<a href=${outputUrl(job.id, f.path)} download>${visibleText(f.path)}</a>`}</td>
            <td>${formatBytes(f.size)}</td><td class="mono" title=${f.sha256}>${(f.sha256 || '').slice(0, 12)}</td></tr>`)}
            </tbody></table>`}
      ${(job.history || []).length > 0 && html`<h2>History</h2>
        <table class="grid" id="job-history"><thead><tr><th>Time</th><th>State</th><th>Attempt</th>
          <th>Reason</th></tr></thead><tbody>${job.history.map((hst) => html`<tr>
          <td>${formatTime(hst.time)}</td><td>${visibleText(hst.state)}</td><td>${hst.attempt}</td>
          <td>${visibleText(hst.reason)}</td></tr>`)}</tbody></table>`}
    </section>`;
}
