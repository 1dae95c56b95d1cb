/**
 * Watching locks: who holds a resource now, and each time that changes
 * (the protocol's WATCH and EVENT HOLDER lines: docs/protocol.md,
 * "Watching a lock").
 *
 * A Watch is an async iterator of HolderEvents. Its events are buffered in
 * the Watch itself, one per resource: the connection's reader never waits
 * for a consumer, and a consumer that is slower than the changes gets the
 * latest state of each resource (states in between are merged, as the
 * daemon merges them; an older state never comes after a newer one).
 */

/** Who holds a resource, as an `EVENT HOLDER` line tells it. */
export interface HolderEvent {
  /** The resource watched. */
  readonly resource: string;
  /** How many hold it: 0 (free), 1 for an exclusive holder (or a foreign
   * Redlock client's key), the shared holders, or the semaphore slots in
   * use. */
  readonly held: number;
  /** `exclusive`, `shared` or `semaphore`; undefined when free or held by
   * a foreign client. */
  readonly mode: 'exclusive' | 'shared' | 'semaphore' | undefined;
  /** The exclusive holder's fencing token. */
  readonly fence: bigint | undefined;
  /** The exclusive holder's client name (its `name` option; '' when it
   * gave none). */
  readonly name: string | undefined;
  /** The id of the daemon the exclusive holder holds it through. */
  readonly daemon: string | undefined;
  /** The exclusive holder's value, when it set one (`value` of acquire,
   * `lease.setValue()`): a leader's address, say. */
  readonly value: string | undefined;
  /** A key set by another Redlock (or plain `SET NX`) client holds it. */
  readonly foreign: boolean;
  /** A semaphore's size. */
  readonly limit: number | undefined;
}

/** The options of `client.watch()`. */
export interface WatchOptions {
  /** Stops the watch: its iterator gives the events it still has, then
   * rejects with the signal's reason (an `AbortError` by default). */
  signal?: AbortSignal;
}

/** @internal the Client's side of a Watch. */
export interface WatchOwner {
  _unwatch(w: Watch): void;
}

/** @internal the fields of an EVENT HOLDER line (after "EVENT HOLDER ")
 * as an event; null when it names no resource. */
export function holderEvent(f: Record<string, string>): HolderEvent | null {
  const resource = f.resource;
  if (resource === undefined || resource === '') return null;
  const held = Number(f.held);
  const mode = f.mode === 'exclusive' || f.mode === 'shared' || f.mode === 'semaphore' ? f.mode : undefined;
  const limit = f.limit === undefined ? NaN : Number(f.limit);
  return Object.freeze({
    resource,
    held: Number.isInteger(held) && held >= 0 ? held : 0,
    mode,
    fence: f.fence !== undefined && /^[0-9]+$/.test(f.fence) ? BigInt(f.fence) : undefined,
    name: f.name,
    daemon: f.daemon,
    value: f.value === undefined || f.value === '' ? undefined : f.value,
    foreign: f.foreign === '1',
    limit: Number.isInteger(limit) && limit > 0 ? limit : undefined,
  });
}

interface Pull {
  resolve: (r: IteratorResult<HolderEvent, undefined>) => void;
  reject: (e: unknown) => void;
}

/**
 * A watch of one or more resources, made by `client.watch()`: an async
 * iterator of HolderEvents. The first event of each resource describes it
 * now; then one comes each time that changes, on any daemon of the same
 * Redis nodes. Ends with `break` (or `return()`), with `close()`, with its
 * signal, or when the Client is closed.
 *
 *     for await (const ev of client.watch('leader:db')) {
 *       console.log(ev.held ? `leader ${ev.value}` : 'no leader');
 *     }
 */
export class Watch implements AsyncIterableIterator<HolderEvent> {
  /** The resources watched. */
  readonly resources: readonly string[];
  /** Resolves once the daemon accepted the WATCH of every resource (the
   * first states follow). Rejects with its refusal (`LIMIT`, `DENIED`) or
   * whatever else ended the watch first (the signal's reason,
   * `CONNECTION`), as the iterator does; resolves if `return()` ended it
   * first. Waiting for it is optional. */
  readonly ready: Promise<void>;

