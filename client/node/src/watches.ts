/**
 * The Client's watches: which resources its Watches watch, the WATCH and
 * UNWATCH lines for them (the session sends WATCH once per resource, and
 * again on a new session: a resumed one still has them), and each EVENT
 * HOLDER handed to the Watches of its resource. The Watch iterator itself
 * is watch.ts.
 */
import type { EventEmitter } from 'node:events';

import type { Req } from './conn.js';
import { connectionError, replyError } from './errors.js';
import { resourceList } from './proto.js';
import { isOk, K_WATCH, mkReq } from './request.js';
import type { Session } from './session.js';
import { type HolderEvent, holderEvent, Watch, type WatchOptions, type WatchOwner } from './watch.js';

/** A WATCH or UNWATCH line is cut at about this length (the daemon's
 * limits.max_line is 4096 by default). */
const WATCH_LINE_MAX = 3000;

/** @internal A resource some Watch of this client watches. */
export interface Watched {
  readonly resource: string;
  readonly watches: Set<Watch>;
  /** The last EVENT HOLDER line's words, and its event. */
  line: string | null;
  event: HolderEvent | null;
  /** The session (its number here) the WATCH went out on; -1: to send. */
  epoch: number;
  /** The WATCH on its way, if any. */
  req: Req | null;
}

/** @internal The resources watched, and their Watches. */
export class Watches implements WatchOwner {
  /** resource -> the Watches of it. */
  readonly _watched = new Map<string, Watched>();
  /** Resources nobody watches any more that the session may still watch
   * (their UNWATCH could not be sent): UNWATCH after a resume. */
  readonly _stale = new Set<string>();

  /** `events`: the Client, which emits 'holder'. */
  constructor(
    private readonly session: Session,
    private readonly events: EventEmitter,
  ) {}

  /** client.watch(): its arguments (resources, as arguments or an array,
   * then options) checked, a new Watch, and WATCH for what is not
   * watched yet. */
  watch(...args: unknown[]): Watch {
    let options: unknown = {};
    let names: unknown[] = args;
    const last = args[args.length - 1];
    if (args.length > 0 && last !== null && typeof last === 'object' && !Array.isArray(last)) {
      options = last;
      names = args.slice(0, -1);
    }
    if (names.length === 1 && Array.isArray(names[0])) names = names[0] as unknown[];
    const list = resourceList(names);
    const o = options as WatchOptions;
    if (o.signal !== undefined && !(o.signal instanceof AbortSignal)) throw new TypeError('signal must be an AbortSignal');
    const w = new Watch(this, Object.freeze(list), o.signal);
    if (this.session._closing || this.session._closed) {
      w._finish(this.session._closedError());
      return w;
    }
    if (o.signal?.aborted) {
      w._finish(o.signal.reason);
      return w;
    }
    for (const r of list) {
      let e = this._watched.get(r);
      if (e === undefined) {
        e = { resource: r, watches: new Set(), line: null, event: null, epoch: -1, req: null };
        this._watched.set(r, e);
      }
      e.watches.add(w);
      // Watched already: what is known now, and nothing more to send.
      if (e.event !== null) w._deliver(e.event);
      if (e.epoch === this.session._epoch && e.req === null) w._confirmed(r);
    }
    this._syncWatches();
    return w;
  }

  /** EVENT HOLDER: a new state of a watched resource, for each of its
   * Watches (the same state again, as a resume or a second WATCH sends
   * it, is not told twice). */
  _onHolder(words: string, f: Record<string, string>): void {
    const r = f.resource;
    const e = r === undefined ? undefined : this._watched.get(r);
    if (e === undefined || e.line === words) return; // unwatched meanwhile, or nothing new
    const ev = holderEvent(f);
    if (ev === null) return;
    e.line = words;
    e.event = ev;
    for (const w of [...e.watches]) w._deliver(ev);
    if (this.events.listenerCount('holder') > 0) this.events.emit('holder', ev);
  }

