package redlockd

// How the Client follows its session and leases across lost connections
// and daemons: the daemon's events, the keeper, the handshakes that set a
// session up on a connection (HELLO, AUTH), and the requests that keep
// the leases this session's (LOCKS, ADOPT).
//
// One goroutine, the keeper, owns the session's life: it refreshes the
// leases' deadlines (LOCKS at least every ttl/3), and when the connection
// is lost it reconnects with backoff:
//
//  1. HELLO resume=<session> secret= on the daemon the session lives on:
//     the same session and its leases; LOCKS confirms them (a lease it no
//     longer lists is lost; one an ADOPT gave the session while the reply
//     was lost shows up with a new token, matched by its fence);
//  2. on ERR NOSESSION, an unreachable daemon, or after EVENT SHUTDOWN: a
//     new session on the next server (round robin, that one last) and one
//     ADOPT per grant while its deadline is ahead: a new token, the same
//     fence. ERR LOST (or another refusal) loses the lease.
//
// Meanwhile requests wait for the connection (within their ctx and
// Config.Timeout) and are sent again on the new one when that is safe:
// LOCK (what a lost reply may have granted is released by the next
// LOCKS, or at once if the retry meets ERR HELD), UNLOCK, EXTEND and the
// inspections. A resumed session keeps its watches (WATCH); a new one
// sends WATCH again for every Watcher (watch.go).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"
)

const (
	// Resumes cut short after connecting that are tried again before the
	// session is given up for a new one.
	maxResumeCuts = 3
	// A reply while leases may have to move is waited for at most half
	// the time left to the nearest deadline (so that another server can
	// still be tried), but never less than this.
	minReplyLimit = 250 * time.Millisecond
)

// ---- the daemon's events ---------------------------------------------------

// onEvent handles an EVENT line (without "EVENT ") from connection cn.
func (c *Client) onEvent(cn *conn, ev string) {
	name, rest, _ := strings.Cut(ev, " ")
	f := fields(rest)
	switch name {
	case "LOST":
		c.mu.Lock()
		if c.cn == cn {
			l := c.leases[f.str("resource")]
			fence, ok := f.get("fence")
			if l != nil && l.err == nil && (!ok || fence == itoa(l.fence)) {
				reason := f.str("reason")
				if reason == "" {
					reason = "lost"
				}
				c.loseLocked(l, reason)
			}
		}
		c.mu.Unlock()
	case "SHUTDOWN":
		cn.setShutdown()
		c.mu.Lock()
		c.broadcastLocked() // a LOCK waiting for a connection looks again
		c.mu.Unlock()
	case "CLOSING":
		cn.mu.Lock()
		cn.closing = f.str("reason")
		if cn.closing == "" {
			cn.closing = "unknown"
		}
		cn.mu.Unlock()
	case "HOLDER":
		c.onHolder(cn, f)
	}
	// Other events are ignored, as the protocol asks.
}

// ---- the keeper ---------------------------------------------------------

type keeperAction int

const (
	actNone keeperAction = iota
	actReconnect
	actRefresh
	actAdopt
	actPing
)

func (c *Client) keeper() {
	defer close(c.keeperDone)
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return
		}
		at, act := c.nextActionLocked()
		c.wakeAt = at
		c.mu.Unlock()
		if d := time.Until(at); at.IsZero() || d > 0 {
			var tc <-chan time.Time
			var t *time.Timer
			if !at.IsZero() {
				t = time.NewTimer(d)
				tc = t.C
			}
			select {
			case <-tc:
			case <-c.poke:
			case <-c.ctx.Done():
			}
			if t != nil {
				t.Stop()
			}
			continue
		}
		switch act {
		case actReconnect:
			c.reconnect()
		case actRefresh:
			c.refresh()
		case actAdopt:
			c.adoptAgain()
		case actPing:
			c.ping()
		}
	}
}

