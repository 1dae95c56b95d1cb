package redlockd

// The Client's core: the state that its goroutines share (the Client,
// its leases, its Watchers, this client's queue of the goroutines that
// want a resource) and the few helpers that every part above uses: waking
// whoever waits for a change, waiting for a ready connection, a request
// that changes nothing, UNLOCK of what no lease knows.
//
// The types are declared here and their behaviour in the files above it:
// lease.go (a lease's deadline, Unlock, Extend), watch.go (Watch),
// lock.go (the queue's waits, Lock, Do, Mutex), status.go (STATUS,
// LOCKS), session.go (the keeper: refresh, reconnect, resume, adopt; the
// daemon's events) and client.go (Dial, Close). Below it: options.go (the
// options of Lock), conn.go (one connection), proto.go (the lines) and
// errors.go.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"
)

const (
	// Config's defaults (Detach, Timeout).
	defaultDetach  = 30 * time.Second
	defaultTimeout = 10 * time.Second
	// The backoff between rounds of reconnection attempts (session.go);
	// Mutex.Lock waits reconnectMax before it tries again (lock.go).
	reconnectMin = 50 * time.Millisecond
	reconnectMax = time.Second
)

// ---- the Client ----------------------------------------------------------

// Config says where the daemons are and how to log in. Only Servers is
// commonly set; the zero value of every other field is a sensible default.
type Config struct {
	// Servers: daemon addresses, tried in order at Dial; the others are for
	// failover. HOST:PORT, tcp://HOST:PORT, [IPV6]:PORT, tls://HOST:PORT,
	// unix:/PATH or /PATH (the port defaults to 7390). Empty: the
	// comma-separated list in $REDLOCKD_SERVER, else 127.0.0.1:7390.
	Servers []string
	// Name labels the session in the daemon's SESSIONS, STATUS and logs
	// (HELLO name=; 1 to 64 visible ASCII characters).
	Name string
	// Password is sent with AUTH (again on every new session); with User,
	// as AUTH <user> <password> for a user of the daemon's auth.users.
	Password string
	User     string
	// TLS for tls:// servers (nil: the system's CAs). ServerName defaults
	// to the address's host; TLS 1.2 at least.
	TLS *tls.Config
	// Detach: how long the daemon keeps the session's leases after its
	// connection is lost, for a resume (HELLO detach=). 0 means 30 s; a
	// negative value turns it off (a lost connection then needs ADOPT).
	// At most the daemon's limits.max_detach_ms (default 60 s); a daemon
	// that refuses it is used without.
	Detach time.Duration
	// Timeout bounds connecting, each reply (a LOCK's reply may take its
	// Wait longer), and how long a request waits for a lost connection to
	// come back. 0 means 10 s.
	Timeout time.Duration
}

// Client is one session with redlockd over one connection at a time. It is
// safe for concurrent use by many goroutines: their requests are tagged
// and in flight together on the one connection.
type Client struct {
	cfg      Config
	servers  []serverAddr
	detachMs uint64
	ctx      context.Context // ends at Close: stops the keeper's work
	cancel   context.CancelFunc

	poke       chan struct{} // wakes the keeper
	keeperDone chan struct{}

	mu      sync.Mutex
	cn      *conn // the current connection (ready, or being set up), or nil
	ready   bool
	changed chan struct{} // closed and replaced when ready, closed or adoptions change
	closed  bool

	session   string
	secret    string // resumes the session: never shown
	sessionAt int    // the server the session lives on
	server    int    // the server of the current (or last) connection

	leases map[string]*Lease    // by resource: live leases, and those being released
	queues map[string][]*ticket // by resource: this client's holders and waiters, in order

	// The live leases by deadline, and the timer that ends them there.
	deadlines leaseHeap
	dlTimer   *time.Timer
	dlAt      time.Time // when dlTimer fires (zero: not armed)

	retryAt    time.Time // the next reconnection attempt (not ready)
	backoff    time.Duration
	resumeCuts int       // resumes in a row cut short after connecting
	adoptAt    time.Time // the next try of leases ERR UNAVAILABLE refused to adopt
	wakeAt     time.Time // when the keeper means to wake (zero: when poked)
	lastErr    error
	maxWaitEnd time.Time // the latest end of a LOCK wait sent (bounds Close's QUIT)

	// Watching (watch.go): watchMu orders WATCH and UNWATCH on the wire
	// (taken before mu); the rest under mu.
	watchMu      sync.Mutex
	watches      map[string]map[*Watcher]struct{} // by resource: its Watchers
	unwatchLater map[string]bool                  // UNWATCH to send after a resume
	pingAt       time.Time                        // the keeper's next PING while watching
}

// ---- a lease's state (its behaviour: lease.go) -----------------------------

