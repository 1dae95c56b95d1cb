/**
 * The leases of the session: every lease not released for good, their
 * deadlines and their loss, the UNLOCK and EXTEND of a lease, and the
 * LOCKS that confirms them. The Lease objects call in here (LeaseOwner).
 *
 * Deadlines (docs/protocol.md, "the lease deadline rule")
 * ---------
 * A lease's deadline is the send time of the request that last confirmed
 * it plus the validity its reply reported (LOCK, EXTEND, ADOPT, or the
 * lease's entry in LOCKS). A LOCKS goes out at least every ttl/3 of each
 * lease. Past its deadline without a newer confirmation a lease is lost
 * ("deadline"): its signal aborts. A refresh that gets no reply by half the
 * time left to the nearest deadline drops the connection.
 */
import type { EventEmitter } from 'node:events';

import { lostError, RedlockdError, replyError } from './errors.js';
import { HELD, type Lease, type LeaseOwner, LOST, RELEASED } from './lease.js';
import { checkMs, checkValue, fields, intField } from './proto.js';
import type { LocalQueue } from './queue.js';
import { errCode, HEX32, isOk, K_EXTEND, K_READ, K_REFRESH, K_UNLOCK, MIN_REPLY_MS, mkReq, now } from './request.js';
import type { Session } from './session.js';
import type { LockInfo, Locks } from './types.js';

/** @internal A LOCKS reply: its entries by resource (held), and the
 * resources the session lost while detached (lost). */
export function readLocks(body: Locks): { held: Map<string, LockInfo>; lost: Set<string> } {
  const held = new Map<string, LockInfo>();
  for (const e of Array.isArray(body.locks) ? body.locks : []) {
    if (e !== null && typeof e === 'object' && typeof e.resource === 'string') held.set(e.resource, e);
  }
  return { held, lost: new Set(Array.isArray(body.lost) ? body.lost : []) };
}

/** @internal Lease l against the entries (held) of a LOCKS sent at tSend:
 * missing, the first of its resources not held with its fence (null: all
 * are); and from the entries before it, the last well-formed token (null:
 * none), the nearest deadline (d), the least validity (v) and the ttl
 * (Infinity, Infinity, undefined: none reported). */
export function matchLease(
  l: Lease,
  held: Map<string, LockInfo>,
  tSend: number,
): { missing: string | null; token: string | null; d: number; v: number; ttl: number | undefined } {
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
  return { missing, token, d, v, ttl };
}

/** @internal The Client's leases. */
export class LeaseBook implements LeaseOwner {
  /** Every lease not released for good: held, or with an UNLOCK on its way. */
  readonly _leases = new Set<Lease>();
  /** resource -> its held lease. */
  readonly _byRes = new Map<string, Lease>();
  _refreshing = false;
  _refreshAgain = false;

  /** `events`: the Client, which emits 'lost'. */
  constructor(
    private readonly session: Session,
    private readonly queue: LocalQueue,
    private readonly events: EventEmitter,
  ) {}

  // ---- leases: release, extend, loss ---------------------------------------------