// nextActionLocked: what the keeper does next, and when (a zero time and
// actNone: nothing until it is poked).
func (c *Client) nextActionLocked() (time.Time, keeperAction) {
	now := time.Now()
	if !c.ready {
		if c.retryAt.IsZero() {
			return now, actReconnect
		}
		return c.retryAt, actReconnect
	}
	var at time.Time
	act := actNone
	for _, l := range c.leases {
		if l.err != nil {
			continue
		}
		if l.needsAdopt {
			due := c.adoptAt
			if due.IsZero() {
				due = now
			}
			if at.IsZero() || due.Before(at) {
				at, act = due, actAdopt
			}
			continue
		}
		if l.releasing {
			continue
		}
		if due := l.refreshDue(); at.IsZero() || due.Before(at) {
			at, act = due, actRefresh
		}
	}
	if len(c.watches) > 0 {
		// Something to notice a stalled daemon by (watch.go).
		if c.pingAt.IsZero() {
			c.pingAt = now.Add(c.watchPingEvery())
		}
		if at.IsZero() || c.pingAt.Before(at) {
			at, act = c.pingAt, actPing
		}
	}
	return at, act
}

// replyLimit: how long the keeper waits for a reply while leases may have
// to move.
func (c *Client) replyLimit() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	limit := c.cfg.Timeout
	now := time.Now()
	for _, l := range c.leases {
		if l.err != nil || l.unconfirmed {
			continue
		}
		if d := l.deadline.Sub(now) / 2; d < limit {
			limit = d
		}
	}
	if limit < minReplyLimit {
		limit = minReplyLimit
	}
	return limit
}

func (c *Client) reconnect() {
	c.mu.Lock()
	session, secret, at, start := c.session, c.secret, c.sessionAt, c.server
	c.mu.Unlock()
	var last error
	if session != "" && secret != "" {
		var connected bool
		if connected, last = c.tryResume(at); last == nil {
			return
		}
		c.mu.Lock()
		if errors.Is(last, ErrNoSession) && c.session == session {
			c.forgetSessionLocked()
		}
		// A connection that broke during the resume, without a timeout
		// or a shutdown, is tried again before the session is given up:
		// it may hold leases under tokens only it knows (an ADOPT whose
		// reply was lost), which a new session could not adopt.
		var te *replyTimeout
		again := connected && c.session == session && !errors.As(last, &te) &&
			!errors.Is(last, ErrNoSession) && c.resumeCuts < maxResumeCuts
		if again {
			c.resumeCuts++
		}
		c.mu.Unlock()
		if again {
			c.roundFailed(last)
			return
		}
		start = at
	}
	n := len(c.servers)
	for k := 1; k <= n && c.ctx.Err() == nil; k++ {
		if last = c.tryFresh(c.ctx, (start+k)%n); last == nil {
			return
		}
		c.mu.Lock()
		resumable := c.secret != "" && c.session != session
		c.mu.Unlock()
		if resumable {
			// A session was set up before the attempt failed: an ADOPT
			// whose reply was lost may have given it a lease (with a new
			// token). The next round resumes it rather than adopt the
			// old token elsewhere.
			break
		}
	}
	c.roundFailed(last)
}

// roundFailed: no server would do; the next round after the backoff.
func (c *Client) roundFailed(last error) {
	c.mu.Lock()
	c.lastErr = last
	c.backoff *= 2
	if c.backoff < reconnectMin {
		c.backoff = reconnectMin
	}
	if c.backoff > reconnectMax {
		c.backoff = reconnectMax
	}
	c.retryAt = time.Now().Add(c.backoff)
	c.broadcastLocked()
	c.mu.Unlock()
}

// open dials server i and makes it the current connection (not ready).
func (c *Client) open(ctx context.Context, i int, limit time.Duration) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	cn, err := dialConn(dctx, c, c.servers[i], i, c.cfg.Timeout, c.cfg.TLS)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		cn.fail(ErrClosed)
		return nil, ErrClosed
	}
	old := c.cn
	c.cn, c.ready, c.server = cn, false, i
	c.mu.Unlock()
	if old != nil {
		old.fail(errors.New("replaced by a new connection"))
	}
	return cn, nil
}

// setReady: the connection's session is set up; requests may use it.
func (c *Client) setReady(cn *conn) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cn != cn || cn.isDead() {
		return &ConnError{Server: cn.server.text, Err: errors.New("the connection ended during the handshake")}
	}
	c.ready = true
	c.backoff = 0
	c.resumeCuts = 0
	c.retryAt = time.Time{}
	c.lastErr = nil
	c.broadcastLocked()
	c.pokeKeeper()
	return nil
}

