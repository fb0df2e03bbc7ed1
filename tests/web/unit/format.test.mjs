// The dashboard's pure helpers: text shown safely and legibly, the
// diary's virtual-scroll range math, the jobs list's query strings.
import assert from 'node:assert/strict';
import {test} from 'node:test';
import {actionsFor, formatBytes, formatDuration, formatNumber, formatTime, mayAct,
        metricValue, outputUrl, progressFraction, rankJobs, visibleText} from
    '../../../scheduler/web/ui/src/format.js';
import {safeNextPath} from '../../../scheduler/web/ui/src/next.js';
import {jobsQuery, readJobsParams, writeJobsParams} from
    '../../../scheduler/web/ui/src/query.js';

test('visibleText shows control bytes as pictures and keeps markup as text', () => {
  assert.equal(visibleText('a\x1b[31mb\n'), 'a\u241b[31mb\u240a');
  assert.equal(visibleText('\x7f\tok'), '\u2421\tok');
  assert.equal(visibleText('<img src=x onerror=alert(1)>'), '<img src=x onerror=alert(1)>');
  assert.equal(visibleText(null), '');
});

test('formatBytes, formatDuration, formatTime, formatNumber', () => {
  assert.equal(formatBytes(0), '0 B');
  assert.equal(formatBytes(1536), '1.5 KiB');
  assert.equal(formatBytes(80 * 2 ** 30), '80 GiB');
  assert.equal(formatDuration(45), '45s');
  assert.equal(formatDuration(725), '12m 05s');
  assert.equal(formatDuration(3 * 3600 + 20 * 60), '3h 20m');
  assert.equal(formatDuration(2 * 86400 + 4 * 3600), '2d 4h');
  assert.equal(formatTime('2026-11-25T11:22:33.456Z'), '2026-11-25 11:22:33');
  assert.equal(formatTime(null), '');
  assert.equal(formatTime('soon'), 'soon');
  assert.equal(formatNumber(0.123456), '0.1235');
  assert.equal(formatNumber(1e-5), '1.000e-5');
  assert.equal(formatNumber(42), '42');
  assert.equal(formatNumber(null), '');
});

test('progressFraction from iterations, epochs, or the end', () => {
  assert.equal(progressFraction({state: 'running', progress: {iteration: 25, iterations: 100}}), 0.25);
  assert.equal(progressFraction({state: 'running', progress: {iteration: 0, iterations: 0,
                                                              epoch: 1, epochs: 4}}), 0.25);
  assert.equal(progressFraction({state: 'running', progress: {iterations: 0, epochs: 0}}), null);
  assert.equal(progressFraction({state: 'finished', progress: null}), 1);
});

test('only the owner or an admin may act; actions follow the state', () => {
  const job = {user: 'alice', state: 'queued', held: false};
  assert.ok(mayAct({user: 'alice', admin: false}, job));
  assert.ok(!mayAct({user: 'bob', admin: false}, job));
  assert.ok(mayAct({user: 'bob', admin: true}, job));
  assert.ok(!mayAct(null, job));
  assert.deepEqual(actionsFor(job), ['cancel', 'hold']);
  assert.deepEqual(actionsFor({...job, held: true}), ['cancel', 'release']);
  assert.deepEqual(actionsFor({state: 'running'}), ['cancel', 'requeue']);
  assert.deepEqual(actionsFor({state: 'finished'}), []);
  assert.deepEqual(actionsFor({state: 'failed'}), ['requeue']);
});

test('outputUrl escapes each segment, keeps the folders', () => {
  assert.equal(outputUrl(7, 'model/best #1.onnx'), '/api/v1/jobs/7/outputs/model/best%20%231.onnx');
  assert.equal(outputUrl(7, '../x?y'), '/api/v1/jobs/7/outputs/../x%3Fy');
});

test('rankJobs: lower is better for losses, missing values last', () => {
  const jobs = [{id: 1, progress: {loss: 0.5}}, {id: 2, progress: {loss: 0.2}},
                {id: 3, progress: null}, {id: 4, progress: {metrics: {bleu: 30}}},
                {id: 5, progress: {metrics: {bleu: 40}}}];
  assert.deepEqual(rankJobs(jobs, 'loss').map((j) => j.id), [2, 1, 3, 4, 5]);
  assert.deepEqual(rankJobs(jobs, 'bleu').map((j) => j.id), [5, 4, 1, 2, 3]);
});

test('metricValue: a job that never reported has no values, not the zeros of the shape', () => {
  // A command job's progress as the scheduler sends it before any report.
  const silent = {progress: {time: null, iteration: 0, loss: 0, accuracy: 0, has_validation: false,
                             validation_loss: 0, metrics: {}}};
  assert.equal(metricValue(silent, 'loss'), null);
  assert.equal(metricValue(silent, 'validation_loss'), null);
  const trained = {progress: {time: '2026-12-02T18:40:43.000Z', iteration: 5, loss: 0.5, has_validation: false,
                              validation_loss: 0, metrics: {f1: 0}}};
  assert.equal(metricValue(trained, 'loss'), 0.5);
  assert.equal(metricValue(trained, 'validation_loss'), null);
  assert.equal(metricValue(trained, 'f1'), 0);
  assert.equal(rankJobs([silent, {...trained, id: 2}], 'loss', true)[0].id, 2);
});

test('safeNextPath refuses other sites', () => {
  assert.equal(safeNextPath('/jobs/3?x=1'), '/jobs/3?x=1');
  assert.equal(safeNextPath('//evil.example/'), '/');
  assert.equal(safeNextPath('/\\evil.example'), '/');
  assert.equal(safeNextPath('https://evil.example/'), '/');
  assert.equal(safeNextPath(null), '/');
});

test('jobs params round-trip through the query string', () => {
  const p = readJobsParams('?state=running,bogus,queued&q=res%20net&sort=name&order=asc&offset=200');
  assert.deepEqual(p.states, ['queued', 'running']);
  assert.equal(p.q, 'res net');
  assert.equal(p.sort, 'name');
  assert.equal(p.order, 'asc');
  assert.equal(p.offset, 200);
  assert.deepEqual(readJobsParams(writeJobsParams(p)), p);
  assert.equal(writeJobsParams(readJobsParams('')), '');
  assert.equal(readJobsParams('?sort=evil&offset=-5').sort, 'id');
  assert.equal(readJobsParams('?offset=-5').offset, 0);
  const api = new URLSearchParams(jobsQuery(p).slice(1));
  assert.equal(api.get('state'), 'queued,running');
  assert.equal(api.get('limit'), '100');
  assert.equal(api.get('offset'), '200');
});
