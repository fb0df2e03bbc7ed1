// Shared bits of markup. Every string a user or a job wrote goes through
// preact as a text node (htm's ${value} in element content or an attribute
// value); nothing here builds HTML from strings.
import {h} from 'preact';
import htm from 'htm';
import {formatNumber, progressFraction, visibleText} from './format.js';

export const html = htm.bind(h);

export function navigate(path) {
  history.pushState(null, '', path);
  dispatchEvent(new PopStateEvent('popstate'));
}

// A link that routes inside the app (a plain click) or opens a tab.
export function Link({href, children, ...rest}) {
  const onClick = (e) => {
    if (e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
    e.preventDefault();
    navigate(href);
  };
  return html`<a href=${href} onClick=${onClick} ...${rest}>${children}</a>`;
}

export function Text({value}) { return visibleText(value); }

export function StateBadge({job, id}) {
  const label = job.held && job.state === 'queued' ? 'held' : job.state;
  return html`<span class="state state-${label}" id=${id}
      data-state=${job.state}>${label}</span>`;
}

export function ProgressBar({job}) {
  const f = progressFraction(job);
  if (f === null) return html`<span class="muted">—</span>`;
  return html`<progress max="1" value=${f}
      title=${`${formatNumber(100 * f, 3)}%`}></progress>`;
}

export function ErrorNote({error}) {
  if (!error) return null;
  return html`<p class="error" role="alert">${visibleText(error.message || String(error))}</p>`;
}