  /** LeaseOwner: UNLOCK (lease.release()). */
  _releaseLease(lease: Lease): Promise<void> {
    this._checkLease(lease);
    if (lease._state === LOST) return Promise.reject(lease._lostErr);
    if (lease._state === RELEASED) return Promise.resolve();
    lease._state = RELEASED;
    for (const r of lease.resources) if (this._byRes.get(r) === lease) this._byRes.delete(r);
    if (this.session._closing || this.session._closed) {
      this._leases.delete(lease);
      this.queue._free(lease.resources);
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
          if (this.session._closing && this.session._closeQuitOk) resolve();
          else reject(err);
        },
      );
      this.session._send(req);
      this.queue._free(lease.resources);
    });
  }

  /** LeaseOwner: EXTEND ttl= and/or value= (one of them at least). */
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
                this.session._arm(lease._stopAt());
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
          this.session._send(req);
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

  /** LeaseOwner, lazily: a lease past its deadline is lost now. */
  _checkLease(lease: Lease): void {
    if (lease._state === HELD && lease._confirming === null && now() >= lease._stopAt()) {
      this._lose(lease, lostError(lease.resource, 'deadline'));
    }
  }

  /** LeaseOwner: while the client reconnects, resumes or adopts it. */
  _leaseUnconfirmed(lease: Lease): boolean {
    return !this.session._ready || lease._needsAdopt || lease._adopting || lease._confirming !== null;
  }

  _confirm(lease: Lease, tSend: number, deadline: number, validity: number, ttl?: number): void {
    this._checkLease(lease);
    if (lease._state === LOST) return;
    if (tSend >= lease._confirmedAt) {
      lease._deadline = deadline;
      lease._confirmedAt = tSend;
      lease._validity = validity;
    }
    if (tSend > lease._refreshedAt) lease._refreshedAt = tSend;
    if (ttl !== undefined) lease._ttl = ttl;
    this.session._arm(lease._refreshedAt + lease._ttl / 3);
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
  _lose(lease: Lease, err: RedlockdError): void {
    if (lease._state !== HELD) return;
    lease._state = LOST;
    lease._lostErr = err;
    this._leases.delete(lease);
    for (const r of lease.resources) if (this._byRes.get(r) === lease) this._byRes.delete(r);
    const adopted = !lease._needsAdopt && !lease._adopting;
    lease._needsAdopt = false;
    if (adopted && this.session._ready && !this.session._closing) this._sendUnlockQuiet(lease.resources, false);
    this.queue._free(lease.resources);
    const fail = lease._confirmFail;
    lease._confirming = null;
    lease._confirmFail = null;
    if (fail !== null) fail(err);
    if (lease._ctrl !== null) lease._ctrl.abort(err);
    if (fail === null && this.events.listenerCount('lost') > 0) this.events.emit('lost', lease, err);
  }

  /** UNLOCK whose answer nobody waits for (a cancelled LOCK, a lost lease,
   * what the session holds that no lease knows). */
  _sendUnlockQuiet(resources: readonly string[], replay: boolean): void {
    const req = mkReq(
      'UNLOCK ' + resources.join(' '),
      K_UNLOCK,
      replay,
      () => {},
      () => {},
    );
    this.session._send(req);
  }

  // ---- LOCKS: confirming the deadlines -------------------------------------------

  /** LOCKS: this session's leases as the daemon sees them. Also confirms
   * the deadline of every lease of this client (client.locks()). */
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
            body = this.session._json(line.slice(3)) as Locks;
          } catch (e) {
            return reject(e);
          }
          this._applyLocks(snapshot, body, req.tSend);
          resolve(body);
        },
        reject,
      );
      this.session._send(req);
    });
  }

  _snapshot(): Lease[] {
    const out: Lease[] = [];
    for (const l of this._leases) {
      if (l._state === HELD && !l._needsAdopt && !l._adopting) out.push(l);
    }
    return out;
  }

  /** Send a LOCKS now if none is in flight (`again`: or right after the
   * one in flight, which was sent before something that needs it). */
  _refresh(again = false): void {
    if (!this.session._ready || this.session._conn === null || this.session._closing) return;
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
            body = this.session._json(line.slice(3)) as Locks;
          } catch (e) {
            this.session._emitError(e as Error);
          }
          if (body !== null) this._applyLocks(snapshot, body, req.tSend);
        } else {
          this.session._emitError(replyError(line));
          const t = now();
          for (const l of snapshot) if (l._refreshedAt < t) l._refreshedAt = t; // do not spin
        }
        if (this._refreshAgain) this._refresh();
        this.session._arm(now());
      },
      () => {
        this._refreshing = false;
      },
    );
    this.session._send(req);
    // No answer by half the time left to the nearest deadline: drop the
    // connection, so that there is time to move the leases elsewhere.
    let nearest = Infinity;
    for (const l of snapshot) if (l._confirming === null && l._stopAt() < nearest) nearest = l._stopAt();
    const limit = Math.min(this.session._timeout, Math.max(MIN_REPLY_MS, (nearest - req.tSend) / 2));
    req.expectBy = req.tSend + limit;
    this.session._arm(req.expectBy);
  }

  _applyLocks(snapshot: Lease[], body: Locks, tSend: number): void {
    const { held, lost } = readLocks(body);
    for (const l of snapshot) {
      if (l._state !== HELD || l._needsAdopt || l._adopting) continue;
      const { missing, token, d, v, ttl } = matchLease(l, held, tSend);
      if (token !== null) l._token = token;
      if (missing !== null) {
        this._lose(l, lostError(missing, lost.has(missing) ? 'lost' : 'gone'));
      } else if (v <= 0) {
        this._lose(l, lostError(l.resource, 'lost'));
      } else if (d < Infinity) {
        this._confirm(l, tSend, d, v, ttl);
      }
    }
  }

  // ---- what the session asks (SessionHooks) ----------------------------------------

  /** The timer: a lease past its deadline (or granted past it and not
   * confirmed within the timeout) is lost; a LOCKS goes out when a lease
   * is due for one (ttl/3 after its last). Returns when next. */
  _tickLeases(t: number): number {
    let next = Infinity;
    let refresh = false;
    for (const l of this._leases) {
      if (l._state !== HELD) continue;
      if (l._confirming !== null) {
        const lim = l._confirmSince + this.session._timeout;
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
    return next;
  }

  /** The nearest time a held lease counts as lost (Infinity: none). */
  _nearestStop(): number {
    let nearest = Infinity;
    for (const l of this._leases) if (l._state === HELD && l._stopAt() < nearest) nearest = l._stopAt();
    return nearest;
  }

  /** The session is gone: every lease is to be adopted by the next one. */
  _forgetAll(): void {
    for (const l of this._leases) l._needsAdopt = true;
  }

  /** EVENT LOST resource= fence= reason=. */
  _onLostEvent(f: Record<string, string>): void {
    const r = f.resource;
    const lease = r === undefined ? undefined : this._byRes.get(r);
    if (lease !== undefined && r !== undefined && (f.fence === undefined || f.fence === lease._fence)) {
      this._lose(lease, lostError(r, f.reason ?? 'lost'));
    }
  }

  /** The client is closed for good (reconnect: false): every lease is lost. */
  _loseAll(): void {
    for (const l of [...this._leases]) this._lose(l, lostError(l.resource, 'closed'));
  }

  /** close(), after QUIT: a lease held is lost ("closed"); one with its
   * UNLOCK on the way is forgotten. */
  _closeAll(): void {
    for (const l of [...this._leases]) {
      if (l._state === HELD) this._lose(l, lostError(l.resource, 'closed'));
      else this._leases.delete(l);
    }
  }
}
