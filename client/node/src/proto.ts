/**
 * The line protocol's small pieces: server addresses, the words a request
 * may carry, and reading `OK key=value ...` replies (docs/protocol.md).
 */

export const DEFAULT_PORT = 7390;
export const DEFAULT_SERVER = `127.0.0.1:${DEFAULT_PORT}`;
/** Durations, counts: decimal, at most 32 bits. */
export const MAX_U32 = 4294967295;

/** Where a daemon listens. */
export type Address =
  | { kind: 'tcp' | 'tls'; host: string; port: number; text: string }
  | { kind: 'unix'; path: string; text: string };

/**
 * One address in the grammar the daemon's configuration and the other
 * clients use: `HOST:PORT`, `tcp://HOST:PORT`, `tls://HOST:PORT`,
 * `[IPV6]:PORT`, `HOST` (port 7390), `unix:/PATH`, `unix:///PATH`, `/PATH`.
 */
export function parseServer(text: string): Address {
  if (typeof text !== 'string' || text.trim() === '') {
    throw new TypeError('a server address must be a non-empty string');
  }
  const s = text.trim();
  if (s.startsWith('unix:') || s.startsWith('/')) {
    let path = s.startsWith('unix:') ? s.slice(5) : s;
    if (path.startsWith('//')) path = path.slice(2);
    if (!path.startsWith('/')) throw new TypeError(`bad unix socket address '${s}': the path must be absolute`);
    return { kind: 'unix', path, text: s };
  }
  let kind: 'tcp' | 'tls' = 'tcp';
  let rest = s;
  if (s.startsWith('tcp://')) rest = s.slice(6);
  else if (s.startsWith('tls://')) {
    kind = 'tls';
    rest = s.slice(6);
  } else if (/^[a-z]+:\/\//i.test(s)) {
    throw new TypeError(`bad server address '${s}': use tcp://, tls:// or unix:`);
  }
  let host: string;
  let port = DEFAULT_PORT;
  if (rest.startsWith('[')) {
    const close = rest.indexOf(']');
    if (close < 0) throw new TypeError(`bad server address '${s}': no ']'`);
    host = rest.slice(1, close);
    const after = rest.slice(close + 1);
    if (after !== '') {
      if (!after.startsWith(':')) throw new TypeError(`bad server address '${s}'`);
      port = parsePort(after.slice(1), s);
    }
    if (!host.includes(':')) throw new TypeError(`bad server address '${s}': brackets are for IPv6 addresses`);
  } else {
    const colon = rest.lastIndexOf(':');
    if (colon >= 0) {
      host = rest.slice(0, colon);
      port = parsePort(rest.slice(colon + 1), s);
    } else {
      host = rest;
    }
    if (!/^[A-Za-z0-9.-]+$/.test(host)) throw new TypeError(`bad server address '${s}': bad host name`);
  }
  return { kind, host, port, text: s };
}

function parsePort(p: string, s: string): number {
  if (!/^[0-9]{1,5}$/.test(p)) throw new TypeError(`bad port in server address '${s}'`);
  const n = Number(p);
  if (n < 1 || n > 65535) throw new TypeError(`bad port in server address '${s}'`);
  return n;
}

/** Servers from a list, or one string of comma-separated addresses. */
export function serverList(spec: string | readonly string[] | undefined, env: string | undefined): Address[] {
  let items: readonly string[];
  if (spec === undefined) items = [env && env.trim() !== '' ? env : DEFAULT_SERVER];
  else if (typeof spec === 'string') items = [spec];
  else if (Array.isArray(spec)) items = spec;
  else throw new TypeError('servers must be a string or an array of strings');
  const out: Address[] = [];
  for (const item of items) {
    if (typeof item !== 'string') throw new TypeError('a server address must be a string');
    for (const part of item.split(',')) {
      if (part.trim() !== '') out.push(parseServer(part));
    }
  }
  if (out.length === 0) throw new TypeError('no server address given');
  return out;
}

const VISIBLE = /^[\x21-\x7e]+$/;

/** A resource name: 1 to 1024 visible ASCII characters without '='. */
export function checkResource(r: unknown): string {
  if (typeof r !== 'string' || r.length === 0 || r.length > 1024 || !VISIBLE.test(r)) {
    throw new TypeError(`bad resource name ${JSON.stringify(r)}: 1 to 200 visible ASCII characters (no spaces)`);
  }
  if (r.includes('=')) throw new TypeError(`bad resource name ${JSON.stringify(r)}: a name with '=' cannot be sent`);
  return r;
}

/** resources: one name or a non-empty array of distinct names. */
export function resourceList(resources: unknown): string[] {
  const list = typeof resources === 'string' ? [resources] : Array.isArray(resources) ? resources.slice() : null;
  if (list === null || list.length === 0) {
    throw new TypeError('resources must be a resource name or a non-empty array of them');
  }
  for (const r of list) checkResource(r);
  if (list.length > 1 && new Set(list).size !== list.length) {
    throw new TypeError('a resource is named twice');
  }
  return list as string[];
}

/** The longest holder value the protocol allows (the daemon's own limit,
 * locks.max_value_len, is 256 by default: longer ones get ERR ARG). */
export const MAX_VALUE_LEN = 4096;

/** A holder's value (LOCK/EXTEND value=): 1 to 4096 visible ASCII
 * characters (no spaces; '=' is fine). */
export function checkValue(v: unknown): string {
  if (typeof v !== 'string' || v.length === 0 || v.length > MAX_VALUE_LEN || !VISIBLE.test(v)) {
    throw new TypeError(`bad value ${JSON.stringify(v)}: 1 to 256 visible ASCII characters without spaces (the daemon's locks.max_value_len)`);
  }
  return v;
}

/** A word for HELLO name= / AUTH: 1 to `max` visible ASCII characters. */
export function checkWord(w: unknown, what: string, max: number): string {
  if (typeof w !== 'string' || w.length === 0 || w.length > max || !VISIBLE.test(w)) {
    throw new TypeError(`bad ${what}: 1 to ${max} visible ASCII characters without spaces`);
  }
  return w;
}

/** A password: no spaces or control characters (it is one word of AUTH). */
export function checkPassword(p: unknown): string {
  if (typeof p !== 'string' || p.length === 0 || /[\s\x00-\x1f\x7f]/.test(p)) {
    throw new TypeError('the password must be a non-empty string without spaces or control characters');
  }
  return p;
}

/** Milliseconds for ttl=, wait=, detach=: an integer 0..2^32-1. */
export function checkMs(v: unknown, what: string, min = 0): number {
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > MAX_U32) {
    throw new TypeError(`${what} must be an integer number of milliseconds from ${min} to ${MAX_U32}`);
  }
  return v;
}

/** The words of `OK k=v k=v ...` (the text after "OK ") as an object. */
export function fields(rest: string): Record<string, string> {
  const out: Record<string, string> = {};
  let i = 0;
  const n = rest.length;
  while (i < n) {
    let sp = rest.indexOf(' ', i);
    if (sp < 0) sp = n;
    const eq = rest.indexOf('=', i);
    if (eq > i && eq < sp) out[rest.slice(i, eq)] = rest.slice(eq + 1, sp);
    i = sp + 1;
  }
  return out;
}

/** An integer field, or `dflt` when absent or not a number. */
export function intField(f: Record<string, string>, key: string, dflt: number): number {
  const v = f[key];
  if (v === undefined) return dflt;
  const n = Number(v);
  return Number.isFinite(n) ? n : dflt;
}
