package redlockd

// Taking locks: this client's own queue of the goroutines that want a
// resource, Lock, Do and the sync.Locker adapter. The options are
// options.go's; the queue's tickets and their order, core.go's.
//
// A session holds a resource at most once (the daemon answers ERR HELD to
// a second LOCK of it). So the goroutines of one Client that want the same
// resource queue here, first come first served, and only the one at the
// head of every queue its resources are in sends its LOCK; the daemon's
// own queue then orders it among other sessions. A request is enqueued on
// all its resources at once, under one lock, so two goroutines that lock
// overlapping sets in different orders never wait for each other in a
// circle.

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ---- this client's queue --------------------------------------------------

// queue waits for this client's turn on the resources: at once, or ErrBusy
// when another goroutine has them and there is no wait; else until
// waitEnd, ctx or Close.
func (c *Client) queue(ctx context.Context, resources []string, wait bool, waitEnd time.Time) (*ticket, error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil, ErrClosed
	}
	if !wait {
		for _, r := range resources {
			if len(c.queues[r]) > 0 {
				c.mu.Unlock()
				return nil, &Error{Code: "BUSY", Message: r + " is held by another goroutine of this client"}
			}
		}
	}
	t := c.enqueueLocked(resources)
	c.mu.Unlock()
	if t.ready == nil {
		return t, nil
	}
	timer := time.NewTimer(time.Until(waitEnd))
	defer timer.Stop()
	var err error
	select {
	case <-t.ready:
		return t, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = &Error{Code: "TIMEOUT", Message: "waited for another goroutine of this client holding " +
			strings.Join(resources, " ")}
	case <-c.ctx.Done():
		err = ErrClosed
	}
	c.mu.Lock()
	c.releaseTicketLocked(t)
	c.mu.Unlock()
	return nil, err
}

// ---- Lock -------------------------------------------------------------------

// lockState is shared by a LOCK's sender and its hook (the flags under
// c.mu).
type lockState struct {
	c         *Client
	t         *ticket
	resources []string
	o         *lockOptions
	handled   bool
	abandoned bool
	lease     *Lease
	err       error
}

func (st *lockState) replied(cl *call) { st.c.lockReplied(st, cl) }

