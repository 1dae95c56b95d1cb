// The package as a user gets it: `npm pack` makes the tarball, which
// installs into an empty project with no registry (a registry address that
// answers nothing, an empty cache, --offline), and the README's example
// runs from there against scripts/run; the TypeScript fixtures type-check
// against the installed package (ESM, CommonJS and node10 resolution).
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readFileSync, readdirSync, writeFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, describe, it } from 'node:test';

import { Harness, REDLOCKD_BIN, REPO, freePort, waitFor } from './harness.mjs';

const pkgDir = resolve(dirname(fileURLToPath(import.meta.url)), '..');
const pkg = JSON.parse(readFileSync(join(pkgDir, 'package.json'), 'utf8'));
const h = new Harness();
let work;
let tarball;
let app;
let run = null;
let server;

function npm(args, cwd, env = {}) {
  const r = spawnSync('npm', args, {
    cwd,
    encoding: 'utf8',
    env: { ...process.env, npm_config_update_notifier: 'false', npm_config_fund: 'false', npm_config_audit: 'false', ...env },
  });
  assert.equal(r.status, 0, `npm ${args.join(' ')}:\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

function node(file, env) {
  return spawnSync(process.execPath, [file], { cwd: app, encoding: 'utf8', env: { ...process.env, ...env }, timeout: 30000 });
}

/** The README's example: the code block after its "example" marker. */
function readmeExample() {
  const text = readFileSync(join(pkgDir, 'README.md'), 'utf8');
  const m = /<!-- example[^>]*-->\s*```js\n([\s\S]*?)```/.exec(text);
  assert.ok(m, 'no marked example in README.md');
  return m[1];
}

// Node 18's runner runs top-level hooks after the suites: every hook and
// suite is inside this one.
describe('the packed package', () => {
  before(async () => {
    work = h.mkdtemp('pack');
    // The build is there already (scripts/test.sh): pack it as it is, without
    // prepack's rebuild under the other test files' feet.
    npm(['pack', '--ignore-scripts', '--pack-destination', work], pkgDir);
    tarball = join(work, `${pkg.name}-${pkg.version}.tgz`);
    app = join(work, 'app');
    mkdirSync(app);
    writeFileSync(join(app, 'package.json'), JSON.stringify({ name: 'app', version: '1.0.0', private: true }, null, 2));
    npm(['install', '--offline', '--no-package-lock', tarball], app, {
      npm_config_registry: 'http://127.0.0.1:9/',
      npm_config_cache: join(work, 'empty-cache'),
    });
    // scripts/run, with the build's daemon, on ports of its own.
    const port = await freePort();
    const redisPorts = [await freePort(), await freePort(), await freePort()];
    server = `127.0.0.1:${port}`;
    run = spawn('/usr/bin/setpriv', ['--pdeathsig', 'TERM', '--', join(REPO, 'scripts', 'run')], {
      env: {
        ...process.env,
        REDLOCKD_BIN,
        REDLOCKD_PORT: String(port),
        REDIS_PORTS: redisPorts.join(' '),
        REDLOCKD_LOG: 'notice',
      },
      stdio: ['ignore', 'ignore', 'pipe'],
    });
    let err = '';
    run.stderr.setEncoding('utf8');
    run.stderr.on('data', (d) => {
      err += d;
    });
    const ready = await waitFor(() => err.includes('redlockd is running') || run.exitCode !== null, 20000);
    assert.ok(ready && run.exitCode === null, `scripts/run did not start:\n${err}`);
  });

  after(async () => {
    if (run !== null && run.exitCode === null) {
      const exited = new Promise((res) => run.once('exit', res));
      run.kill('SIGTERM');
      await exited;
    }
    await h.cleanup();
  });

  describe('the package', () => {
    it('holds the built code, its types and the README, nothing else', () => {
      const list = spawnSync('tar', ['tzf', tarball], { encoding: 'utf8' }).stdout.trim().split('\n').sort();
      for (const f of [
        'package/package.json',
        'package/README.md',
        'package/dist/esm/index.js',
        'package/dist/esm/index.d.ts',
        'package/dist/esm/redlock.js',
        'package/dist/cjs/index.js',
        'package/dist/cjs/index.d.ts',
        'package/dist/cjs/redlock.d.ts',
        'package/dist/cjs/package.json',
      ]) {
        assert.ok(list.includes(f), `${f} not in the tarball`);
      }
      assert.deepEqual(list.filter((f) => /\/(src|test|scripts|node_modules)\//.test(f)), []);
      const installed = JSON.parse(readFileSync(join(app, 'node_modules', 'redlockd', 'package.json'), 'utf8'));
      assert.deepEqual(installed.dependencies ?? {}, {}, 'no runtime dependencies');
      assert.deepEqual(readdirSync(join(app, 'node_modules')).filter((d) => !d.startsWith('.')), ['redlockd']);
    });

    it("runs the README's example against scripts/run (ES module)", () => {
      writeFileSync(join(app, 'example.mjs'), readmeExample());
      const r = node('example.mjs', { REDLOCKD_SERVER: server });
      assert.equal(r.status, 0, r.stderr);
      assert.match(r.stdout, /^holding invoice:1001, fence \d+\nreleased, fence was \d+\n$/);
    });

    it('works from CommonJS too', () => {
      writeFileSync(
        join(app, 'example.cjs'),
        `const { Client } = require('redlockd');
  const { default: Redlock } = require('redlockd/redlock');
  (async () => {
    const client = new Client({ name: 'cjs' });
    const lease = await client.acquire('cjs:1', { wait: 1000 });
    console.log(typeof lease.fence);
    await lease.release();
    await client.close();
    const redlock = new Redlock([process.env.REDLOCKD_SERVER]);
    console.log(await redlock.using(['cjs:2'], 5000, async () => 'compat'));
    await redlock.quit();
  })().catch((e) => { console.error(e); process.exit(1); });
  `,
      );
      const r = node('example.cjs', { REDLOCKD_SERVER: server });
      assert.equal(r.status, 0, r.stderr);
      assert.equal(r.stdout, 'bigint\ncompat\n');
    });

    it('type-checks a TypeScript user of the installed package (tsc --noEmit --strict)', () => {
      const tsc = join(pkgDir, 'node_modules', 'typescript', 'bin', 'tsc');
      const types = join(pkgDir, 'test', 'types');
      for (const f of ['esm.mts', 'cjs.cts', 'node10.ts']) copyFileSync(join(types, f), join(app, f));
      for (const cfg of ['tsconfig.json', 'tsconfig.node10.json']) {
        const c = JSON.parse(readFileSync(join(types, cfg), 'utf8'));
        c.compilerOptions.typeRoots = [join(pkgDir, 'node_modules', '@types')];
        writeFileSync(join(app, cfg), JSON.stringify(c, null, 2));
        const r = spawnSync(process.execPath, [tsc, '-p', join(app, cfg)], { cwd: app, encoding: 'utf8' });
        assert.equal(r.status, 0, `tsc -p ${cfg}:\n${r.stdout}${r.stderr}`);
      }
      assert.ok(existsSync(join(app, 'node_modules', 'redlockd', 'dist', 'esm', 'index.d.ts')));
    });
  });
});
