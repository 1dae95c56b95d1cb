/**
 * `redlockd/redlock`: node-redlock v5's API, backed by redlockd.
 *
 * A node-redlock user changes the import and the constructor's first
 * argument (the daemon's addresses instead of ioredis clients) and keeps
 * the rest:
 *
 *     import Redlock, { ResourceLockedError } from 'redlockd/redlock';
 *     const redlock = new Redlock(['127.0.0.1:7390'], { retryCount: 10 });
 *     await redlock.using(['a'], 5000, async (signal) => { ... });
 *
 * What differs: retries become waiting (the daemon queues the request
 * first come first served and grants it the moment the holder lets go:
 * `wait = retryCount * (retryDelay + retryJitter)`, forever for -1); the
 * lock's `value` is the daemon's token; `driftFactor` is the daemon's
 * (locks.drift_factor); `using` does not extend by itself, the daemon
 * renews the lease while the session lives; `attempts` carry no per-node
 * votes (the daemon counts them).
 */
import { EventEmitter } from 'node:events';
import { Client } from './client.js';
import { RedlockdError } from './errors.js';
import type { Lease } from './lease.js';
import type { ClientOptions } from './types.js';

/** node-redlock's settings. */
export interface Settings {
  /** Ignored: the daemon's locks.drift_factor applies. */
  readonly driftFactor: number;
  /** Attempts after the first; -1: until granted. With the daemon this
   * becomes how long to wait: retryCount * (retryDelay + retryJitter). */
  readonly retryCount: number;
  readonly retryDelay: number;
  readonly retryJitter: number;
  /** Checked as node-redlock does (duration - 100 or less); the daemon
   * renews the lease of `using` itself. */
  readonly automaticExtensionThreshold: number;
}

/** Per attempt: node-redlock's votes of the Redis clients. Here one
 * attempt, decided by the daemon: `votesFor` holds the Client when it was
 * granted, `votesAgainst` maps it to the error otherwise. */
export type ExecutionStats = {
  readonly membershipSize: number;
  readonly quorumSize: number;
  readonly votesFor: Set<Client>;
  readonly votesAgainst: Map<Client, Error>;
};

export type ExecutionResult = {
  attempts: ReadonlyArray<Promise<ExecutionStats>>;
};

export type ClientExecutionResult =
  | { client: Client; vote: 'for'; value: number }
  | { client: Client; vote: 'against'; error: Error };

/** The signal given to `using`'s routine: aborted when the lease is lost,
 * with the reason also in `error`. */
export type RedlockAbortSignal = AbortSignal & { error?: Error };

/** The resource is held by someone else (node-redlock's class). */
export class ResourceLockedError extends Error {
  constructor(override readonly message: string) {
    super();
    this.name = 'ResourceLockedError';
  }
}

/** An operation failed (node-redlock's class); `cause` is the daemon's
 * RedlockdError. */
export class ExecutionError extends Error {
  constructor(
    override readonly message: string,
    readonly attempts: ReadonlyArray<Promise<ExecutionStats>>,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'ExecutionError';
  }
}

const defaultSettings: Settings = Object.freeze({
  driftFactor: 0.01,
  retryCount: 10,
  retryDelay: 200,
  retryJitter: 100,
  automaticExtensionThreshold: 500,
});

const leases = new WeakMap<Lock, Lease>();

/** A lock held through Redlock (node-redlock's class). */
export class Lock {
  constructor(
    readonly redlock: Redlock,
    readonly resources: string[],
    /** The daemon's token for this grant. */
    readonly value: string,
    readonly attempts: ReadonlyArray<Promise<ExecutionStats>>,
    /** ms since the epoch until which the lock is known to be valid; 0
     * once released or replaced by an extension. */
    public expiration: number,
  ) {}

  async release(): Promise<ExecutionResult> {
    return this.redlock.release(this);
  }

  async extend(duration: number): Promise<Lock> {
    return this.redlock.extend(this, duration);
  }
}

/** What `new Redlock(...)` takes instead of ioredis clients: the daemon's
 * addresses (a list, or one string), a Client's options, or a Client. */
