/**
 * The one error class of the client.
 *
 * `code` is the protocol's error code (`ERR <CODE> ...` from the daemon:
 * docs/protocol.md, "Error codes") or `CONNECTION` when no daemon could be
 * reached or the connection failed under a request. Programs branch on
 * `code`; `message` is for people.
 */

/** The daemon's error codes, and `CONNECTION` for transport failures. */
export type ErrorCode =
  | 'ARG'
  | 'UNKNOWN'
  | 'TOOLONG'
  | 'NOAUTH'
  | 'AUTH'
  | 'BUSY'
  | 'TIMEOUT'
  | 'HELD'
  | 'NOTHELD'
  | 'LOST'
  | 'UNAVAILABLE'
  | 'LIMIT'
  | 'SHUTDOWN'
  | 'NOSESSION'
  | 'DENIED'
  | 'CONNECTION';

/**
 * Why a lease was lost (`RedlockdError.reason` when `code` is `LOST`):
 * the daemon's reasons (`expired`, `quorum`, `node`: EVENT LOST), and the
 * client's own: `deadline` (no confirmation before the lease's deadline),
 * `adopt` (another daemon refused to take it over), `gone` (the daemon no
 * longer lists it), `closed` (the Client was closed), `lost` (ERR LOST).
 */
export type LostReason =
  | 'expired'
  | 'quorum'
  | 'node'
  | 'deadline'
  | 'adopt'
  | 'gone'
  | 'closed'
  | 'lost'
  | (string & {});

export interface RedlockdErrorOptions {
  /** The resource the error is about, when there is one. */
  resource?: string;
  /** For `LOST`: why the lease was lost. */
  reason?: LostReason;
  /** The underlying error (a socket error, say). */
  cause?: unknown;
}

export class RedlockdError extends Error {
  /** The protocol's code (`BUSY`, `TIMEOUT`, `LOST`, ...) or `CONNECTION`. */
  readonly code: ErrorCode | (string & {});
  /** The resource the error is about, when there is one. */
  readonly resource: string | undefined;
  /** For `LOST`: why the lease was lost. */
  readonly reason: LostReason | undefined;

  constructor(code: ErrorCode | (string & {}), message: string, options: RedlockdErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'RedlockdError';
    this.code = code;
    this.resource = options.resource;
    this.reason = options.reason;
  }
}

/** An `ERR <CODE> <message>` reply line (without a tag) as an error. */
export function replyError(line: string, resource?: string): RedlockdError {
  // "ERR CODE message..."
  const sp = line.indexOf(' ', 4);
  const code = sp < 0 ? line.slice(4) : line.slice(4, sp);
  const message = sp < 0 ? code : line.slice(sp + 1);
  return new RedlockdError(code || 'UNKNOWN', message, {
    resource,
    reason: code === 'LOST' ? 'lost' : undefined,
  });
}

export function connectionError(message: string, cause?: unknown): RedlockdError {
  return new RedlockdError('CONNECTION', message, { cause });
}

export function lostError(resource: string, reason: LostReason, detail?: string): RedlockdError {
  const why: Record<string, string> = {
    expired: 'its lease expired on the nodes',
    quorum: 'the daemon could not renew it on a quorum of nodes',
    node: 'a node no longer holds it (a forced release, or adopted elsewhere)',
    deadline: 'its deadline passed before the daemon confirmed it again',
    adopt: 'no daemon could take it over',
    gone: 'the daemon no longer holds it',
    closed: 'the client was closed',
    lost: 'the daemon lost it',
  };
  const text = detail ?? why[reason] ?? reason;
  return new RedlockdError('LOST', `lock on ${resource} lost: ${text}`, { resource, reason });
}
