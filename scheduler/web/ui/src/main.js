// The dashboard: a single-page app with history routing. The server hands
// index.html out for every page path; this picks the page from the path.
import 'uplot/dist/uPlot.min.css';
import '../css/app.css';
import {render} from 'preact';
import {useEffect, useState} from 'preact/hooks';
import {loadSession, logout} from './api.js';
import {visibleText} from './format.js';
import {ClusterPage} from './pages/cluster.js';
import {JobPage} from './pages/job.js';
import {JobsPage} from './pages/jobs.js';
import {QueuePage} from './pages/queue.js';
import {GroupPage} from './pages/group.js';
import {safeNextPath as safeNext} from './next.js';
import {ErrorNote, html, Link, navigate} from './ui.js';

function route(path) {
  let m;
  if (path === '/' || path === '/jobs' || path === '/jobs/') return {page: 'jobs'};
  if ((m = path.match(/^\/jobs\/(\d+)\/?$/))) return {page: 'job', id: m[1]};
  if ((m = path.match(/^\/sweeps\/(\d+)\/?$/))) return {page: 'group', kind: 'sweeps', id: m[1]};
  if ((m = path.match(/^\/arrays\/(\d+)\/?$/))) return {page: 'group', kind: 'arrays', id: m[1]};
  if (path === '/cluster') return {page: 'cluster'};
  if (path === '/queue') return {page: 'queue'};
  if (path === '/login') return {page: 'login'};
  return {page: 'missing'};
}

function Page({where, session}) {
  switch (where.page) {
    case 'jobs': return html`<${JobsPage} session=${session} />`;
    case 'job': return html`<${JobPage} key=${where.id} id=${where.id} session=${session} />`;
    case 'group':
      return html`<${GroupPage} key=${where.kind + where.id} kind=${where.kind}
          id=${where.id} session=${session} />`;
    case 'cluster': return html`<${ClusterPage} />`;
    case 'queue': return html`<${QueuePage} />`;
    default:
      return html`<p id="not-found">No page here. <${Link} href="/jobs">The jobs<//>.</p>`;
  }
}

function App() {
  const [path, setPath] = useState(location.pathname);
  const [session, setSession] = useState(null);
  const [error, setError] = useState(null);
  useEffect(() => {
    const onPop = () => setPath(location.pathname);
    addEventListener('popstate', onPop);
    loadSession().then(setSession, setError);
    return () => removeEventListener('popstate', onPop);
  }, []);
  const where = route(path);
  useEffect(() => {
    // Signed in already: the login page's ?next= is where to go.
    if (session && where.page === 'login') {
      navigate(safeNext(new URLSearchParams(location.search).get('next')));
    }
  }, [session, where.page]);
  const nav = (href, label, pages) => html`<${Link} href=${href}
      class=${pages.includes(where.page) ? 'active' : ''}>${label}<//>`;
  return html`
    <header id="header">
      <span class="brand">dlbatch</span>
      <nav>${nav('/jobs', 'Jobs', ['jobs', 'job', 'group'])}${nav('/queue', 'Queue', ['queue'])}${
          nav('/cluster', 'Cluster', ['cluster'])}</nav>
      <span class="spacer"></span>
      ${session && html`<span id="session-user">${visibleText(session.user)}${
          session.admin ? ' (admin)' : ''}</span>
        <button id="logout" onClick=${() => logout()}>Log out</button>`}
    </header>
    <main id="main">
      <${ErrorNote} error=${error} />
      ${session && html`<${Page} where=${where} session=${session} />`}
    </main>`;
}

render(html`<${App} />`, document.getElementById('app'));
