/**
 * The in-process queue, per resource: two tasks of this Client after the
 * same resource queue here, first come first served (a session holds a
 * resource once: the daemon would answer HELD), and the next one's LOCK
 * is written right behind the UNLOCK of the one before (the daemon runs
 * the requests of one session that name the same resource in the order
 * read). An acquire of several resources goes once it is first in the
 * queue of each. A queued acquire ends by its wait, its signal, or close.
 */
import type { Req } from './conn.js';
import { RedlockdError } from './errors.js';
import type { Lease } from './lease.js';
import { now } from './request.js';
import type { Session } from './session.js';

// Waiter states.
/** @internal */ export const W_QUEUED = 1;
/** @internal */ export const W_SENT = 2;
/** @internal */ export const W_DONE = 3;
/** @internal */ export const W_CANCELLED = 4;

/** @internal An acquire: queued here, then one LOCK on its way. */
export class Waiter {
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

/** @internal A resource of this client: taken (a LOCK on its way, or
 * held), and the acquires queued for it, first come first served. */
export interface Slot {
  busy: boolean;
  q: Waiter[] | null;
}

/** @internal The resources taken by this Client's acquires, and the
 * acquires queued for them. */
export class LocalQueue {
  /** resource -> taken here, and the acquires queued for it. */
  readonly _slots = new Map<string, Slot>();

  /** `lock`: send the LOCK of an acquire that got its turn (acquire.ts). */
  constructor(
    private readonly session: Session,
    private readonly lock: (w: Waiter) => void,
  ) {}

  _enqueue(w: Waiter): void {
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

  _listenAbort(w: Waiter): void {
    const signal = w.signal;
    if (signal === undefined || w.onAbort !== null) return;
    w.onAbort = () => this._abortWaiter(w);
    signal.addEventListener('abort', w.onAbort, { once: true });
  }

  _unlistenAbort(w: Waiter): void {
    if (w.onAbort !== null && w.signal !== undefined) w.signal.removeEventListener('abort', w.onAbort);
    w.onAbort = null;
  }

  _abortWaiter(w: Waiter): void {
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
      if (req !== null && this.session._withdraw(req)) {
        // Not written yet: it never will be.
        this._free(w.resources);
      }
      // Else the LOCK is with the daemon, which has no way to call it off:
      // the resources stay taken until its answer, and a grant is given
      // back at once (acquire.ts, _onLockReply).
    }
  }

  /** Take w out of the queues it waits in (it gave up). */
  _unqueue(w: Waiter): void {
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

  _take(w: Waiter): void {
    for (const r of w.resources) {
      const s = this._slots.get(r);
      if (s === undefined) this._slots.set(r, { busy: true, q: null });
      else s.busy = true;
    }
    if (w.timer !== null) clearTimeout(w.timer);
    w.timer = null;
    w.state = W_SENT;
    this._listenAbort(w);
    this.lock(w);
  }

  /** These resources are no longer taken here: the next waiters go. */
  _free(resources: readonly string[]): void {
    for (const r of resources) {
      const s = this._slots.get(r);
      if (s !== undefined) s.busy = false;
    }
    this._pump(resources);
  }

  _pump(resources: readonly string[]): void {
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

  _eligible(w: Waiter): boolean {
    for (const r of w.resources) {
      const s = this._slots.get(r);
      if (s === undefined || s.busy || s.q === null || s.q[0] !== w) return false;
    }
    return true;
  }

  /** Every acquire still queued here fails with err (close, or the client
   * closed for good). */
  _rejectQueued(err: Error): void {
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
  }
}
