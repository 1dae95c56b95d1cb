package redlockd

// Watching locks: WATCH, UNWATCH and the EVENT HOLDER lines, handed to
// each Watcher through a buffer that keeps the latest state per resource.
//
// The daemon's watches are the session's, not a Watcher's: the session
// watches a resource while some Watcher of the Client does. A Watch sends
// WATCH for each of its resources, also those another Watcher watches
// already (the daemon then sends their state again, to every Watcher of
// them: a state may come twice); UNWATCH goes out when the last Watcher
// of a resource ends. Client.watchMu keeps the WATCH and UNWATCH lines on
// the wire in the order of those changes.
//
// Events are routed by resource on the reader's goroutine, which never
// waits for a Watcher: each keeps at most one state per resource that its
// reader has not taken yet, the latest, and its own goroutine hands them
// to the channel. A Watcher that does not read stalls nothing; when it
// reads again it gets the latest state of each resource, never an older
// one after a newer.
//
// Across connections: a resumed session (HELLO resume=) keeps its
// watches, and the daemon sends the state of each again. A new session
// (after a failover) watches nothing: freshOn sends WATCH again for every
// Watcher (a refusal ends that Watcher with the daemon's error). An
// UNWATCH that found no connection goes out after the next resume. While
// the Client watches anything, the keeper sends a PING every
// watchPingEvery, so that a daemon that stalls (or a network that drops
// everything) is noticed by a client that asks nothing else.
//
// A Watcher's fields, HolderEvent and parseHolder (the words of an EVENT
// HOLDER line) are in core.go, with the Client's state.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

const (
	// A WATCH or UNWATCH line names at most this many resources, in at
	// most this many bytes (the daemon's parser takes 256 words, and lines
	// of limits.max_line, 4096 bytes by default); more go in more lines.
	maxWatchWords = 64
	maxWatchLine  = 3000
	// The keeper's PING while watching: at least this often (and at least
	// every Config.Timeout).
	watchPingMax = 5 * time.Second
)