  /** @internal */ _owner: WatchOwner;
  /** @internal the latest state of each resource not yet taken, oldest first */
  _queue = new Map<string, HolderEvent>();
  /** @internal next() calls waiting for an event */ _pulls: Pull[] = [];
  /** @internal no more events (the error, if any, is still to be told) */ _done = false;
  /** @internal */ _error: unknown = null;
  /** @internal */ _errorTold = false;
  /** @internal resources whose WATCH the daemon has not accepted yet */ _unconfirmed: Set<string>;
  /** @internal */ _readyResolve: (() => void) | null = null;
  /** @internal */ _readyReject: ((e: unknown) => void) | null = null;
  /** @internal */ _signal: AbortSignal | undefined;
  /** @internal */ _onAbort: (() => void) | null = null;

  /** @internal */
  constructor(owner: WatchOwner, resources: readonly string[], signal: AbortSignal | undefined) {
    this._owner = owner;
    this.resources = resources;
    this._unconfirmed = new Set(resources);
    this.ready = new Promise<void>((resolve, reject) => {
      this._readyResolve = resolve;
      this._readyReject = reject;
    });
    this.ready.catch(() => {}); // told through the iterator too: never unhandled
    this._signal = signal;
    if (signal !== undefined) {
      this._onAbort = () => this._finish(signal.reason);
      signal.addEventListener('abort', this._onAbort, { once: true });
    }
  }

  /** The next event (the latest state of a resource not told yet), or
   * `done` once the watch ended. */
  next(): Promise<IteratorResult<HolderEvent, undefined>> {
    const first = this._queue.entries().next();
    if (!first.done) {
      const [r, ev] = first.value;
      this._queue.delete(r);
      return Promise.resolve({ value: ev, done: false });
    }
    if (this._done) {
      if (this._error !== null && !this._errorTold) {
        this._errorTold = true;
        return Promise.reject(this._error);
      }
      return Promise.resolve({ value: undefined, done: true });
    }
    return new Promise((resolve, reject) => this._pulls.push({ resolve, reject }));
  }

  /** Stop watching (what `break` in `for await` calls): UNWATCH for the
   * resources no other watch of this Client wants; events not taken are
   * dropped. */
  return(): Promise<IteratorResult<HolderEvent, undefined>> {
    this._queue.clear();
    this._finish(null);
    this._errorTold = true;
    return Promise.resolve({ value: undefined, done: true });
  }

  /** Stop watching, as `return()` does. */
  async close(): Promise<void> {
    await this.return();
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  /** @internal a new state of one of its resources */
  _deliver(ev: HolderEvent): void {
    if (this._done) return;
    const pull = this._pulls.shift();
    if (pull !== undefined) {
      pull.resolve({ value: ev, done: false });
      return;
    }
    // The latest state only, behind the others waiting.
    this._queue.delete(ev.resource);
    this._queue.set(ev.resource, ev);
  }

  /** @internal the daemon accepted the WATCH of r */
  _confirmed(r: string): void {
    if (!this._unconfirmed.delete(r) || this._unconfirmed.size > 0) return;
    const resolve = this._readyResolve;
    this._readyResolve = null;
    this._readyReject = null;
    if (resolve !== null) resolve();
  }

  /** @internal ends it: `err` null for a quiet end (done), else the
   * iterator rejects with it once the events still queued were taken. The
   * Client forgets it (and sends UNWATCH for what nobody else watches). */
  _finish(err: unknown): void {
    if (this._done) return;
    this._done = true;
    this._error = err;
    if (this._onAbort !== null && this._signal !== undefined) this._signal.removeEventListener('abort', this._onAbort);
    this._onAbort = null;
    if (err !== null && this._readyReject !== null) this._readyReject(err);
    else if (this._readyResolve !== null) this._readyResolve();
    this._readyResolve = null;
    this._readyReject = null;
    const pulls = this._pulls.splice(0);
    for (const p of pulls) {
      if (err !== null && !this._errorTold) {
        this._errorTold = true;
        p.reject(err);
      } else {
        p.resolve({ value: undefined, done: true });
      }
    }
    this._owner._unwatch(this);
  }
}
