/**
 * The session with the daemon: its settings, the connection (one at a
 * time), the requests on it and those waiting for one, the one timer, and
 * connecting, resuming and failing over. What the leases, the acquires
 * queued here and the watches need at those moments it asks of the parts
 * above it through SessionHooks (the Client wires them).
 *
 * Requests
 * --------
 * Every request but HELLO, AUTH and QUIT is tagged, so hundreds of tasks
 * have requests in flight at once on the one connection and each reply
 * finds its request by its tag. A request made while there is no ready
 * connection waits for one (at most `timeout` ms, more for a LOCK's wait).
 *
 * Failover (as libredlockd and the Python client do it)
 * --------
 * The session asks for HELLO detach=, so it outlives its connection on its
 * daemon. A lost connection is re-established with backoff: HELLO resume=
 * on the same daemon (then LOCKS confirms the leases, matched by fence,
 * and UNLOCK gives back what the session holds that no lease knows); on
 * ERR NOSESSION, or when that daemon cannot be reached or announced its
 * shutdown, a new session on the next server and one ADOPT per lease while
 * its deadline is ahead (a new token, the same fence: adopt.ts). Requests
 * in flight when the connection went are sent again on the new one.
 */
import type { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';
import * as net from 'node:net';
import * as tls from 'node:tls';

import { Conn, type ConnOwner, type Req } from './conn.js';
import { connectionError, RedlockdError, replyError } from './errors.js';
import { type Address, checkMs, checkPassword, checkWord, fields, serverList } from './proto.js';
import {
  errCode,
  HEX32,
  isOk,
  K_HANDSHAKE,
  K_LOCK,
  K_READ,
  MIN_REPLY_MS,
  mkReq,
  now,
  RECONNECT_MAX_MS,
  RECONNECT_MIN_MS,
} from './request.js';
import type { ClientOptions, Locks, ServerInfo, TlsOptions } from './types.js';

/** A request whose connection is lost under it this many times fails
 * (CONNECTION) instead of going out again: one the daemon answers by
 * closing (ERR TOOLONG) must not loop. */
const MAX_TRIES = 3;

function readEnvFile(name: string): Buffer | undefined {
  const path = process.env[name];
  if (path === undefined || path === '') return undefined;
  return readFileSync(path);
}

/** @internal What the session asks of the parts above it: the leases
 * (leases.ts, adopt.ts), the acquires queued here (queue.ts) and the
 * watches (watches.ts). */
export interface SessionHooks {
  /** The timer, first: leases past their deadline are lost, a LOCKS goes
   * out if one is due. Returns when the leases next need the timer
   * (Infinity: not). */
  tickLeases(t: number): number;
  /** The timer, after the requests: ADOPTs to try again. Returns when
   * next (Infinity: not). */
  tickAdopt(t: number): number;
  /** The nearest time a held lease counts as lost (Infinity: none). */
  nearestStop(): number;
  /** The session is gone: every lease is to be adopted by the next one. */
  forgotten(): void;
  /** HELLO resume= and its LOCKS were answered on conn: match the leases,
   * ADOPT what still needs it. */
  resumed(conn: Conn, body: Locks, tSend: number): void;
  /** A new session on conn: every lease is to be adopted (`hadSession`:
   * it takes over from another one, a failover). */
  fresh(conn: Conn, hadSession: boolean): void;
  /** The connection is ready and the requests that waited were written:
   * the watches to send (or to give up, after a resume). */
  ready(resumed: boolean): void;
  /** After 'ready' or 'reconnect': the 'failover' event, unless ADOPTs
   * are still on their way. */
  settled(): void;
  /** EVENT HOLDER (its words after "EVENT HOLDER ", and their fields). */
  holder(words: string, f: Record<string, string>): void;
  /** EVENT LOST's fields. */
  lost(f: Record<string, string>): void;
  /** Closed for good: every lease is lost ("closed"). */
  loseAll(): void;
  /** The acquires still queued here fail with err. */
  rejectQueued(err: Error): void;
  /** Every Watch ends (err null: quietly). */
  endWatches(err: Error | null): void;
}

/** @internal One session with redlockd over one connection at a time. */
export class Session implements ConnOwner {
  /** The addresses, as given. */
  readonly servers: readonly string[];
  readonly _addrs: Address[];
  readonly _name: string | undefined;
  readonly _password: string | undefined;
  readonly _user: string | undefined;
  readonly _tls: tls.ConnectionOptions | null;
  readonly _detach: number;
  readonly _timeout: number;
  readonly _autoReconnect: boolean;

  _conn: Conn | null = null;
  _ready = false;
  _started = false;
  _connecting = false;
  _closing = false;
  _closed = false;
  _session: string | null = null;
  _secret: string | null = null;
  _sessionIndex = 0;
  /** The session's daemon said it is stopping: do not try to resume it. */
  _sessionGone = false;
  _index = 0;
  _backoff = 0;
  _nextAttempt = 0;
  _lastError: Error | null = null;
  _authError: Error | null = null;
  _info: ServerInfo | null = null;
  /** QUIT was answered OK: the daemon released every lock of the session. */
  _closeQuitOk = false;

  /** Requests waiting for a connection (replays first, in order). */
  _waiting: Req[] = [];
  _readyWaiters: Array<{ resolve: () => void; reject: (e: Error) => void; until: number }> = [];

  _timer: ReturnType<typeof setTimeout> | null = null;
  _timerAt = Infinity;
  /** Counts the sessions: a new one (not a resume) must be sent WATCH again. */
  _epoch = 0;

  /** The settings checked (a TypeError for a bad one); nothing starts
   * before _kick(). `events`: the Client, which emits the events. */
  constructor(
    options: ClientOptions,
    private readonly events: EventEmitter,
    private readonly hooks: SessionHooks,
  ) {
    if (options === null || typeof options !== 'object') throw new TypeError('options must be an object');
    this._addrs = serverList(options.servers, process.env.REDLOCKD_SERVER);
    this.servers = this._addrs.map((a) => a.text);
    if (options.name !== undefined) this._name = checkWord(options.name, 'client name', 64);
    if (options.password !== undefined) this._password = checkPassword(options.password);
    if (options.user !== undefined) {
      this._user = checkWord(options.user, 'user name', 64);
      if (this._password === undefined) throw new TypeError('a user needs a password');
    }
    this._timeout = options.timeout === undefined ? 5000 : checkMs(options.timeout, 'timeout', 1);
    this._autoReconnect = options.reconnect !== false;
    const detach = options.detach === undefined ? 30000 : options.detach === false ? 0 : checkMs(options.detach, 'detach');
    this._detach = this._autoReconnect ? detach : 0;
    this._tls = this._addrs.some((a) => a.kind === 'tls') ? this._tlsOptions(options.tls ?? {}) : null;
  }

  _tlsOptions(o: TlsOptions): tls.ConnectionOptions {
    const out: tls.ConnectionOptions = { minVersion: 'TLSv1.2' };
    const ca = o.ca ?? readEnvFile('REDLOCKD_TLS_CA');
    const cert = o.cert ?? readEnvFile('REDLOCKD_TLS_CERT');
    const key = o.key ?? (o.cert === undefined ? readEnvFile('REDLOCKD_TLS_KEY') : undefined);
    if (ca !== undefined) out.ca = ca;
    if (cert !== undefined) out.cert = cert;
    if (key !== undefined) out.key = key;
    else if (cert !== undefined) out.key = cert; // the key may be in the certificate's file
    if (o.passphrase !== undefined) out.passphrase = o.passphrase;
    if (o.servername !== undefined) out.servername = o.servername;
    if (o.rejectUnauthorized === false) out.rejectUnauthorized = false;
    return out;
  }

  // ---- state ------------------------------------------------------------------

  /** The address in use (or last used). */
  get server(): string {
    return (this._addrs[this._index] as Address).text;
  }

  /** Resolves once a session is ready (rejects after `timeout` ms
   * without one, or when the client is closed). Requests do not need it:
   * they wait for the connection themselves. */
  connect(): Promise<void> {
    if (this._ready && !this._closed) return Promise.resolve();
    if (this._closing || this._closed) return Promise.reject(this._closedError());
    return new Promise((resolve, reject) => {
      const until = now() + this._timeout;
      this._readyWaiters.push({ resolve, reject, until });
      this._arm(until);
      this._kick();
    });
  }

  /** 'error' is emitted only when someone listens (a client without a
   * listener does not crash the process on a failed reconnection). */
  _emitError(err: Error): void {
    if (this.events.listenerCount('error') > 0) this.events.emit('error', err);
  }

  // ---- requests ---------------------------------------------------------------

  /** Write req on the ready connection, or keep it until there is one. */
  _send(req: Req): void {
    if (this._closed) {
      req.onFail(this._closedError());
      return;
    }
    const conn = this._conn;
    if (this._ready && conn !== null && !(conn.shutdown && req.kind === K_LOCK && this._autoReconnect)) {
      this._write(conn, req);
      return;
    }
    req.queuedAt = now();
    this._waiting.push(req);
    this._arm(req.queuedAt + this._timeout + req.extra);
    this._kick();
  }

  /** Take req back if it is still waiting for a connection (it was never
   * written); false if it is not there. */
  _withdraw(req: Req): boolean {
    const i = this._waiting.indexOf(req);
    if (i < 0) return false;
    this._waiting.splice(i, 1);
    return true;
  }

  _write(conn: Conn, req: Req, tagged = true): void {
    // The line anew (a LOCK's wait= counts down), unless a LOCK goes out
    // at once the first time (its line was just made).
    if (req.rebuild !== null && (req.sent || req.queuedAt !== 0 || req.kind !== K_LOCK)) {
      const line = req.rebuild();
      if (line instanceof Error) {
        req.onFail(line);
        return;
      }
      req.line = line;
    }
    req.retried = req.sent;
    req.sent = true;
    req.tries++;
    req.tSend = now();
    req.expectBy = req.tSend + this._timeout + req.extra;
    conn.write(req, tagged);
    if (req.expectBy < this._timerAt) this._arm(req.expectBy);
  }

  /** One request; resolves to the reply line (after OK, or PONG...). */
  _query(line: string, resource?: string, want = 'OK'): Promise<string> {
    return new Promise((resolve, reject) => {
      const req = mkReq(
        line,
        K_READ,
        true,
        (reply) => {
          if (reply.startsWith(want)) resolve(reply.startsWith(want + ' ') ? reply.slice(want.length + 1) : '');
          else if (reply.startsWith('ERR ')) reject(replyError(reply, resource));
          else reject(connectionError(`unexpected reply to ${line.split(' ')[0]}: ${reply.slice(0, 120)}`));
        },
        reject,
      );
      this._send(req);
    });
  }

  _json(text: string): Record<string, unknown> {
    const v: unknown = JSON.parse(text.startsWith('OK ') ? text.slice(3) : text);
    if (v === null || typeof v !== 'object' || Array.isArray(v)) throw connectionError('the daemon sent JSON that is not an object');
    return v as Record<string, unknown>;
  }

  // ---- the connection's lines ------------------------------------------------

  /** ConnOwner: a line from the daemon. */
  onLine(conn: Conn, line: string): void {
    if (conn.dead) return;
    if (line.charCodeAt(0) === 35 /* # */) {
      const sp = line.indexOf(' ');
      const req = sp > 1 ? conn.take(line.slice(1, sp)) : undefined;
      if (req === undefined) {
        this._drop(conn, `a reply with a tag not in flight: ${line.slice(0, 80)}`);
        return;
      }
      req.onReply(line.slice(sp + 1));
      return;
    }
    if (line.startsWith('EVENT ')) {
      this._onEvent(conn, line);
      return;
    }
    const req = conn.untagged.shift();
    if (req === undefined) {
      this._drop(conn, `an unexpected line from the daemon: ${line.slice(0, 80)}`);
      return;
    }
    req.onReply(line);
  }

  _onEvent(conn: Conn, line: string): void {
    if (conn !== this._conn) return; // news of a session we left
    const sp = line.indexOf(' ', 6);
    const name = sp < 0 ? line.slice(6) : line.slice(6, sp);
    const f = sp < 0 ? {} : fields(line.slice(sp + 1));
    if (name === 'HOLDER') {
      this.hooks.holder(line.slice(sp + 1), f);
    } else if (name === 'LOST') {
      this.hooks.lost(f);
    } else if (name === 'SHUTDOWN') {
      this._onShutdown(conn);
    } else if (name === 'CLOSING') {
      conn.closingReason = f.reason ?? 'unknown';
    }
  }

  /** The daemon is stopping: it takes no new locks. With other servers,
   * move there now (its leases are adopted there); with one, LOCKs wait
   * for it to be back, while the leases stay held until it closes. */
  _onShutdown(conn: Conn): void {
    if (conn.shutdown) return;
    conn.shutdown = true;
    if (conn === this._conn && this._autoReconnect && this._addrs.length > 1 && this._ready) {
      this._sessionGone = true;
      this._drop(conn, 'the daemon is shutting down');
    }
  }

  /** ConnOwner: the socket closed or failed. */
  onClosed(conn: Conn, why: string): void {
    this._drop(conn, why);
  }

  // ---- a connection lost, the client closed --------------------------------------

  /** This connection is done: its requests fail, or wait to be sent again. */
  _drop(conn: Conn, why: string): void {
    if (conn.dead) return;
    const current = conn === this._conn;
    const wasReady = current && this._ready;
    conn.destroy();
    const reason = conn.closingReason ?? (conn.shutdown ? 'shutdown' : null);
    const err = this._closed
      ? this._closedError()
      : connectionError(`${conn.addr.text}: ${why}${reason === null ? '' : ` (daemon: ${reason})`}`);
    const untagged = conn.untagged.splice(0);
    const inflight = [...conn.inflight.values()];
    conn.inflight.clear();
    const replay: Req[] = [];
    for (const r of inflight) {
      if (wasReady && r.replay && r.tries < MAX_TRIES && this._autoReconnect && !this._closed) replay.push(r);
    }
    if (current) {
      this._conn = null;
      this._ready = false;
      if (reason === 'shutdown' || conn.shutdown) this._sessionGone = true;
      if (!this._closed && !this._closing) {
        this._lastError = err;
        if (this._autoReconnect) {
          const t = now();
          for (const r of replay) r.queuedAt = t;
          this._waiting = replay.concat(this._waiting);
          this._nextAttempt = t + this._backoff;
          this._arm(this._nextAttempt);
        } else if (this._started) {
          this._closeForGood(err);
        }
      }
    }
    for (const r of untagged) r.onFail(err);
    const again = new Set(replay);
    for (const r of inflight) if (!again.has(r)) r.onFail(err);
  }

  /** reconnect: false and the connection went: the client is closed. */
  _closeForGood(err: Error): void {
    this._closed = true;
    this.hooks.loseAll();
    this._failAll(err);
    this.hooks.endWatches(err);
    this._clearTimer();
    this.events.emit('close');
  }

  _failAll(err: Error): void {
    const waiting = this._waiting.splice(0);
    for (const r of waiting) r.onFail(err);
    this.hooks.rejectQueued(err);
    const rw = this._readyWaiters.splice(0);
    for (const x of rw) x.reject(err);
  }

  _closedError(): RedlockdError {
    return connectionError('the client is closed');
  }

  // ---- the timer: deadlines, refreshes, replies that do not come, reconnects ------

  /** The timer fires at `at` (performance.now()) or sooner. */
  _arm(at: number): void {
    if (at >= this._timerAt || this._closed) return;
    if (this._timer !== null) clearTimeout(this._timer);
    this._timerAt = at;
    this._timer = setTimeout(this._tick, Math.max(0, Math.ceil(at - now())));
  }

  _clearTimer(): void {
    if (this._timer !== null) clearTimeout(this._timer);
    this._timer = null;
    this._timerAt = -Infinity; // never again
  }

  readonly _tick = (): void => {
    this._timer = null;
    this._timerAt = Infinity;
    if (this._closed) return;
    const t = now();
    let next = this.hooks.tickLeases(t);
    const conn = this._conn;
    if (conn !== null && this._ready) {
      for (const r of conn.inflight.values()) {
        if (r.expectBy <= t) {
          this._drop(conn, `no reply within ${Math.round(r.expectBy - r.tSend)} ms to ${r.line.split(' ')[0]}`);
          break;
        }
        if (r.expectBy < next) next = r.expectBy;
      }
    }
    if (this._waiting.length > 0) {
      const expired: Req[] = [];
      const keep: Req[] = [];
      for (const r of this._waiting) {
        const lim = r.queuedAt + this._timeout + r.extra;
        if (t >= lim) expired.push(r);
        else {
          keep.push(r);
          if (lim < next) next = lim;
        }
      }
      this._waiting = keep;
      for (const r of expired) r.onFail(this._unreachable());
    }
    if (this._readyWaiters.length > 0) {
      const keep = [];
      for (const x of this._readyWaiters) {
        if (t >= x.until) x.reject(this._unreachable());
        else {
          keep.push(x);
          next = Math.min(next, x.until);
        }
      }
      this._readyWaiters = keep;
    }
    next = Math.min(next, this.hooks.tickAdopt(t));
    if (this._conn === null && !this._connecting && (this._autoReconnect || !this._started) && !this._closing) {
      if (t >= this._nextAttempt) this._kick();
      else next = Math.min(next, this._nextAttempt);
    }
    if (next < Infinity) this._arm(next);
  };

  _unreachable(): RedlockdError {
    if (this._authError !== null) return this._authError as RedlockdError;
    const last = this._lastError;
    return connectionError(
      `not connected to any of ${this.servers.join(', ')}${last === null ? '' : `: ${last.message}`}`,
      last ?? undefined,
    );
  }

  // ---- connecting, resuming, a new session ------------------------------------

  /** Start a connection attempt if one is due. */
  _kick(): void {
    if (this._closed || this._closing || this._conn !== null || this._connecting) return;
    if (this._started && !this._autoReconnect) return;
    const t = now();
    if (t < this._nextAttempt) {
      this._arm(this._nextAttempt);
      return;
    }
    this._connecting = true;
    this._attempt().then(
      () => {
        this._connecting = false;
      },
      (e: unknown) => {
        this._connecting = false;
        this._emitError(e as Error);
      },
    );
  }

  /** One pass over the servers. */
  async _attempt(): Promise<void> {
    let last: Error | null = null;
    const n = this._addrs.length;
    let start = this._index;
    if (this._session !== null && this._secret !== null && !this._sessionGone) {
      start = this._sessionIndex;
      try {
        await this._resumeAt(this._sessionIndex);
        this._attemptOk(true);
        return;
      } catch (e) {
        last = e as Error;
        this._abandon();
        if (e instanceof RedlockdError && e.code === 'NOSESSION') this._forgetSession();
      }
      if (this._closing) return;
    }
    for (let k = 0; k < n; k++) {
      const i = this._started ? (start + 1 + k) % n : k;
      try {
        await this._freshAt(i);
        this._attemptOk(false);
        return;
      } catch (e) {
        last = e as Error;
        this._abandon();
        if (e instanceof RedlockdError && (e.code === 'AUTH' || e.code === 'NOAUTH' || e.code === 'DENIED')) {
          this._authError = e;
          this._failAll(e);
        }
      }
      if (this._closing) return;
    }
    this._backoff = Math.min(RECONNECT_MAX_MS, Math.max(RECONNECT_MIN_MS, this._backoff * 2));
    this._nextAttempt = now() + this._backoff;
    this._lastError = last;
    this._arm(this._nextAttempt);
    if (last !== null) this._emitError(last);
  }

  _abandon(): void {
    const conn = this._conn;
    if (conn !== null && !this._ready) this._drop(conn, 'connection attempt given up');
  }

  /** The session is gone: every lease is to be adopted by the next one. */
  _forgetSession(): void {
    this._session = null;
    this._secret = null;
    this.hooks.forgotten();
  }

  _attemptOk(resumed: boolean): void {
    const conn = this._conn;
    if (conn === null || conn.dead) throw connectionError('the connection ended during the handshake');
    const first = !this._started;
    this._ready = true;
    this._started = true;
    this._index = conn.index;
    this._backoff = 0;
    this._nextAttempt = 0;
    this._lastError = null;
    this._authError = null;
    this._sessionGone = false;
    const waiting = this._waiting.splice(0);
    for (const r of waiting) {
      if (!this._ready || this._conn !== conn) {
        this._waiting.push(r);
        continue;
      }
      this._write(conn, r);
    }
    this.hooks.ready(resumed);
    const rw = this._readyWaiters.splice(0);
    for (const x of rw) x.resolve();
    const info = this._info as ServerInfo;
    if (first) this.events.emit('ready', info);
    else this.events.emit('reconnect', { server: conn.addr.text, resumed, session: info.session });
    this.hooks.settled(); // the 'failover' event, unless ADOPTs are still on their way
    this._arm(now());
  }

  /** Connect to server i; the connection becomes the current one (not ready). */
  _open(i: number, limit: number): Promise<Conn> {
    const addr = this._addrs[i] as Address;
    return new Promise((resolve, reject) => {
      let sock: net.Socket;
      let ev = 'connect';
      if (addr.kind === 'unix') sock = net.connect({ path: addr.path });
      else if (addr.kind === 'tcp') sock = net.connect({ host: addr.host, port: addr.port, noDelay: true } as net.NetConnectOpts);
      else {
        ev = 'secureConnect';
        sock = tls.connect({ ...this._tls, host: addr.host, port: addr.port });
      }
      const timer = setTimeout(() => fail(new Error(`no connection within ${limit} ms`)), limit);
      const fail = (e: Error): void => {
        clearTimeout(timer);
        sock.removeListener(ev, ok);
        sock.destroy();
        reject(connectionError(`cannot connect to ${addr.text}: ${e.message}`, e));
      };
      const ok = (): void => {
        clearTimeout(timer);
        sock.removeListener('error', fail);
        if (addr.kind !== 'unix') sock.setNoDelay(true);
        if (this._closing || this._closed) {
          sock.destroy();
          reject(this._closedError());
          return;
        }
        const conn = new Conn(this, sock, i, addr);
        this._conn = conn;
        this._ready = false;
        resolve(conn);
      };
      sock.once('error', fail);
      sock.once(ev, ok);
    });
  }

  /** A request on a connection being set up (HELLO, AUTH, LOCKS), with its
   * own time limit: no reply by then drops the connection. */
  _call(conn: Conn, line: string, limit: number, tagged: boolean): Promise<{ line: string; tSend: number }> {
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => this._drop(conn, `no reply within ${limit} ms to ${line.split(' ')[0]}`),
        limit,
      );
      const req = mkReq(
        line,
        K_HANDSHAKE,
        false,
        (reply) => {
          clearTimeout(timer);
          resolve({ line: reply, tSend: req.tSend });
        },
        (err) => {
          clearTimeout(timer);
          reject(err);
        },
      );
      if (conn.dead) {
        clearTimeout(timer);
        reject(connectionError(`${conn.addr.text}: connection closed`));
        return;
      }
      req.tSend = now();
      req.expectBy = Infinity;
      conn.write(req, tagged);
    });
  }

  /** How long to wait for a handshake reply: half the time left to the
   * nearest lease deadline (at least MIN_REPLY_MS), at most the timeout. */
  _replyLimit(): number {
    const nearest = this.hooks.nearestStop();
    if (nearest === Infinity) return this._timeout;
    return Math.min(this._timeout, Math.max(MIN_REPLY_MS, (nearest - now()) / 2));
  }

  _helloWords(): string {
    return 'HELLO proto=1' + (this._name === undefined ? '' : ' name=' + this._name);
  }

  _hello(conn: Conn, f: Record<string, string>): void {
    this._info = {
      server: conn.addr.text,
      session: f.session ?? '',
      version: f.server,
      nodes: f.nodes === undefined ? undefined : Number(f.nodes),
      quorum: f.quorum === undefined ? undefined : Number(f.quorum),
    };
  }

  /** HELLO resume= on the session's daemon; LOCKS confirms the leases. */
  async _resumeAt(i: number): Promise<void> {
    const limit = this._replyLimit();
    const conn = await this._open(i, limit);
    const hello = await this._call(
      conn,
      `${this._helloWords()} resume=${this._session as string} secret=${this._secret as string}`,
      limit,
      false,
    );
    if (!isOk(hello.line)) throw replyError(hello.line);
    const f = fields(hello.line.slice(3));
    if (f.session !== this._session) throw connectionError('HELLO resume= answered for another session');
    this._hello(conn, f);
    const locks = await this._call(conn, 'LOCKS', limit, true);
    if (!isOk(locks.line)) throw replyError(locks.line);
    const body = this._json(locks.line.slice(3)) as Locks;
    if (conn.dead || this._conn !== conn) throw connectionError('the connection ended during the handshake');
    this.hooks.resumed(conn, body, locks.tSend);
  }

  /** A new session on server i, and ADOPT of every lease. */
  async _freshAt(i: number): Promise<void> {
    const limit = this._replyLimit();
    const conn = await this._open(i, limit);
    let hello = null;
    if (this._detach > 0) {
      hello = await this._call(conn, `${this._helloWords()} detach=${this._detach}`, limit, false);
      if (errCode(hello.line) === 'ARG') hello = null; // no detach here: go on without
    }
    if (hello === null) hello = await this._call(conn, this._helloWords(), limit, false);
    if (!isOk(hello.line)) throw replyError(hello.line);
    const f = fields(hello.line.slice(3));
    if (this._password !== undefined) {
      const auth = await this._call(
        conn,
        'AUTH ' + (this._user === undefined ? '' : this._user + ' ') + this._password,
        limit,
        false,
      );
      if (!isOk(auth.line)) throw replyError(auth.line);
    }
    if (conn.dead || this._conn !== conn) throw connectionError('the connection ended during the handshake');
    const hadSession = this._started;
    this._epoch++; // its watches are to be sent again
    this._session = f.session ?? null;
    this._secret = f.secret !== undefined && HEX32.test(f.secret) ? f.secret : null;
    this._sessionIndex = i;
    this._hello(conn, f);
    this.hooks.fresh(conn, hadSession); // every lease to be adopted
  }
}
