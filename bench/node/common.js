'use strict';
// Shared by the Node comparisons of scripts/bench: options, the CPU time
// of other processes from /proc, latency percentiles and the JSON result
// (the same fields redlockd-bench --json prints, so scripts/bench reads
// every row the same way).

const fs = require('fs');

function usage(name, extra) {
  process.stderr.write(
    `usage: node ${name} --duration SEC --conns N [--watch NAME=PID]...` +
      ` ${extra}\n`,
  );
  process.exit(2);
}

// --key value pairs; --watch may repeat.
function parseArgs(name, extra, known) {
  const o = { duration: 10, conns: 50, watch: [], prefix: `node:${process.pid}` };
  const a = process.argv.slice(2);
  for (let i = 0; i < a.length; i++) {
    const k = a[i];
    const v = a[i + 1];
    if (v === undefined) usage(name, extra);
    i++;
    if (k === '--duration') o.duration = Number(v);
    else if (k === '--conns') o.conns = Number(v);
    else if (k === '--prefix') o.prefix = v;
    else if (k === '--watch') {
      const m = /^([^=]+)=(\d+)$/.exec(v);
      if (!m) usage(name, extra);
      o.watch.push({ name: m[1], pid: Number(m[2]) });
    } else if (known.includes(k)) o[k.slice(2)] = v;
    else usage(name, extra);
  }
  if (!(o.duration > 0) || !(o.conns >= 1)) usage(name, extra);
  return o;
}

const TICKS = Number(process.env.CLK_TCK || 100);

// utime + stime of pid in seconds (fields 14 and 15 of /proc/PID/stat,
// counted after the command name's closing parenthesis), or -1.
function procCpu(pid) {
  try {
    const s = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const f = s.slice(s.lastIndexOf(')') + 2).split(' ');
    return (Number(f[11]) + Number(f[12])) / TICKS;
  } catch (e) {
    return -1;
  }
}

// CPU of the watched processes and of this one, at the window's edges.
class CpuWindow {
  constructor(watch) {
    this.watch = watch;
  }

  start() {
    this.w0 = this.watch.map((w) => procCpu(w.pid));
    this.self0 = process.cpuUsage();
  }

  stop() {
    this.w1 = this.watch.map((w) => procCpu(w.pid));
    this.self = process.cpuUsage(this.self0);
  }

  json(cycles) {
    const cpu = {};
    const per = {};
    this.watch.forEach((w, i) => {
      if (this.w0[i] >= 0 && this.w1[i] >= 0) cpu[w.name] = this.w1[i] - this.w0[i];
    });
    cpu.client = (this.self.user + this.self.system) / 1e6;
    for (const k of Object.keys(cpu)) if (cycles > 0) per[k] = (cpu[k] * 1e6) / cycles;
    return { cpu_s: cpu, cpu_us_per_cycle: per };
  }
}

// Latencies in milliseconds; percentiles by rank in the sorted samples.
class Samples {
  constructor() {
    this.v = new Float64Array(1 << 16);
    this.n = 0;
  }

  add(ms) {
    if (this.n === this.v.length) {
      const nv = new Float64Array(this.v.length * 2);
      nv.set(this.v);
      this.v = nv;
    }
    this.v[this.n++] = ms;
  }

  json() {
    const s = this.v.slice(0, this.n).sort();
    const at = (p) => (this.n ? s[Math.min(this.n - 1, Math.max(0, Math.ceil((p / 100) * this.n) - 1))] : 0);
    let sum = 0;
    for (let i = 0; i < this.n; i++) sum += s[i];
    return {
      count: this.n,
      mean: this.n ? sum / this.n : 0,
      p50: at(50),
      p90: at(90),
      p99: at(99),
      p999: at(99.9),
      max: this.n ? s[this.n - 1] : 0,
    };
  }
}

function nowMs() {
  return Number(process.hrtime.bigint()) / 1e6;
}

// Error counts by code (ERR <CODE> for the line protocol, the exception's
// name for the library).
class Errors {
  constructor() {
    this.total = 0;
    this.by = {};
    this.shown = 0;
  }

  add(code, text) {
    this.total++;
    this.by[code] = (this.by[code] || 0) + 1;
    if (this.shown++ < 3) process.stderr.write(`${code}: ${String(text).slice(0, 200)}\n`);
  }

  json() {
    return { total: this.total, ...this.by };
  }
}

// Prints the one JSON object of a run (redlockd-bench's fields): the
// program's own fields first, then the window's figures.
function report(fields, { elapsed, cycles, ttl, lat, errors, cpu }) {
  const out = {
    ...fields,
    elapsed_s: elapsed,
    cycles,
    cycles_per_s: cycles / elapsed,
    ttl_ms: ttl,
    latency_ms: { lock: lat.json() },
    errors: errors.json(),
    complete: cycles > 0,
    ...cpu.json(cycles),
  };
  process.stdout.write(`${JSON.stringify(out)}\n`);
}

// Runs the program's async main; a failure is printed under name, exit 1.
function run(name, main) {
  main().catch((e) => {
    process.stderr.write(`${name}: ${e.stack || e}\n`);
    process.exit(1);
  });
}

module.exports = { parseArgs, CpuWindow, Samples, Errors, nowMs, report, run };
