// Real redis-server and redlockd processes for the Node client's tests.
//
// Every process runs on a free loopback port in a temporary directory of
// its own, started through `setpriv --pdeathsig KILL` when there is one (so
// it dies with the test process even if that is killed). A Harness stops
// exactly what it started, by PID. REDLOCKD_BIN names the daemon (default:
// the build in ../../build/daemon/redlockd).
import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync, closeSync } from 'node:fs';
import { createConnection, createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

const here = dirname(fileURLToPath(import.meta.url));
export const REPO = resolve(here, '..', '..', '..');
export const REDLOCKD_BIN = process.env.REDLOCKD_BIN || resolve(here, '..', '..', '..', 'build', 'daemon', 'redlockd');
const SETPRIV = ['/usr/bin/setpriv', '/bin/setpriv'].find((p) => existsSync(p));
const REDIS_SERVER = (() => {
  const r = spawnSync('sh', ['-c', 'command -v redis-server'], { encoding: 'utf8' });
  return r.status === 0 ? r.stdout.trim() : null;
})();

/** A free loopback TCP port (bound and released: another program may
 * still take it first, so starts are retried). */
export function freePort() {
  return new Promise((res, rej) => {
    const s = createServer();
    s.once('error', rej);
    s.listen(0, '127.0.0.1', () => {
      const { port } = s.address();
      s.close(() => res(port));
    });
  });
}

/** Poll fn() until it is truthy or ms pass; its last value. */
export async function waitFor(fn, ms = 5000, every = 20) {
  const end = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v || Date.now() >= end) return v;
    await sleep(every);
  }
}

/** Send `line` to 127.0.0.1:port or a unix path, read until `want` shows
 * up (or nothing more comes); the text read. */
export function ask(where, text, ms = 1000) {
  return new Promise((res) => {
    const sock = typeof where === 'number' ? createConnection({ host: '127.0.0.1', port: where }) : createConnection({ path: where });
    let buf = '';
    const done = () => {
      clearTimeout(timer);
      sock.destroy();
      res(buf);
    };
    const timer = setTimeout(done, ms);
    sock.setEncoding('utf8');
    sock.on('connect', () => sock.write(text));
    sock.on('data', (d) => {
      buf += d;
      const lines = buf.split('\n').filter((l) => l && !l.startsWith('EVENT '));
      if (lines.length >= text.split('\n').filter(Boolean).length) done();
    });
    sock.on('error', done);
    sock.on('close', done);
  });
}

function tail(path, n = 6000) {
  try {
    const s = readFileSync(path, 'utf8');
    return s.slice(-n);
  } catch {
    return '(no log)';
  }
}

class Proc {
  constructor(argv, logPath) {
    const fd = openSync(logPath, 'a');
    const full = SETPRIV ? [SETPRIV, '--pdeathsig', 'KILL', '--', ...argv] : argv;
    this.child = spawn(full[0], full.slice(1), { stdio: ['ignore', fd, fd] });
    closeSync(fd);
    this.pid = this.child.pid;
    this.exited = false;
    this.code = null;
    this.exit = new Promise((res) => {
      this.child.on('exit', (code, sig) => {
        this.exited = true;
        this.code = code === null ? sig : code;
        res(this.code);
      });
    });
  }

  signal(sig) {
    if (!this.exited) {
      try {
        process.kill(this.pid, sig);
      } catch {
        // gone meanwhile
      }
    }
  }

  /** Signal and wait; SIGKILL after ms. */
  async stop(sig = 'SIGTERM', ms = 10000) {
    if (this.exited) return this.code;
    this.signal('SIGCONT');
    this.signal(sig);
    const t = setTimeout(() => this.signal('SIGKILL'), ms);
    const code = await this.exit;
    clearTimeout(t);
    return code;
  }
}

export class Redis {
  constructor(h) {
    this.h = h;
    this.dir = h.mkdtemp('redis');
    this.logPath = join(this.dir, 'redis.log');
  }

  async start() {
    for (let attempt = 0; attempt < 5; attempt++) {
      this.port = await freePort();
      this.proc = new Proc(
        [REDIS_SERVER, '--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
          '--daemonize', 'no', '--dir', this.dir, '--logfile', this.logPath],
        this.logPath,
      );
      this.h.procs.push(this.proc);
      const ok = await waitFor(async () => this.proc.exited || (await ask(this.port, 'PING\r\n', 300)).startsWith('+PONG'), 5000);
      if (ok && !this.proc.exited) return this;
      await this.proc.stop('SIGKILL');
    }
    throw new Error(`redis-server did not start:\n${tail(this.logPath)}`);
  }

