package redlockd

// The options of Lock (and of Do, NewMutex and Status, which take them
// too): what a LOCK request asks for besides its resources.

import (
	"fmt"
	"time"
)

// Option is an option of Lock, Do and NewMutex.
type Option func(*lockOptions)

type lockOptions struct {
	ttl     time.Duration
	wait    time.Duration
	shared  bool
	limit   int
	also    []string
	noRenew bool
	value   *string
	err     error
}

// TTL sets the lease on the Redis nodes (LOCK ttl=; the daemon's default,
// 30 s, without it). The daemon renews it while the session lives, so the
// ttl bounds how long the lock outlives a daemon that died, and how long a
// failover may take.
func TTL(d time.Duration) Option {
	return func(o *lockOptions) {
		if d <= 0 {
			o.err = fmt.Errorf("%w: TTL must be above 0", ErrArg)
		}
		o.ttl = d
	}
}

// Wait makes Lock wait up to d for the lock (first come first served,
// among this client's goroutines and then among the daemon's waiters)
// instead of answering ErrBusy at once. The ctx of Lock may end the wait
// earlier. d is at most the daemon's locks.max_wait_ms (1 h by default).
func Wait(d time.Duration) Option {
	return func(o *lockOptions) {
		if d < 0 {
			o.err = fmt.Errorf("%w: Wait must not be negative", ErrArg)
		}
		o.wait = d
	}
}

// Shared takes the lock in shared mode (readers/writer): any number of
// shared holders, or one exclusive. One Client holds a resource once: its
// goroutines queue for it whatever the mode (use a Client each for
// several shared holders in one process).
func Shared() Option { return func(o *lockOptions) { o.shared = true } }

// Limit makes the resource a semaphore of k slots: at most k holders.
// Every holder must use the same k.
func Limit(k int) Option {
	return func(o *lockOptions) {
		if k < 1 {
			o.err = fmt.Errorf("%w: Limit must be at least 1", ErrArg)
		}
		o.limit = k
	}
}

// Also locks more resources with the first, all or none (exclusive only,
// at most the daemon's locks.max_multi, 16, in all): one lease, one token,
// one fence.
func Also(resources ...string) Option {
	return func(o *lockOptions) { o.also = append(o.also, resources...) }
}

// NoRenew asks the daemon not to renew the lease (LOCK renew=0): it
// expires after its TTL unless extended (Lease.Extend).
func NoRenew() Option { return func(o *lockOptions) { o.noRenew = true } }

// Value stores a value with the holder (LOCK value=): an address, say,
// that Status (Holder.Value), Locks and watchers (HolderEvent.Value) show
// on every daemon, as etcd's Campaign value. 1 to the daemon's
// locks.max_value_len (256 by default) visible ASCII characters, no
// spaces. Exclusive locks only (with Also too: each resource carries it);
// with Shared or Limit, Lock refuses it (ErrArg). Lease.SetValue replaces
// it while the lock is held.
func Value(v string) Option {
	return func(o *lockOptions) {
		if err := checkValue(v); err != nil {
			o.err = err
		}
		o.value = &v
	}
}