// Lease is a lock held through a Client. Its methods are safe for
// concurrent use.
type Lease struct {
	c         *Client
	resources []string
	fence     uint64
	mode      string
	limit     int
	slot      int
	renew     bool
	t         *ticket // this client's hold of the resources (released at the end)
	done      chan struct{}

	// Under c.mu:
	token      string
	ttl        time.Duration
	value      string         // the holder's value (Value, SetValue), "" without
	rd         []confirmation // by resource
	deadline   time.Time      // the earliest of rd
	hidx       int            // its index in Client.deadlines (-1: not there)
	err        error          // nil while held: a *LostError, ErrReleased
	needsAdopt bool           // its session was left behind: ADOPT it
	releasing  bool           // an UNLOCK is on its way
	// unconfirmed: a grant that waited in the daemon for more than half its
	// validity, so that its deadline, counted from the LOCK's send, is near
	// or past: the keeper's LOCKS confirms it (then confirmed closes) before
	// Lock returns it. Not in Client.deadlines meanwhile.
	unconfirmed bool
	confirmed   chan struct{}
}

// confirmation: the newest request that confirmed one resource of a lease.
type confirmation struct {
	sent     time.Time
	deadline time.Time
}

// The leases by deadline: a min-heap watched by one timer, which fires at
// the earliest deadline (or earlier: it is moved forward only, and set
// again when it fires).
type leaseHeap []*Lease

func (h leaseHeap) Len() int            { return len(h) }
func (h leaseHeap) Less(i, j int) bool  { return h[i].deadline.Before(h[j].deadline) }
func (h leaseHeap) Swap(i, j int)       { h[i], h[j] = h[j], h[i]; h[i].hidx = i; h[j].hidx = j }
func (h *leaseHeap) Push(x interface{}) { l := x.(*Lease); l.hidx = len(*h); *h = append(*h, l) }
func (h *leaseHeap) Pop() interface{} {
	old := *h
	l := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	l.hidx = -1
	return l
}

// ---- a Watcher's state (its behaviour: watch.go) ---------------------------

// HolderEvent is who holds a watched resource (EVENT HOLDER): its state
// when the watch began, and again after each change.
type HolderEvent struct {
	Resource string
	// Held counts the holders: 0 when the resource is free, 1 for an
	// exclusive holder (or another Redlock client's key), the number of
	// shared holders, or a semaphore's used slots.
	Held int
	// Mode is "exclusive", "shared" or "semaphore"; "" when free or
	// foreign.
	Mode string
	// An exclusive holder's Fence, Name (its Config.Name, "" without one),
	// Daemon (the id of the daemon it holds the lock through) and Value
	// (set with Value or Lease.SetValue, "" without one).
	Fence  uint64
	Name   string
	Daemon string
	Value  string
	// Foreign: the key was set by another Redlock client (Held is 1;
	// nothing else is known of it).
	Foreign bool
	// Limit is a semaphore's size (Mode "semaphore").
	Limit int
}

// parseHolder reads the words of an EVENT HOLDER line; false when it
// lacks resource= or held=.
func parseHolder(f fields) (HolderEvent, bool) {
	ev := HolderEvent{Resource: f.str("resource")}
	held, err := f.uint("held")
	if ev.Resource == "" || err != nil {
		return ev, false
	}
	ev.Held = int(held)
	ev.Mode = f.str("mode")
	if v, ok := f.get("fence"); ok {
		ev.Fence, _ = strconv.ParseUint(v, 10, 64)
	}
	ev.Name = f.str("name")
	ev.Daemon = f.str("daemon")
	ev.Value = f.str("value")
	ev.Foreign = f.str("foreign") == "1"
	if v, ok := f.get("limit"); ok {
		ev.Limit, _ = strconv.Atoi(v)
	}
	return ev, true
}

// Watcher receives the holder changes of the resources given to Watch.
// Its methods are safe for concurrent use.
type Watcher struct {
	c         *Client
	resources []string
	ch        chan HolderEvent
	wake      chan struct{} // a state is pending (capacity 1)
	stop      chan struct{} // closed when the Watcher ends

	mu      sync.Mutex
	pending map[string]HolderEvent // the latest state not yet handed over, by resource
	order   []string               // the resources of pending, in the order they came
	ended   bool
	err     error
}

// ---- this client's queue (why it queues, and its waits: lock.go) -----------

// ticket is one goroutine's place in the queues of its resources.
type ticket struct {
	resources []string
	ready     chan struct{} // closed when at the head of every queue (nil: it was at once)
	blocked   int           // queues where it is not at the head yet
	released  bool
}

// enqueueLocked puts a ticket at the end of each of its resources' queues.
func (c *Client) enqueueLocked(resources []string) *ticket {
	t := &ticket{resources: resources}
	for _, r := range resources {
		q := c.queues[r]
		if len(q) > 0 {
			t.blocked++
		}
		c.queues[r] = append(q, t)
	}
	if t.blocked > 0 {
		t.ready = make(chan struct{})
	}
	return t
}

