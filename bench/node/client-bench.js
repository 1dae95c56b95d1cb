'use strict';
// The redlockd Node client (client/node, built: dist/cjs) for scripts/bench:
// ONE Client (one session, one connection, tagged requests) and --conns
// concurrent `using` loops, each on a resource of its own, looping
// using(r, { ttl: 30000 }, routine) for --duration seconds: one LOCK and one
// UNLOCK per cycle, uncontended. The lock latency is from the using() call
// to the routine's start. Prints one JSON object (redlockd-bench's fields,
// cpu_us_per_cycle.client from process.cpuUsage()).
//
//   node client-bench.js --server 127.0.0.1:7390 --duration 10 --conns 50 \
//       [--watch daemon=PID]...
//
// --server /PATH (or unix:/PATH) connects to the daemon's unix socket.

const path = require('path');
const { parseArgs, CpuWindow, Samples, Errors, nowMs, report, run } = require('./common');

const dist = path.join(__dirname, '..', '..', 'client', 'node', 'dist', 'cjs', 'index.js');
let Client;
try {
  ({ Client } = require(dist));
} catch (e) {
  process.stderr.write(`client-bench.js: ${dist} does not load (cd client/node && npm ci && npm run build): ${e.message}\n`);
  process.exit(2);
}

const o = parseArgs('client-bench.js', '--server HOST:PORT|/PATH [--ttl MS]', ['--server', '--ttl']);
if (!o.server) {
  process.stderr.write('client-bench.js: --server is required\n');
  process.exit(2);
}
const ttl = Number(o.ttl || 30000);
const server = o.server.startsWith('/') ? `unix:${o.server}` : o.server;

async function main() {
  const client = new Client({ servers: [server], name: 'node-client-bench', timeout: 10000 });
  client.on('error', (e) => process.stderr.write(`client: ${e.message}\n`));
  await client.connect();
  const names = Array.from({ length: o.conns }, (_, w) => `${o.prefix}:${w}`);
  // One warm-up cycle per loop before the window (the JIT, the daemon's
  // first grant of each name), as the library's baseline has.
  await Promise.all(names.map((r) => client.using(r, { ttl }, () => {})));

  const lat = new Samples();
  const errors = new Errors();
  let cycles = 0;
  let stop = false;

  const cpu = new CpuWindow(o.watch);
  cpu.start();
  const t0 = nowMs();
  const timer = setTimeout(() => {
    stop = true;
  }, o.duration * 1000);

  async function loop(r) {
    while (!stop) {
      const a = nowMs();
      try {
        await client.using(r, { ttl }, () => {
          lat.add(nowMs() - a);
        });
        cycles++;
      } catch (e) {
        errors.add(e.code || e.name || 'error', e.message);
      }
    }
  }

  await Promise.all(names.map(loop));
  const elapsed = (nowMs() - t0) / 1000;
  cpu.stop();
  clearTimeout(timer);
  await client.close();

  report({
    mode: 'node-client',
    connections: 1,
    loops: o.conns,
  }, { elapsed, cycles, ttl, lat, errors, cpu });
}

run('client-bench.js', main);
