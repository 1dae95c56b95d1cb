/**
 * A lock held through a Client: its token, fence, deadline and signal.
 */
import { performance } from 'node:perf_hooks';
import type { RedlockdError } from './errors.js';

/** The state of a lease, as `lease.state` tells it. */
export type LeaseState = 'held' | 'unconfirmed' | 'lost' | 'released';

/** @internal A lease counts as lost a twentieth of its ttl before its
 * deadline (at least 5 ms, at most 1 s), as `redlockctl run` stops its
 * command: a timer that fires late, or a process that gets the CPU late,
 * must not make the signal late. */
export function earlyMs(ttl: number): number {
  return Math.max(5, Math.min(ttl / 20, 1000));
}

/** @internal the Client's side of a lease. */
export interface LeaseOwner {
  _releaseLease(lease: Lease): Promise<void>;
  _extendLease(lease: Lease, ttl: number | undefined, value: string | undefined): Promise<Lease>;
  _checkLease(lease: Lease): void;
  _leaseUnconfirmed(lease: Lease): boolean;
}

/** What `lease.extend()` may change besides the ttl. */
export interface ExtendOptions {
  /** A new holder value (exclusive locks only): replaced in the same
   * EXTEND, without giving up the lock. */
  value?: string;
}

/** @internal internal states */
export const HELD = 0;
/** @internal */
export const RELEASED = 1;
/** @internal */
export const LOST = 2;

/**
 * A lock held by a Client's session. Made by `client.acquire()` and handed
 * to the routine of `client.using()`.
 */
export class Lease {
  /** The resources the lease covers (all of them, one grant). */
  readonly resources: readonly string[];
  /** `exclusive` or `shared`; a semaphore slot is `exclusive` with a `limit`. */
  readonly mode: 'exclusive' | 'shared';
  /** For a semaphore: its size K. */
  readonly limit: number | undefined;
  /** For a semaphore: the slot held (0 to K-1). */
  readonly slot: number | undefined;
  /** Whether the daemon renews the lease (`renew=1`). */
  readonly renew: boolean;

  /** @internal */ _owner: LeaseOwner;
  /** @internal */ _token: string;
  /** @internal */ _fence: string;
  /** @internal */ _ttl: number;
  /** @internal the holder's value, as the last LOCK or EXTEND set it */ _value: string | undefined;
  /** @internal */ _validity: number;
  /** @internal performance.now() time until which the lease is confirmed */ _deadline: number;
  /** @internal send time of the request that last confirmed it */ _confirmedAt: number;
  /** @internal send time of the last LOCKS (or LOCK, EXTEND, ADOPT) */ _refreshedAt: number;
  /** @internal HELD, RELEASED or LOST */ _state = HELD;
  /** @internal its session is gone: to be adopted by the current one */ _needsAdopt = false;
  /** @internal an ADOPT of it is in flight */ _adopting = false;
  /** @internal granted past its deadline: waits for a LOCKS (the acquire's resolve) */
  _confirming: ((lease: Lease) => void) | null = null;
  /** @internal */ _confirmSince = 0;
  /** @internal the acquire's reject while confirming */ _confirmFail: ((e: Error) => void) | null = null;
  /** @internal */ _lostErr: RedlockdError | null = null;
  /** @internal */ _ctrl: AbortController | null = null;
  /** @internal */ _release: Promise<void> | null = null;
  /** @internal an UNLOCK of it is on its way */ _unlocking = false;

  /** @internal */
  constructor(
    owner: LeaseOwner,
    resources: readonly string[],
    token: string,
    fence: string,
    ttl: number,
    validity: number,
    tSend: number,
    renew: boolean,
    mode: 'exclusive' | 'shared',
    limit: number | undefined,
    slot: number | undefined,
    value: string | undefined,
  ) {
    this._owner = owner;
    this.resources = resources;
    this._token = token;
    this._fence = fence;
    this._ttl = ttl;
    this._validity = validity;
    this._deadline = tSend + validity;
    this._confirmedAt = tSend;
    this._refreshedAt = tSend;
    this.renew = renew;
    this.mode = mode;
    this.limit = limit;
    this.slot = slot;
    this._value = value;
  }

  /** The first (or only) resource. */
  get resource(): string {
    return this.resources[0] as string;
  }