// releaseTicketLocked takes a ticket out of its queues; the next in each
// moves up.
func (c *Client) releaseTicketLocked(t *ticket) {
	if t == nil || t.released {
		return
	}
	t.released = true
	for _, r := range t.resources {
		q := c.queues[r]
		for i, x := range q {
			if x != t {
				continue
			}
			q = append(q[:i], q[i+1:]...)
			if i == 0 && len(q) > 0 {
				n := q[0]
				if n.blocked--; n.blocked == 0 {
					close(n.ready)
				}
			}
			break
		}
		if len(q) == 0 {
			delete(c.queues, r)
		} else {
			c.queues[r] = q
		}
	}
}

// ---- helpers ---------------------------------------------------------------

// broadcastLocked wakes every goroutine waiting for a change of state.
func (c *Client) broadcastLocked() {
	close(c.changed)
	c.changed = make(chan struct{})
}

// pokeKeeper wakes the keeper (session.go) to look at the state again.
func (c *Client) pokeKeeper() {
	select {
	case c.poke <- struct{}{}:
	default:
	}
}

// wakeForLocked: a lease's refresh is due then; the keeper may have to
// wake earlier for it.
func (c *Client) wakeForLocked(due time.Time) {
	if c.wakeAt.IsZero() || due.Before(c.wakeAt) {
		c.wakeAt = due
		c.pokeKeeper()
	}
}

// readyConn returns the connection once it is ready (for a LOCK, one whose
// daemon is not shutting down; for a request about lease l, one whose
// session holds l: adopted), waiting at most until *until (a zero one
// becomes Config.Timeout from the first wait: the retries of a request
// share it) and ctx. A lease that ends meanwhile returns its error.
func (c *Client) readyConn(ctx context.Context, until *time.Time, forLock bool, l *Lease) (*conn, error) {
	var timer *time.Timer
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		if l != nil && l.err != nil {
			err := l.err
			c.mu.Unlock()
			return nil, err
		}
		if c.ready && !(forLock && c.cn.isShutdown()) && (l == nil || !l.needsAdopt) {
			cn := c.cn
			c.mu.Unlock()
			return cn, nil
		}
		ch, last := c.changed, c.lastErr
		if c.ready {
			// Ready, but l waits for its ADOPT (ERR UNAVAILABLE put it
			// off): the keeper tries again now.
			last = fmt.Errorf("%w: the lease is not adopted by a daemon yet", ErrUnavailable)
			c.pokeKeeper()
		}
		c.mu.Unlock()
		if timer == nil {
			if until.IsZero() {
				*until = time.Now().Add(c.cfg.Timeout)
			}
			timer = time.NewTimer(time.Until(*until))
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-timer.C:
			if last == nil {
				last = errors.New("reconnecting")
			}
			return nil, &ConnError{Err: fmt.Errorf("not connected in time: %w", last)}
		}
	}
}

// connLost is told by a connection that it ended (the Client is its
// connOwner: conn.go).
func (c *Client) connLost(cn *conn) {
	cn.mu.Lock()
	forget := cn.shutdown || cn.closing == "shutdown" || cn.closing == "resumed"
	err := cn.err
	cn.mu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cn != cn {
		return
	}
	c.cn = nil
	c.ready = false
	c.lastErr = err
	if forget {
		// A daemon that shut down (or whose session another connection
		// took) resumes nothing: the leases go by ADOPT.
		c.forgetSessionLocked()
	}
	if c.retryAt.IsZero() || c.retryAt.Before(time.Now()) {
		c.retryAt = time.Now().Add(c.backoff)
	}
	c.broadcastLocked()
	c.pokeKeeper()
}

// forgetSessionLocked: the session is not to be resumed; its leases go to
// a new one by ADOPT.
func (c *Client) forgetSessionLocked() {
	c.session, c.secret = "", ""
}

// request sends one tagged request that changes nothing (PING, STATUS,
// LOCKS...) and returns its reply; sent again once if the connection is
// lost under it.
func (c *Client) request(ctx context.Context, line string) (string, error) {
	var until time.Time
	for attempt := 0; ; attempt++ {
		cn, err := c.readyConn(ctx, &until, false, nil)
		if err != nil {
			return "", err
		}
		cl, err := cn.roundtrip(ctx, line, true, c.cfg.Timeout)
		if err == nil {
			return cl.reply, nil
		}
		var cerr *ConnError
		if attempt > 0 || !errors.As(err, &cerr) || ctx.Err() != nil {
			return "", err
		}
	}
}

// unlockAll sends UNLOCK of each resource (one request each, all in
// flight together) and waits for the answers, which change nothing here:
// what the session holds and no lease knows (session.go's LOCKS, lock.go's
// ERR HELD).
func (c *Client) unlockAll(ctx context.Context, cn *conn, resources []string, limit time.Duration) {
	calls := make([]*call, len(resources))
	for i, r := range resources {
		calls[i] = cn.start("UNLOCK "+r, true, limit, nil)
	}
	for _, cl := range calls {
		_ = cn.wait(ctx, cl)
	}
}
