// The cluster: every worker, its slots or GPUs and the job on each, its
// state (online, draining, offline), its GPUs' utilisation and memory where
// it reports them (NVML; none shown where it does not), and the profiles.
import {useEffect, useState} from 'preact/hooks';
import {getJson, subscribe} from '../api.js';
import {formatBytes, formatNumber, formatTime, visibleText} from '../format.js';
import {ErrorNote, html, Link} from '../ui.js';

// worker id -> device index -> job id, from the running jobs' placement.
function holders(jobs) {
  const out = new Map();
  for (const j of jobs) {
    for (const p of j.placement || []) {
      if (!out.has(p.worker_id)) out.set(p.worker_id, new Map());
      for (const d of p.devices || []) out.get(p.worker_id).set(d, j.id);
    }
  }
  return out;
}

function workerState(w) {
  if (!w.online) return 'offline';
  return w.draining ? 'draining' : 'online';
}

function Device({d, job}) {
  return html`<li class="device" data-device=${d.index}>
    <span class="mono">${d.kind === 'gpu' || d.kind === 'GPU' ? 'GPU' : visibleText(d.kind)} ${d.index}</span>
    ${d.name && html` ${visibleText(d.name)}`}
    ${d.memory_bytes > 0 && html` <span class="muted">${formatBytes(d.memory_bytes)}</span>`}
    ${job ? html` ← <${Link} href=${`/jobs/${job}`}>job ${job}<//>` : html` <span class="muted">free</span>`}
  </li>`;
}

// One GPU as the worker last read it through NVML (numbered as NVML numbers
// them, which need not be the devices' order); a reading NVML refused is
// left out.
function GpuReading({g}) {
  const util = typeof g.utilization_percent === 'number' ? g.utilization_percent : null;
  const used = typeof g.memory_used_bytes === 'number' ? g.memory_used_bytes : null;
  const total = typeof g.memory_total_bytes === 'number' ? g.memory_total_bytes : null;
  return html`<li class="gpu-reading" data-gpu=${g.index} title=${visibleText(g.uuid || '')}>
    <span class="mono">GPU ${g.index}</span>
    ${util !== null && html` <progress class="gpu-util" max="100" value=${util}></progress>
        <span class="gpu-util-text">${formatNumber(util, 3)}%</span>`}
    ${used !== null && total !== null && html` <span class="muted gpu-memory">${
        formatBytes(used)} / ${formatBytes(total)}</span>`}
  </li>`;
}

// How often the page reads the workers again for fresh GPU readings (the
// workers send theirs every few seconds; they come with no event).
const READINGS_REFRESH_MS = 5000;

export function ClusterPage() {
  const [workers, setWorkers] = useState(null);
  const [profiles, setProfiles] = useState([]);
  const [running, setRunning] = useState([]);
  const [error, setError] = useState(null);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    getJson('/api/v1/workers').then((r) => { setWorkers(r.workers || []); setError(null); }, setError);
    getJson('/api/v1/profiles').then((r) => setProfiles(r.profiles || []), () => {});
    getJson('/api/v1/jobs?state=running,cancelling&limit=1000')
        .then((r) => setRunning(r.jobs || []), () => {});
  }, [tick]);
  useEffect(() => {
    let pending = 0;
    const later = () => { clearTimeout(pending); pending = setTimeout(() => setTick((t) => t + 1), 1000); };
    const offWorker = subscribe('worker', (w) => {
      setWorkers((ws) => (ws ? ws.map((x) => (x.id === w.id ? {...x, ...w} : x)) : ws));
      later();
    });
    const offJob = subscribe('job', later);
    const refresh = setInterval(() => {
      if (!document.hidden) setTick((t) => t + 1);
    }, READINGS_REFRESH_MS);
    return () => { offWorker(); offJob(); clearTimeout(pending); clearInterval(refresh); };
  }, []);
  if (error && !workers) return html`<${ErrorNote} error=${error} />`;
  if (!workers) return html`<p class="muted">Loading…</p>`;
  const held = holders(running);
  return html`
    <section id="cluster-page">
      <h1>Workers</h1>
      <table class="grid" id="workers-table">
        <thead><tr><th>Name</th><th>Host</th><th>Profile</th><th>State</th><th>Slots</th>
          <th>Devices and jobs</th><th>GPU use</th><th>Last seen</th></tr></thead>
        <tbody>${workers.map((w) => {
          const byDevice = held.get(w.id) || new Map();
          const devices = w.devices && w.devices.length ? w.devices
              : Array.from({length: w.slots}, (_, i) => ({index: i, kind: 'slot'}));
          return html`<tr key=${w.id} data-worker-id=${w.id} data-state=${workerState(w)}>
            <td>${visibleText(w.name)}</td><td>${visibleText(w.host)}</td><td>${visibleText(w.profile)}</td>
            <td><span class=${'state state-' + workerState(w)}>${workerState(w)}</span>${
                w.draining && w.drain_reason ? html` <span class="muted">${visibleText(w.drain_reason)}</span>` : ''}</td>
            <td>${w.slots - w.free_slots} / ${w.slots}</td>
            <td><ul class="devices">${devices.map((d) => html`<${Device} d=${d} job=${byDevice.get(d.index)} />`)}</ul>
              ${byDevice.size === 0 && (w.running_jobs || []).map((j) => html`<${Link} href=${`/jobs/${j}`}>job ${j}<//> `)}</td>
            <td class="gpu-readings">${(w.gpus || []).length
              ? html`<ul class="devices">${w.gpus.map((g) => html`<${GpuReading} key=${g.index} g=${g} />`)}</ul>`
              : html`<span class="muted">—</span>`}</td>
            <td>${formatTime(w.last_seen)}</td></tr>`;
        })}</tbody>
      </table>
      <h2>Profiles</h2>
      <table class="grid" id="profiles-table">
        <thead><tr><th>Name</th><th>Type</th><th>Workers</th><th>Slots free</th><th>Max pool</th>
          <th>Queued</th><th>Running</th></tr></thead>
        <tbody>${profiles.map((p) => html`<tr key=${p.name} data-profile=${p.name}>
          <td>${visibleText(p.name)}</td><td>${visibleText(p.type)}</td>
          <td>${p.workers_online} / ${p.workers}</td><td>${p.free_slots} / ${p.total_slots} ${visibleText(p.slot_kind)}</td>
          <td>${p.max_pool}</td><td>${p.queued_jobs}</td><td>${p.running_jobs}</td></tr>`)}</tbody>
      </table>
    </section>`;
}
