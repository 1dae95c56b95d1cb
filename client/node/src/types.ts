/**
 * The Client's public types: its options, what STATUS, LOCKS and HELLO
 * answer, and the arguments of its events. Types only (index.ts exports
 * them through client.ts).
 */
import type { RedlockdError } from './errors.js';
import type { Lease } from './lease.js';
import type { HolderEvent } from './watch.js';

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

export interface ClientEvents {
  ready: [info: ServerInfo];
  reconnect: [info: ReconnectInfo];
  failover: [info: FailoverInfo];
  lost: [lease: Lease, error: RedlockdError];
  holder: [event: HolderEvent];
  error: [error: Error];
  close: [];
}