// Lock takes a lock on resource (with Also, on several) and returns its
// Lease. Without Wait it tries once: ErrBusy when someone else holds it.
// With Wait it waits up to that long (ErrTimeout), and ctx may end the
// wait sooner (ctx's error; a LOCK the daemon grants after that is
// released at once). Other errors: ErrUnavailable (no quorum of Redis
// nodes, or no daemon reachable), ErrArg, ErrLimit, ErrDenied, ErrClosed.
// A connection lost meanwhile is re-established and the LOCK sent again.
func (c *Client) Lock(ctx context.Context, resource string, opts ...Option) (*Lease, error) {
	var o lockOptions
	for _, f := range opts {
		f(&o)
	}
	if o.err != nil {
		return nil, o.err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if o.value != nil && (o.shared || o.limit > 0) {
		return nil, fmt.Errorf("%w: Value is for exclusive locks: not with Shared or Limit", ErrArg)
	}
	resources := append(make([]string, 0, 1+len(o.also)), resource)
	resources = append(resources, o.also...)
	if len(resources) > maxMulti {
		return nil, fmt.Errorf("%w: at most %d resources in one LOCK", ErrArg, maxMulti)
	}
	for i, r := range resources {
		if err := checkResource(r); err != nil {
			return nil, err
		}
		for _, q := range resources[:i] {
			if q == r {
				return nil, fmt.Errorf("%w: resource %q named twice", ErrArg, r)
			}
		}
	}
	base := lockLine(resources, &o)

	// A connection is waited for Config.Timeout, or as long as the wait.
	var waitEnd, connUntil time.Time
	if o.wait > 0 {
		start := time.Now()
		waitEnd = start.Add(o.wait)
		if dl, ok := ctx.Deadline(); ok && dl.Before(waitEnd) {
			waitEnd = dl
		}
		if connUntil = start.Add(c.cfg.Timeout); waitEnd.After(connUntil) {
			connUntil = waitEnd
		}
	}
	t, err := c.queue(ctx, resources, o.wait > 0, waitEnd)
	if err != nil {
		return nil, err
	}
	lease, err := c.acquire(ctx, t, resources, &o, base, waitEnd, connUntil)
	if err != nil {
		return nil, err
	}
	return lease, nil
}

// lockLine is the LOCK request of the options, without wait=.
func lockLine(resources []string, o *lockOptions) string {
	b := make([]byte, 0, 64)
	b = append(b, "LOCK"...)
	for _, r := range resources {
		b = append(b, ' ')
		b = append(b, r...)
	}
	if o.ttl > 0 {
		b = append(b, " ttl="...)
		b = strconv.AppendUint(b, millis(o.ttl), 10)
	}
	if o.noRenew {
		b = append(b, " renew=0"...)
	}
	if o.shared {
		b = append(b, " mode=shared"...)
	}
	if o.limit > 0 {
		b = append(b, " limit="...)
		b = strconv.AppendUint(b, uint64(o.limit), 10)
	}
	if o.value != nil {
		b = append(b, " value="...)
		b = append(b, *o.value...)
	}
	return string(b)
}

// acquire sends the LOCK (again after a lost connection) for a ticket at
// the head of its queues. The ticket goes to the lease, or is released.
func (c *Client) acquire(ctx context.Context, t *ticket, resources []string, o *lockOptions,
	base string, waitEnd, connUntil time.Time) (*Lease, error) {
	heldOnce := false
	var last error
	for {
		cn, err := c.readyConn(ctx, &connUntil, true, nil)
		if err != nil {
			if last != nil && ctx.Err() == nil && !errors.Is(err, ErrClosed) {
				err = last
			}
			c.mu.Lock()
			c.releaseTicketLocked(t)
			c.mu.Unlock()
			return nil, err
		}
		line := base
		var waitMs uint64
		if !waitEnd.IsZero() {
			// The wait left (1 ms when it is used up after a reconnection:
			// one more try, answered TIMEOUT if it fails).
			if waitMs = millis(time.Until(waitEnd)); waitMs == 0 {
				waitMs = 1
			}
			line += " wait=" + itoa(waitMs)
			c.mu.Lock()
			if waitEnd.After(c.maxWaitEnd) {
				c.maxWaitEnd = waitEnd
			}
			c.mu.Unlock()
		}
		st := &lockState{c: c, t: t, resources: resources, o: o}
		cl := cn.start(line, true, c.cfg.Timeout+time.Duration(waitMs)*time.Millisecond, st)
		werr := cn.wait(ctx, cl)
		c.mu.Lock()
		if !st.handled {
			// ctx ended: the hook gives back what the daemon grants.
			st.abandoned = true
			c.mu.Unlock()
			return nil, werr
		}
		c.mu.Unlock()
		if st.lease != nil {
			return c.confirmGrant(ctx, st.lease)
		}
		err = st.err
		switch {
		case cl.err != nil && ctx.Err() == nil:
			last = err
			continue // the connection was lost: again on the next one
		case errors.Is(err, ErrHeld) && !heldOnce:
			// The session holds it, though no lease here does: a lease
			// lost by its deadline, or a LOCK whose reply a lost
			// connection ate. Ours to give back, since this ticket
			// heads the queue.
			heldOnce = true
			c.unlockAll(ctx, cn, resources, c.cfg.Timeout)
			continue
		case errors.Is(err, ErrShutdown) && ctx.Err() == nil:
			// The daemon is stopping: the next connection will do.
			cn.setShutdown()
			last = err
			continue
		}
		c.mu.Lock()
		c.releaseTicketLocked(t)
		c.mu.Unlock()
		return nil, err
	}
}

// lockReplied is the LOCK's hook: it makes the lease at once, on the
// reader's goroutine, so that an EVENT LOST right after the grant finds
// it, and gives the lease back if the caller has left.
func (c *Client) lockReplied(st *lockState, cl *call) {
	var l *Lease
	t := st.t
	err := cl.err
	if err == nil {
		var rest string
		if rest, err = okReply(cl.reply); err == nil {
			l, err = c.newLease(t, st.resources, st.o, rest, cl.sent)
		}
	}
	c.mu.Lock()
	st.handled = true
	st.lease, st.err = l, err
	abandoned := st.abandoned
	if l != nil {
		c.registerLocked(l)
	} else if abandoned {
		c.releaseTicketLocked(t)
	}
	c.mu.Unlock()
	if l != nil && abandoned {
		go l.Unlock(context.Background())
	}
}

// newLease reads a LOCK's OK reply.
func (c *Client) newLease(t *ticket, resources []string, o *lockOptions, rest string, sent time.Time) (*Lease, error) {
	f := fields(rest)
	if n, ok := f.get("resources"); ok {
		if n != itoa(uint64(len(resources))) {
			return nil, protoErr("LOCK of %d resources answered resources=%s", len(resources), n)
		}
	} else if len(resources) != 1 || f.str("resource") != resources[0] {
		return nil, protoErr("LOCK reply for another resource: %.80q", rest)
	}
	fence, err := f.uint("fence")
	if err != nil {
		return nil, err
	}
	ttl, err := f.uint("ttl")
	if err != nil {
		return nil, err
	}
	validity, err := f.uint("validity")
	if err != nil {
		return nil, err
	}
	token := f.str("token")
	if token == "" {
		return nil, protoErr("LOCK reply without token=")
	}
	l := &Lease{
		c: c, resources: resources, fence: fence, renew: !o.noRenew,
		mode: "exclusive", slot: -1, t: t, done: make(chan struct{}), hidx: -1,
		token: token, ttl: time.Duration(ttl) * time.Millisecond,
		rd: make([]confirmation, len(resources)),
	}
	if o.value != nil {
		l.value = *o.value
	}
	if m := f.str("mode"); m != "" {
		l.mode = m
	}
	if _, ok := f.get("limit"); ok {
		k, err := f.uint("limit")
		if err != nil {
			return nil, err
		}
		s, err := f.uint("slot")
		if err != nil {
			return nil, err
		}
		l.limit, l.slot = int(k), int(s)
	}
	for i := range l.rd {
		l.rd[i] = confirmation{sent: sent, deadline: sent.Add(time.Duration(validity) * time.Millisecond)}
	}
	l.deadline = l.rd[0].deadline
	if time.Until(l.deadline) < time.Duration(validity)*time.Millisecond/2 {
		// Granted after a long wait: confirmed by LOCKS first (the
		// protocol's deadline rule).
		l.unconfirmed = true
		l.confirmed = make(chan struct{})
	}
	return l, nil
}

// confirmGrant returns a granted lease once it is confirmed: at once, or
// for a grant that waited in the daemon for more than half its validity
// (its deadline, counted from the LOCK's send, near or past) once the
// keeper's LOCKS, sent at once, reports its validity. Within ctx and
// Config.Timeout; else the lease is given back.
func (c *Client) confirmGrant(ctx context.Context, l *Lease) (*Lease, error) {
	c.mu.Lock()
	pending, ch := l.unconfirmed, l.confirmed
	c.mu.Unlock()
	if !pending {
		return l, nil
	}
	timer := time.NewTimer(c.cfg.Timeout)
	defer timer.Stop()
	var err error
	select {
	case <-ch:
		return l, nil
	case <-l.done:
		return nil, l.Err()
	case <-ctx.Done():
		err = ctx.Err()
	case <-timer.C:
		err = &ConnError{Err: errors.New("a lock granted after a long wait was not confirmed in time (LOCKS)")}
	}
	go l.Unlock(context.Background())
	return nil, err
}

// ---- Do -------------------------------------------------------------------------

// Do locks resource (with the options of Lock), runs fn with a context
// that is cancelled if the lease is lost, and unlocks. It returns fn's
// error; else a *LostError if the lease was lost while fn ran (fn may
// have overlapped another holder); else Unlock's error. The lock follows
// its lease across lost connections and daemons (see Client): a failover
// does not cancel fn as long as the lease's deadline holds.
func (c *Client) Do(ctx context.Context, resource string, fn func(ctx context.Context) error, opts ...Option) error {
	l, err := c.Lock(ctx, resource, opts...)
	if err != nil {
		return err
	}
	lctx, cancel := l.context(ctx)
	defer func() {
		if r := recover(); r != nil {
			cancel()
			_ = l.Unlock(context.Background())
			panic(r)
		}
	}()
	ferr := fn(lctx)
	cancel()
	lost := l.Err()
	uerr := l.Unlock(context.Background())
	switch {
	case ferr != nil:
		return ferr
	case lost != nil:
		return lost
	}
	return uerr
}

// ---- sync.Locker ---------------------------------------------------------------

// Mutex is a lock on one resource for code that wants a sync.Locker (or
// redsync's Lock/Unlock pair): NewMutex.
type Mutex struct {
	c        *Client
	resource string
	opts     []Option

	mu    sync.Mutex
	lease *Lease
}

// NewMutex returns a Mutex on resource, taken with the given options.
// Without a Wait option Lock waits in steps of a minute until it has the
// lock.
func (c *Client) NewMutex(resource string, opts ...Option) *Mutex {
	return &Mutex{c: c, resource: resource, opts: append([]Option{Wait(time.Minute)}, opts...)}
}

// Locker returns NewMutex(resource, opts...) as a sync.Locker.
func (c *Client) Locker(resource string, opts ...Option) sync.Locker {
	return c.NewMutex(resource, opts...)
}

// LockContext takes the lock, waiting until it has it (ErrTimeout and
// ErrBusy only make it try again) or until ctx ends.
func (m *Mutex) LockContext(ctx context.Context) error {
	for {
		l, err := m.c.Lock(ctx, m.resource, m.opts...)
		if err == nil {
			m.mu.Lock()
			m.lease = l
			m.mu.Unlock()
			return nil
		}
		if (errors.Is(err, ErrTimeout) || errors.Is(err, ErrBusy)) && ctx.Err() == nil {
			continue
		}
		return err
	}
}

// UnlockContext releases the lock; like Lease.Unlock, it returns a
// *LostError if the lease had been lost.
func (m *Mutex) UnlockContext(ctx context.Context) error {
	m.mu.Lock()
	l := m.lease
	m.lease = nil
	m.mu.Unlock()
	if l == nil {
		return fmt.Errorf("%w: unlock of an unlocked redlockd.Mutex on %s", ErrNotHeld, m.resource)
	}
	return l.Unlock(ctx)
}

// Lock is sync.Locker's: it waits until it has the lock, and panics if it
// cannot be had for another reason than contention or a daemon out of
// reach (the Client closed, a refusal such as ErrDenied), as etcd's
// NewLocker does.
func (m *Mutex) Lock() {
	for {
		err := m.LockContext(context.Background())
		if err == nil {
			return
		}
		if !errors.Is(err, ErrUnavailable) || errors.Is(err, ErrClosed) {
			panic(err)
		}
		time.Sleep(reconnectMax)
	}
}

// Unlock is sync.Locker's. A lease that was lost is let go silently (use
// Lease().Done() to hear of it); unlocking an unlocked Mutex panics.
func (m *Mutex) Unlock() {
	if m.Lease() == nil {
		panic("redlockd: unlock of an unlocked Mutex on " + m.resource)
	}
	_ = m.UnlockContext(context.Background())
}

// Lease is the lease the Mutex holds now, or nil.
func (m *Mutex) Lease() *Lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lease
}
