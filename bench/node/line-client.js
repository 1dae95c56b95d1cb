'use strict';
// A small Node client of redlockd's line protocol, for scripts/bench: plain
// `net` sockets, --conns connections, each with one request outstanding at
// a time (no pipelining) and a resource of its own, looping
// LOCK <r> ttl=30000 / UNLOCK <r> for --duration seconds. One cycle is one
// LOCK+UNLOCK. Prints one JSON object (redlockd-bench's fields).
//
//   node line-client.js --server 127.0.0.1:7390 --duration 10 --conns 50 \
//       [--watch daemon=PID]...
//
// --server /PATH connects to the daemon's unix socket instead.

const net = require('net');
const { parseArgs, CpuWindow, Samples, Errors, nowMs } = require('./common');

const o = parseArgs('line-client.js', '--server HOST:PORT|/PATH [--ttl MS]', ['--server', '--ttl']);
if (!o.server) {
  process.stderr.write('line-client.js: --server is required\n');
  process.exit(2);
}
const ttl = Number(o.ttl || 30000);

// One connection: request() sends a line and resolves with the next reply
// line; EVENT lines are not replies and are counted apart.
class Conn {
  constructor(where) {
    this.buf = '';
    this.waiting = null;
    this.events = 0;
    this.sock = net.connect(where);
    this.sock.setNoDelay(true);
    this.sock.setEncoding('latin1');
    this.ready = new Promise((resolve, reject) => {
      this.sock.once('connect', resolve);
      this.sock.once('error', reject);
    });
    this.sock.on('data', (d) => this.onData(d));
    this.sock.on('close', () => {
      if (this.waiting) this.waiting.reject(new Error('connection closed'));
      this.waiting = null;
    });
    this.sock.on('error', () => {});
  }

  onData(d) {
    this.buf += d;
    let nl;
    while ((nl = this.buf.indexOf('\n')) >= 0) {
      let line = this.buf.slice(0, nl);
      this.buf = this.buf.slice(nl + 1);
      if (line.endsWith('\r')) line = line.slice(0, -1);
      if (line.startsWith('EVENT ')) {
        this.events++;
        continue;
      }
      const w = this.waiting;
      this.waiting = null;
      if (w) w.resolve(line);
    }
  }

  request(line) {
    return new Promise((resolve, reject) => {
      this.waiting = { resolve, reject };
      this.sock.write(`${line}\n`);
    });
  }
}

function code(line) {
  return line.startsWith('ERR ') ? line.split(' ')[1] : '?';
}

async function main() {
  let where = { path: o.server };
  if (!o.server.startsWith('/')) {
    const i = o.server.lastIndexOf(':');
    where = { host: o.server.slice(0, i), port: Number(o.server.slice(i + 1)) };
  }
  const conns = Array.from({ length: o.conns }, () => new Conn(where));
  await Promise.all(conns.map((c) => c.ready));
  for (const [w, c] of conns.entries()) {
    const r = await c.request(`HELLO proto=1 name=node-line-${w}`);
    if (!r.startsWith('OK ')) throw new Error(`HELLO answered: ${r}`);
  }

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

  async function worker(c, w) {
    const r = `${o.prefix}:${w}`;
    while (!stop) {
      const a = nowMs();
      const got = await c.request(`LOCK ${r} ttl=${ttl}`);
      if (!got.startsWith('OK')) {
        errors.add(code(got), got);
        continue;
      }
      lat.add(nowMs() - a);
      const rel = await c.request(`UNLOCK ${r}`);
      if (rel.startsWith('OK')) cycles++;
      else errors.add(code(rel), rel);
    }
  }

  await Promise.all(conns.map(worker));
  const elapsed = (nowMs() - t0) / 1000;
  cpu.stop();
  clearTimeout(timer);
  await Promise.all(conns.map((c) => c.request('QUIT').catch(() => '')));
  conns.forEach((c) => c.sock.destroy());

  const out = {
    mode: 'line-client',
    connections: o.conns,
    elapsed_s: elapsed,
    cycles,
    cycles_per_s: cycles / elapsed,
    ttl_ms: ttl,
    latency_ms: { lock: lat.json() },
    errors: errors.json(),
    events: conns.reduce((n, c) => n + c.events, 0),
    complete: cycles > 0,
    ...cpu.json(cycles),
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

main().catch((e) => {
  process.stderr.write(`line-client.js: ${e.stack || e}\n`);
  process.exit(1);
});
