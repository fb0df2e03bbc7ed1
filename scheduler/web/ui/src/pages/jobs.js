// The jobs list: state chips, search by name and user, sortable columns,
// pages of 100, live rows from the event stream, bulk actions.
import {useEffect, useRef, useState} from 'preact/hooks';
import {actOn, getJson, subscribe} from '../api.js';
import {actionsFor, formatTime, mayAct, STATES, visibleText} from '../format.js';
import {jobsQuery, readJobsParams, writeJobsParams} from '../query.js';
import {ErrorNote, html, Link, ProgressBar, StateBadge} from '../ui.js';

const COLUMNS = [
  ['id', 'Id', true], ['name', 'Name', true], ['user', 'User', true],
  ['state', 'State', true], ['progress', 'Progress', false], ['pool', 'Pool', false],
  ['priority', 'Priority', true], ['submit_time', 'Submitted', true],
];
const BULK = ['cancel', 'hold', 'release'];

export function JobsPage({session}) {
  const [params, setParams] = useState(() => readJobsParams(location.search));
  const [reply, setReply] = useState(null);
  const [error, setError] = useState(null);
  const [selected, setSelected] = useState(new Set());
  const [results, setResults] = useState(null);
  const [reload, setReload] = useState(0);
  const rows = useRef(null);

  useEffect(() => {
    history.replaceState(null, '', location.pathname + writeJobsParams(params));
    let live = true;
    getJson('/api/v1/jobs' + jobsQuery(params)).then((r) => {
      if (!live) return;
      setReply(r);
      setError(null);
      rows.current = r;
    }, (e) => live && setError(e));
    return () => { live = false; };
  }, [params, reload]);

  // A `job` event updates its row where the row is on this page.
  useEffect(() => subscribe('job', (job) => {
    const r = rows.current;
    if (!r || !r.jobs.some((j) => j.id === job.id)) return;
    const next = {...r, jobs: r.jobs.map((j) => (j.id === job.id ? {...j, ...job} : j))};
    rows.current = next;
    setReply(next);
  }), []);

  const set = (change) => { setSelected(new Set()); setParams({...params, offset: 0, ...change}); };
  const toggleState = (s) => {
    const states = new Set(params.states);
    states.has(s) ? states.delete(s) : states.add(s);
    set({states: STATES.filter((x) => states.has(x))});
  };
  const sortBy = (key) => set({sort: key,
    order: params.sort === key && params.order === 'desc' ? 'asc' : 'desc'});
  const jobs = reply ? reply.jobs : [];
  const own = jobs.filter((j) => mayAct(session, j));
  const toggle = (id) => {
    const s = new Set(selected);
    s.has(id) ? s.delete(id) : s.add(id);
    setSelected(s);
  };
  const bulk = async (action) => {
    const ids = [...selected].filter((id) => {
      const j = jobs.find((x) => x.id === id);
      return j && actionsFor(j).includes(action);
    });
    if (ids.length === 0) {
      setResults([{job: 0, ok: false, message: `none of the selected jobs can be ${action}ed now`}]);
      return;
    }
    try {
      const r = await actOn(action, ids);
      setResults(r.results || []);
      setSelected(new Set());
      setReload(reload + 1);
    } catch (e) {
      setError(e);
    }
  };

  const total = reply ? reply.total : 0;
  const first = total === 0 ? 0 : params.offset + 1;
  const last = Math.min(total, params.offset + jobs.length);
  return html`
    <section id="jobs-page">
      <div class="toolbar">
        <span class="chips" id="state-chips">${STATES.map((s) => html`
          <button class=${'chip' + (params.states.includes(s) ? ' on' : '')}
              data-state=${s} aria-pressed=${params.states.includes(s)}
              onClick=${() => toggleState(s)}>${s}</button>`)}</span>
        <input id="jobs-q" type="search" placeholder="name contains" value=${params.q}
            onChange=${(e) => set({q: e.target.value})} />
        <input id="jobs-user" type="search" placeholder="user" value=${params.user}
            onChange=${(e) => set({user: e.target.value})} />
        <span class="spacer"></span>
        ${BULK.map((a) => html`<button data-action=${a} class="bulk"
            disabled=${selected.size === 0} onClick=${() => bulk(a)}>${
            a[0].toUpperCase() + a.slice(1)}</button>`)}
      </div>
      <${ErrorNote} error=${error} />
      ${results && html`<ul id="action-results">${results.map((r) => html`
        <li class=${r.ok ? 'ok' : 'error'}>${r.job ? `job ${r.job}: ` : ''}${
          visibleText(r.message || (r.ok ? 'done' : 'refused'))}</li>`)}</ul>`}
      <table id="jobs-table" class="grid">
        <thead><tr>
          <th><input type="checkbox" id="select-all" aria-label="select all"
              disabled=${own.length === 0}
              checked=${own.length > 0 && own.every((j) => selected.has(j.id))}
              onChange=${(e) => setSelected(new Set(e.target.checked ? own.map((j) => j.id) : []))} /></th>
          ${COLUMNS.map(([key, label, sortable]) => html`<th data-column=${key}
              class=${sortable ? 'sortable' : ''}
              aria-sort=${params.sort === key ? (params.order === 'asc' ? 'ascending' : 'descending') : undefined}
              onClick=${sortable ? () => sortBy(key) : undefined}>${label}${
              params.sort === key ? (params.order === 'asc' ? ' ▲' : ' ▼') : ''}</th>`)}
        </tr></thead>
        <tbody>${jobs.map((j) => html`
          <tr key=${j.id} data-job-id=${j.id} data-user=${j.user}>
            <td>${mayAct(session, j) && html`<input type="checkbox" data-select=${j.id}
                aria-label=${`select job ${j.id}`} checked=${selected.has(j.id)}
                onChange=${() => toggle(j.id)} />`}</td>
            <td><${Link} href=${`/jobs/${j.id}`}>${j.id}<//></td>
            <td class="name">${visibleText(j.name)}${j.sweep_id && !j.array_id ? html` <${Link}
                class="tag" href=${`/sweeps/${j.sweep_id}`}>sweep ${j.sweep_id}<//>` : ''}${
              j.array_id ? html` <${Link} class="tag" href=${`/arrays/${j.array_id}`}>array ${
                j.array_id}[${j.array_index}]<//>` : ''}</td>
            <td>${visibleText(j.user)}</td>
            <td><${StateBadge} job=${j} /></td>
            <td><${ProgressBar} job=${j} /></td>
            <td>${j.pool}</td>
            <td>${j.priority}</td>
            <td>${formatTime(j.submit_time)}</td>
          </tr>`)}</tbody>
      </table>
      ${reply && jobs.length === 0 && html`<p class="muted" id="jobs-empty">No jobs match.</p>`}
      <div class="pager">
        <button id="jobs-prev" disabled=${params.offset === 0}
            onClick=${() => setParams({...params, offset: Math.max(0, params.offset - params.limit)})}>Previous</button>
        <span id="jobs-range">${first}–${last} of ${total}</span>
        <button id="jobs-next" disabled=${params.offset + params.limit >= total}
            onClick=${() => setParams({...params, offset: params.offset + params.limit})}>Next</button>
      </div>
    </section>`;
}