export type RedlockServers = Client | ClientOptions | string | Iterable<string>;

function checkDuration(duration: number): void {
  if (Math.floor(duration) !== duration) {
    throw new Error('Duration must be an integer value in milliseconds.');
  }
}

/** node-redlock v5's Redlock, backed by one redlockd Client. */
export class Redlock extends EventEmitter {
  readonly clients: Set<Client>;
  readonly settings: Settings;
  /** The Client the locks go through. */
  readonly client: Client;
  private readonly ownClient: boolean;

  constructor(servers: RedlockServers, settings: Partial<Settings> = {}, _scripts: unknown = {}) {
    super();
    // As node-redlock: no crash on an 'error' nobody listens to.
    this.on('error', () => {});
    if (servers instanceof Client) {
      this.client = servers;
      this.ownClient = false;
    } else {
      let options: ClientOptions;
      if (typeof servers === 'string') options = { servers };
      else if (servers !== null && typeof servers === 'object' && Symbol.iterator in servers) {
        options = { servers: [...(servers as Iterable<string>)] };
      } else options = { ...(servers as ClientOptions) };
      if (Array.isArray(options.servers) && options.servers.length === 0) {
        throw new Error('Redlock must be instantiated with at least one redlockd server.');
      }
      this.client = new Client(options);
      this.ownClient = true;
    }
    this.client.on('error', (e) => this.emit('error', e));
    this.clients = new Set([this.client]);
    this.settings = {
      driftFactor: typeof settings.driftFactor === 'number' ? settings.driftFactor : defaultSettings.driftFactor,
      retryCount: typeof settings.retryCount === 'number' ? settings.retryCount : defaultSettings.retryCount,
      retryDelay: typeof settings.retryDelay === 'number' ? settings.retryDelay : defaultSettings.retryDelay,
      retryJitter: typeof settings.retryJitter === 'number' ? settings.retryJitter : defaultSettings.retryJitter,
      automaticExtensionThreshold:
        typeof settings.automaticExtensionThreshold === 'number'
          ? settings.automaticExtensionThreshold
          : defaultSettings.automaticExtensionThreshold,
    };
  }

  /** Closes the Client (when this Redlock made it): the daemon releases
   * every lock still held. */
  async quit(): Promise<void> {
    if (this.ownClient) await this.client.close();
  }

  private wait(settings?: Partial<Settings>): number {
    const s = settings ? { ...this.settings, ...settings } : this.settings;
    if (s.retryCount === -1) return Infinity;
    const w = Math.max(0, s.retryCount) * (Math.max(0, s.retryDelay) + Math.max(0, s.retryJitter));
    return Math.min(Math.round(w), 4294967295);
  }

  private stats(error: Error | null): ReadonlyArray<Promise<ExecutionStats>> {
    const info = this.client.serverInfo;
    const membershipSize = info?.nodes ?? 1;
    const stats: ExecutionStats = {
      membershipSize,
      quorumSize: info?.quorum ?? Math.floor(membershipSize / 2) + 1,
      votesFor: error === null ? new Set([this.client]) : new Set(),
      votesAgainst: error === null ? new Map() : new Map([[this.client, error]]),
    };
    return [Promise.resolve(stats)];
  }

  /** An ExecutionError for a refusal (emitted first, as node-redlock emits
   * each vote's error: a ResourceLockedError when someone holds it). */
  private failure(e: unknown, what: string): unknown {
    if (!(e instanceof RedlockdError)) return e;
    const vote =
      e.code === 'BUSY' || e.code === 'TIMEOUT' || e.code === 'HELD'
        ? new ResourceLockedError(`The operation was applied to: 0 of the requested resources (${e.message}).`)
        : e;
    this.emit('error', vote);
    return new ExecutionError(`The operation was unable to ${what}: ${e.message}`, this.stats(vote), { cause: e });
  }

  private async lease(
    resources: string[],
    duration: number,
    settings: Partial<Settings> | undefined,
    renew: boolean,
  ): Promise<Lock> {
    checkDuration(duration);
    let lease: Lease;
    try {
      lease = await this.client.acquire(resources, { ttl: duration, wait: this.wait(settings), renew });
    } catch (e) {
      throw this.failure(e, 'achieve a quorum during its retry window');
    }
    const lock = new Lock(this, [...lease.resources], lease.token, this.stats(null), lease.deadline);
    leases.set(lock, lease);
    return lock;
  }

