// Pure formatting helpers (no DOM, no fetch): unit-tested with node --test.
// Everything they return is plain text that the caller sets as a text node.

export const STATES = ['queued', 'running', 'cancelling', 'finished', 'failed',
                       'cancelled'];
const TERMINAL = new Set(['finished', 'failed', 'cancelled']);

export function isTerminal(state) { return TERMINAL.has(state); }

// Control characters made visible (U+2400 pictures, DEL as U+2421), so that
// a job's text can neither hide in the page nor move other text around; tab
// is kept. Lone surrogates cannot occur: the API sends valid UTF-8.
export function visibleText(s) {
  if (s === null || s === undefined) return '';
  return String(s).replace(/[\u0000-\u0008\u000a-\u001f\u007f]/g, (c) => {
    const code = c.charCodeAt(0);
    return String.fromCharCode(code === 0x7f ? 0x2421 : 0x2400 + code);
  });
}

export function formatBytes(n) {
  if (n === null || n === undefined || !Number.isFinite(n)) return '';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];
  let v = n, u = 0;
  while (Math.abs(v) >= 1024 && u < units.length - 1) { v /= 1024; u++; }
  return u === 0 ? `${v} B` : `${v.toFixed(v < 10 ? 1 : 0)} ${units[u]}`;
}

// Seconds as "45s", "12m 05s", "3h 20m", "2d 4h".
export function formatDuration(s) {
  if (s === null || s === undefined || !Number.isFinite(s) || s < 0) return '';
  s = Math.round(s);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60), h = Math.floor(m / 60), d = Math.floor(h / 24);
  const pad = (x) => String(x).padStart(2, '0');
  if (h === 0) return `${m}m ${pad(s % 60)}s`;
  if (d === 0) return `${h}h ${pad(m % 60)}m`;
  return `${d}d ${h % 24}h`;
}

// An RFC 3339 time as "2026-11-25 11:22:33" in UTC (what the CLI shows),
// '' for null. A malformed value is shown as it came.
export function formatTime(t) {
  if (!t) return '';
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return String(t);
  return d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, '');
}

// The clock part only, for diary lines.
export function formatClock(t) {
  const full = formatTime(t);
  return full.length >= 19 ? full.slice(11, 19) : full;
}

export function formatNumber(v, digits = 4) {
  if (v === null || v === undefined) return '';
  if (typeof v !== 'number') return String(v);
  if (!Number.isFinite(v)) return String(v);
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  if (a !== 0 && (a < 1e-3 || a >= 1e6)) return v.toExponential(digits - 1);
  return String(Number(v.toPrecision(digits)));
}

// A job's progress as a fraction in [0, 1], or null where it is unknown.
export function progressFraction(job) {
  if (!job) return null;
  if (job.state === 'finished') return 1;
  const p = job.progress;
  if (!p) return null;
  if (p.iterations > 0) return Math.min(1, Math.max(0, p.iteration / p.iterations));
  if (p.epochs > 0) return Math.min(1, Math.max(0, p.epoch / p.epochs));
  return null;
}

// Whether `session` ({user, admin}) may act on `job`: its owner or an admin.
export function mayAct(session, job) {
  return !!session && !!job && (session.admin === true || session.user === job.user);
}

// The actions that make sense for a job in its state, in button order.
export function actionsFor(job) {
  if (!job) return [];
  const out = [];
  if (job.state === 'queued' || job.state === 'running') out.push('cancel');
  if (job.state === 'queued' && !job.held) out.push('hold');
  if (job.held) out.push('release');
  if (['running', 'failed', 'cancelled'].includes(job.state)) out.push('requeue');
  return out;
}

// Where a job runs: "gpu-1[0,1] gpu-2[0]".
export function formatPlacement(placement) {
  if (!Array.isArray(placement)) return '';
  return placement
      .map((p) => `${visibleText(p.worker_name || p.worker_id)}` +
                  `[${(p.devices || []).join(',')}]`)
      .join(' ');
}

// The link of an output file: each path segment escaped on its own so
// that '/' still separates folders and nothing else is read as syntax.
export function outputUrl(jobId, filePath) {
  const segs = String(filePath).split('/').map(encodeURIComponent);
  return `/api/v1/jobs/${encodeURIComponent(jobId)}/outputs/${segs.join('/')}`;
}

// Lower is better for losses and errors; higher for everything else.
export function lowerIsBetter(metric) {
  return /loss|error|perplexity|time/i.test(metric || '');
}

// A job's value of a metric: a progress field or one of its own metrics.
export function metricValue(job, metric) {
  const p = job && job.progress;
  // A job that never reported (time null) carries the shape's zeros, and
  // validation values count only where has_validation says there are any.
  if (!p || p.time === null) return null;
  if (metric.startsWith('validation_') && p.has_validation === false) return null;
  if (metric in p && typeof p[metric] === 'number') return p[metric];
  const m = p.metrics || {};
  return typeof m[metric] === 'number' ? m[metric] : null;
}

// Jobs ordered best first by `metric`; jobs without a value go last, ties
// by id so that the order is stable.
export function rankJobs(jobs, metric, lowerBetter = lowerIsBetter(metric)) {
  return [...jobs].sort((a, b) => {
    const va = metricValue(a, metric), vb = metricValue(b, metric);
    if (va === null && vb === null) return a.id - b.id;
    if (va === null) return 1;
    if (vb === null) return -1;
    if (va !== vb) return lowerBetter ? va - vb : vb - va;
    return a.id - b.id;
  });
}
