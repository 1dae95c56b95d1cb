/**
 * The redlockd client: one session with the daemon, over one connection,
 * shared by every task of the process. This file is the public class:
 * its options and calls checked, its parts built and wired together, and
 * close(). The parts, each importing only those listed before it:
 *
 *   types.ts     the public types (options, STATUS, LOCKS, the events)
 *   request.ts   request kinds, a new request, a reply's status, the clock
 *   session.ts   the connection, tagged requests and those waiting for a
 *                connection, the timer, reconnecting, resuming, failover
 *   queue.ts     the in-process queue per resource, first come first served
 *   leases.ts    the leases: deadlines, loss, UNLOCK, EXTEND, LOCKS
 *   adopt.ts     the leases across a resume or a new session (ADOPT)
 *   acquire.ts   an acquire's options, its LOCK, the Lease made of its reply
 *   watches.ts   WATCH and UNWATCH, each EVENT HOLDER to its Watches
 *
 * What the session needs of the parts above it goes through its
 * SessionHooks, and the queue sends a LOCK through the callback it is
 * given: both are wired here.
 */
import { EventEmitter } from 'node:events';

import { Locker } from './acquire.js';
import { Adopter } from './adopt.js';
import { RedlockdError } from './errors.js';
import type { Lease } from './lease.js';
import { LeaseBook } from './leases.js';
import { checkMs, checkResource, checkWord } from './proto.js';
import { LocalQueue } from './queue.js';
import { K_UNLOCK } from './request.js';
import { Session, type SessionHooks } from './session.js';
import type { AcquireOptions, ClientEvents, ClientOptions, Locks, ServerInfo, Status } from './types.js';
import type { Watch, WatchOptions } from './watch.js';
import { Watches } from './watches.js';

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
  private readonly _sess: Session;
  private readonly _queue: LocalQueue;
  private readonly _book: LeaseBook;
  private readonly _adopt: Adopter;
  private readonly _locker: Locker;
  private readonly _watches: Watches;
  private _closePromise: Promise<void> | null = null;

  constructor(options: ClientOptions = {}) {
    super();
    const hooks: SessionHooks = {
      tickLeases: (t) => this._book._tickLeases(t),
      tickAdopt: (t) => this._adopt._tickAdopt(t),
      nearestStop: () => this._book._nearestStop(),
      forgotten: () => this._book._forgetAll(),
      resumed: (conn, body, tSend) => this._adopt._resumed(conn, body, tSend),
      fresh: (conn, hadSession) => this._adopt._fresh(conn, hadSession),
      ready: (resumed) => this._watches._ready(resumed),
      settled: () => this._adopt._failoverDone(),
      holder: (words, f) => this._watches._onHolder(words, f),
      lost: (f) => this._book._onLostEvent(f),
      loseAll: () => this._book._loseAll(),
      rejectQueued: (err) => this._queue._rejectQueued(err),
      endWatches: (err) => this._watches._endWatches(err),
    };
    this._sess = new Session(options, this, hooks);
    this.servers = this._sess.servers;
    this._queue = new LocalQueue(this._sess, (w) => this._locker._sendLock(w));
    this._book = new LeaseBook(this._sess, this._queue, this);
    this._adopt = new Adopter(this._sess, this._book, this);
    this._locker = new Locker(this._sess, this._queue, this._book);
    this._watches = new Watches(this._sess, this);
    process.nextTick(() => this._sess._kick());
  }

  // ---- public: state ------------------------------------------------------

  /** The address in use (or last used). */
  get server(): string {
    return this._sess.server;
  }

  /** The session id (HELLO's `session=`), once there is one. */
  get session(): string | null {
    return this._sess._session;
  }

  /** True while a connection is up and its session confirmed. */
  get connected(): boolean {
    return this._sess._ready && !this._sess._closed;
  }

  /** True once close() was called. */
  get closed(): boolean {
    return this._sess._closing || this._sess._closed;
  }

  /** What the daemon said in HELLO (null before the first session). */
  get serverInfo(): ServerInfo | null {
    return this._sess._info;
  }

  /** Resolves once a session is ready (rejects after `timeout` ms
   * without one, or when the client is closed). Requests do not need it:
   * they wait for the connection themselves. */
  connect(): Promise<void> {
    return this._sess.connect();
  }

  // ---- public: locks -------------------------------------------------------

  /**
   * Take a lock on one resource or on several at once (all or none).
   * Resolves to a Lease. Rejects with a RedlockdError: BUSY (held and no
   * wait), TIMEOUT, UNAVAILABLE, LIMIT, DENIED, ARG, CONNECTION, ...; with
   * the signal's reason when `signal` aborts it.
   */
  acquire(resources: string | readonly string[], options: AcquireOptions = {}): Promise<Lease> {
    return this._locker.acquire(resources, options);
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
        if (!(err instanceof RedlockdError && err.code === 'LOST')) this._sess._emitError(err as Error);
      }
      throw e;
    }
    this._book._checkLease(lease);
    const lostBefore = lease._lostErr;
    try {
      await lease.release();
    } catch (err) {
      if (lostBefore !== null) throw lostBefore;
      if (err instanceof RedlockdError && err.code === 'LOST') throw err;
      this._sess._emitError(err as Error);
    }
    if (lostBefore !== null) throw lostBefore;
    return result;
  }

  /** STATUS of one resource (any holder, on any daemon of the same
   * nodes). `limit` names a semaphore's size. */
  async status(resource: string, options: { limit?: number } = {}): Promise<Status> {
    checkResource(resource);
    const limit = options.limit === undefined ? '' : ` limit=${checkMs(options.limit, 'limit', 1)}`;
    return this._sess._json(await this._sess._query(`STATUS ${resource}${limit}`, resource)) as Status;
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
    return this._watches.watch(...args);
  }


  /** LOCKS: this session's leases as the daemon sees them. Also confirms
   * the deadline of every lease of this client. */
  locks(): Promise<Locks> {
    return this._book.locks();
  }


  /** PING; resolves to the word echoed ('' without one). */
  async ping(word?: string): Promise<string> {
    const w = word === undefined ? '' : ' ' + checkWord(word, 'word', 256);
    return this._sess._query('PING' + w, undefined, 'PONG');
  }

  /** SESSIONS (every session of this daemon, or only this user's). */
  async sessions(): Promise<Record<string, unknown>> {
    return this._sess._json(await this._sess._query('SESSIONS'));
  }

  /** STATS (the daemon's counters). */
  async stats(): Promise<Record<string, unknown>> {
    return this._sess._json(await this._sess._query('STATS'));
  }

  /** QUIT: the daemon releases every lock of the session. Leases still
   * held are lost ("closed"); waiting acquires reject with CONNECTION.
   * Idempotent. */
  close(): Promise<void> {
    if (this._closePromise === null) this._closePromise = this._close();
    return this._closePromise;
  }

  // ---- close ------------------------------------------------------------------------------

  private async _close(): Promise<void> {
    const s = this._sess;
    s._closing = true;
    // Acquires still queued here, and requests that never went out.
    const err = s._closedError();
    const unsent = s._waiting.splice(0);
    this._queue._rejectQueued(err);
    if (!s._ready && s._started && s._autoReconnect && this._book._leases.size > 0 && s._session !== null) {
      // Down with leases held: one try to get back to the session, so that
      // QUIT can release them (else they wait for the detach time).
      s._closing = false;
      try {
        await this.connect();
      } catch {
        // nothing to release with, then
      }
      s._closing = true;
    }
    const conn = s._conn;
    if (conn !== null && s._ready && !conn.dead) {
      try {
        const r = await s._call(conn, 'QUIT', s._timeout, false);
        s._closeQuitOk = r.line.startsWith('OK');
      } catch {
        // the connection went: the daemon releases or detaches the session
      }
    }
    s._closed = true;
    s._clearTimer();
    for (const r of unsent) {
      if (r.kind === K_UNLOCK && s._closeQuitOk) r.onReply('OK');
      else r.onFail(err);
    }
    this._book._closeAll();
    if (s._conn !== null) s._drop(s._conn, 'closed by the client');
    s._failAll(err);
    this._watches._endWatches(null);
    this.emit('close');
  }
}
