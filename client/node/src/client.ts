/**
 * The redlockd client: one session with the daemon, over one connection,
 * shared by every task of the process.
 *
 * Requests
 * --------
 * Every request but HELLO, AUTH and QUIT is tagged, so hundreds of tasks
 * have requests in flight at once on the one connection and each reply
 * finds its request by its tag. Two tasks after the same resource queue
 * here, first come first served (a session holds a resource once: the
 * daemon would answer HELD), and the next one's LOCK is written right
 * behind the UNLOCK of the one before (the daemon runs the requests of one
 * session that name the same resource in the order read).
 *
 * Deadlines (docs/protocol.md, "the lease deadline rule")
 * ---------
 * A lease's deadline is the send time of the request that last confirmed
 * it plus the validity its reply reported (LOCK, EXTEND, ADOPT, or the
 * lease's entry in LOCKS). A LOCKS goes out at least every ttl/3 of each
 * lease. Past its deadline without a newer confirmation a lease is lost
 * ("deadline"): its signal aborts. A refresh that gets no reply by half the
 * time left to the nearest deadline drops the connection.
 *
 * Failover (as libredlockd and the Python client do it)
 * --------
 * The session asks for HELLO detach=, so it outlives its connection on its
 * daemon. A lost connection is re-established with backoff: HELLO resume=
 * on the same daemon (then LOCKS confirms the leases, matched by fence,
 * and UNLOCK gives back what the session holds that no lease knows); on
 * ERR NOSESSION, or when that daemon cannot be reached or announced its
 * shutdown, a new session on the next server and one ADOPT per lease while
 * its deadline is ahead (a new token, the same fence). Requests in flight
 * when the connection went are sent again on the new one.
 */
import { EventEmitter } from 'node:events';
import { readFileSync } from 'node:fs';
import * as net from 'node:net';
import { performance } from 'node:perf_hooks';
import * as tls from 'node:tls';

import { Conn, type Req } from './conn.js';
import { connectionError, lostError, RedlockdError, replyError } from './errors.js';
import { HELD, Lease, LOST, RELEASED } from './lease.js';
import {
  type Address,
  checkMs,
  checkPassword,
  checkResource,
  checkValue,
  checkWord,
  fields,
  intField,
  MAX_U32,
  resourceList,
  serverList,
} from './proto.js';
import { type HolderEvent, holderEvent, Watch, type WatchOptions } from './watch.js';

/** TLS settings for `tls://` servers (node:tls's names). */
export interface TlsOptions {
  /** CA certificate(s) to trust (PEM); default `$REDLOCKD_TLS_CA` (a
   * file), else Node's bundled CAs. */
  ca?: string | Buffer | Array<string | Buffer>;
  /** A client certificate (PEM), for a daemon with `tls.verify_clients`;
   * default `$REDLOCKD_TLS_CERT` (a file). */
  cert?: string | Buffer;
  /** Its key (PEM); default `$REDLOCKD_TLS_KEY` (a file). */
  key?: string | Buffer;
  /** The key's passphrase. */
  passphrase?: string;
  /** The name the server's certificate must carry (and the SNI), instead
   * of the address's host. */
  servername?: string;
  /** false turns the certificate check off (never in production). */
  rejectUnauthorized?: boolean;
}

export interface ClientOptions {
  /** Daemon addresses, tried in order; the others are for failover:
   * `HOST:PORT`, `tcp://HOST:PORT`, `tls://HOST:PORT`, `[IPV6]:PORT`,
   * `unix:/PATH`. Default `$REDLOCKD_SERVER` (a comma list), else
   * `127.0.0.1:7390`. */
  servers?: string | readonly string[];
  /** Labels the session in the daemon's SESSIONS, STATUS and logs. */
  name?: string;
  /** Sent with AUTH (again on every new session). */
  password?: string;
  /** With `password`: `AUTH <user> <password>`, a user of `auth.users`. */
  user?: string;
  /** For `tls://` servers. */
  tls?: TlsOptions;
  /** How long (ms) the daemon keeps the session's leases after its
   * connection ends without QUIT, for a resume (HELLO detach=). Default
   * 30000; 0 or false: off (a lost connection then loses them). */
  detach?: number | false;
  /** ms: connecting, each reply (a LOCK's may take its `wait` longer), and
   * how long a request waits for a connection. Default 5000. */
  timeout?: number;
  /** Reconnect and fail over after a lost connection (default true).
   * false: a lost connection closes the Client and loses its leases. */
  reconnect?: boolean;
}

export interface AcquireOptions {
  /** The lease on the nodes, ms (default: the daemon's, 30000). With
   * `renew` the daemon renews it for as long as the session lives. */
  ttl?: number;
  /** How long to wait for the lock, ms (default 0: BUSY at once when
   * held). Infinity waits until it is granted. Waiting behind another
   * task of this Client counts too. */
  wait?: number;
  /** `exclusive` (default) or `shared` (readers). */
  mode?: 'exclusive' | 'shared';
  /** A semaphore of K slots: at most K holders at once. */
  limit?: number;
  /** The daemon renews the lease while the session lives (default true);
   * false: it expires after `ttl` unless extended. */
  renew?: boolean;
  /** Cancels the acquire while it waits: it rejects with the signal's
   * reason (a lock granted meanwhile is given back at once). */
  signal?: AbortSignal;
  /** The holder's value (exclusive locks only): 1 to 256 visible ASCII
   * characters (the daemon's locks.max_value_len), shown by STATUS, LOCKS
   * and watchers on every daemon, as a leader's address. */
  value?: string;
}

/** One holder in STATUS (docs/protocol.md, "STATUS"): a session of the
 * daemon asked, or one of another daemon read off the nodes (`daemon`,
 * `session`, `name`, `fence`, `value` only), or `{ foreign: true }`. */
export interface StatusHolder {
  daemon?: string;
  session?: string;
  /** The client's name (null or absent when it gave none). */
  name?: string | null;
  fence?: number;
  /** The holder's value, when it set one. */
  value?: string;
  mode?: 'exclusive' | 'shared';
  held_ms?: number;
  validity?: number;
  attached?: boolean;
  slot?: number;
  /** A key another Redlock client set. */
  foreign?: boolean;
  [key: string]: unknown;
}

/** STATUS's object (docs/protocol.md, "STATUS"). */
export interface Status {
  resource: string;
  key: string;
  held: boolean;
  mode: 'exclusive' | 'shared' | null;
  /** One holder, wherever it is (`holder.value`: its value), or null. */
  holder: StatusHolder | null;
  holders?: StatusHolder[];
  holders_here?: number;
  shared_holders?: number;
  waiters: number;
  limit?: number;
  slots_held?: number;
  nodes: Array<Record<string, unknown>>;
  [key: string]: unknown;
}

/** One lease in LOCKS. */
export interface LockInfo {
  resource: string;
  fence: number;
  ttl: number;
  validity: number;
  held_ms: number;
  renew: boolean;
  mode?: 'exclusive' | 'shared';
  limit?: number;
  slot?: number;
  /** The holder's value, when the lease has one. */
  value?: string;
  token?: string;
  renewals?: number;
  [key: string]: unknown;
}

/** LOCKS's object. */
export interface Locks {
  session: string;
  locks: LockInfo[];
  lost?: string[];
  [key: string]: unknown;
}

/** What the daemon said in HELLO. */
export interface ServerInfo {
  server: string;
  session: string;
  version: string | undefined;
  nodes: number | undefined;
  quorum: number | undefined;
}

/** The 'reconnect' event's argument. */
export interface ReconnectInfo {
  /** The address now in use. */
  server: string;
  /** true: the same session on the same daemon (HELLO resume=). */
  resumed: boolean;
  session: string;
}

/** The 'failover' event's argument: a new session took the leases over. */
export interface FailoverInfo {
  server: string;
  session: string;
  /** Leases adopted (ADOPT) by the new session. */
  adopted: number;
  /** Leases that could not be (past their deadline, or refused). */
  lost: number;
}

