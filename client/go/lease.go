package redlockd

// A Lease is one grant: one resource, or the resources of one LOCK a b c.
//
// Its deadline follows docs/protocol.md's rule: the time a confirming
// request was sent plus the validity its reply reported (LOCK, ADOPT,
// EXTEND, or the keeper's LOCKS, each resource on its own; the lease's
// deadline is the earliest). The newest confirmation of a resource counts,
// even when it is shorter. A deadline that passes without a newer one ends
// the lease (Done closes), whatever a later reply says: nobody can know
// that the lock held in between.
//
// The Lease's fields, and the heap of the leases by deadline, are declared
// in core.go with the Client's (most under Client.mu). Here: what a Lease
// shows, how its deadline moves and ends it, Unlock, Extend, SetValue and
// Context. Lock makes leases (lock.go), the keeper confirms and moves them
// (session.go).

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Resource is the lease's (first) resource.
func (l *Lease) Resource() string { return l.resources[0] }

// Resources are the lease's resources, in the order they were asked for.
func (l *Lease) Resources() []string { return append([]string(nil), l.resources...) }

// Fence is the fencing token: it increases with every grant of the
// resource across all daemons of the same Redis nodes; give it to storage
// that rejects writes with an older one. It stays the same across ADOPT.
func (l *Lease) Fence() uint64 { return l.fence }

// Mode is "exclusive" or "shared".
func (l *Lease) Mode() string { return l.mode }

// Limit and Slot: for a semaphore (the Limit option) its size and the slot
// held; 0 and -1 otherwise.
func (l *Lease) Limit() int { return l.limit }
func (l *Lease) Slot() int  { return l.slot }

// Token is the lease's token (a bearer credential: keep it to yourself).
// It changes when the lease is adopted by another daemon.
func (l *Lease) Token() string {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.token
}

// TTL is the lease's ttl on the Redis nodes (as set by LOCK or Extend).
func (l *Lease) TTL() time.Duration {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.ttl
}

// Value is the holder's value stored with the lease: the one Lock was
// given (Value), or the last one SetValue set (answered OK on every
// resource); "" without one.
func (l *Lease) Value() string {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.value
}

// Deadline is the time until which the lease is known to be valid; the
// client moves it forward while the daemon confirms the lease.
func (l *Lease) Deadline() time.Time {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.deadline
}

// Done is closed when the lease ends: lost (the daemon says so, or the
// deadline passed unconfirmed), released by Unlock, or its Client closed.
func (l *Lease) Done() <-chan struct{} { return l.done }

// Err is nil while the lease is held; then a *LostError (errors.Is
// ErrLost) for a lost lease, ErrReleased after Unlock.
func (l *Lease) Err() error {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.err
}

func (l *Lease) String() string {
	return fmt.Sprintf("redlockd.Lease{%s fence=%d}", strings.Join(l.resources, " "), l.fence)
}

// confirmLocked records that a request sent at `sent` found resource i
// valid for `validity` more; touchLocked then applies it.
func (l *Lease) confirmLocked(i int, sent time.Time, validity time.Duration) {
	if sent.Before(l.rd[i].sent) {
		return // an older confirmation than one already had
	}
	l.rd[i] = confirmation{sent: sent, deadline: sent.Add(validity)}
}

// refreshDue: when the keeper's next LOCKS is due for this lease.
func (l *Lease) refreshDue() time.Time {
	oldest := l.rd[0].sent
	for _, r := range l.rd[1:] {
		if r.sent.Before(oldest) {
			oldest = r.sent
		}
	}
	return oldest.Add(l.ttl / 3)
}

// touchLocked moves the deadline to what the confirmations say, unless the
// old one has passed already (no revival), and rearms the timer.
// An unconfirmed grant has no deadline yet to pass: it becomes a lease
// with one here, or is lost.
func (c *Client) touchLocked(l *Lease) {
	if l.err != nil {
		return
	}
	now := time.Now()
	if !l.unconfirmed && !now.Before(l.deadline) {
		c.loseLocked(l, "deadline")
		return
	}
	d := l.rd[0].deadline
	for _, r := range l.rd[1:] {
		if r.deadline.Before(d) {
			d = r.deadline
		}
	}
	l.deadline = d
	if !now.Before(d) {
		c.loseLocked(l, "deadline")
		return
	}
	if l.unconfirmed {
		l.unconfirmed = false
		heap.Push(&c.deadlines, l)
		close(l.confirmed)
	} else {
		heap.Fix(&c.deadlines, l.hidx)
	}
	c.armDeadlinesLocked()
	c.wakeForLocked(l.refreshDue())
}

