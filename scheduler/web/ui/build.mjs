// Bundles the dashboard: src/main.js -> assets/app.js (+ app.css, uPlot's
// styles included), src/login.js -> assets/login.js, and copies the two
// pages. Nothing is fetched at run time and nothing inline is emitted: the
// server's Content-Security-Policy is default-src 'self'.
//
//   node build.mjs [--out DIR] [--modules DIR]
//
// --modules names the node_modules folder `npm ci` filled (the CMake build
// keeps it in the build tree, never in the sources); default ./node_modules
// of the current folder. --out defaults to ./web of the current folder.
import {copyFileSync, mkdirSync} from 'node:fs';
import {createRequire} from 'node:module';
import path from 'node:path';
import {fileURLToPath} from 'node:url';

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
function flag(name, fallback) {
  const i = args.indexOf(name);
  if (i < 0) return fallback;
  if (i + 1 >= args.length) {
    console.error(`build.mjs: ${name} needs a folder`);
    process.exit(2);
  }
  return path.resolve(args[i + 1]);
}
const out = flag('--out', path.resolve('web'));
const modules = flag('--modules', path.resolve('node_modules'));

let esbuild;
try {
  esbuild = createRequire(path.join(modules, 'noop.js'))('esbuild');
} catch (e) {
  console.error(`build.mjs: no esbuild in ${modules}; run npm ci there first ` +
                `(the CMake target dlbatch-web-ui does)`);
  process.exit(1);
}

mkdirSync(path.join(out, 'assets'), {recursive: true});
await esbuild.build({
  entryPoints: {
    app: path.join(here, 'src/main.js'),
    login: path.join(here, 'src/login.js'),
  },
  outdir: path.join(out, 'assets'),
  bundle: true,
  minify: true,
  sourcemap: false,
  format: 'esm',
  target: ['es2020'],
  nodePaths: [modules],
  logLevel: 'warning',
  legalComments: 'none',
});
for (const page of ['index.html', 'login.html']) {
  copyFileSync(path.join(here, page), path.join(out, page));
}