// Request kinds.
const K_LOCK = 1;
const K_UNLOCK = 2;
const K_EXTEND = 3;
const K_REFRESH = 4;
const K_READ = 5;
const K_ADOPT = 6;
const K_HANDSHAKE = 7;
const K_WATCH = 8;

/** A WATCH or UNWATCH line is cut at about this length (the daemon's
 * limits.max_line is 4096 by default). */
const WATCH_LINE_MAX = 3000;

// Waiter states.
const W_QUEUED = 1;
const W_SENT = 2;
const W_DONE = 3;
const W_CANCELLED = 4;

/** Reconnection: the first try at once, then after these, doubling. */
const RECONNECT_MIN_MS = 50;
const RECONNECT_MAX_MS = 1000;
/** A reply while leases may have to move is waited for at most half the
 * time left to the nearest deadline, but never less than this. */
const MIN_REPLY_MS = 250;
/** The longest wait= one LOCK asks for (the daemon's locks.max_wait_ms);
 * a longer wait is several LOCKs. */
const MAX_WAIT_MS = 3600000;
/** A request whose connection is lost under it this many times fails
 * (CONNECTION) instead of going out again: one the daemon answers by
 * closing (ERR TOOLONG) must not loop. */
const MAX_TRIES = 3;

const now = (): number => performance.now();

const HEX32 = /^[0-9a-f]{32}$/;

/** An acquire: queued here, then one LOCK on its way. */
class Waiter {
  state = W_QUEUED;
  readonly start = now();
  readonly until: number;
  timer: ReturnType<typeof setTimeout> | null = null;
  onAbort: (() => void) | null = null;
  req: Req | null = null;
  heldRetry = false;

  constructor(
    readonly resources: string[],
    readonly ttl: number | undefined,
    readonly wait: number,
    readonly mode: 'exclusive' | 'shared' | undefined,
    readonly limit: number | undefined,
    readonly renew: boolean,
    readonly signal: AbortSignal | undefined,
    readonly value: string | undefined,
    readonly resolve: (lease: Lease) => void,
    readonly reject: (err: unknown) => void,
  ) {
    this.until = wait === Infinity ? Infinity : this.start + wait;
  }
}

/** A resource of this client: taken (a LOCK on its way, or held), and the
 * acquires queued for it, first come first served. */
interface Slot {
  busy: boolean;
  q: Waiter[] | null;
}

/** A resource some Watch of this client watches. */
interface Watched {
  readonly resource: string;
  readonly watches: Set<Watch>;
  /** The last EVENT HOLDER line's words, and its event. */
  line: string | null;
  event: HolderEvent | null;
  /** The session (its number here) the WATCH went out on; -1: to send. */
  epoch: number;
  /** The WATCH on its way, if any. */
  req: Req | null;
}

function mkReq(
  line: string,
  kind: number,
  replay: boolean,
  onReply: (line: string) => void,
  onFail: (err: Error) => void,
): Req {
  return {
    line,
    kind,
    tag: '',
    tSend: 0,
    expectBy: 0,
    queuedAt: 0,
    extra: 0,
    sent: false,
    tries: 0,
    retried: false,
    replay,
    rebuild: null,
    onReply,
    onFail,
  };
}

const isOk = (line: string): boolean => line.startsWith('OK');
const errCode = (line: string): string => {
  if (!line.startsWith('ERR ')) return '';
  const sp = line.indexOf(' ', 4);
  return sp < 0 ? line.slice(4) : line.slice(4, sp);
};

function readEnvFile(name: string): Buffer | undefined {
  const path = process.env[name];
  if (path === undefined || path === '') return undefined;
  return readFileSync(path);
}

export interface ClientEvents {
  ready: [info: ServerInfo];
  reconnect: [info: ReconnectInfo];
  failover: [info: FailoverInfo];
  lost: [lease: Lease, error: RedlockdError];
  holder: [event: HolderEvent];
  error: [error: Error];
  close: [];
}

// Typed events (declaration merging with the class below).
export interface Client {
  on<K extends keyof ClientEvents>(event: K, listener: (...args: ClientEvents[K]) => void): this;
  once<K extends keyof ClientEvents>(event: K, listener: (...args: ClientEvents[K]) => void): this;
  off<K extends keyof ClientEvents>(event: K, listener: (...args: ClientEvents[K]) => void): this;
  emit<K extends keyof ClientEvents>(event: K, ...args: ClientEvents[K]): boolean;
}

/**
 * A session with redlockd over one connection at a time, shared by every
 * task of the process. Connects at once (in the background); requests wait
 * for the connection. Events: `ready`, `reconnect`, `failover`, `lost`,
 * `holder` (a watched resource's new state), `error` (only emitted when it
 * has a listener), `close`.
 */
export class Client extends EventEmitter {
  /** The addresses, as given. */
  readonly servers: readonly string[];
  private readonly _addrs: Address[];
  private readonly _name: string | undefined;
  private readonly _password: string | undefined;
  private readonly _user: string | undefined;
  private readonly _tls: tls.ConnectionOptions | null;
  private readonly _detach: number;
  private readonly _timeout: number;
  private readonly _autoReconnect: boolean;

  private _conn: Conn | null = null;
  private _ready = false;
  private _started = false;
  private _connecting = false;
  private _closing = false;
  private _closed = false;
  private _closePromise: Promise<void> | null = null;
  private _session: string | null = null;
  private _secret: string | null = null;
  private _sessionIndex = 0;
  /** The session's daemon said it is stopping: do not try to resume it. */
  private _sessionGone = false;
  private _index = 0;
  private _backoff = 0;
  private _nextAttempt = 0;
  private _lastError: Error | null = null;
  private _authError: Error | null = null;
  private _info: ServerInfo | null = null;

  /** Requests waiting for a connection (replays first, in order). */
  private _waiting: Req[] = [];
  /** Every lease not released for good: held, or with an UNLOCK on its way. */
  private readonly _leases = new Set<Lease>();
  /** resource -> its held lease. */
  private readonly _byRes = new Map<string, Lease>();
  /** resource -> taken here, and the acquires queued for it. */
  private readonly _slots = new Map<string, Slot>();
  private _readyWaiters: Array<{ resolve: () => void; reject: (e: Error) => void; until: number }> = [];

  private _timer: ReturnType<typeof setTimeout> | null = null;
  private _timerAt = Infinity;
  private _refreshing = false;
  private _refreshAgain = false;
  private _adoptRetryAt = 0;
  /** ADOPTs in flight for the 'failover' event. */
  private _failover: { adopted: number; lost: number; pending: number } | null = null;
  /** resource -> the Watches of it. */
  private readonly _watched = new Map<string, Watched>();
  /** Counts the sessions: a new one (not a resume) must be sent WATCH again. */
  private _epoch = 0;
  /** Resources nobody watches any more that the session may still watch
   * (their UNWATCH could not be sent): UNWATCH after a resume. */
  private readonly _stale = new Set<string>();

  constructor(options: ClientOptions = {}) {
    super();
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
    process.nextTick(() => this._kick());
  }