// armDeadlinesLocked makes the timer fire by the earliest deadline.
func (c *Client) armDeadlinesLocked() {
	if len(c.deadlines) == 0 {
		return
	}
	first := c.deadlines[0].deadline
	if !c.dlAt.IsZero() && !first.Before(c.dlAt) {
		return
	}
	c.dlAt = first
	if c.dlTimer == nil {
		c.dlTimer = time.AfterFunc(time.Until(first), c.deadlinesDue)
	} else {
		c.dlTimer.Reset(time.Until(first))
	}
}

// deadlinesDue: the timer fired; the leases past their deadline are lost.
func (c *Client) deadlinesDue() {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := time.Now()
	for len(c.deadlines) > 0 && !now.Before(c.deadlines[0].deadline) {
		c.loseLocked(c.deadlines[0], "deadline")
	}
	c.dlAt = time.Time{}
	c.armDeadlinesLocked()
}

// loseLocked ends a lease that was not released by its holder.
func (c *Client) loseLocked(l *Lease, reason string) {
	if l.err != nil {
		return
	}
	c.endLocked(l, &LostError{Resources: l.resources, Fence: l.fence, Reason: reason})
}

// endLocked: the lease is over; the next goroutine waiting for its
// resources in this client may go.
func (c *Client) endLocked(l *Lease, err error) {
	if l.err != nil {
		return
	}
	l.err = err
	l.needsAdopt = false
	if l.hidx >= 0 {
		heap.Remove(&c.deadlines, l.hidx)
	}
	close(l.done)
	for _, r := range l.resources {
		if c.leases[r] == l {
			delete(c.leases, r)
		}
	}
	c.releaseTicketLocked(l.t)
}

// registerLocked makes a granted lease known: events and LOCKS find it by
// its resources, the keeper refreshes it, its timer watches its deadline.
func (c *Client) registerLocked(l *Lease) {
	for _, r := range l.resources {
		c.leases[r] = l
	}
	if !l.unconfirmed {
		heap.Push(&c.deadlines, l)
		c.armDeadlinesLocked()
	}
	if c.closed {
		c.loseLocked(l, "closed")
		return
	}
	c.wakeForLocked(l.refreshDue())
}

// unlockState is shared by an UNLOCK's sender and its hook (the flags
// under c.mu).
type unlockState struct {
	l         *Lease
	handled   bool
	abandoned bool
	retried   bool
	err       error
}

func (st *unlockState) replied(cl *call) { st.l.c.unlockReplied(st.l, st, cl) }

// extendState is one EXTEND's: resource i of a lease, to ttl ms (0: the
// ttl stays), with a new value (nil: none).
type extendState struct {
	l  *Lease
	i  int
	ms uint64
	v  *valueSet
}

// valueSet is one SetValue's, shared by the EXTENDs of its resources: the
// lease's value changes when every one of them is answered OK.
type valueSet struct {
	value  string
	left   int
	failed bool
}

func (st *extendState) replied(cl *call) { st.l.c.extendReplied(st, cl) }

