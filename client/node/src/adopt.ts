/**
 * The leases follow the session across connections and daemons. After a
 * resume (HELLO resume=, the same session on the same daemon), the
 * session's LOCKS is matched with the leases by fence; what the session
 * holds that no lease knows is given back. On a new session (ERR
 * NOSESSION, or another daemon: a failover), one ADOPT per lease while its
 * deadline is ahead: a new token, the same fence. Then the 'failover'
 * event tells how many were adopted and lost.
 */
import type { EventEmitter } from 'node:events';

import type { Conn, Req } from './conn.js';
import { lostError } from './errors.js';
import { HELD, type Lease } from './lease.js';
import { type LeaseBook, matchLease, readLocks } from './leases.js';
import { fields, intField } from './proto.js';
import { errCode, HEX32, isOk, K_ADOPT, K_UNLOCK, MIN_REPLY_MS, mkReq, now, RECONNECT_MIN_MS } from './request.js';
import type { Session } from './session.js';
import type { Locks } from './types.js';

/** @internal Resuming and adopting the leases. */
export class Adopter {
  _adoptRetryAt = 0;
  /** ADOPTs in flight for the 'failover' event. */
  _failover: { adopted: number; lost: number; pending: number } | null = null;

  /** `events`: the Client, which emits 'failover'. */
  constructor(
    private readonly session: Session,
    private readonly book: LeaseBook,
    private readonly events: EventEmitter,
  ) {}

  /** HELLO resume= and its LOCKS were answered on conn. */
  _resumed(conn: Conn, body: Locks, tSend: number): void {
    this._applyResume(conn, body, tSend);
    this._adoptPending(conn);
  }

  /** A new session on conn: every lease is to be adopted (`hadSession`:
   * a failover, counted for its event). */
  _fresh(conn: Conn, hadSession: boolean): void {
    this.book._forgetAll();
    if (hadSession) this._failover = { adopted: 0, lost: 0, pending: 0 };
    this._adoptPending(conn);
  }

  /** The timer: ADOPTs the daemon could not do yet, again. Returns when
   * next (Infinity: not). */
  _tickAdopt(t: number): number {
    const conn = this.session._conn;
    if (this._adoptRetryAt > 0 && this.session._ready && conn !== null) {
      if (t >= this._adoptRetryAt) {
        this._adoptRetryAt = 0;
        this._adoptPending(conn);
      } else return this._adoptRetryAt;
    }
    return Infinity;
  }

  /** After a resume: each lease is still held (same fence), adopted by an
   * ADOPT whose reply was lost (same fence, a new token), or lost; what
   * the session holds that no lease knows is given back. */
  _applyResume(conn: Conn, body: Locks, tSend: number): void {
    const { held, lost } = readLocks(body);
    const used = new Set<string>();
    for (const l of [...this.book._leases]) {
      const { missing, token, d, v, ttl } = matchLease(l, held, tSend);
      if (missing !== null) {
        if (!l._needsAdopt && l._state === HELD) this.book._lose(l, lostError(missing, lost.has(missing) ? 'lost' : 'gone'));
        continue;
      }
      for (const r of l.resources) used.add(r);
      if (token !== null) l._token = token;
      if (l._needsAdopt && this._failover !== null) this._failover.adopted++; // by an ADOPT whose answer was lost
      l._needsAdopt = false;
      if (l._state === HELD && d < Infinity && v > 0) this.book._confirm(l, tSend, d, v, ttl);
    }
    for (const r of lost) {
      // A lease lost while detached (its EVENT LOST came before): UNLOCK
      // answers LOST and clears the daemon's record of it.
      if (typeof r !== 'string' || held.has(r)) continue;
      this.session._write(conn, mkReq(`UNLOCK ${r}`, K_UNLOCK, false, () => {}, () => {}));
    }
    for (const r of held.keys()) {
      if (used.has(r)) continue;
      // A LOCK whose reply the lost connection ate, or a lease lost here
      // meanwhile: give it back.
      const req = mkReq(`UNLOCK ${r}`, K_UNLOCK, false, () => {}, () => {});
      this.session._write(conn, req);
    }
  }

  /** ADOPT each lease that needs it, one request per grant (written
   * before anything else goes on the connection). */
  _adoptPending(conn: Conn): void {
    const t = now();
    for (const l of [...this.book._leases]) {
      if (!l._needsAdopt || l._adopting) continue;
      if (t >= l._stopAt()) {
        // Never adopted past its deadline: lost.
        if (l._state === HELD) {
          this.book._lose(l, lostError(l.resource, 'deadline'));
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
      this.session._write(conn, req);
      // An answer that does not come by half the time left to the lease's
      // deadline drops the connection, while there is time to try again.
      const limit = Math.max(MIN_REPLY_MS, (l._stopAt() - req.tSend) / 2);
      if (req.tSend + limit < req.expectBy) {
        req.expectBy = req.tSend + limit;
        this.session._arm(req.expectBy);
      }
    }
  }

  _onAdoptReply(l: Lease, req: Req, line: string): void {
    if (isOk(line)) {
      const f = fields(line.slice(3));
      if (f.token !== undefined && HEX32.test(f.token)) l._token = f.token;
      l._needsAdopt = false;
      if (f.fence !== l._fence) {
        if (l._state === HELD) this.book._lose(l, lostError(l.resource, 'adopt', 'the lease adopted has another fence'));
        if (this._failover !== null) this._failover.lost++;
        return;
      }
      if (this._failover !== null) this._failover.adopted++;
      const v = intField(f, 'validity', 0);
      this.book._confirm(l, req.tSend, req.tSend + v, v, intField(f, 'ttl', l._ttl));
      return;
    }
    const code = errCode(line);
    if (code === 'UNAVAILABLE' || code === 'SHUTDOWN') {
      // Try again soon, while its deadline holds.
      const at = now() + Math.max(RECONNECT_MIN_MS, this.session._backoff);
      if (this._adoptRetryAt === 0 || at < this._adoptRetryAt) this._adoptRetryAt = at;
      this.session._arm(this._adoptRetryAt);
      return;
    }
    if (code === 'HELD') {
      // This session holds it already (an ADOPT whose reply was lost, then
      // a resume): the next LOCKS tells its token.
      l._needsAdopt = false;
      l._refreshedAt = -Infinity;
      this.session._arm(now());
      return;
    }
    l._needsAdopt = false;
    if (l._state === HELD) this.book._lose(l, lostError(l.resource, 'adopt', `no daemon took it over (${line.slice(4, 120)})`));
    if (this._failover !== null) this._failover.lost++;
  }

  _failoverDone(): void {
    const fo = this._failover;
    if (fo === null || fo.pending > 0 || this.session._info === null) return;
    this._failover = null;
    this.events.emit('failover', { server: this.session._info.server, session: this.session._info.session, adopted: fo.adopted, lost: fo.lost });
  }
}