  private _tlsOptions(o: TlsOptions): tls.ConnectionOptions {
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

  // ---- public: state ------------------------------------------------------

  /** The address in use (or last used). */
  get server(): string {
    return (this._addrs[this._index] as Address).text;
  }

  /** The session id (HELLO's `session=`), once there is one. */
  get session(): string | null {
    return this._session;
  }

  /** True while a connection is up and its session confirmed. */
  get connected(): boolean {
    return this._ready && !this._closed;
  }

  /** True once close() was called. */
  get closed(): boolean {
    return this._closing || this._closed;
  }

  /** What the daemon said in HELLO (null before the first session). */
  get serverInfo(): ServerInfo | null {
    return this._info;
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

  // ---- public: locks -------------------------------------------------------

  /**
   * Take a lock on one resource or on several at once (all or none).
   * Resolves to a Lease. Rejects with a RedlockdError: BUSY (held and no
   * wait), TIMEOUT, UNAVAILABLE, LIMIT, DENIED, ARG, CONNECTION, ...; with
   * the signal's reason when `signal` aborts it.
   */
  acquire(resources: string | readonly string[], options: AcquireOptions = {}): Promise<Lease> {
    let w: Waiter | null = null;
    const p = new Promise<Lease>((resolve, reject) => {
      const list = resourceList(resources);
      const o = options ?? {};
      if (typeof o !== 'object') throw new TypeError('options must be an object');
      const ttl = o.ttl === undefined ? undefined : checkMs(o.ttl, 'ttl', 1);
      let wait = 0;
      if (o.wait !== undefined) wait = o.wait === Infinity ? Infinity : checkMs(o.wait, 'wait');
      if (o.mode !== undefined && o.mode !== 'exclusive' && o.mode !== 'shared') {
        throw new TypeError("mode must be 'exclusive' or 'shared'");
      }
      const limit = o.limit === undefined ? undefined : checkMs(o.limit, 'limit', 1);
      if (o.renew !== undefined && typeof o.renew !== 'boolean') throw new TypeError('renew must be a boolean');
      if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
      const value = o.value === undefined ? undefined : checkValue(o.value);
      if (value !== undefined && (o.mode === 'shared' || limit !== undefined)) {
        throw new TypeError('a value is for exclusive locks (not with mode shared or a limit)');
      }
      if (this._closing || this._closed) throw this._closedError();
      if (o.signal?.aborted) throw o.signal.reason;
      w = new Waiter(list, ttl, wait, o.mode, limit, o.renew !== false, o.signal, value, resolve, reject);
    });
    if (w !== null) this._enqueue(w);
    return p;
  }

  /**
   * Take the lock, run `routine(lease)`, release the lock when the routine
   * settles (also when it throws), and return the routine's result. If the
   * lease was lost before the routine settled, rejects with that loss (a
   * RedlockdError, code LOST) even when the routine succeeded; the
   * routine's own error always wins. An error of the release itself (the
   * lease expires at its ttl then) goes to the 'error' event.
   */
  using<T>(resources: string | readonly string[], routine: (lease: Lease) => Promise<T> | T): Promise<T>;
  using<T>(
    resources: string | readonly string[],
    options: AcquireOptions,
    routine: (lease: Lease) => Promise<T> | T,
  ): Promise<T>;
  async using<T>(
    resources: string | readonly string[],
    optionsOrRoutine: AcquireOptions | ((lease: Lease) => Promise<T> | T),
    maybeRoutine?: (lease: Lease) => Promise<T> | T,
  ): Promise<T> {
    const routine = typeof optionsOrRoutine === 'function' ? optionsOrRoutine : maybeRoutine;
    const options = typeof optionsOrRoutine === 'function' ? {} : optionsOrRoutine;
    if (typeof routine !== 'function') throw new TypeError('using() needs a routine');
    const lease = await this.acquire(resources, options);
    let result: T;
    try {
      result = await routine(lease);
    } catch (e) {
      try {
        await lease.release();
      } catch (err) {
        if (!(err instanceof RedlockdError && err.code === 'LOST')) this._emitError(err as Error);
      }
      throw e;
    }
    this._checkLease(lease);
    const lostBefore = lease._lostErr;
    try {
      await lease.release();
    } catch (err) {
      if (lostBefore !== null) throw lostBefore;
      if (err instanceof RedlockdError && err.code === 'LOST') throw err;
      this._emitError(err as Error);
    }
    if (lostBefore !== null) throw lostBefore;
    return result;
  }

  /** STATUS of one resource (any holder, on any daemon of the same
   * nodes). `limit` names a semaphore's size. */
  async status(resource: string, options: { limit?: number } = {}): Promise<Status> {
    checkResource(resource);
    const limit = options.limit === undefined ? '' : ` limit=${checkMs(options.limit, 'limit', 1)}`;
    return this._json(await this._query(`STATUS ${resource}${limit}`, resource)) as Status;
  }

  /**
   * Watch who holds these resources: an async iterator of HolderEvents,
   * the state of each resource now, then one event each time it changes
   * (through any daemon of the same nodes). `break` (or `return()`) ends
   * it; so do `options.signal` (the iterator then rejects with its
   * reason) and `close()` of the Client. A refused WATCH (`LIMIT`,
   * `DENIED`) rejects the iterator, and `ready`. The watch follows the
   * session: a resumed session hears each state again, and a new one (a
   * failover) is sent WATCH again.
   *
   *     for await (const ev of client.watch('leader:db')) console.log(ev.value);
   *
   * Resources may be given as arguments or as an array; options last.
   */
  watch(...resources: string[]): Watch;
  watch(...args: [...resources: string[], options: WatchOptions]): Watch;
  watch(resources: readonly string[], options?: WatchOptions): Watch;
  watch(...args: unknown[]): Watch {
    let options: unknown = {};
    let names: unknown[] = args;
    const last = args[args.length - 1];
    if (args.length > 0 && last !== null && typeof last === 'object' && !Array.isArray(last)) {
      options = last;
      names = args.slice(0, -1);
    }
    if (names.length === 1 && Array.isArray(names[0])) names = names[0] as unknown[];
    const list = resourceList(names);
    const o = options as WatchOptions;
    if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
    const w = new Watch(this, Object.freeze(list), o.signal);
    if (this._closing || this._closed) {
      w._finish(this._closedError());
      return w;
    }
    if (o.signal?.aborted) {
      w._finish(o.signal.reason);
      return w;
    }
    for (const r of list) {
      let e = this._watched.get(r);
      if (e === undefined) {
        e = { resource: r, watches: new Set(), line: null, event: null, epoch: -1, req: null };
        this._watched.set(r, e);
      }
      e.watches.add(w);
      // Watched already: what is known now, and nothing more to send.
      if (e.event !== null) w._deliver(e.event);
      if (e.epoch === this._epoch && e.req === null) w._confirmed(r);
    }
    this._syncWatches();
    return w;
  }

  /** LOCKS: this session's leases as the daemon sees them. Also confirms
   * the deadline of every lease of this client. */
  locks(): Promise<Locks> {
    return new Promise((resolve, reject) => {
      const snapshot = this._snapshot();
      const req = mkReq(
        'LOCKS',
        K_READ,
        true,
        (line) => {
          if (!isOk(line)) return reject(replyError(line));
          let body: Locks;
          try {
            body = this._json(line.slice(3)) as Locks;
          } catch (e) {
            return reject(e);
          }
          this._applyLocks(snapshot, body, req.tSend);
          resolve(body);
        },
        reject,
      );
      this._send(req);
    });
  }

  /** PING; resolves to the word echoed ('' without one). */
  async ping(word?: string): Promise<string> {
    const w = word === undefined ? '' : ' ' + checkWord(word, 'word', 256);
    return this._query('PING' + w, undefined, 'PONG');
  }

  /** SESSIONS (every session of this daemon, or only this user's). */
  async sessions(): Promise<Record<string, unknown>> {
    return this._json(await this._query('SESSIONS'));
  }

  /** STATS (the daemon's counters). */
  async stats(): Promise<Record<string, unknown>> {
    return this._json(await this._query('STATS'));
  }

  /** QUIT: the daemon releases every lock of the session. Leases still
   * held are lost ("closed"); waiting acquires reject with CONNECTION.
   * Idempotent. */
  close(): Promise<void> {
    if (this._closePromise === null) this._closePromise = this._close();
    return this._closePromise;
  }

  // ---- events -----------------------------------------------------------------

  /** 'error' is emitted only when someone listens (a client without a
   * listener does not crash the process on a failed reconnection). */
  private _emitError(err: Error): void {
    if (this.listenerCount('error') > 0) this.emit('error', err);
  }

  // ---- the local queue ---------------------------------------------------------

  private _enqueue(w: Waiter): void {
    let free = true;
    for (const r of w.resources) {
      const s = this._slots.get(r);
      if (s !== undefined && (s.busy || (s.q !== null && s.q.length > 0))) {
        free = false;
        break;
      }
    }
    if (free) {
      this._take(w);
      return;
    }
    if (w.wait === 0) {
      w.state = W_DONE;
      w.reject(
        new RedlockdError('BUSY', `${w.resources.join(' ')}: held by another task of this client`, {
          resource: w.resources[0],
        }),
      );
      return;
    }
    for (const r of w.resources) {
      let s = this._slots.get(r);
      if (s === undefined) {
        s = { busy: false, q: null };
        this._slots.set(r, s);
      }
      if (s.q === null) s.q = [];
      s.q.push(w);
    }
    if (w.wait !== Infinity) {
      w.timer = setTimeout(() => {
        if (w.state !== W_QUEUED) return;
        this._unqueue(w);
        w.state = W_DONE;
        w.reject(
          new RedlockdError('TIMEOUT', `${w.resources.join(' ')}: timed out after ${w.wait} ms behind another task of this client`, {
            resource: w.resources[0],
          }),
        );
      }, w.wait);
    }
    this._listenAbort(w);
  }

  private _listenAbort(w: Waiter): void {
    const signal = w.signal;
    if (signal === undefined || w.onAbort !== null) return;
    w.onAbort = () => this._abortWaiter(w);
    signal.addEventListener('abort', w.onAbort, { once: true });
  }

  private _unlistenAbort(w: Waiter): void {
    if (w.onAbort !== null && w.signal !== undefined) w.signal.removeEventListener('abort', w.onAbort);
    w.onAbort = null;
  }

  private _abortWaiter(w: Waiter): void {
    const reason: unknown = w.signal?.reason;
    w.onAbort = null;
    if (w.state === W_QUEUED) {
      this._unqueue(w);
      w.state = W_DONE;
      w.reject(reason);
    } else if (w.state === W_SENT) {
      w.state = W_CANCELLED;
      w.reject(reason);
      const req = w.req;
      const i = req === null ? -1 : this._waiting.indexOf(req);
      if (i >= 0) {
        // Not written yet: it never will be.
        this._waiting.splice(i, 1);
        this._free(w.resources);
      }
      // Else the LOCK is with the daemon, which has no way to call it off:
      // the resources stay taken until its answer, and a grant is given
      // back at once (_onLockReply).
    }
  }

  /** Take w out of the queues it waits in (it gave up). */
  private _unqueue(w: Waiter): void {
    if (w.timer !== null) clearTimeout(w.timer);
    w.timer = null;
    this._unlistenAbort(w);
    for (const r of w.resources) {
      const s = this._slots.get(r);
      if (s === undefined || s.q === null) continue;
      const i = s.q.indexOf(w);
      if (i >= 0) s.q.splice(i, 1);
    }
    this._pump(w.resources);
  }

  private _take(w: Waiter): void {
    for (const r of w.resources) {
      const s = this._slots.get(r);
      if (s === undefined) this._slots.set(r, { busy: true, q: null });
      else s.busy = true;
    }
    if (w.timer !== null) clearTimeout(w.timer);
    w.timer = null;
    w.state = W_SENT;
    this._listenAbort(w);
    this._sendLock(w);
  }

  /** These resources are no longer taken here: the next waiters go. */
  private _free(resources: readonly string[]): void {
    for (const r of resources) {
      const s = this._slots.get(r);
      if (s !== undefined) s.busy = false;
    }
    this._pump(resources);
  }

  private _pump(resources: readonly string[]): void {
    for (const r of resources) {
      const s = this._slots.get(r);
      if (s === undefined) continue;
      if (s.q === null || s.q.length === 0) {
        if (!s.busy) this._slots.delete(r);
        continue;
      }
      if (s.busy) continue;
      const w = s.q[0] as Waiter;
      if (!this._eligible(w)) continue;
      for (const rr of w.resources) (this._slots.get(rr) as Slot).q?.shift();
      this._take(w);
    }
  }

  private _eligible(w: Waiter): boolean {
    for (const r of w.resources) {
      const s = this._slots.get(r);
      if (s === undefined || s.busy || s.q === null || s.q[0] !== w) return false;
    }
    return true;
  }

  // ---- LOCK ------------------------------------------------------------------------

  private _lockLine(w: Waiter): string | Error {
    let line = 'LOCK ' + w.resources.join(' ');
    if (w.ttl !== undefined) line += ' ttl=' + w.ttl;
    if (w.wait === Infinity) {
      line += ' wait=' + MAX_WAIT_MS;
    } else if (w.wait > 0) {
      const left = Math.ceil(w.until - now());
      if (left <= 0) {
        return new RedlockdError('TIMEOUT', `${w.resources.join(' ')}: timed out after ${w.wait} ms`, {
          resource: w.resources[0],
        });
      }
      line += ' wait=' + Math.min(left, MAX_U32);
    }
    if (w.mode !== undefined) line += ' mode=' + w.mode;
    if (w.limit !== undefined) line += ' limit=' + w.limit;
    if (!w.renew) line += ' renew=0';
    if (w.value !== undefined) line += ' value=' + w.value;
    return line;
  }

  private _sendLock(w: Waiter): void {
    const line = this._lockLine(w);
    if (line instanceof Error) {
      w.state = W_DONE;
      this._unlistenAbort(w);
      this._free(w.resources);
      w.reject(line);
      return;
    }
    const req = mkReq(
      line,
      K_LOCK,
      true,
      (reply) => this._onLockReply(w, req, reply),
      (err) => {
        if (w.state === W_CANCELLED) {
          w.state = W_DONE;
          this._free(w.resources);
          return;
        }
        if (w.state !== W_SENT) return;
        w.state = W_DONE;
        this._unlistenAbort(w);
        this._free(w.resources);
        w.reject(err);
      },
    );
    req.extra = w.wait === Infinity ? MAX_WAIT_MS : Math.min(w.wait, MAX_U32);
    req.rebuild = () => (w.state === W_SENT ? this._lockLine(w) : new Error('cancelled'));
    w.req = req;
    this._send(req);
  }

  private _onLockReply(w: Waiter, req: Req, line: string): void {
    if (w.state === W_CANCELLED) {
      // Its acquire was called off: give a grant back at once.
      w.state = W_DONE;
      if (isOk(line)) this._sendUnlockQuiet(w.resources, true);
      this._free(w.resources);
      return;
    }
    if (w.state !== W_SENT) return;
    if (isOk(line)) {
      let lease: Lease;
      try {
        lease = this._leaseFromReply(w, line, req.tSend);
      } catch (e) {
        w.state = W_DONE;
        this._unlistenAbort(w);
        this._sendUnlockQuiet(w.resources, false);
        this._free(w.resources);
        w.reject(e);
        return;
      }
      w.state = W_DONE;
      this._unlistenAbort(w);
      this._leases.add(lease);
      for (const r of lease.resources) this._byRes.set(r, lease);
      if (lease._stopAt() <= now()) {
        // Granted after a wait longer than its validity: a LOCKS confirms it
        // before the acquire resolves (the deadline counts from the send).
        lease._confirming = w.resolve;
        lease._confirmFail = w.reject;
        lease._confirmSince = now();
        this._arm(lease._confirmSince + this._timeout);
        this._refresh(true);
        return;
      }
      this._arm(lease._refreshedAt + lease._ttl / 3);
      w.resolve(lease);
      return;
    }
    const code = errCode(line);
    if (code === 'HELD' && !w.heldRetry) {
      // This session holds it already: a LOCK whose reply a lost connection
      // ate, granted after the resume looked. Give it back and ask again.
      w.heldRetry = true;
      this._sendUnlockQuiet(w.resources, true);
      this._sendLock(w);
      return;
    }
    if (code === 'TIMEOUT' && w.wait === Infinity) {
      this._sendLock(w);
      return;
    }
    if (code === 'SHUTDOWN' && this._autoReconnect && !this._closing) {
      // The daemon is stopping: ask again on the next connection.
      if (this._conn !== null) this._onShutdown(this._conn);
      this._sendLock(w);
      return;
    }
    w.state = W_DONE;
    this._unlistenAbort(w);
    this._free(w.resources);
    w.reject(replyError(line, w.resources[0]));
  }

  private _leaseFromReply(w: Waiter, line: string, tSend: number): Lease {
    const f = fields(line.slice(3));
    const token = f.token;
    const fence = f.fence;
    if (token === undefined || fence === undefined || !/^[0-9]+$/.test(fence)) {
      throw connectionError(`a LOCK reply without token= or fence=: ${line.slice(0, 120)}`);
    }
    const n = f.resources === undefined ? 1 : Number(f.resources);
    if (n !== w.resources.length || (f.resource !== undefined && f.resource !== w.resources[0])) {
      throw connectionError(`a LOCK reply for other resources: ${line.slice(0, 120)}`);
    }
    return new Lease(
      this,
      w.resources,
      token,
      fence,
      intField(f, 'ttl', w.ttl ?? 30000),
      intField(f, 'validity', 0),
      tSend,
      w.renew,
      f.mode === 'shared' ? 'shared' : 'exclusive',
      f.limit === undefined ? w.limit : Number(f.limit),
      f.slot === undefined ? undefined : Number(f.slot),
      w.value,
    );
  }

  /** UNLOCK whose answer nobody waits for (a cancelled LOCK, a lost lease,
   * what the session holds that no lease knows). */
  private _sendUnlockQuiet(resources: readonly string[], replay: boolean): void {
    const req = mkReq(
      'UNLOCK ' + resources.join(' '),
      K_UNLOCK,
      replay,
      () => {},
      () => {},
    );
    this._send(req);
  }

  // ---- leases: release, extend, loss ---------------------------------------------

  /** @internal */
  _releaseLease(lease: Lease): Promise<void> {
    this._checkLease(lease);
    if (lease._state === LOST) return Promise.reject(lease._lostErr);
    if (lease._state === RELEASED) return Promise.resolve();
    lease._state = RELEASED;
    for (const r of lease.resources) if (this._byRes.get(r) === lease) this._byRes.delete(r);
    if (this._closing || this._closed) {
      this._leases.delete(lease);
      this._free(lease.resources);
      return Promise.resolve(); // QUIT releases it
    }
    return new Promise<void>((resolve, reject) => {
      lease._unlocking = true;
      const req = mkReq(
        'UNLOCK ' + lease.resources.join(' '),
        K_UNLOCK,
        true,
        (line) => {
          lease._unlocking = false;
          this._leases.delete(lease);
          if (isOk(line)) return resolve();
          const code = errCode(line);
          if (code === 'NOTHELD') {
            // A second try after a lost connection: the first did it.
            if (req.retried) return resolve();
            if (lease._needsAdopt) {
              return reject(
                new RedlockdError('UNAVAILABLE', `${lease.resource}: the lease could not be adopted for its release (it expires at its ttl)`, {
                  resource: lease.resource,
                }),
              );
            }
            return reject(lostError(lease.resource, 'gone'));
          }
          if (code === 'LOST') return reject(lostError(lease.resource, 'lost'));
          reject(replyError(line, lease.resource));
        },
        (err) => {
          lease._unlocking = false;
          this._leases.delete(lease);
          if (this._closing && this._closeQuitOk) resolve();
          else reject(err);
        },
      );
      this._send(req);
      this._free(lease.resources);
    });
  }

  /** @internal EXTEND ttl= and/or value= (one of them at least). */
  _extendLease(lease: Lease, ttl: number | undefined, value: string | undefined): Promise<Lease> {
    try {
      if (ttl !== undefined || value === undefined) checkMs(ttl, 'ttl', 1);
      if (value !== undefined) {
        checkValue(value);
        if (lease.mode !== 'exclusive' || lease.limit !== undefined) {
          throw new TypeError('a value is for exclusive locks (not a shared hold or a semaphore slot)');
        }
      }
    } catch (e) {
      return Promise.reject(e);
    }
    this._checkLease(lease);
    if (lease._state === LOST) return Promise.reject(lease._lostErr);
    if (lease._state === RELEASED) {
      return Promise.reject(new RedlockdError('NOTHELD', `${lease.resource} was released`, { resource: lease.resource }));
    }
    const oldTtl = lease._ttl;
    const words = (ttl === undefined ? '' : ` ttl=${ttl}`) + (value === undefined ? '' : ` value=${value}`);
    const parts = lease.resources.map(
      (r) =>
        new Promise<{ tSend: number; validity: number; ttl: number }>((resolve, reject) => {
          const req = mkReq(
            `EXTEND ${r}${words}`,
            K_EXTEND,
            true,
            (line) => {
              if (isOk(line)) {
                const f = fields(line.slice(3));
                return resolve({
                  tSend: req.tSend,
                  validity: intField(f, 'validity', 0),
                  ttl: intField(f, 'ttl', ttl ?? lease._ttl),
                });
              }
              const code = errCode(line);
              if (code === 'LOST' || code === 'NOTHELD') {
                const err = lostError(r, code === 'LOST' ? 'lost' : 'gone');
                this._lose(lease, err);
                return reject(err);
              }
              if (code === 'UNAVAILABLE' && ttl !== undefined && ttl < oldTtl && lease._state === HELD) {
                // Some nodes may have the shorter ttl now: count the lease
                // confirmed only up to when this EXTEND was sent.
                lease._deadline = Math.min(lease._deadline, req.tSend);
                this._refresh(true);
                this._arm(lease._stopAt());
              }
              reject(replyError(line, r));
            },
            reject,
          );
          req.rebuild = () =>
            lease._state !== HELD
              ? lease._lostErr ?? new RedlockdError('NOTHELD', `${r} was released`, { resource: r })
              : lease._needsAdopt && !lease._adopting
                ? new RedlockdError('UNAVAILABLE', `${r}: the lease is not adopted on this session yet`, { resource: r })
                : req.line;
          this._send(req);
        }),
    );
    return Promise.all(parts).then((rs) => {
      let d = Infinity;
      let v = Infinity;
      let t = Infinity;
      let newTtl = lease._ttl;
      for (const x of rs) {
        d = Math.min(d, x.tSend + x.validity);
        v = Math.min(v, x.validity);
        t = Math.min(t, x.tSend);
        newTtl = x.ttl;
      }
      this._confirm(lease, t, d, v, newTtl);
      if (lease._state === LOST) throw lease._lostErr;
      if (value !== undefined) lease._value = value;
      return lease;
    });
  }

  /** @internal lazily: a lease past its deadline is lost now. */
  _checkLease(lease: Lease): void {
    if (lease._state === HELD && lease._confirming === null && now() >= lease._stopAt()) {
      this._lose(lease, lostError(lease.resource, 'deadline'));
    }
  }

  /** @internal */
  _leaseUnconfirmed(lease: Lease): boolean {
    return !this._ready || lease._needsAdopt || lease._adopting || lease._confirming !== null;
  }

  private _confirm(lease: Lease, tSend: number, deadline: number, validity: number, ttl?: number): void {
    this._checkLease(lease);
    if (lease._state === LOST) return;
    if (tSend >= lease._confirmedAt) {
      lease._deadline = deadline;
      lease._confirmedAt = tSend;
      lease._validity = validity;
    }
    if (tSend > lease._refreshedAt) lease._refreshedAt = tSend;
    if (ttl !== undefined) lease._ttl = ttl;
    this._arm(lease._refreshedAt + lease._ttl / 3);
    const confirming = lease._confirming;
    if (confirming !== null && lease._state === HELD) {
      if (now() >= lease._stopAt()) return; // not this one
      lease._confirming = null;
      lease._confirmFail = null;
      confirming(lease);
    }
  }

  /** The lease is lost: its signal aborts, its resources go to the next
   * waiters here, and an UNLOCK clears it on the daemon (which answers LOST
   * for a lease it lost, and releases one lost by its deadline). */
  private _lose(lease: Lease, err: RedlockdError): void {
    if (lease._state !== HELD) return;
    lease._state = LOST;
    lease._lostErr = err;
    this._leases.delete(lease);
    for (const r of lease.resources) if (this._byRes.get(r) === lease) this._byRes.delete(r);
    const adopted = !lease._needsAdopt && !lease._adopting;
    lease._needsAdopt = false;
    if (adopted && this._ready && !this._closing) this._sendUnlockQuiet(lease.resources, false);
    this._free(lease.resources);
    const fail = lease._confirmFail;
    lease._confirming = null;
    lease._confirmFail = null;
    if (fail !== null) fail(err);
    if (lease._ctrl !== null) lease._ctrl.abort(err);
    if (fail === null && this.listenerCount('lost') > 0) this.emit('lost', lease, err);
  }

  // ---- LOCKS: confirming the deadlines -------------------------------------------

  private _snapshot(): Lease[] {
    const out: Lease[] = [];
    for (const l of this._leases) {
      if (l._state === HELD && !l._needsAdopt && !l._adopting) out.push(l);
    }
    return out;
  }

  /** Send a LOCKS now if none is in flight (`again`: or right after the
   * one in flight, which was sent before something that needs it). */
  private _refresh(again = false): void {
    if (!this._ready || this._conn === null || this._closing) return;
    if (this._refreshing) {
      if (again) this._refreshAgain = true;
      return;
    }
    const snapshot = this._snapshot();
    if (snapshot.length === 0) return;
    this._refreshing = true;
    this._refreshAgain = false;
    const req = mkReq(
      'LOCKS',
      K_REFRESH,
      false,
      (line) => {
        this._refreshing = false;
        if (isOk(line)) {
          let body: Locks | null = null;
          try {
            body = this._json(line.slice(3)) as Locks;
          } catch (e) {
            this._emitError(e as Error);
          }
          if (body !== null) this._applyLocks(snapshot, body, req.tSend);
        } else {
          this._emitError(replyError(line));
          const t = now();
          for (const l of snapshot) if (l._refreshedAt < t) l._refreshedAt = t; // do not spin
        }
        if (this._refreshAgain) this._refresh();
        this._arm(now());
      },
      () => {
        this._refreshing = false;
      },
    );
    this._send(req);
    // No answer by half the time left to the nearest deadline: drop the
    // connection, so that there is time to move the leases elsewhere.
    let nearest = Infinity;
    for (const l of snapshot) if (l._confirming === null && l._stopAt() < nearest) nearest = l._stopAt();
    const limit = Math.min(this._timeout, Math.max(MIN_REPLY_MS, (nearest - req.tSend) / 2));
    req.expectBy = req.tSend + limit;
    this._arm(req.expectBy);
  }

  private _applyLocks(snapshot: Lease[], body: Locks, tSend: number): void {
    const held = new Map<string, LockInfo>();
    for (const e of Array.isArray(body.locks) ? body.locks : []) {
      if (e !== null && typeof e === 'object' && typeof e.resource === 'string') held.set(e.resource, e);
    }
    const lost = new Set(Array.isArray(body.lost) ? body.lost : []);
    for (const l of snapshot) {
      if (l._state !== HELD || l._needsAdopt || l._adopting) continue;
      let d = Infinity;
      let v = Infinity;
      let ttl: number | undefined;
      let missing: string | null = null;
      for (const r of l.resources) {
        const e = held.get(r);
        if (e === undefined || String(e.fence) !== l._fence) {
          missing = r;
          break;
        }
        if (typeof e.token === 'string' && HEX32.test(e.token)) l._token = e.token;
        if (typeof e.validity === 'number') {
          d = Math.min(d, tSend + e.validity);
          v = Math.min(v, e.validity);
        }
        if (typeof e.ttl === 'number') ttl = e.ttl;
      }
      if (missing !== null) {
        this._lose(l, lostError(missing, lost.has(missing) ? 'lost' : 'gone'));
      } else if (v <= 0) {
        this._lose(l, lostError(l.resource, 'lost'));
      } else if (d < Infinity) {
        this._confirm(l, tSend, d, v, ttl);
      }
    }
  }

  // ---- requests ---------------------------------------------------------------------

  /** Write req on the ready connection, or keep it until there is one. */
  private _send(req: Req): void {
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

  private _write(conn: Conn, req: Req, tagged = true): void {
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
  private _query(line: string, resource?: string, want = 'OK'): Promise<string> {
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

  private _json(text: string): Record<string, unknown> {
    const v: unknown = JSON.parse(text.startsWith('OK ') ? text.slice(3) : text);
    if (v === null || typeof v !== 'object' || Array.isArray(v)) throw connectionError('the daemon sent JSON that is not an object');
    return v as Record<string, unknown>;
  }

  // ---- the connection's lines --------------------------------------------------------

  /** @internal */
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

  private _onEvent(conn: Conn, line: string): void {
    if (conn !== this._conn) return; // news of a session we left
    const sp = line.indexOf(' ', 6);
    const name = sp < 0 ? line.slice(6) : line.slice(6, sp);
    const f = sp < 0 ? {} : fields(line.slice(sp + 1));
    if (name === 'HOLDER') {
      this._onHolder(line.slice(sp + 1), f);
    } else if (name === 'LOST') {
      const r = f.resource;
      const lease = r === undefined ? undefined : this._byRes.get(r);
      if (lease !== undefined && r !== undefined && (f.fence === undefined || f.fence === lease._fence)) {
        this._lose(lease, lostError(r, f.reason ?? 'lost'));
      }
    } else if (name === 'SHUTDOWN') {
      this._onShutdown(conn);
    } else if (name === 'CLOSING') {
      conn.closingReason = f.reason ?? 'unknown';
    }
  }

  // ---- watches ---------------------------------------------------------------------

  /** EVENT HOLDER: a new state of a watched resource, for each of its
   * Watches (the same state again, as a resume or a second WATCH sends
   * it, is not told twice). */
  private _onHolder(words: string, f: Record<string, string>): void {
    const r = f.resource;
    const e = r === undefined ? undefined : this._watched.get(r);
    if (e === undefined || e.line === words) return; // unwatched meanwhile, or nothing new
    const ev = holderEvent(f);
    if (ev === null) return;
    e.line = words;
    e.event = ev;
    for (const w of [...e.watches]) w._deliver(ev);
    if (this.listenerCount('holder') > 0) this.emit('holder', ev);
  }

  /** Send WATCH for each watched resource this session has not been sent
   * (a new watch, or every one after a new session), in lines of at most
   * WATCH_LINE_MAX characters. */
  private _syncWatches(): void {
    if (!this._ready || this._conn === null || this._closing || this._closed) return;
    const epoch = this._epoch;
    let batch: Watched[] = [];
    let len = 0;
    const flush = (): void => {
      if (batch.length > 0) this._sendWatch(batch, epoch);
      batch = [];
      len = 0;
    };
    for (const e of this._watched.values()) {
      if (e.epoch === epoch) continue;
      if (len + e.resource.length + 1 > WATCH_LINE_MAX) flush();
      batch.push(e);
      len += e.resource.length + 1;
    }
    flush();
  }

  private _sendWatch(batch: Watched[], epoch: number): void {
    const req: Req = mkReq(
      'WATCH ' + batch.map((e) => e.resource).join(' '),
      K_WATCH,
      false,
      (line) => {
        const mine = batch.filter((e) => e.req === req);
        for (const e of mine) e.req = null;
        if (isOk(line)) {
          for (const e of mine) for (const w of e.watches) w._confirmed(e.resource);
          return;
        }
        // Refused, all of it (LIMIT, DENIED): every Watch of these ends.
        const err = line.startsWith('ERR ')
          ? replyError(line, mine[0]?.resource)
          : connectionError(`unexpected reply to WATCH: ${line.slice(0, 120)}`);
        for (const e of mine) {
          if (this._watched.get(e.resource) === e) this._watched.delete(e.resource);
        }
        const ws = new Set<Watch>();
        for (const e of mine) for (const w of e.watches) ws.add(w);
        for (const w of ws) w._finish(err);
      },
      () => {
        // The connection went first: WATCH again on the next one (a
        // resumed session may have it already: it tells the state again).
        for (const e of batch) {
          if (e.req !== req) continue;
          e.req = null;
          e.epoch = -1;
        }
      },
    );
    for (const e of batch) {
      e.epoch = epoch;
      e.req = req;
    }
    this._send(req);
  }

  /** @internal a Watch ended: UNWATCH what no other Watch wants. */
  _unwatch(w: Watch): void {
    const gone: string[] = [];
    for (const r of w.resources) {
      const e = this._watched.get(r);
      if (e === undefined || !e.watches.delete(w) || e.watches.size > 0) continue;
      this._watched.delete(r);
      if (e.epoch !== -1 || e.req !== null) gone.push(r);
    }
    if (gone.length === 0 || this._closing || this._closed) return;
    if (!this._ready) {
      // The session may be resumed with these watches: UNWATCH then.
      for (const r of gone) this._stale.add(r);
      return;
    }
    this._sendUnwatch(gone);
  }

  /** UNWATCH these (that no Watch wants now), in lines of at most
   * WATCH_LINE_MAX characters. */
  private _sendUnwatch(resources: readonly string[]): void {
    let batch: string[] = [];
    let len = 0;
    const flush = (): void => {
      if (batch.length === 0) return;
      const names = batch;
      const failed = (): void => {
        // The connection went first: again after a resume.
        for (const r of names) if (!this._watched.has(r)) this._stale.add(r);
      };
      this._send(mkReq('UNWATCH ' + names.join(' '), K_WATCH, false, () => {}, failed));
      batch = [];
      len = 0;
    };
    for (const r of resources) {
      if (len + r.length + 1 > WATCH_LINE_MAX) flush();
      batch.push(r);
      len += r.length + 1;
    }
    flush();
  }

  /** Every Watch ends (err null: quietly, as at close()). */
  private _endWatches(err: Error | null): void {
    const ws = new Set<Watch>();
    for (const e of this._watched.values()) for (const w of e.watches) ws.add(w);
    this._watched.clear();
    for (const w of ws) w._finish(err);
  }

  /** The daemon is stopping: it takes no new locks. With other servers,
   * move there now (its leases are adopted there); with one, LOCKs wait
   * for it to be back, while the leases stay held until it closes. */
  private _onShutdown(conn: Conn): void {
    if (conn.shutdown) return;
    conn.shutdown = true;
    if (conn === this._conn && this._autoReconnect && this._addrs.length > 1 && this._ready) {
      this._sessionGone = true;
      this._drop(conn, 'the daemon is shutting down');
    }
  }

  /** @internal the socket closed or failed */
  onClosed(conn: Conn, why: string): void {
    this._drop(conn, why);
  }

  /** This connection is done: its requests fail, or wait to be sent again. */
  private _drop(conn: Conn, why: string): void {
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
  private _closeForGood(err: Error): void {
    this._closed = true;
    for (const l of [...this._leases]) this._lose(l, lostError(l.resource, 'closed'));
    this._failAll(err);
    this._endWatches(err);
    this._clearTimer();
    this.emit('close');
  }

  private _failAll(err: Error): void {
    const waiting = this._waiting.splice(0);
    for (const r of waiting) r.onFail(err);
    for (const s of [...this._slots.values()]) {
      for (const w of s.q ?? []) {
        if (w.state !== W_QUEUED) continue;
        w.state = W_DONE;
        if (w.timer !== null) clearTimeout(w.timer);
        this._unlistenAbort(w);
        w.reject(err);
      }
      s.q = null;
    }
    const rw = this._readyWaiters.splice(0);
    for (const x of rw) x.reject(err);
  }

  private _closedError(): RedlockdError {
    return connectionError('the client is closed');
  }

  // ---- the timer: deadlines, refreshes, replies that do not come, reconnects ------

  private _arm(at: number): void {
    if (at >= this._timerAt || this._closed) return;
    if (this._timer !== null) clearTimeout(this._timer);
    this._timerAt = at;
    this._timer = setTimeout(this._tick, Math.max(0, Math.ceil(at - now())));
  }

  private _clearTimer(): void {
    if (this._timer !== null) clearTimeout(this._timer);
    this._timer = null;
    this._timerAt = -Infinity; // never again
  }

  private readonly _tick = (): void => {
    this._timer = null;
    this._timerAt = Infinity;
    if (this._closed) return;
    const t = now();
    let next = Infinity;
    let refresh = false;
    for (const l of this._leases) {
      if (l._state !== HELD) continue;
      if (l._confirming !== null) {
        const lim = l._confirmSince + this._timeout;
        if (t >= lim) this._lose(l, lostError(l.resource, 'deadline'));
        else next = Math.min(next, lim);
        continue;
      }
      if (t >= l._stopAt()) {
        this._lose(l, lostError(l.resource, 'deadline'));
        continue;
      }
      next = Math.min(next, l._stopAt());
      if (!l._needsAdopt && !l._adopting) {
        const due = l._refreshedAt + l._ttl / 3;
        if (due <= t) refresh = true;
        else next = Math.min(next, due);
      }
    }
    if (refresh) this._refresh();
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
    if (this._adoptRetryAt > 0 && this._ready && this._conn !== null) {
      if (t >= this._adoptRetryAt) {
        this._adoptRetryAt = 0;
        this._adoptPending(this._conn);
      } else next = Math.min(next, this._adoptRetryAt);
    }
    if (this._conn === null && !this._connecting && (this._autoReconnect || !this._started) && !this._closing) {
      if (t >= this._nextAttempt) this._kick();
      else next = Math.min(next, this._nextAttempt);
    }
    if (next < Infinity) this._arm(next);
  };

  private _unreachable(): RedlockdError {
    if (this._authError !== null) return this._authError as RedlockdError;
    const last = this._lastError;
    return connectionError(
      `not connected to any of ${this.servers.join(', ')}${last === null ? '' : `: ${last.message}`}`,
      last ?? undefined,
    );
  }

  // ---- connecting, resuming, adopting --------------------------------------------------

  /** Start a connection attempt if one is due. */
  private _kick(): void {
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
  private async _attempt(): Promise<void> {
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

  private _abandon(): void {
    const conn = this._conn;
    if (conn !== null && !this._ready) this._drop(conn, 'connection attempt given up');
  }

  /** The session is gone: every lease is to be adopted by the next one. */
  private _forgetSession(): void {
    this._session = null;
    this._secret = null;
    for (const l of this._leases) l._needsAdopt = true;
  }

  private _attemptOk(resumed: boolean): void {
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
    if (this._stale.size > 0) {
      // Given up while the connection was down: a resumed session still
      // watches them, a new one does not.
      const stale = [...this._stale].filter((r) => !this._watched.has(r));
      this._stale.clear();
      if (resumed && stale.length > 0) this._sendUnwatch(stale);
    }
    this._syncWatches();
    const rw = this._readyWaiters.splice(0);
    for (const x of rw) x.resolve();
    const info = this._info as ServerInfo;
    if (first) this.emit('ready', info);
    else this.emit('reconnect', { server: conn.addr.text, resumed, session: info.session });
    this._failoverDone(); // unless ADOPTs are still on their way
    this._arm(now());
  }

  /** Connect to server i; the connection becomes the current one (not ready). */
  private _open(i: number, limit: number): Promise<Conn> {
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
  private _call(conn: Conn, line: string, limit: number, tagged: boolean): Promise<{ line: string; tSend: number }> {
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
  private _replyLimit(): number {
    let nearest = Infinity;
    for (const l of this._leases) if (l._state === HELD && l._stopAt() < nearest) nearest = l._stopAt();
    if (nearest === Infinity) return this._timeout;
    return Math.min(this._timeout, Math.max(MIN_REPLY_MS, (nearest - now()) / 2));
  }

  private _helloWords(): string {
    return 'HELLO proto=1' + (this._name === undefined ? '' : ' name=' + this._name);
  }

  private _hello(conn: Conn, f: Record<string, string>): void {
    this._info = {
      server: conn.addr.text,
      session: f.session ?? '',
      version: f.server,
      nodes: f.nodes === undefined ? undefined : Number(f.nodes),
      quorum: f.quorum === undefined ? undefined : Number(f.quorum),
    };
  }

  /** HELLO resume= on the session's daemon; LOCKS confirms the leases. */
  private async _resumeAt(i: number): Promise<void> {
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
    this._applyResume(conn, body, locks.tSend);
    this._adoptPending(conn);
  }

  /** After a resume: each lease is still held (same fence), adopted by an
   * ADOPT whose reply was lost (same fence, a new token), or lost; what
   * the session holds that no lease knows is given back. */
  private _applyResume(conn: Conn, body: Locks, tSend: number): void {
    const held = new Map<string, LockInfo>();
    for (const e of Array.isArray(body.locks) ? body.locks : []) {
      if (e !== null && typeof e === 'object' && typeof e.resource === 'string') held.set(e.resource, e);
    }
    const lost = new Set(Array.isArray(body.lost) ? body.lost : []);
    const used = new Set<string>();
    for (const l of [...this._leases]) {
      let d = Infinity;
      let v = Infinity;
      let ttl: number | undefined;
      let token: string | null = null;
      let missing: string | null = null;
      for (const r of l.resources) {
        const e = held.get(r);
        if (e === undefined || String(e.fence) !== l._fence) {
          missing = r;
          break;
        }
        if (typeof e.token === 'string' && HEX32.test(e.token)) token = e.token;
        if (typeof e.validity === 'number') {
          d = Math.min(d, tSend + e.validity);
          v = Math.min(v, e.validity);
        }
        if (typeof e.ttl === 'number') ttl = e.ttl;
      }
      if (missing !== null) {
        if (!l._needsAdopt && l._state === HELD) this._lose(l, lostError(missing, lost.has(missing) ? 'lost' : 'gone'));
        continue;
      }
      for (const r of l.resources) used.add(r);
      if (token !== null) l._token = token;
      if (l._needsAdopt && this._failover !== null) this._failover.adopted++; // by an ADOPT whose answer was lost
      l._needsAdopt = false;
      if (l._state === HELD && d < Infinity && v > 0) this._confirm(l, tSend, d, v, ttl);
    }
    for (const r of lost) {
      // A lease lost while detached (its EVENT LOST came before): UNLOCK
      // answers LOST and clears the daemon's record of it.
      if (typeof r !== 'string' || held.has(r)) continue;
      this._write(conn, mkReq(`UNLOCK ${r}`, K_UNLOCK, false, () => {}, () => {}));
    }
    for (const r of held.keys()) {
      if (used.has(r)) continue;
      // A LOCK whose reply the lost connection ate, or a lease lost here
      // meanwhile: give it back.
      const req = mkReq(`UNLOCK ${r}`, K_UNLOCK, false, () => {}, () => {});
      this._write(conn, req);
    }
  }

  /** A new session on server i, and ADOPT of every lease. */
  private async _freshAt(i: number): Promise<void> {
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
    for (const l of this._leases) l._needsAdopt = true;
    if (hadSession) this._failover = { adopted: 0, lost: 0, pending: 0 };
    this._adoptPending(conn);
  }

  /** ADOPT each lease that needs it, one request per grant (written
   * before anything else goes on the connection). */
  private _adoptPending(conn: Conn): void {
    const t = now();
    for (const l of [...this._leases]) {
      if (!l._needsAdopt || l._adopting) continue;
      if (t >= l._stopAt()) {
        // Never adopted past its deadline: lost.
        if (l._state === HELD) {
          this._lose(l, lostError(l.resource, 'deadline'));
          if (this._failover !== null) this._failover.lost++;
        } else {
          l._needsAdopt = false;
        }
        continue;
      }
      l._adopting = true;
      if (this._failover !== null) this._failover.pending++;
      let line = `ADOPT ${l.resources.join(' ')} token=${l._token} ttl=${l._ttl}`;
      if (!l.renew) line += ' renew=0';
      const req = mkReq(
        line,
        K_ADOPT,
        false,
        (reply) => {
          l._adopting = false;
          this._onAdoptReply(l, req, reply);
          if (this._failover !== null) this._failover.pending--;
          this._failoverDone();
        },
        () => {
          // The next connection resumes this session (its LOCKS shows the
          // lease if the ADOPT was done: same fence, a new token) or
          // adopts it again.
          l._adopting = false;
          if (this._failover !== null) this._failover.pending--;
        },
      );
      this._write(conn, req);
      // An answer that does not come by half the time left to the lease's
      // deadline drops the connection, while there is time to try again.
      const limit = Math.max(MIN_REPLY_MS, (l._stopAt() - req.tSend) / 2);
      if (req.tSend + limit < req.expectBy) {
        req.expectBy = req.tSend + limit;
        this._arm(req.expectBy);
      }
    }
  }

  private _onAdoptReply(l: Lease, req: Req, line: string): void {
    if (isOk(line)) {
      const f = fields(line.slice(3));
      if (f.token !== undefined && HEX32.test(f.token)) l._token = f.token;
      l._needsAdopt = false;
      if (f.fence !== l._fence) {
        if (l._state === HELD) this._lose(l, lostError(l.resource, 'adopt', 'the lease adopted has another fence'));
        if (this._failover !== null) this._failover.lost++;
        return;
      }
      if (this._failover !== null) this._failover.adopted++;
      const v = intField(f, 'validity', 0);
      this._confirm(l, req.tSend, req.tSend + v, v, intField(f, 'ttl', l._ttl));
      return;
    }
    const code = errCode(line);
    if (code === 'UNAVAILABLE' || code === 'SHUTDOWN') {
      // Try again soon, while its deadline holds.
      const at = now() + Math.max(RECONNECT_MIN_MS, this._backoff);
      if (this._adoptRetryAt === 0 || at < this._adoptRetryAt) this._adoptRetryAt = at;
      this._arm(this._adoptRetryAt);
      return;
    }
    if (code === 'HELD') {
      // This session holds it already (an ADOPT whose reply was lost, then
      // a resume): the next LOCKS tells its token.
      l._needsAdopt = false;
      l._refreshedAt = -Infinity;
      this._arm(now());
      return;
    }
    l._needsAdopt = false;
    if (l._state === HELD) this._lose(l, lostError(l.resource, 'adopt', `no daemon took it over (${line.slice(4, 120)})`));
    if (this._failover !== null) this._failover.lost++;
  }

  private _failoverDone(): void {
    const fo = this._failover;
    if (fo === null || fo.pending > 0 || this._info === null) return;
    this._failover = null;
    this.emit('failover', { server: this._info.server, session: this._info.session, adopted: fo.adopted, lost: fo.lost });
  }

  // ---- close ------------------------------------------------------------------------------

  private _closeQuitOk = false;

  private async _close(): Promise<void> {
    this._closing = true;
    // Acquires still queued here, and requests that never went out.
    const err = this._closedError();
    const unsent = this._waiting.splice(0);
    for (const s of [...this._slots.values()]) {
      for (const w of s.q ?? []) {
        if (w.state !== W_QUEUED) continue;
        w.state = W_DONE;
        if (w.timer !== null) clearTimeout(w.timer);
        this._unlistenAbort(w);
        w.reject(err);
      }
      s.q = null;
    }
    if (!this._ready && this._started && this._autoReconnect && this._leases.size > 0 && this._session !== null) {
      // Down with leases held: one try to get back to the session, so that
      // QUIT can release them (else they wait for the detach time).
      this._closing = false;
      try {
        await this.connect();
      } catch {
        // nothing to release with, then
      }
      this._closing = true;
    }
    const conn = this._conn;
    if (conn !== null && this._ready && !conn.dead) {
      try {
        const r = await this._call(conn, 'QUIT', this._timeout, false);
        this._closeQuitOk = r.line.startsWith('OK');
      } catch {
        // the connection went: the daemon releases or detaches the session
      }
    }
    this._closed = true;
    this._clearTimer();
    for (const r of unsent) {
      if (r.kind === K_UNLOCK && this._closeQuitOk) r.onReply('OK');
      else r.onFail(err);
    }
    for (const l of [...this._leases]) {
      if (l._state === HELD) this._lose(l, lostError(l.resource, 'closed'));
      else this._leases.delete(l);
    }
    if (this._conn !== null) this._drop(this._conn, 'closed by the client');
    this._failAll(err);
    this._endWatches(null);
    this.emit('close');
  }
}