// Unlock releases the lease (UNLOCK of its resources). It returns nil once
// released, also for a lease released before; a *LostError if the lease
// had been lost (its work may have overlapped another holder's). If ctx
// ends first the release goes on in the background. When no daemon can be
// reached within Config.Timeout the lease ends all the same (ErrReleased)
// and the error says why; the session's next LOCKS releases it on the
// daemon, else its keys expire at its ttl.
func (l *Lease) Unlock(ctx context.Context) error {
	c := l.c
	c.mu.Lock()
	if l.err != nil {
		err := l.err
		c.mu.Unlock()
		if err == ErrReleased {
			return nil
		}
		return err
	}
	if l.releasing {
		c.mu.Unlock()
		select {
		case <-l.done:
		case <-ctx.Done():
			return ctx.Err()
		}
		return l.Unlock(ctx)
	}
	l.releasing = true
	c.mu.Unlock()

	st := &unlockState{l: l}
	var until time.Time
	line := "UNLOCK " + strings.Join(l.resources, " ")
	for {
		cn, err := c.readyConn(ctx, &until, false, l)
		if err != nil {
			c.mu.Lock()
			switch {
			case l.err != nil:
				if l.err != ErrReleased {
					err = l.err
				}
			case ctx.Err() != nil:
				// The caller left: go on without it.
				l.releasing = false
				go l.Unlock(context.Background())
			default:
				c.endLocked(l, ErrReleased) // given up: see the comment above
			}
			c.mu.Unlock()
			return err
		}
		cl := cn.start(line, true, c.cfg.Timeout, st)
		werr := cn.wait(ctx, cl)
		c.mu.Lock()
		if !st.handled {
			st.abandoned = true // the hook finishes the lease when the reply comes
			c.mu.Unlock()
			go c.finishUnlock(l, st, cl)
			return werr
		}
		err = st.err
		switch {
		case cl.err == nil: // answered
		case l.err != nil: // ended meanwhile (lost, the Client closed)
			err = nil
			if l.err != ErrReleased {
				err = l.err
			}
		case ctx.Err() != nil:
			l.releasing = false
			go l.Unlock(context.Background()) // the caller left: go on without it
			err = ctx.Err()
		default:
			// The connection ate it: again on the next one.
			st.retried = true
			st.handled = false
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		return err
	}
}

// unlockReplied is the UNLOCK's hook (the reader's goroutine, or the
// connection's end).
func (c *Client) unlockReplied(l *Lease, st *unlockState, cl *call) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st.handled = true
	st.err = nil
	if cl.err != nil {
		st.err = cl.err // sent again, by the caller or finishUnlock
		return
	}
	_, err := okReply(cl.reply)
	switch {
	case err == nil:
		c.endLocked(l, ErrReleased)
	case errors.Is(err, ErrNotHeld):
		// After a retry: the first UNLOCK did it. Else the session had
		// lost it without a word (it is over all the same).
		if l.err == nil && !st.retried {
			c.loseLocked(l, "gone")
			st.err = l.err
			return
		}
		c.endLocked(l, ErrReleased)
	case errors.Is(err, ErrLost):
		c.loseLocked(l, "lost")
		st.err = l.err
	default:
		l.releasing = false
		st.err = err
	}
}

// finishUnlock: the caller of Unlock left; wait for the answer, and send
// the UNLOCK again if the connection ate it.
func (c *Client) finishUnlock(l *Lease, st *unlockState, cl *call) {
	<-cl.done
	c.mu.Lock()
	again := cl.err != nil && l.err == nil
	if again {
		l.releasing = false
	}
	c.mu.Unlock()
	if again {
		_ = l.Unlock(context.Background())
	}
}

// Extend sets the lease's ttl on the Redis nodes (EXTEND of each
// resource) and makes it the ttl the daemon renews; the deadline becomes
// the send time plus the validity reported. ERR LOST ends the lease (a
// *LostError); after ERR UNAVAILABLE with a shorter ttl the lease counts
// as confirmed only up to when the EXTEND was sent, until the keeper's
// next LOCKS.
func (l *Lease) Extend(ctx context.Context, ttl time.Duration) error {
	ms := millis(ttl)
	if ms == 0 {
		return fmt.Errorf("%w: Extend needs a ttl above 0", ErrArg)
	}
	return l.extend(ctx, ms, nil)
}

// SetValue replaces the holder's value (EXTEND value=) without giving up
// the lock: the token and fence stay, nobody else can slip in, and
// watchers hear the new value (etcd's Proclaim). The ttl stays as it is;
// the deadline moves on as Extend moves it. v is checked as Value checks
// it; a shared lease or a semaphore slot has no value (ErrArg). ERR LOST
// ends the lease; after another error (ErrUnavailable: some nodes may
// have the new value, others the old) Value keeps the old value, and
// SetValue may be called again. A lease of several resources sets the
// value of each.
func (l *Lease) SetValue(ctx context.Context, v string) error {
	if err := checkValue(v); err != nil {
		return err
	}
	if l.mode == "shared" || l.limit > 0 {
		return fmt.Errorf("%w: only an exclusive lease has a value (this one is %s)", ErrArg, l.kind())
	}
	return l.extend(ctx, 0, &v)
}

func (l *Lease) kind() string {
	if l.limit > 0 {
		return "a semaphore slot"
	}
	return l.mode
}