// Watch watches resources (WATCH) and returns a Watcher whose channel, C,
// has the state of each resource first (who holds it now: a HolderEvent
// with Held 0 when free), then a state after each change, made through
// any daemon on the same Redis nodes (within about a round trip to them)
// or by another Redlock client (within the daemon's locks.watch_poll_ms,
// 1 s by default).
//
// The Watcher buffers what its reader has not taken, one state per
// resource, the latest: a reader that falls behind never holds up the
// Client, and reads each resource's latest state, never an older one
// after a newer (states in between may be skipped; the same state may
// come twice). The order across resources is the order in which they
// changed, as far as states are not merged.
//
// The watch follows the Client across lost connections: a resumed session
// hears each state again, a new session (a failover) sends WATCH again.
// While the Client reconnects no states come.
//
// C is closed when ctx ends, when Close is called (both send UNWATCH),
// when the Client is closed, or when a new session's daemon refuses the
// watch; Err then says which. Watch's errors: ErrArg (no resource, a bad
// or repeated name), ErrLimit (the daemon's limits.max_watches, 1024 by
// default, per Client), ErrDenied (outside the user's prefixes), ErrClosed,
// a *ConnError, ctx's error.
func (c *Client) Watch(ctx context.Context, resources ...string) (*Watcher, error) {
	if len(resources) == 0 {
		return nil, fmt.Errorf("%w: Watch needs a resource name", ErrArg)
	}
	seen := make(map[string]bool, len(resources))
	for _, r := range resources {
		if err := checkResource(r); err != nil {
			return nil, err
		}
		if seen[r] {
			return nil, fmt.Errorf("%w: resource %q named twice", ErrArg, r)
		}
		seen[r] = true
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w := &Watcher{
		c: c, resources: append([]string(nil), resources...),
		ch: make(chan HolderEvent), wake: make(chan struct{}, 1), stop: make(chan struct{}),
		pending: make(map[string]HolderEvent, len(resources)),
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	for _, r := range w.resources {
		set := c.watches[r]
		if set == nil {
			set = make(map[*Watcher]struct{})
			c.watches[r] = set
		}
		set[w] = struct{}{}
		delete(c.unwatchLater, r)
	}
	c.pokeKeeper() // its PINGs start
	c.mu.Unlock()
	go w.pump()
	if err := c.sendWatch(ctx, w); err != nil {
		w.end(err)
		return nil, err
	}
	go func() {
		select {
		case <-ctx.Done():
			w.end(ctx.Err())
		case <-w.stop:
		}
	}()
	return w, nil
}

// C is the channel of states. It is closed when the Watcher ends.
func (w *Watcher) C() <-chan HolderEvent { return w.ch }

// Resources are the resources watched, in the order given to Watch.
func (w *Watcher) Resources() []string { return append([]string(nil), w.resources...) }

// Close stops watching (UNWATCH of the resources no other Watcher of the
// Client watches) and closes C; states not read yet are dropped. Err is
// then ErrClosed. Idempotent.
func (w *Watcher) Close() { w.end(ErrClosed) }

// Err is nil while the Watcher watches. After C is closed: ctx's error
// when the ctx given to Watch ended, ErrClosed after Close or when the
// Client was closed, or the error with which a new session's daemon
// refused to watch again after a failover (ErrDenied, ErrLimit).
func (w *Watcher) Err() error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

// push is the latest state of one of its resources (on the reader's
// goroutine, under c.mu): it replaces a state of the resource not handed
// over yet, or joins the queue.
func (w *Watcher) push(ev HolderEvent) {
	w.mu.Lock()
	if w.ended {
		w.mu.Unlock()
		return
	}
	if _, ok := w.pending[ev.Resource]; !ok {
		w.order = append(w.order, ev.Resource)
	}
	w.pending[ev.Resource] = ev
	w.mu.Unlock()
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// pump hands the pending states to C, oldest resource first, until the
// Watcher ends; then it closes C.
func (w *Watcher) pump() {
	defer close(w.ch)
	for {
		w.mu.Lock()
		if w.ended {
			w.mu.Unlock()
			return
		}
		if len(w.order) == 0 {
			w.mu.Unlock()
			select {
			case <-w.wake:
			case <-w.stop:
				return
			}
			continue
		}
		r := w.order[0]
		w.order[0] = ""
		w.order = w.order[1:]
		if len(w.order) == 0 {
			w.order = nil // let the array go
		}
		ev := w.pending[r]
		delete(w.pending, r)
		w.mu.Unlock()
		select {
		case w.ch <- ev:
		case <-w.stop:
			return
		}
	}
}

// finish marks the Watcher ended with err (C closes); false if it had
// ended already.
func (w *Watcher) finish(err error) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended {
		return false
	}
	w.ended, w.err = true, err
	w.pending, w.order = nil, nil
	close(w.stop)
	return true
}

// end ends the Watcher and UNWATCHes what no other Watcher watches.
func (w *Watcher) end(err error) {
	c := w.c
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	if !w.finish(err) {
		return
	}
	var unwatched []string
	c.mu.Lock()
	for _, r := range w.resources {
		set := c.watches[r]
		delete(set, w)
		if set != nil && len(set) == 0 {
			delete(c.watches, r)
			unwatched = append(unwatched, r)
		}
	}
	c.mu.Unlock()
	c.unwatchLocked(unwatched)
}

// watchLines splits "WATCH a b c..." into lines the daemon takes.
func watchLines(cmd string, resources []string) []string {
	var lines []string
	var b strings.Builder
	n := 0
	for _, r := range resources {
		if n > 0 && (n == maxWatchWords || b.Len()+1+len(r) > maxWatchLine) {
			lines = append(lines, b.String())
			b.Reset()
			n = 0
		}
		if n == 0 {
			b.WriteString(cmd)
		}
		b.WriteByte(' ')
		b.WriteString(r)
		n++
	}
	if n > 0 {
		lines = append(lines, b.String())
	}
	return lines
}

// sendWatch sends a new Watcher's WATCH and waits for the answers; sent
// again on the next connection if the connection is lost under it.
func (c *Client) sendWatch(ctx context.Context, w *Watcher) error {
	var until time.Time
	for attempt := 0; ; attempt++ {
		cn, err := c.readyConn(ctx, &until, false, nil)
		if err != nil {
			return err
		}
		calls, err := c.startWatch(cn, w, c.cfg.Timeout, nil)
		if err != nil {
			return err
		}
		var first error
		for _, cl := range calls {
			werr := cn.wait(ctx, cl)
			if werr == nil {
				_, werr = okReply(cl.reply)
			}
			if werr != nil && first == nil {
				first = werr
			}
		}
		var cerr *ConnError
		if first != nil && errors.As(first, &cerr) && ctx.Err() == nil && attempt < 3 {
			continue
		}
		return first
	}
}

// startWatch sends the WATCH lines of a Watcher that has not ended (else
// its error) on cn, each with the hook made by mk (nil: none).
func (c *Client) startWatch(cn *conn, w *Watcher, limit time.Duration, mk func() replyHook) ([]*call, error) {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	w.mu.Lock()
	ended, err := w.ended, w.err
	w.mu.Unlock()
	if ended {
		return nil, err
	}
	var calls []*call
	for _, line := range watchLines("WATCH", w.resources) {
		var hook replyHook
		if mk != nil {
			hook = mk()
		}
		calls = append(calls, cn.start(line, true, limit, hook))
	}
	return calls, nil
}

// unwatchLocked (under watchMu) sends UNWATCH of resources nobody here
// watches any more; with no connection, they wait for the next resume (a
// new session watches nothing).
func (c *Client) unwatchLocked(resources []string) {
	if len(resources) == 0 {
		return
	}
	c.mu.Lock()
	cn, ready, closed := c.cn, c.ready, c.closed
	if !ready && !closed {
		for _, r := range resources {
			c.unwatchLater[r] = true
		}
	}
	c.mu.Unlock()
	if !ready || closed {
		return
	}
	for _, line := range watchLines("UNWATCH", resources) {
		cn.start(line, true, c.cfg.Timeout, unwatchHook{c: c, resources: resources})
	}
}

// unwatchHook: an UNWATCH the connection ate is sent after the resume.
type unwatchHook struct {
	c         *Client
	resources []string
}

func (h unwatchHook) replied(cl *call) {
	if cl.err == nil {
		return
	}
	c := h.c
	c.mu.Lock()
	for _, r := range h.resources {
		if c.watches[r] == nil && !c.closed {
			c.unwatchLater[r] = true
		}
	}
	c.mu.Unlock()
}

// flushUnwatch sends the UNWATCHes put off for a lack of connection (after
// a resume; a new session has none to send).
func (c *Client) flushUnwatch() {
	c.watchMu.Lock()
	defer c.watchMu.Unlock()
	c.mu.Lock()
	var rs []string
	for r := range c.unwatchLater {
		if c.watches[r] == nil {
			rs = append(rs, r)
		}
	}
	c.unwatchLater = make(map[string]bool)
	c.mu.Unlock()
	c.unwatchLocked(rs)
}

// watchersLocked: the Watchers of c.watches, each once (one may watch
// several resources).
func (c *Client) watchersLocked() []*Watcher {
	var ws []*Watcher
	seen := make(map[*Watcher]bool)
	for _, set := range c.watches {
		for w := range set {
			if !seen[w] {
				seen[w] = true
				ws = append(ws, w)
			}
		}
	}
	return ws
}

// rewatch: a new session watches nothing; WATCH again what every Watcher
// watches (without waiting for the answers: a refusal ends its Watcher).
func (c *Client) rewatch(cn *conn, limit time.Duration) {
	c.mu.Lock()
	ws := c.watchersLocked()
	c.mu.Unlock()
	for _, w := range ws {
		w := w
		_, _ = c.startWatch(cn, w, limit, func() replyHook { return rewatchHook{w} })
	}
}

// rewatchHook: a daemon that refuses a Watcher's WATCH on a new session
// ends it (a lost connection leaves it to the next session).
type rewatchHook struct{ w *Watcher }

func (h rewatchHook) replied(cl *call) {
	if cl.err != nil {
		return
	}
	if _, err := okReply(cl.reply); err != nil {
		// Not here: a hook neither blocks nor sends.
		go h.w.end(fmt.Errorf("watching again on a new session: %w", err))
	}
}

// onHolder hands an EVENT HOLDER of connection cn to the Watchers of its
// resource.
func (c *Client) onHolder(cn *conn, f fields) {
	ev, ok := parseHolder(f)
	if !ok {
		return
	}
	c.mu.Lock()
	if c.cn == cn {
		for w := range c.watches[ev.Resource] {
			w.push(ev)
		}
	}
	c.mu.Unlock()
}

// watchPingEvery: how often the keeper PINGs while watching.
func (c *Client) watchPingEvery() time.Duration {
	if c.cfg.Timeout < watchPingMax {
		return c.cfg.Timeout
	}
	return watchPingMax
}

// ping: the keeper's PING while watching; a reply later than
// Config.Timeout ends the connection (and the client reconnects).
func (c *Client) ping() {
	c.mu.Lock()
	cn, ready := c.cn, c.ready
	c.pingAt = time.Now().Add(c.watchPingEvery())
	c.mu.Unlock()
	if ready {
		cn.start("PING", true, c.cfg.Timeout, nil)
	}
}

// endWatchersLocked: the Client is closed; every Watcher ends (the QUIT
// ends the session's watches). Returns them, to finish outside c.mu.
func (c *Client) endWatchersLocked() []*Watcher {
	ws := c.watchersLocked()
	c.watches = make(map[string]map[*Watcher]struct{})
	c.unwatchLater = make(map[string]bool)
	return ws
}