  /** The daemon's random token for this grant (32 hex digits); a new one
   * after the lease was adopted by another daemon. */
  get token(): string {
    return this._token;
  }

  /** The fencing token: strictly increasing per resource across grants.
   * Give it to the storage the lock guards. */
  get fence(): bigint {
    return BigInt(this._fence);
  }

  /** The holder's value (the `value` option of the acquire, or the last
   * `setValue()`), which STATUS and watchers on every daemon show;
   * undefined when none was set. */
  get value(): string | undefined {
    return this._value;
  }

  /** The lease's ttl on the nodes, in ms. */
  get ttl(): number {
    return this._ttl;
  }

  /** The validity (ms) the daemon last reported. */
  get validity(): number {
    return this._validity;
  }

  /** Until when (ms since the epoch) the lease is known to be valid: the
   * send time of its last confirmation plus the validity reported. */
  get deadline(): number {
    return performance.timeOrigin + this._deadline;
  }

  /** ms left before the lease counts as lost if no confirmation comes
   * (its deadline less a twentieth of the ttl, at most 1 s); 0 once lost
   * or released. */
  get remaining(): number {
    this._owner._checkLease(this);
    if (this._state !== HELD) return 0;
    return Math.max(0, this._stopAt() - performance.now());
  }

  /** @internal when the lease counts as lost without a new confirmation */
  _stopAt(): number {
    return this._deadline - earlyMs(this._ttl);
  }

  /** `held`; `unconfirmed` while the client reconnects, resumes or adopts
   * it elsewhere (still valid until `deadline`); `lost`; `released`. */
  get state(): LeaseState {
    this._owner._checkLease(this);
    if (this._state === LOST) return 'lost';
    if (this._state === RELEASED) return 'released';
    return this._owner._leaseUnconfirmed(this) ? 'unconfirmed' : 'held';
  }

  /** True once the lease is lost (it stays true). */
  get lost(): boolean {
    this._owner._checkLease(this);
    return this._state === LOST;
  }

  /** Aborted, with a `RedlockdError` (code `LOST`) as its reason, when the
   * lease is lost: EVENT LOST from the daemon, or its deadline coming with
   * no confirmation (a twentieth of the ttl before it, at most 1 s). Not
   * aborted by a release. */
  get signal(): AbortSignal {
    if (this._ctrl === null) {
      this._ctrl = new AbortController();
      if (this._lostErr !== null) this._ctrl.abort(this._lostErr);
    }
    this._owner._checkLease(this);
    return this._ctrl.signal;
  }

  /** Throws the loss (a `RedlockdError`, code `LOST`) if the lease is lost;
   * call it before each step of the protected work. */
  check(): void {
    this._owner._checkLease(this);
    if (this._lostErr !== null) throw this._lostErr;
  }

  /** EXTEND every resource to `ttl` ms from now (and the daemon's renewals
   * use it from then on); with `value`, the holder's value is replaced in
   * the same step. Resolves to this lease with its new deadline. */
  extend(ttl: number, options: ExtendOptions = {}): Promise<Lease> {
    if (options === null || typeof options !== 'object') return Promise.reject(new TypeError('options must be an object'));
    return this._owner._extendLease(this, ttl, options.value);
  }

  /** Replace the holder's value without giving up the lock (EXTEND
   * value=, exclusive locks only): the token and fence stay, the ttl stays
   * as it is, and watchers on every daemon hear the new value. Resolves to
   * this lease with its new deadline (as `extend` does). */
  setValue(value: string): Promise<Lease> {
    return this._owner._extendLease(this, undefined, value);
  }

  /** UNLOCK. Resolves once the daemon released it. Rejects with `LOST` if
   * the lease had been lost. A second call returns the first one's
   * promise. */
  release(): Promise<void> {
    if (this._release === null) this._release = this._owner._releaseLease(this);
    return this._release;
  }

  /** @internal */
  toJSON(): Record<string, unknown> {
    return {
      resources: this.resources,
      fence: this._fence,
      ttl: this._ttl,
      mode: this.mode,
      limit: this.limit,
      slot: this.slot,
      value: this._value,
      deadline: this.deadline,
      state: this.state,
    };
  }
}
