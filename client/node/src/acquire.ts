/**
 * Acquiring: the options of an acquire checked, its place in the queue
 * here (queue.ts), then its LOCK: the line (a wait counts down across
 * reconnections; an endless wait is one LOCK of the longest wait after
 * another), the reply made a Lease, or the refusal. A LOCK whose acquire
 * was called off meanwhile gives its grant back at once.
 */
import type { Req } from './conn.js';
import { connectionError, RedlockdError, replyError } from './errors.js';
import { Lease } from './lease.js';
import type { LeaseBook } from './leases.js';
import { checkMs, checkValue, fields, intField, MAX_U32, resourceList } from './proto.js';
import { type LocalQueue, W_CANCELLED, W_DONE, W_SENT, Waiter } from './queue.js';
import { errCode, isOk, K_LOCK, mkReq, now } from './request.js';
import type { Session } from './session.js';
import type { AcquireOptions } from './types.js';

/** The longest wait= one LOCK asks for (the daemon's locks.max_wait_ms);
 * a longer wait is several LOCKs. */
const MAX_WAIT_MS = 3600000;

/** @internal The acquires of the Client, and their LOCKs. */
export class Locker {
  constructor(
    private readonly session: Session,
    private readonly queue: LocalQueue,
    private readonly book: LeaseBook,
  ) {}

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
      if (this.session._closing || this.session._closed) throw this.session._closedError();
      if (o.signal?.aborted) throw o.signal.reason;
      w = new Waiter(list, ttl, wait, o.mode, limit, o.renew !== false, o.signal, value, resolve, reject);
    });
    if (w !== null) this.queue._enqueue(w);
    return p;
  }

  // ---- LOCK ------------------------------------------------------------------------

  _lockLine(w: Waiter): string | Error {
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

  _sendLock(w: Waiter): void {
    const line = this._lockLine(w);
    if (line instanceof Error) {
      w.state = W_DONE;
      this.queue._unlistenAbort(w);
      this.queue._free(w.resources);
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
          this.queue._free(w.resources);
          return;
        }
        if (w.state !== W_SENT) return;
        w.state = W_DONE;
        this.queue._unlistenAbort(w);
        this.queue._free(w.resources);
        w.reject(err);
      },
    );
    req.extra = w.wait === Infinity ? MAX_WAIT_MS : Math.min(w.wait, MAX_U32);
    req.rebuild = () => (w.state === W_SENT ? this._lockLine(w) : new Error('cancelled'));
    w.req = req;
    this.session._send(req);
  }

  _onLockReply(w: Waiter, req: Req, line: string): void {
    if (w.state === W_CANCELLED) {
      // Its acquire was called off: give a grant back at once.
      w.state = W_DONE;
      if (isOk(line)) this.book._sendUnlockQuiet(w.resources, true);
      this.queue._free(w.resources);
      return;
    }
    if (w.state !== W_SENT) return;
    if (isOk(line)) {
      let lease: Lease;
      try {
        lease = this._leaseFromReply(w, line, req.tSend);
      } catch (e) {
        w.state = W_DONE;
        this.queue._unlistenAbort(w);
        this.book._sendUnlockQuiet(w.resources, false);
        this.queue._free(w.resources);
        w.reject(e);
        return;
      }
      w.state = W_DONE;
      this.queue._unlistenAbort(w);
      this.book._leases.add(lease);
      for (const r of lease.resources) this.book._byRes.set(r, lease);
      if (lease._stopAt() <= now()) {
        // Granted after a wait longer than its validity: a LOCKS confirms it
        // before the acquire resolves (the deadline counts from the send).
        lease._confirming = w.resolve;
        lease._confirmFail = w.reject;
        lease._confirmSince = now();
        this.session._arm(lease._confirmSince + this.session._timeout);
        this.book._refresh(true);
        return;
      }
      this.session._arm(lease._refreshedAt + lease._ttl / 3);
      w.resolve(lease);
      return;
    }
    const code = errCode(line);
    if (code === 'HELD' && !w.heldRetry) {
      // This session holds it already: a LOCK whose reply a lost connection
      // ate, granted after the resume looked. Give it back and ask again.
      w.heldRetry = true;
      this.book._sendUnlockQuiet(w.resources, true);
      this._sendLock(w);
      return;
    }
    if (code === 'TIMEOUT' && w.wait === Infinity) {
      this._sendLock(w);
      return;
    }
    if (code === 'SHUTDOWN' && this.session._autoReconnect && !this.session._closing) {
      // The daemon is stopping: ask again on the next connection.
      if (this.session._conn !== null) this.session._onShutdown(this.session._conn);
      this._sendLock(w);
      return;
    }
    w.state = W_DONE;
    this.queue._unlistenAbort(w);
    this.queue._free(w.resources);
    w.reject(replyError(line, w.resources[0]));
  }

  _leaseFromReply(w: Waiter, line: string, tSend: number): Lease {
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
      this.book,
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
}
