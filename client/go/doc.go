// Package redlockd is the Go client of redlockd, a lock service that runs
// the Redlock algorithm over N Redis nodes and speaks a small line
// protocol (docs/protocol.md in the redlockd repository).
//
// A Client is one session with the daemon over one connection, shared by
// every goroutine of the program: each request is tagged, so that many are
// in flight at once. Goroutines of one Client that want the same resource
// queue in the client, first come first served; the daemon orders the
// Client among other sessions.
//
//	c, err := redlockd.Dial(ctx, redlockd.Config{Servers: []string{"127.0.0.1:7390"}})
//	...
//	defer c.Close()
//	err = c.Do(ctx, "job:42", func(ctx context.Context) error {
//		// ctx is cancelled if the lock is lost
//		return work(ctx)
//	}, redlockd.TTL(10*time.Second), redlockd.Wait(5*time.Second))
//
// Leases follow the protocol's deadline rule: a lease's Deadline is the
// time its last confirming request was sent plus the validity the reply
// reported, and the Client confirms every lease at least every third of
// its ttl. Done is closed when the lease is lost or its deadline passes
// unconfirmed; stop working under it then.
//
// Failover: with several Servers the session is detachable (HELLO
// detach=). A lost connection is re-established in the background: the
// session is resumed on its daemon, or its leases are adopted (ADOPT) by a
// new session on another daemon (or the restarted one) while their
// deadlines hold. The fence stays the same, the token changes; Done does
// not close.
//
// Leader election: a holder stores a value with its lock (the Value
// option: an address, say) and replaces it while it holds the lock
// (Lease.SetValue); Status shows it, and Watch returns a Watcher whose
// channel has who holds each resource watched, now and after each change
// (a HolderEvent), on every daemon of the same Redis nodes. A Watcher
// keeps the latest state of each resource its reader has not taken, so a
// slow reader never stalls the Client; it follows the Client across lost
// connections and daemons.
//
// Errors compare with errors.Is against ErrBusy, ErrTimeout, ErrLost,
// ErrUnavailable, ErrDenied and the other Err values; an ERR reply is an
// *Error that keeps the daemon's message.
package redlockd