// hello sends HELLO (fresh, or resuming the session) and reads its reply.
func (c *Client) hello(ctx context.Context, cn *conn, limit time.Duration, extra string) (fields, error) {
	line := "HELLO proto=1"
	if c.cfg.Name != "" {
		line += " name=" + c.cfg.Name
	}
	cl, err := cn.roundtrip(ctx, line+extra, false, limit)
	if err != nil {
		return "", err
	}
	rest, err := okReply(cl.reply)
	if err != nil {
		return "", err
	}
	f := fields(rest)
	if f.str("session") == "" {
		return "", protoErr("HELLO reply without session=: %.80q", cl.reply)
	}
	return f, nil
}

// tryFresh: a new session on server i (HELLO detach=, AUTH) and ADOPT of
// every lease of the old one still within its deadline.
func (c *Client) tryFresh(ctx context.Context, i int) error {
	limit := c.replyLimit()
	cn, err := c.open(ctx, i, limit)
	if err != nil {
		return err
	}
	err = c.freshOn(ctx, cn, limit)
	if err == nil {
		err = c.setReady(cn)
	}
	if err != nil {
		cn.fail(fmt.Errorf("setting up a session: %w", err))
		return err
	}
	c.flushUnwatch()
	return nil
}

func (c *Client) freshOn(ctx context.Context, cn *conn, limit time.Duration) error {
	var f fields
	var err error
	if c.detachMs > 0 {
		f, err = c.hello(ctx, cn, limit, " detach="+itoa(c.detachMs))
		if errors.Is(err, ErrArg) {
			f = "" // a daemon without detach=, or a lower limit: without
		} else if err != nil {
			return err
		}
	}
	if f == "" {
		if f, err = c.hello(ctx, cn, limit, ""); err != nil {
			return err
		}
	}
	secret := f.str("secret")
	if len(secret) != 32 {
		secret = ""
	}
	c.mu.Lock()
	c.session, c.secret, c.sessionAt = f.str("session"), secret, cn.index
	// The old session's watches ended with it: nothing to UNWATCH.
	c.unwatchLater = make(map[string]bool)
	// The old session is left behind: its leases are this one's to adopt
	// (those being released too: the UNLOCK goes to this session).
	for _, l := range c.leases {
		if l.err == nil {
			l.needsAdopt = true
		}
	}
	c.mu.Unlock()
	if c.cfg.Password != "" {
		line := "AUTH " + c.cfg.Password
		if c.cfg.User != "" {
			line = "AUTH " + c.cfg.User + " " + c.cfg.Password
		}
		cl, err := cn.roundtrip(ctx, line, false, limit)
		if err != nil {
			return err
		}
		if _, err := okReply(cl.reply); err != nil {
			return err
		}
	}
	if _, err = c.adoptPending(ctx, cn, limit); err != nil {
		return err
	}
	c.rewatch(cn, limit)
	return nil
}

// tryResume: HELLO resume= on server i; LOCKS confirms the leases.
// connected: the failure came after the connection was made.
func (c *Client) tryResume(i int) (connected bool, err error) {
	limit := c.replyLimit()
	cn, err := c.open(c.ctx, i, limit)
	if err != nil {
		return false, err
	}
	err = c.resumeOn(cn, limit)
	if err == nil {
		err = c.setReady(cn)
	}
	if err != nil {
		cn.fail(fmt.Errorf("resuming the session: %w", err))
		return true, err
	}
	c.flushUnwatch() // the session's watches stayed, and its states come again
	return true, nil
}

func (c *Client) resumeOn(cn *conn, limit time.Duration) error {
	c.mu.Lock()
	session, secret := c.session, c.secret
	c.mu.Unlock()
	f, err := c.hello(c.ctx, cn, limit, " resume="+session+" secret="+secret)
	if err != nil {
		return err
	}
	if f.str("session") != session {
		return protoErr("HELLO resume= answered for another session")
	}
	if err := c.refreshOn(c.ctx, cn, limit, true); err != nil {
		return err
	}
	_, err = c.adoptPending(c.ctx, cn, limit)
	return err
}

