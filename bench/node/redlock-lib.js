'use strict';
// The Redlock library baseline of scripts/bench: npm redlock@5.0.0-beta.2
// over ioredis, straight to the Redis nodes (no redlockd). --conns
// concurrent workers, each with a resource of its own, loop
// acquire (ttl 30 s) + release for --duration seconds; one cycle is one
// acquire+release. Prints one JSON object (redlockd-bench's fields).
//
//   node redlock-lib.js --nodes 127.0.0.1:6379,127.0.0.1:6380,... \
//       --duration 10 --conns 50 [--watch node1=PID]...

const Redis = require('ioredis');
const Redlock = require('redlock').default;
const { parseArgs, CpuWindow, Samples, Errors, nowMs, report, run } = require('./common');

const extra = '--nodes HOST:PORT,... [--ttl MS]';
const o = parseArgs('redlock-lib.js', extra, ['--nodes', '--ttl']);
if (!o.nodes) {
  process.stderr.write(`redlock-lib.js: --nodes is required\n`);
  process.exit(2);
}
const ttl = Number(o.ttl || 30000);

async function main() {
  const clients = o.nodes.split(',').map((hp) => {
    const i = hp.lastIndexOf(':');
    return new Redis({
      host: hp.slice(0, i),
      port: Number(hp.slice(i + 1)),
      maxRetriesPerRequest: 1,
      enableAutoPipelining: false,
      lazyConnect: true,
    });
  });
  await Promise.all(clients.map((c) => c.connect()));
  // The library's defaults except retryCount: every worker has its own
  // resource, so a failed attempt is an error to count, not contention.
  const redlock = new Redlock(clients, {
    driftFactor: 0.01,
    retryCount: 0,
    retryDelay: 200,
    retryJitter: 200,
    automaticExtensionThreshold: 500,
  });
  redlock.on('error', () => {});

  const lat = new Samples();
  const errors = new Errors();
  let cycles = 0;
  let stop = false;

  // One warm-up cycle per worker before the window: connections, script
  // loading (EVALSHA falls back to EVAL once) and the JIT.
  const names = Array.from({ length: o.conns }, (_, w) => `${o.prefix}:${w}`);
  for (const r of names) {
    const l = await redlock.acquire([r], ttl);
    await l.release();
  }

  const cpu = new CpuWindow(o.watch);
  cpu.start();
  const t0 = nowMs();
  const timer = setTimeout(() => {
    stop = true;
  }, o.duration * 1000);

  async function worker(r) {
    while (!stop) {
      const a = nowMs();
      let lock;
      try {
        lock = await redlock.acquire([r], ttl);
      } catch (e) {
        errors.add(e.name || 'acquire', e.message);
        continue;
      }
      lat.add(nowMs() - a);
      try {
        await lock.release();
        cycles++;
      } catch (e) {
        errors.add(e.name || 'release', e.message);
      }
    }
  }

  await Promise.all(names.map(worker));
  const elapsed = (nowMs() - t0) / 1000;
  cpu.stop();
  clearTimeout(timer);
  await Promise.all(clients.map((c) => c.quit()));

  report({
    mode: 'redlock-lib',
    connections: o.conns,
    nodes: clients.length,
  }, { elapsed, cycles, ttl, lat, errors, cpu });
}

run('redlock-lib.js', main);