  get addr() {
    return `127.0.0.1:${this.port}`;
  }

  pause() {
    this.proc.signal('SIGSTOP');
  }

  resume() {
    this.proc.signal('SIGCONT');
  }

  stop() {
    return this.proc.stop();
  }

  /** Start again on the same port and directory. */
  async startAgain() {
    this.proc = new Proc(
      [REDIS_SERVER, '--port', String(this.port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no',
        '--daemonize', 'no', '--dir', this.dir, '--logfile', this.logPath],
      this.logPath,
    );
    this.h.procs.push(this.proc);
    const ok = await waitFor(async () => this.proc.exited || (await ask(this.port, 'PING\r\n', 300)).startsWith('+PONG'), 5000);
    if (!ok || this.proc.exited) throw new Error(`redis-server did not start again:\n${tail(this.logPath)}`);
  }
}

function merge(base, extra) {
  for (const [k, v] of Object.entries(extra)) {
    if (v && typeof v === 'object' && !Array.isArray(v) && base[k] && typeof base[k] === 'object') merge(base[k], v);
    else base[k] = v;
  }
  return base;
}

export class Daemon {
  constructor(h, nodes, extra = {}) {
    this.h = h;
    this.nodes = nodes;
    this.extra = extra;
    this.dir = h.mkdtemp('redlockd');
    this.logPath = join(this.dir, 'redlockd.log');
    this.confPath = join(this.dir, 'redlockd.json');
    this.sockPath = join(this.dir, 'redlockd.sock');
  }

  async start() {
    for (let attempt = 0; attempt < 3; attempt++) {
      this.port = await freePort();
      const conf = {
        listen: [`tcp://127.0.0.1:${this.port}`, `unix:${this.sockPath}`],
        redis: { nodes: this.nodes.map((n) => n.addr) },
        log: { level: 'debug' },
        // A stop under held leases waits this long for their clients to
        // release them (the daemon's default is 5000).
        shutdown_timeout_ms: 1000,
      };
      merge(conf, JSON.parse(JSON.stringify(this.extra)));
      if (conf.tls && conf.tls.cert_file && !conf.listen.some((a) => a.startsWith('tls://'))) {
        this.tlsPort = await freePort();
        conf.listen.push(`tls://127.0.0.1:${this.tlsPort}`);
      }
      writeFileSync(this.confPath, JSON.stringify(conf, null, 2));
      this.proc = new Proc([REDLOCKD_BIN, '-c', this.confPath], this.logPath);
      this.h.procs.push(this.proc);
      if (await this._waitReady()) return this;
      await this.proc.stop('SIGKILL');
      if (!tail(this.logPath).includes('in use')) break;
    }
    throw new Error(`redlockd did not start:\n${tail(this.logPath)}`);
  }

  /** Ready: it answers PING, its socket is there, and its log (at debug)
   * says since this start that every node votes ("redis ADDR: votes"). */
  async _waitReady(ms = 8000) {
    const from = this._logSize();
    const want = this.nodes.map((n) => `redis ${n.addr}: votes`);
    return waitFor(async () => {
      if (this.proc.exited) return true;
      const log = this._logFrom(from);
      if (!want.every((w) => log.includes(w)) || !existsSync(this.sockPath)) return false;
      return (await ask(this.port, 'PING\n', 300)).startsWith('PONG');
    }, ms).then((ok) => ok && !this.proc.exited);
  }

  _logSize() {
    try {
      return readFileSync(this.logPath).length;
    } catch {
      return 0;
    }
  }

  _logFrom(offset) {
    try {
      return readFileSync(this.logPath).subarray(offset).toString('utf8');
    } catch {
      return '';
    }
  }

  get server() {
    return `127.0.0.1:${this.port}`;
  }

  get unixServer() {
    return `unix:${this.sockPath}`;
  }

  get tlsServer() {
    return `tls://127.0.0.1:${this.tlsPort}`;
  }

  /** SIGTERM, and the exit code. */
  stop() {
    return this.proc.stop('SIGTERM');
  }

  kill() {
    return this.proc.stop('SIGKILL');
  }