// ---- LOCKS and ADOPT: the leases on the session ---------------------------

// refresh: the keeper's LOCKS on the ready connection.
func (c *Client) refresh() {
	c.mu.Lock()
	cn := c.cn
	ready := c.ready
	c.mu.Unlock()
	if !ready {
		return
	}
	err := c.refreshOn(c.ctx, cn, c.replyLimit(), false)
	var cerr *ConnError
	if err != nil && !errors.As(err, &cerr) && c.ctx.Err() == nil {
		// Not expected of LOCKS: do not spin on it.
		c.mu.Lock()
		now := time.Now()
		for _, l := range c.leases {
			for i := range l.rd {
				if l.rd[i].sent.Before(now) {
					l.rd[i].sent = now
				}
			}
		}
		c.mu.Unlock()
	}
}

// locksEntry is one lease in a LOCKS reply.
type locksEntry struct {
	Resource string `json:"resource"`
	Fence    uint64 `json:"fence"`
	TTL      int64  `json:"ttl"`
	Validity *int64 `json:"validity"`
	Token    string `json:"token"`
}

// refreshOn sends LOCKS on cn and sets every lease's deadline from it: a
// lease it does not list with its fence is lost (one waiting for an ADOPT
// is adopted if listed, else still waits). What the session holds that
// no lease knows and no goroutine of this client waits for is released:
// a LOCK whose reply a lost connection ate, a lease lost by its deadline.
func (c *Client) refreshOn(ctx context.Context, cn *conn, limit time.Duration, resume bool) error {
	c.mu.Lock()
	snapshot := make([]*Lease, 0, len(c.leases))
	seen := make(map[*Lease]bool, len(c.leases))
	for _, l := range c.leases {
		// After a resume every lease; else those that are this session's
		// and not being released (the LOCKS may pass their UNLOCK).
		if l.err == nil && (resume || !l.releasing && !l.needsAdopt) && !seen[l] {
			seen[l] = true
			snapshot = append(snapshot, l)
		}
	}
	c.mu.Unlock()
	cl, err := cn.roundtrip(ctx, "LOCKS", true, limit)
	if err != nil {
		return err
	}
	rest, err := okReply(cl.reply)
	if err != nil {
		return err
	}
	var body struct {
		Locks []locksEntry `json:"locks"`
	}
	if err := json.Unmarshal([]byte(rest), &body); err != nil {
		cn.fail(protoErr("LOCKS reply: %v", err))
		return err
	}
	held := make(map[string]*locksEntry, len(body.Locks))
	for i := range body.Locks {
		held[body.Locks[i].Resource] = &body.Locks[i]
	}
	var orphans []string
	var tickets []*ticket
	c.mu.Lock()
	for _, l := range snapshot {
		c.applyLocksLocked(l, held, cl.sent)
	}
	for r := range held {
		if len(c.queues[r]) == 0 {
			// Taken as a ticket so that no Lock of this client sends a
			// LOCK of it before the UNLOCK is answered.
			t := c.enqueueLocked([]string{r})
			tickets = append(tickets, t)
			orphans = append(orphans, r)
		}
	}
	c.mu.Unlock()
	if len(orphans) > 0 {
		c.unlockAll(ctx, cn, orphans, limit)
		c.mu.Lock()
		for _, t := range tickets {
			c.releaseTicketLocked(t)
		}
		c.mu.Unlock()
	}
	return nil
}

// applyLocksLocked confirms (or loses) one lease by a LOCKS reply.
func (c *Client) applyLocksLocked(l *Lease, held map[string]*locksEntry, sent time.Time) {
	if l.err != nil {
		return
	}
	for i, r := range l.resources {
		e := held[r]
		if e == nil || e.Fence != l.fence {
			// Not this session's yet (the ADOPT is still to come), or
			// released meanwhile; else gone.
			if !l.needsAdopt && !l.releasing {
				c.loseLocked(l, "gone")
			}
			return
		}
		if e.Token != "" {
			l.token = e.Token
		}
		if e.TTL > 0 {
			l.ttl = time.Duration(e.TTL) * time.Millisecond
		}
		if e.Validity != nil {
			l.confirmLocked(i, sent, time.Duration(*e.Validity)*time.Millisecond)
		} else if l.rd[i].sent.Before(sent) {
			l.rd[i].sent = sent // refreshed, if not confirmed: no refresh at once again
		}
	}
	l.needsAdopt = false
	c.touchLocked(l)
}