// extend sends EXTEND of each resource: to ttl ms (0: the ttl stays),
// with a new value (nil: none); sent again once after a lost connection.
func (l *Lease) extend(ctx context.Context, ms uint64, value *string) error {
	c := l.c
	var until time.Time
	for attempt := 0; ; attempt++ {
		cn, err := c.readyConn(ctx, &until, false, l)
		if err != nil {
			return err
		}
		var vs *valueSet
		suffix := ""
		if ms > 0 {
			suffix = " ttl=" + itoa(ms)
		}
		if value != nil {
			vs = &valueSet{value: *value, left: len(l.resources)}
			suffix += " value=" + *value
		}
		calls := make([]*call, len(l.resources))
		for i, r := range l.resources {
			calls[i] = cn.start("EXTEND "+r+suffix, true, c.cfg.Timeout,
				&extendState{l: l, i: i, ms: ms, v: vs})
		}
		var first error
		lostConn := false
		for _, cl := range calls {
			werr := cn.wait(ctx, cl)
			if werr == nil {
				_, werr = okReply(cl.reply)
			} else if cl.err != nil {
				lostConn = true
			}
			if werr != nil && first == nil {
				first = werr
			}
		}
		if lostConn && attempt == 0 && ctx.Err() == nil {
			continue
		}
		c.mu.Lock()
		if errors.Is(first, ErrLost) && l.err != nil {
			first = l.err
		}
		c.mu.Unlock()
		return first
	}
}

// extendReplied is one EXTEND's hook.
func (c *Client) extendReplied(st *extendState, cl *call) {
	l, i, ms := st.l, st.i, st.ms
	if cl.err != nil {
		return // sent again on the next connection, with a new state
	}
	rest, err := okReply(cl.reply)
	c.mu.Lock()
	defer c.mu.Unlock()
	if vs := st.v; vs != nil {
		vs.left--
		vs.failed = vs.failed || err != nil
		if vs.left == 0 && !vs.failed && l.err == nil {
			l.value = vs.value
		}
	}
	if l.err != nil {
		return
	}
	switch {
	case err == nil:
		f := fields(rest)
		v, verr := f.uint("validity")
		if verr != nil {
			return
		}
		if ms == 0 {
			// The ttl stayed: the reply says what it is.
			if t, terr := f.uint("ttl"); terr == nil && t > 0 {
				ms = t
			}
		}
		if ms > 0 {
			l.ttl = time.Duration(ms) * time.Millisecond
		}
		l.confirmLocked(i, cl.sent, time.Duration(v)*time.Millisecond)
		c.touchLocked(l)
	case errors.Is(err, ErrLost):
		c.loseLocked(l, "lost")
	case errors.Is(err, ErrNotHeld):
		c.loseLocked(l, "gone")
	case errors.Is(err, ErrUnavailable):
		// Some nodes may have the shorter ttl now.
		if ms > 0 && time.Duration(ms)*time.Millisecond < l.ttl && cl.sent.Before(l.rd[i].deadline) {
			l.rd[i].deadline = cl.sent
			c.touchLocked(l)
		}
	}
}

// Context returns a context that is cancelled when parent is, or when the
// lease ends (lost, released, or its Client closed). Its Err is then
// context.Canceled wrapped with the lease's error: errors.Is(err,
// context.Canceled) and errors.Is(err, ErrLost) both hold for a lost lease.
func (l *Lease) Context(parent context.Context) context.Context {
	ctx, _ := l.context(parent)
	return ctx
}

func (l *Lease) context(parent context.Context) (context.Context, context.CancelFunc) {
	x := &leaseContext{Context: parent, done: make(chan struct{}), stop: make(chan struct{})}
	go func() {
		var err error
		select {
		case <-parent.Done():
			err = parent.Err()
		case <-l.done:
			err = &leaseEnded{l.Err()}
		case <-x.stop:
			err = context.Canceled
		}
		x.mu.Lock()
		x.err = err
		x.mu.Unlock()
		close(x.done)
	}()
	var once sync.Once
	return x, func() { once.Do(func() { close(x.stop) }) }
}

type leaseContext struct {
	context.Context // the parent: Deadline and Value
	done            chan struct{}
	stop            chan struct{}
	mu              sync.Mutex
	err             error
}

func (x *leaseContext) Done() <-chan struct{} { return x.done }

func (x *leaseContext) Err() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.err
}

// leaseEnded is a lease context's Err: context.Canceled, because of err.
type leaseEnded struct{ err error }

func (e *leaseEnded) Error() string        { return "context canceled: " + e.err.Error() }
func (e *leaseEnded) Unwrap() error        { return e.err }
func (e *leaseEnded) Is(target error) bool { return target == context.Canceled }
