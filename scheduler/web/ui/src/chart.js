// A uPlot line chart in a preact component. `data` is uPlot's aligned
// columns [xs, ys1, ys2, ...]; `series` names each y column. The chart is
// made once and fed new data in place (setData), so live points are cheap.
import uPlot from 'uplot';
import {useEffect, useRef} from 'preact/hooks';
import {html} from './ui.js';

const COLORS = ['#1f77b4', '#d62728', '#2ca02c', '#ff7f0e', '#9467bd', '#8c564b',
                '#e377c2', '#7f7f7f', '#bcbd22', '#17becf'];

export function Chart({id, title, xLabel = 'iteration', series, data, height = 220}) {
  const box = useRef(null);
  const plot = useRef(null);
  const shape = series.join('\u0000');
  useEffect(() => {
    const width = Math.max(300, box.current.clientWidth || 600);
    plot.current = new uPlot({
      title, width, height,
      scales: {x: {time: false}},
      axes: [{label: xLabel}, {}],
      series: [{label: xLabel}, ...series.map((label, i) => ({
        label, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
      }))],
      // data-drawn: how many points the canvas holds once drawn, so that a
      // benchmark or a test can tell when a reported point reached the screen.
      hooks: {draw: [(u) => { if (box.current) box.current.dataset.drawn = String(u.data[0].length); }]},
    }, data, box.current);
    const onResize = () => plot.current &&
        plot.current.setSize({width: Math.max(300, box.current.clientWidth), height});
    addEventListener('resize', onResize);
    return () => {
      removeEventListener('resize', onResize);
      plot.current.destroy();
      plot.current = null;
    };
  }, [shape, title]);
  // data-points: how many x values the plot holds now (uPlot's own data),
  // which tests and scripts read to see a live curve grow.
  useEffect(() => {
    if (!plot.current) return;
    plot.current.setData(data);
    box.current.dataset.points = String((plot.current.data[0] || []).length);
  }, [data]);
  return html`<div class="chart" id=${id} ref=${box}></div>`;
}

// Progress points -> aligned columns of `keys` against the iteration (the
// point's seq where the iteration is unknown). Missing values are null.
export function columns(points, keys) {
  const xs = points.map((p, i) => (typeof p.iteration === 'number' ? p.iteration
                                   : (p.seq ?? i)));
  return [xs, ...keys.map((k) => points.map((p) => {
    const v = k in p ? p[k] : (p.metrics || {})[k];
    return typeof v === 'number' ? v : null;
  }))];
}

// Several jobs' points of one key, on one x axis (uPlot.join aligns them).
export function overlay(pointsByJob, key) {
  if (pointsByJob.length === 0) return [[]];
  const tables = pointsByJob.map((pts) => {
    const [xs, ys] = columns(pts, [key]);
    // uPlot.join wants ascending, distinct x values.
    const seen = new Map();
    xs.forEach((x, i) => seen.set(x, ys[i]));
    const sx = [...seen.keys()].sort((a, b) => a - b);
    return [sx, sx.map((x) => seen.get(x))];
  });
  return uPlot.join(tables);
}