// adoptAgain: the keeper's retry of the ADOPTs that ERR UNAVAILABLE put off.
func (c *Client) adoptAgain() {
	c.mu.Lock()
	cn, ready := c.cn, c.ready
	c.mu.Unlock()
	if !ready {
		return
	}
	if _, err := c.adoptPending(c.ctx, cn, c.replyLimit()); err != nil {
		var cerr *ConnError
		if !errors.As(err, &cerr) {
			// ERR SHUTDOWN or NOAUTH: this daemon will not do; another may.
			cn.fail(fmt.Errorf("ADOPT refused: %w", err))
		}
	}
	c.mu.Lock()
	c.broadcastLocked()
	c.mu.Unlock()
}

// adoptPending ADOPTs every lease the session does not hold yet, one
// request per grant, all in flight together. A lease past its deadline is
// lost ("deadline"), one the daemon refuses too ("adopt"); ERR UNAVAILABLE
// leaves it for later (again). ERR SHUTDOWN and NOAUTH are returned: this
// server will not do.
func (c *Client) adoptPending(ctx context.Context, cn *conn, limit time.Duration) (again bool, err error) {
	type adoption struct {
		l  *Lease
		cl *call
	}
	var todo []adoption
	c.mu.Lock()
	seen := make(map[*Lease]bool)
	now := time.Now()
	for _, l := range c.leases {
		if l.err != nil || !l.needsAdopt || seen[l] {
			continue
		}
		seen[l] = true
		if !now.Before(l.deadline) {
			c.loseLocked(l, "deadline")
			continue
		}
		todo = append(todo, adoption{l: l})
	}
	c.mu.Unlock()
	for i := range todo {
		l := todo[i].l
		line := "ADOPT " + strings.Join(l.resources, " ") + " token=" + l.Token() +
			" ttl=" + itoa(millis(l.TTL()))
		if !l.renew {
			line += " renew=0"
		}
		todo[i].cl = cn.start(line, true, limit, nil)
	}
	for _, a := range todo {
		if werr := cn.wait(ctx, a.cl); werr != nil {
			return false, werr
		}
		rest, rerr := okReply(a.cl.reply)
		c.mu.Lock()
		l := a.l
		switch {
		case l.err != nil:
			// Lost meanwhile (its deadline): a grant is released by the
			// next LOCKS, as what no lease knows.
		case rerr == nil:
			f := fields(rest)
			fence, ferr := f.uint("fence")
			validity, verr := f.uint("validity")
			if ferr != nil || verr != nil || f.str("token") == "" || fence != l.fence {
				c.loseLocked(l, "adopt")
				break
			}
			l.token = f.str("token")
			if ttl, err := f.uint("ttl"); err == nil && ttl > 0 {
				l.ttl = time.Duration(ttl) * time.Millisecond
			}
			l.needsAdopt = false
			for i := range l.resources {
				l.confirmLocked(i, a.cl.sent, time.Duration(validity)*time.Millisecond)
			}
			c.touchLocked(l)
		case errors.Is(rerr, ErrUnavailable):
			again = true
		case errors.Is(rerr, ErrShutdown), errors.Is(rerr, ErrNoAuth):
			if err == nil {
				err = rerr
			}
		case errors.Is(rerr, ErrHeld):
			// This session holds it already (an ADOPT whose reply was
			// lost, then a resume): the next LOCKS says with what token.
			l.needsAdopt = false
			for i := range l.rd {
				l.rd[i].sent = time.Time{}
			}
			c.wakeForLocked(time.Now())
		default:
			c.loseLocked(l, "adopt")
		}
		c.mu.Unlock()
	}
	c.mu.Lock()
	if again {
		d := c.backoff
		if d < reconnectMin {
			d = reconnectMin
		}
		c.adoptAt = time.Now().Add(d)
	}
	c.mu.Unlock()
	return again, err
}