  pause() {
    this.proc.signal('SIGSTOP');
  }

  resume() {
    this.proc.signal('SIGCONT');
  }

  /** The same binary, config, port and socket again (as systemctl
   * restart does); the old one must have exited. */
  async startAgain() {
    if (!this.proc.exited) throw new Error('redlockd is still running');
    this.proc = new Proc([REDLOCKD_BIN, '-c', this.confPath], this.logPath);
    this.h.procs.push(this.proc);
    if (!(await this._waitReady())) throw new Error(`redlockd did not start again:\n${tail(this.logPath)}`);
  }

  async restart() {
    const code = await this.stop();
    await this.startAgain();
    return code;
  }

  /** One request on a fresh connection (EVENT lines skipped). */
  async request(line) {
    const r = await ask(this.port, line + '\n', 2000);
    return r.split('\n').find((l) => l && !l.startsWith('EVENT ')) ?? '';
  }

  async json(line) {
    const r = await this.request(line);
    if (!r.startsWith('OK {')) throw new Error(`${line}: ${r}`);
    return JSON.parse(r.slice(3));
  }

  log() {
    return tail(this.logPath, 20000);
  }
}

export class Harness {
  constructor() {
    this.procs = [];
    this.dirs = [];
  }

  mkdtemp(what) {
    const d = mkdtempSync(join(tmpdir(), `rl-node-${what}-`));
    this.dirs.push(d);
    return d;
  }

  async redis(n = 1) {
    const out = [];
    for (let i = 0; i < n; i++) out.push(await new Redis(this).start());
    return out;
  }

  daemon(nodes, extra) {
    return new Daemon(this, nodes, extra).start();
  }

  /** n redis nodes and a daemon over them. */
  async cluster(n = 3, extra) {
    const nodes = await this.redis(n);
    const daemon = await this.daemon(nodes, extra);
    return { nodes, daemon };
  }

  async cleanup() {
    for (const p of this.procs.reverse()) await p.stop('SIGTERM', 5000);
    for (const d of this.dirs) rmSync(d, { recursive: true, force: true });
  }
}

export const HAVE_REDIS = REDIS_SERVER !== null;
export const HAVE_DAEMON = existsSync(REDLOCKD_BIN);

/** A TCP proxy in this process in front of 127.0.0.1:port: cut() drops
 * every connection through it (both ways), as a network failure would;
 * block() makes it refuse (close) new ones until unblock(). */
export class Proxy {
  constructor(target) {
    this.target = target;
    this.pairs = new Set();
    this.blocked = false;
    this.server = createServer((down) => {
      if (this.blocked) {
        down.destroy();
        return;
      }
      const up = createConnection({ host: '127.0.0.1', port: this.target });
      const pair = { down, up };
      this.pairs.add(pair);
      const end = () => {
        this.pairs.delete(pair);
        down.destroy();
        up.destroy();
      };
      down.on('error', end);
      up.on('error', end);
      down.on('close', end);
      up.on('close', end);
      down.pipe(up);
      if (this.swallow === null) {
        up.pipe(down);
        return;
      }
      // Forward the daemon's bytes up to and including the first line that
      // contains `swallow`, then drop the rest (replies that never come).
      const want = this.swallow;
      let seen = '';
      let open = true;
      up.on('data', (d) => {
        if (!open) return;
        const text = d.toString('latin1');
        const at = (seen + text).indexOf(want);
        if (at < 0) {
          seen = (seen + text).slice(-want.length);
          down.write(d);
          return;
        }
        const nl = (seen + text).indexOf('\n', at);
        const upto = nl < 0 ? text.length : nl + 1 - seen.length;
        down.write(d.subarray(0, Math.max(0, upto)));
        open = false;
      });
    });
    this.swallow = null;
  }

  /** Connections made from now on get the daemon's lines up to the first
   * containing `text`, and nothing after it (null: all again). */
  swallowAfter(text) {
    this.swallow = text;
  }

  listen() {
    return new Promise((res) => this.server.listen(0, '127.0.0.1', () => res(this)));
  }

  get address() {
    return `127.0.0.1:${this.server.address().port}`;
  }

  cut() {
    for (const { down, up } of [...this.pairs]) {
      down.destroy();
      up.destroy();
    }
    this.pairs.clear();
  }

  close() {
    this.cut();
    return new Promise((res) => this.server.close(() => res()));
  }
}
