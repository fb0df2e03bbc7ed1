#!/usr/bin/env node
// Checks Kubernetes manifests offline against the Kubernetes API schemas
// (npm's kubernetes-models: each kind's class validates its object with the
// API's OpenAPI schema), plus what the schemas cannot see: a workload's
// selector must match its pod template's labels, and a Service's selector
// some workload's pods.
//
//   NODE_PATH=DIR/node_modules node check-manifests.js FILE.yaml...
//
// (DIR: where `npm install kubernetes-models@4 js-yaml@4` put them.)
// Exits 1 naming each FILE, document and field that is wrong.
"use strict";
const fs = require("fs");
const yaml = require("js-yaml");

// apiVersion "apps/v1" and kind "StatefulSet" -> the model's class.
function modelFor(apiVersion, kind) {
  // The core group's "v1" is kubernetes-models/v1/Kind.
  let module;
  try {
    module = require(`kubernetes-models/${apiVersion}/${kind}`);
  } catch (e) {
    return null;
  }
  return module[kind] || null;
}

function matches(selector, labels) {
  return Object.entries(selector || {}).every(([k, v]) => (labels || {})[k] === v);
}

const errors = [];
const workloads = [];  // {where, labels}
const services = [];   // {where, selector}
let checked = 0;
for (const file of process.argv.slice(2)) {
  let docs;
  try {
    docs = yaml.loadAll(fs.readFileSync(file, "utf8"));
  } catch (e) {
    errors.push(`${file}: not YAML: ${e.message}`);
    continue;
  }
  docs.forEach((doc, i) => {
    if (doc === null || doc === undefined) return;
    const where = `${file}: document ${i + 1} (${doc.kind || "?"} ${
        (doc.metadata && doc.metadata.name) || "?"})`;
    if (!doc.apiVersion || !doc.kind) {
      errors.push(`${where}: needs apiVersion and kind`);
      return;
    }
    const Model = modelFor(doc.apiVersion, doc.kind);
    if (!Model) {
      errors.push(`${where}: no schema for ${doc.apiVersion} ${doc.kind}`);
      return;
    }
    try {
      new Model(doc).validate();
    } catch (e) {
      errors.push(`${where}: ${e.message}`);
      return;
    }
    checked++;
    const spec = doc.spec || {};
    if (spec.template && spec.selector) {
      const labels = (spec.template.metadata || {}).labels;
      if (!matches(spec.selector.matchLabels, labels)) {
        errors.push(`${where}: spec.selector.matchLabels ${
            JSON.stringify(spec.selector.matchLabels)} does not match the ` +
            `pod template's labels ${JSON.stringify(labels)}`);
      }
      workloads.push({where, labels, ns: doc.metadata.namespace});
    }
    if (doc.kind === "Service" && spec.selector) {
      services.push({where, selector: spec.selector, ns: doc.metadata.namespace});
    }
  });
}
for (const s of services) {
  if (!workloads.some((w) => w.ns === s.ns && matches(s.selector, w.labels))) {
    errors.push(`${s.where}: selector ${JSON.stringify(s.selector)} ` +
                `matches no workload's pods`);
  }
}
if (errors.length) {
  for (const e of errors) console.error(e);
  process.exit(1);
}
console.log(`${checked} manifest(s) valid`);