  /** The session is ready (SessionHooks): what was given up while the
   * connection was down is UNWATCHed (a resumed session still watches
   * it, a new one does not), and the watches not sent on this session
   * are. */
  _ready(resumed: boolean): void {
    if (this._stale.size > 0) {
      // Given up while the connection was down: a resumed session still
      // watches them, a new one does not.
      const stale = [...this._stale].filter((r) => !this._watched.has(r));
      this._stale.clear();
      if (resumed && stale.length > 0) this._sendUnwatch(stale);
    }
    this._syncWatches();
  }

  /** Send WATCH for each watched resource this session has not been sent
   * (a new watch, or every one after a new session), in lines of at most
   * WATCH_LINE_MAX characters. */
  _syncWatches(): void {
    if (!this.session._ready || this.session._conn === null || this.session._closing || this.session._closed) return;
    const epoch = this.session._epoch;
    let batch: Watched[] = [];
    let len = 0;
    const flush = (): void => {
      if (batch.length > 0) this._sendWatch(batch, epoch);
      batch = [];
      len = 0;
    };
    for (const e of this._watched.values()) {
      if (e.epoch === epoch) continue;
      if (len + e.resource.length + 1 > WATCH_LINE_MAX) flush();
      batch.push(e);
      len += e.resource.length + 1;
    }
    flush();
  }

  _sendWatch(batch: Watched[], epoch: number): void {
    const req: Req = mkReq(
      'WATCH ' + batch.map((e) => e.resource).join(' '),
      K_WATCH,
      false,
      (line) => {
        const mine = batch.filter((e) => e.req === req);
        for (const e of mine) e.req = null;
        if (isOk(line)) {
          for (const e of mine) for (const w of e.watches) w._confirmed(e.resource);
          return;
        }
        // Refused, all of it (LIMIT, DENIED): every Watch of these ends.
        const err = line.startsWith('ERR ')
          ? replyError(line, mine[0]?.resource)
          : connectionError(`unexpected reply to WATCH: ${line.slice(0, 120)}`);
        for (const e of mine) {
          if (this._watched.get(e.resource) === e) this._watched.delete(e.resource);
        }
        const ws = new Set<Watch>();
        for (const e of mine) for (const w of e.watches) ws.add(w);
        for (const w of ws) w._finish(err);
      },
      () => {
        // The connection went first: WATCH again on the next one (a
        // resumed session may have it already: it tells the state again).
        for (const e of batch) {
          if (e.req !== req) continue;
          e.req = null;
          e.epoch = -1;
        }
      },
    );
    for (const e of batch) {
      e.epoch = epoch;
      e.req = req;
    }
    this.session._send(req);
  }

  /** WatchOwner: a Watch ended: UNWATCH what no other Watch wants. */
  _unwatch(w: Watch): void {
    const gone: string[] = [];
    for (const r of w.resources) {
      const e = this._watched.get(r);
      if (e === undefined || !e.watches.delete(w) || e.watches.size > 0) continue;
      this._watched.delete(r);
      if (e.epoch !== -1 || e.req !== null) gone.push(r);
    }
    if (gone.length === 0 || this.session._closing || this.session._closed) return;
    if (!this.session._ready) {
      // The session may be resumed with these watches: UNWATCH then.
      for (const r of gone) this._stale.add(r);
      return;
    }
    this._sendUnwatch(gone);
  }

  /** UNWATCH these (that no Watch wants now), in lines of at most
   * WATCH_LINE_MAX characters. */
  _sendUnwatch(resources: readonly string[]): void {
    let batch: string[] = [];
    let len = 0;
    const flush = (): void => {
      if (batch.length === 0) return;
      const names = batch;
      const failed = (): void => {
        // The connection went first: again after a resume.
        for (const r of names) if (!this._watched.has(r)) this._stale.add(r);
      };
      this.session._send(mkReq('UNWATCH ' + names.join(' '), K_WATCH, false, () => {}, failed));
      batch = [];
      len = 0;
    };
    for (const r of resources) {
      if (len + r.length + 1 > WATCH_LINE_MAX) flush();
      batch.push(r);
      len += r.length + 1;
    }
    flush();
  }

  /** Every Watch ends (err null: quietly, as at close()). */
  _endWatches(err: Error | null): void {
    const ws = new Set<Watch>();
    for (const e of this._watched.values()) for (const w of e.watches) ws.add(w);
    this._watched.clear();
    for (const w of ws) w._finish(err);
  }
}
