/**
 * Requests, as every part of the client makes them: their kinds (which the
 * session's failover rules look at), a new Req, the status of a reply
 * line, the clock, and the time limits more than one part uses.
 */
import { performance } from 'node:perf_hooks';

import type { Req } from './conn.js';

// Request kinds.
/** @internal */ export const K_LOCK = 1;
/** @internal */ export const K_UNLOCK = 2;
/** @internal */ export const K_EXTEND = 3;
/** @internal */ export const K_REFRESH = 4;
/** @internal */ export const K_READ = 5;
/** @internal */ export const K_ADOPT = 6;
/** @internal */ export const K_HANDSHAKE = 7;
/** @internal */ export const K_WATCH = 8;

/** @internal Reconnection: the first try at once, then after these,
 * doubling (an ADOPT the daemon could not do yet is tried again after the
 * backoff, at least the first of these). */
export const RECONNECT_MIN_MS = 50;
/** @internal */ export const RECONNECT_MAX_MS = 1000;
/** @internal A reply while leases may have to move is waited for at most
 * half the time left to the nearest deadline, but never less than this. */
export const MIN_REPLY_MS = 250;

/** @internal */
export const now = (): number => performance.now();

/** @internal a token or a session's secret: 32 hex digits */
export const HEX32 = /^[0-9a-f]{32}$/;

/** @internal */
export function mkReq(
  line: string,
  kind: number,
  replay: boolean,
  onReply: (line: string) => void,
  onFail: (err: Error) => void,
): Req {
  return {
    line,
    kind,
    tag: '',
    tSend: 0,
    expectBy: 0,
    queuedAt: 0,
    extra: 0,
    sent: false,
    tries: 0,
    retried: false,
    replay,
    rebuild: null,
    onReply,
    onFail,
  };
}

/** @internal */
export const isOk = (line: string): boolean => line.startsWith('OK');

/** @internal the code of an `ERR CODE ...` line ('' for any other line) */
export const errCode = (line: string): string => {
  if (!line.startsWith('ERR ')) return '';
  const sp = line.indexOf(' ', 4);
  return sp < 0 ? line.slice(4) : line.slice(4, sp);
};