  /** Lock the resources (all or none) for `duration` ms: the lock expires
   * then unless extended (renew=0). Waits as the settings' retries would. */
  acquire(resources: string[], duration: number, settings?: Partial<Settings>): Promise<Lock> {
    return this.lease(resources, duration, settings, false);
  }

  /** Release the lock. Rejects with an ExecutionError when it was lost or
   * had expired (as node-redlock's release finds no quorum then). */
  async release(lock: Lock, _settings?: Partial<Settings>): Promise<ExecutionResult> {
    lock.expiration = 0;
    const lease = leases.get(lock);
    if (lease === undefined) throw new ExecutionError('This lock is not one of this Redlock.', []);
    try {
      await lease.release();
    } catch (e) {
      throw this.failure(e, 'release the lock');
    }
    return { attempts: this.stats(null) };
  }

  /** Extend a valid lock to `duration` ms from now: a new Lock (the old
   * one's expiration becomes 0). */
  async extend(existing: Lock, duration: number, _settings?: Partial<Settings>): Promise<Lock> {
    checkDuration(duration);
    if (existing.expiration < Date.now()) {
      throw new ExecutionError('Cannot extend an already-expired lock.', []);
    }
    const lease = leases.get(existing);
    if (lease === undefined) throw new ExecutionError('This lock is not one of this Redlock.', []);
    try {
      await lease.extend(duration);
    } catch (e) {
      throw this.failure(e, 'extend the lock');
    }
    existing.expiration = 0;
    const lock = new Lock(this, existing.resources, lease.token, this.stats(null), lease.deadline);
    leases.set(lock, lease);
    return lock;
  }

  /**
   * Run `routine(signal)` under the lock and release it afterwards. The
   * daemon renews the lease for as long as it runs; `signal` aborts (its
   * `error` set) if the lease is lost. The routine's own error wins over a
   * failed release.
   */
  using<T>(
    resources: string[],
    duration: number,
    settings: Partial<Settings>,
    routine?: (signal: RedlockAbortSignal) => Promise<T>,
  ): Promise<T>;
  using<T>(resources: string[], duration: number, routine: (signal: RedlockAbortSignal) => Promise<T>): Promise<T>;
  async using<T>(
    resources: string[],
    duration: number,
    settingsOrRoutine: Partial<Settings> | ((signal: RedlockAbortSignal) => Promise<T>) | undefined,
    optionalRoutine?: (signal: RedlockAbortSignal) => Promise<T>,
  ): Promise<T> {
    checkDuration(duration);
    const settings =
      settingsOrRoutine && typeof settingsOrRoutine !== 'function'
        ? { ...this.settings, ...settingsOrRoutine }
        : this.settings;
    const routine = optionalRoutine ?? settingsOrRoutine;
    if (typeof routine !== 'function') throw new Error('INVARIANT: routine is not a function.');
    if (settings.automaticExtensionThreshold > duration - 100) {
      throw new Error(
        'A lock `duration` must be at least 100ms greater than the `automaticExtensionThreshold` setting.',
      );
    }
    const lock = await this.lease(resources, duration, settings, true);
    const lease = leases.get(lock) as Lease;
    const controller = new AbortController();
    const signal = controller.signal as RedlockAbortSignal;
    const onLost = (): void => {
      const reason: unknown = lease.signal.reason;
      signal.error = reason instanceof Error ? reason : new Error(String(reason));
      controller.abort(signal.error);
    };
    if (lease.signal.aborted) onLost();
    else lease.signal.addEventListener('abort', onLost, { once: true });
    let result: T;
    try {
      result = await routine(signal);
    } catch (e) {
      lease.signal.removeEventListener('abort', onLost);
      await lock.release().catch(() => {});
      throw e;
    }
    lease.signal.removeEventListener('abort', onLost);
    await lock.release();
    return result;
  }
}

export default Redlock;
