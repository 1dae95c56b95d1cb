/**
 * One connection to one daemon: the socket, the lines read from it, and
 * the requests waiting for their replies.
 *
 * A tagged request is written as `#<tag> <line>` and its reply, `#<tag>
 * ...`, is found by its tag, in whatever order the daemon finishes them
 * (docs/protocol.md, "Tagged requests"). An untagged request (HELLO, AUTH,
 * QUIT only) is a barrier: its reply is the next untagged line that is not
 * an EVENT. Lines written in one turn of the event loop leave in one write.
 */
import type { Socket } from 'node:net';
import type { Address } from './proto.js';

/** A request on its way to a daemon, or waiting to be sent. @internal */
export interface Req {
  /** The request line, without its tag and LF. */
  line: string;
  /** What kind of request (for the client's failover rules). */
  kind: number;
  /** The tag it was written with ('' untagged, or not written). */
  tag: string;
  /** performance.now() just before it was written. */
  tSend: number;
  /** No reply by then (performance.now()): the connection is dropped. */
  expectBy: number;
  /** When it started waiting for a connection. */
  queuedAt: number;
  /** ms more than the client's timeout its reply may take (a LOCK's wait). */
  extra: number;
  /** Written at least once before (a replay after a reconnection). */
  sent: boolean;
  /** How many times it was written (a request that keeps losing its
   * connection is not sent a fourth time). */
  tries: number;
  retried: boolean;
  /** Re-sent on a new connection when the one it was on is lost. */
  replay: boolean;
  /** Called before each write; a new line, or an error to fail with. */
  rebuild: (() => string | Error) | null;
  /** The reply line, its tag removed. */
  onReply: (line: string) => void;
  /** The connection failed (or the client closed) before a reply. */
  onFail: (err: Error) => void;
}

export interface ConnOwner {
  onLine(conn: Conn, line: string): void;
  onClosed(conn: Conn, why: string): void;
}

/** The longest line the client accepts from a daemon. */
const MAX_LINE = 4 * 1024 * 1024;

/** @internal */
export class Conn {
  readonly inflight = new Map<string, Req>();
  readonly untagged: Req[] = [];
  dead = false;
  /** EVENT SHUTDOWN was seen: the daemon takes no new locks. */
  shutdown = false;
  /** EVENT CLOSING reason=, when one came. */
  closingReason: string | null = null;
  private out = '';
  private flushing = false;
  private buf = '';
  private nextTag = 0;

  constructor(
    private readonly owner: ConnOwner,
    readonly sock: Socket,
    readonly index: number,
    readonly addr: Address,
  ) {
    sock.setEncoding('latin1');
    sock.on('data', (chunk: string) => this.onData(chunk));
    sock.on('error', (e: Error) => this.owner.onClosed(this, `connection error: ${e.message}`));
    sock.on('close', () => this.owner.onClosed(this, 'connection closed by the daemon'));
  }

  /** Queue a request's line; written at the end of this turn. */
  write(req: Req, tagged: boolean): void {
    if (tagged) {
      let tag = (this.nextTag++).toString(36);
      if (this.nextTag >= 0x7fffffff) this.nextTag = 0;
      while (this.inflight.has(tag)) tag = (this.nextTag++).toString(36);
      req.tag = tag;
      this.inflight.set(tag, req);
      this.out += '#' + tag + ' ' + req.line + '\n';
    } else {
      req.tag = '';
      this.untagged.push(req);
      this.out += req.line + '\n';
    }
    if (!this.flushing) {
      this.flushing = true;
      process.nextTick(this.flush);
    }
  }

  private readonly flush = (): void => {
    this.flushing = false;
    if (this.dead || this.out === '') return;
    const s = this.out;
    this.out = '';
    this.sock.write(s, 'latin1');
  };

  /** The request a tagged reply answers, taken off the list. */
  take(tag: string): Req | undefined {
    const req = this.inflight.get(tag);
    if (req !== undefined) this.inflight.delete(tag);
    return req;
  }

  private onData(chunk: string): void {
    const buf = this.buf === '' ? chunk : this.buf + chunk;
    let start = 0;
    let nl: number;
    while ((nl = buf.indexOf('\n', start)) >= 0) {
      let end = nl;
      if (end > start && buf.charCodeAt(end - 1) === 13) end--;
      if (end > start) this.owner.onLine(this, buf.slice(start, end));
      start = nl + 1;
      if (this.dead) return;
    }
    this.buf = start < buf.length ? buf.slice(start) : '';
    if (this.buf.length > MAX_LINE) this.owner.onClosed(this, 'a line from the daemon longer than 4 MiB');
  }

  /** Close the socket (the owner has already failed the requests). */
  destroy(): void {
    this.dead = true;
    this.out = '';
    this.sock.destroy();
  }
}
