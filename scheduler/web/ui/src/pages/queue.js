// The queue: queued jobs of each profile in the order the scheduler tries
// them (priority, fair share, submission; its placement core's own), and
// why each waits. Jobs outside that order (held, waiting for others,
// parked by their array's limit) have no position and come last.
import {useEffect, useState} from 'preact/hooks';
import {getJson, subscribe} from '../api.js';
import {formatTime, visibleText} from '../format.js';
import {ErrorNote, html, Link} from '../ui.js';

export function QueuePage() {
  const [jobs, setJobs] = useState(null);
  const [error, setError] = useState(null);
  const [tick, setTick] = useState(0);
  useEffect(() => {
    getJson('/api/v1/queue').then((r) => { setJobs(r.jobs || []); setError(null); }, setError);
  }, [tick]);
  useEffect(() => {
    let pending = 0;
    const off = subscribe('job', () => {
      clearTimeout(pending);
      pending = setTimeout(() => setTick((t) => t + 1), 1000);
    });
    return () => { off(); clearTimeout(pending); };
  }, []);
  if (error && !jobs) return html`<${ErrorNote} error=${error} />`;
  if (!jobs) return html`<p class="muted">Loading…</p>`;
  return html`
    <section id="queue-page">
      <h1>Queue <span class="muted">${jobs.length} waiting</span></h1>
      <table class="grid" id="queue-table">
        <thead><tr><th>Position</th><th>Job</th><th>Name</th><th>User</th><th>Profile</th><th>Pool</th>
          <th>Priority</th><th>Submitted</th><th>Why it waits</th></tr></thead>
        <tbody>${jobs.map((j) => html`<tr key=${j.id} data-job-id=${j.id}>
          <td class="position">${typeof j.position === 'number' ? j.position : '—'}</td><td><${Link} href=${`/jobs/${j.id}`}>${j.id}<//></td>
          <td>${visibleText(j.name)}</td><td>${visibleText(j.user)}</td><td>${visibleText(j.profile)}</td>
          <td>${j.pool}</td><td>${j.priority}</td><td>${formatTime(j.submit_time)}</td>
          <td class="wait-reason">${visibleText(j.held ? 'held' : j.wait_reason)}</td></tr>`)}</tbody>
      </table>
      ${jobs.length === 0 && html`<p class="muted" id="queue-empty">Nothing is waiting.</p>`}
    </section>`;
}
