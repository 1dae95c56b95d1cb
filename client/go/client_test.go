package redlockd

// The API against the shared daemon (TestMain): locks, errors, waiting,
// this client's own queue, cancellation, the lock kinds, inspection.

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func dial(t testing.TB, cfg Config) *Client {
	t.Helper()
	if len(cfg.Servers) == 0 {
		cfg.Servers = []string{sharedServer(t)}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Dial(ctx, cfg)
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func bg() context.Context { return context.Background() }

// eventually polls cond every 10 ms for up to d.
func eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	end := time.Now().Add(d)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("not within %v: %s", d, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

var hex32 = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestLockUnlock(t *testing.T) {
	c := dial(t, Config{Name: "go-test"})
	r := res(t, "x")
	before := time.Now()
	l, err := c.Lock(bg(), r, TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l.Resource() != r || len(l.Resources()) != 1 || l.Fence() == 0 || !hex32.MatchString(l.Token()) {
		t.Fatalf("lease %v token %q", l, l.Token())
	}
	if l.Mode() != "exclusive" || l.Limit() != 0 || l.Slot() != -1 || l.TTL() != 10*time.Second {
		t.Fatalf("mode %q limit %d slot %d ttl %v", l.Mode(), l.Limit(), l.Slot(), l.TTL())
	}
	if d := l.Deadline(); d.Before(before.Add(9*time.Second)) || d.After(time.Now().Add(10*time.Second)) {
		t.Fatalf("deadline %v, %v after the send", d, d.Sub(before))
	}
	if l.Err() != nil || closed(l.Done()) {
		t.Fatal("a new lease is not held")
	}
	st, err := c.Status(bg(), r)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Held || st.Holder == nil || st.Holder.Name != "go-test" || st.Holder.Fence != l.Fence() ||
		st.Holder.Session != c.Session() || st.Mode != "exclusive" || len(st.Nodes) != 3 {
		t.Fatalf("STATUS: %s", st.Raw)
	}
	locks, err := c.Locks(bg())
	if err != nil || len(locks) != 1 || locks[0].Resource != r || locks[0].Fence != l.Fence() {
		t.Fatalf("LOCKS: %+v %v", locks, err)
	}
	if err := l.Unlock(bg()); err != nil {
		t.Fatal(err)
	}
	if l.Err() != ErrReleased || !closed(l.Done()) {
		t.Fatalf("after Unlock: %v", l.Err())
	}
	if err := l.Unlock(bg()); err != nil {
		t.Fatalf("a second Unlock: %v", err)
	}
	if err := l.Extend(bg(), time.Second); !errors.Is(err, ErrReleased) {
		t.Fatalf("Extend after Unlock: %v", err)
	}
	if st, err = c.Status(bg(), r); err != nil || st.Held {
		t.Fatalf("STATUS after UNLOCK: %v %s", err, st.Raw)
	}
	if err := c.Ping(bg()); err != nil {
		t.Fatal(err)
	}
}

func TestBusyTimeoutAndErrors(t *testing.T) {
	a := dial(t, Config{})
	b := dial(t, Config{})
	r := res(t, "x")
	la, err := a.Lock(bg(), r)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Lock(bg(), r)
	var rerr *Error
	if !errors.Is(err, ErrBusy) || !errors.As(err, &rerr) || rerr.Code != "BUSY" ||
		!strings.Contains(err.Error(), r) {
		t.Fatalf("want ERR BUSY naming %s, got %v", r, err)
	}
	start := time.Now()
	_, err = b.Lock(bg(), r, Wait(300*time.Millisecond))
	if !errors.Is(err, ErrTimeout) || time.Since(start) < 250*time.Millisecond {
		t.Fatalf("want ERR TIMEOUT after the wait, got %v after %v", err, time.Since(start))
	}
	go func() {
		time.Sleep(100 * time.Millisecond)
		la.Unlock(bg())
	}()
	lb, err := b.Lock(bg(), r, Wait(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if lb.Fence() <= la.Fence() {
		t.Fatalf("fences %d then %d", la.Fence(), lb.Fence())
	}
	lb.Unlock(bg())

	// Refused before anything is sent.
	for _, bad := range []string{"", "a b", "a=b", "caf\u00e9", strings.Repeat("x", 2000)} {
		if _, err := a.Lock(bg(), bad); !errors.Is(err, ErrArg) {
			t.Errorf("Lock(%q): %v", bad, err)
		}
	}
	if _, err := a.Lock(bg(), r, Also(r)); !errors.Is(err, ErrArg) {
		t.Errorf("a resource twice: %v", err)
	}
	for _, opts := range [][]Option{
		{Value("")}, {Value("a b")}, {Value("caf\u00e9")}, {Value("a\nb")},
		{Value(strings.Repeat("v", 5000))}, {Value("x"), Shared()}, {Limit(2), Value("x")},
	} {
		if _, err := a.Lock(bg(), r, opts...); !errors.Is(err, ErrArg) {
			t.Errorf("a bad Value: %v", err)
		}
	}
	if _, err := a.Lock(bg(), r, TTL(-1)); !errors.Is(err, ErrArg) {
		t.Errorf("TTL(-1): %v", err)
	}
	// Refused by the daemon, its message kept.
	_, err = a.Lock(bg(), r, TTL(time.Millisecond))
	if !errors.Is(err, ErrArg) || !errors.As(err, &rerr) || rerr.Message == "" ||
		!strings.Contains(err.Error(), rerr.Message) {
		t.Errorf("ttl=1: %v", err)
	}
	if _, err := Dial(bg(), Config{Servers: []string{"host:0"}}); !errors.Is(err, ErrArg) {
		t.Errorf("port 0: %v", err)
	}
	_, err = Dial(bg(), Config{Servers: []string{"127.0.0.1:1"}, Timeout: time.Second})
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrConnection) {
		t.Errorf("nobody there: %v", err)
	}
}

func TestServerAddresses(t *testing.T) {
	good := map[string]serverAddr{
		"127.0.0.1:7390":       {network: "tcp", addr: "127.0.0.1:7390"},
		"tcp://db-1.lan":       {network: "tcp", addr: "db-1.lan:7390"},
		"tls://example.com:99": {network: "tcp", addr: "example.com:99", tls: true},
		"[::1]:80":             {network: "tcp", addr: "[::1]:80"},
		"[fe80::1%eth0]":       {network: "tcp", addr: "[fe80::1%eth0]:7390"},
		"unix:/run/r.sock":     {network: "unix", addr: "/run/r.sock"},
		"unix:///run/r.sock":   {network: "unix", addr: "/run/r.sock"},
		"/run/r.sock":          {network: "unix", addr: "/run/r.sock"},
	}
	for in, want := range good {
		a, err := parseServer(in)
		if err != nil || a.network != want.network || a.addr != want.addr || a.tls != want.tls {
			t.Errorf("%q: %+v %v", in, a, err)
		}
	}
	for _, in := range []string{"host:0", "host:65536", "host:123456", "[1.2.3.4]:1", "::1", "unix:rel", "a_b:1", ":80", "host:-1"} {
		if _, err := parseServer(in); err == nil {
			t.Errorf("%q accepted", in)
		}
	}
}

// Two goroutines of one Client that want the same resource queue in the
// client: nobody sees HELD.
func TestSameClientQueues(t *testing.T) {
	c := dial(t, Config{})
	r := res(t, "x")
	l1, err := c.Lock(bg(), r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Lock(bg(), r); !errors.Is(err, ErrBusy) {
		t.Fatalf("no wait: want BUSY, got %v", err)
	}
	got := make(chan *Lease)
	errc := make(chan error, 3)
	order := make(chan int, 3)
	for i := 1; i <= 3; i++ {
		i := i
		go func() {
			l, err := c.Lock(bg(), r, Wait(10*time.Second))
			if err != nil {
				errc <- err
				return
			}
			order <- i
			got <- l
		}()
		time.Sleep(50 * time.Millisecond) // in this order
	}
	time.Sleep(100 * time.Millisecond)
	if len(order) != 0 {
		t.Fatal("a waiter got the lock while it was held")
	}
	l1.Unlock(bg())
	prev := l1.Fence()
	for i := 1; i <= 3; i++ {
		select {
		case err := <-errc:
			t.Fatal(err)
		case l := <-got:
			if n := <-order; n != i {
				t.Fatalf("waiter %d served %d-th", n, i)
			}
			if l.Fence() <= prev {
				t.Fatalf("fence %d after %d", l.Fence(), prev)
			}
			prev = l.Fence()
			l.Unlock(bg())
		case <-time.After(10 * time.Second):
			t.Fatal("a waiter never got the lock")
		}
	}
	// A wait that ends while another goroutine of the client holds it.
	l, _ := c.Lock(bg(), r)
	if _, err := c.Lock(bg(), r, Wait(100*time.Millisecond)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("want TIMEOUT, got %v", err)
	}
	l.Unlock(bg())
}

// ctx cancels a waiting acquire; what the daemon grants after that is
// given back.
func TestCancelWaitingLock(t *testing.T) {
	a := dial(t, Config{})
	b := dial(t, Config{})
	r := res(t, "x")
	la, err := a.Lock(bg(), r)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(bg())
	errc := make(chan error, 1)
	go func() {
		_, err := b.Lock(ctx, r, Wait(20*time.Second))
		errc <- err
	}()
	time.Sleep(200 * time.Millisecond)
	start := time.Now()
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("want context.Canceled, got %v", err)
		}
	case <-time.After(time.Second):
		t.Fatal("cancel did not end the wait")
	}
	if time.Since(start) > 200*time.Millisecond {
		t.Fatalf("cancel took %v", time.Since(start))
	}
	// The daemon still has b's LOCK waiting: when a releases, b gets it
	// and gives it back at once; then anyone can have it.
	la.Unlock(bg())
	c := dial(t, Config{})
	l, err := c.Lock(bg(), r, Wait(5*time.Second))
	if err != nil {
		t.Fatalf("after the cancelled wait: %v", err)
	}
	l.Unlock(bg())

	// A ctx deadline before the Wait ends it too.
	la, _ = a.Lock(bg(), r)
	ctx, cancel2 := context.WithTimeout(bg(), 200*time.Millisecond)
	defer cancel2()
	start = time.Now()
	_, err = b.Lock(ctx, r, Wait(20*time.Second))
	if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, ErrTimeout) {
		t.Fatalf("want the deadline, got %v", err)
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the deadline took %v", d)
	}
	la.Unlock(bg())

	// Cancelled while queued behind another goroutine of the same client.
	la, _ = a.Lock(bg(), r)
	ctx, cancel = context.WithCancel(bg())
	go func() {
		time.Sleep(100 * time.Millisecond)
		cancel()
	}()
	if _, err := a.Lock(ctx, r, Wait(10*time.Second)); !errors.Is(err, context.Canceled) {
		t.Fatalf("queued: want context.Canceled, got %v", err)
	}
	la.Unlock(bg())
	if l, err := a.Lock(bg(), r); err != nil {
		t.Fatalf("after a cancelled queued wait: %v", err)
	} else {
		l.Unlock(bg())
	}
}

// A LOCK granted after waiting longer than its ttl: its deadline, counted
// from the LOCK's send, has passed at the grant, so the client confirms it
// with LOCKS before Lock returns it, rather than lose it at once.
func TestLongWaitConfirmed(t *testing.T) {
	a := dial(t, Config{})
	b := dial(t, Config{})
	r := res(t, "x")
	la, err := a.Lock(bg(), r)
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		time.Sleep(1200 * time.Millisecond)
		la.Unlock(bg())
	}()
	l, err := b.Lock(bg(), r, Wait(10*time.Second), TTL(500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(l.Deadline()); d < 200*time.Millisecond || l.Err() != nil {
		t.Fatalf("granted after a long wait: deadline in %v, Err %v", d, l.Err())
	}
	time.Sleep(time.Second)
	if l.Err() != nil || !l.Deadline().After(time.Now()) {
		t.Fatalf("a second later: %v", l.Err())
	}
	if err := l.Unlock(bg()); err != nil {
		t.Fatal(err)
	}
}

func TestLockKinds(t *testing.T) {
	a := dial(t, Config{})
	b := dial(t, Config{})
	c := dial(t, Config{})
	x, y, z := res(t, "x"), res(t, "y"), res(t, "z")

	m, err := a.Lock(bg(), x, Also(y, z))
	if err != nil {
		t.Fatal(err)
	}
	if got := m.Resources(); len(got) != 3 || got[0] != x || got[2] != z {
		t.Fatalf("resources %v", got)
	}
	if _, err := b.Lock(bg(), y); !errors.Is(err, ErrBusy) {
		t.Fatalf("y of a multi-resource lease: %v", err)
	}
	if _, err := a.Lock(bg(), y); !errors.Is(err, ErrBusy) {
		t.Fatalf("the same client: %v", err)
	}
	if err := m.Extend(bg(), 20*time.Second); err != nil {
		t.Fatal(err)
	}
	if m.TTL() != 20*time.Second {
		t.Fatalf("ttl %v", m.TTL())
	}
	if err := m.Unlock(bg()); err != nil {
		t.Fatal(err)
	}
	if l, err := b.Lock(bg(), y); err != nil {
		t.Fatal(err)
	} else {
		l.Unlock(bg())
	}

	s1, err := a.Lock(bg(), x, Shared())
	if err != nil {
		t.Fatal(err)
	}
	s2, err := b.Lock(bg(), x, Shared())
	if err != nil {
		t.Fatal(err)
	}
	if s1.Mode() != "shared" || s2.Mode() != "shared" {
		t.Fatalf("modes %s %s", s1.Mode(), s2.Mode())
	}
	if _, err := c.Lock(bg(), x); !errors.Is(err, ErrBusy) {
		t.Fatalf("exclusive over shared: %v", err)
	}
	s1.Unlock(bg())
	s2.Unlock(bg())

	k1, err := a.Lock(bg(), z, Limit(2))
	if err != nil {
		t.Fatal(err)
	}
	k2, err := b.Lock(bg(), z, Limit(2))
	if err != nil {
		t.Fatal(err)
	}
	if k1.Limit() != 2 || k2.Limit() != 2 || k1.Slot() == k2.Slot() || k1.Slot() < 0 {
		t.Fatalf("slots %d %d of %d", k1.Slot(), k2.Slot(), k1.Limit())
	}
	if _, err := c.Lock(bg(), z, Limit(2)); !errors.Is(err, ErrBusy) {
		t.Fatalf("a third of two: %v", err)
	}
	st, err := c.Status(bg(), z, Limit(2))
	if err != nil || st.Limit != 2 || st.SlotsHeld != 2 {
		t.Fatalf("STATUS of the semaphore: %v %s", err, st.Raw)
	}
	k1.Unlock(bg())
	k2.Unlock(bg())
}

func TestExtendAndNoRenew(t *testing.T) {
	c := dial(t, Config{})
	r := res(t, "x")
	l, err := c.Lock(bg(), r, TTL(500*time.Millisecond), NoRenew())
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now()
	if err := l.Extend(bg(), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if d := l.Deadline(); d.Before(before.Add(4 * time.Second)) {
		t.Fatalf("deadline %v after Extend", d.Sub(before))
	}
	if err := l.Extend(bg(), 0); !errors.Is(err, ErrArg) {
		t.Fatal(err)
	}
	l.Unlock(bg())

	// Not renewed: the lease runs out at its deadline.
	l, err = c.Lock(bg(), r, TTL(300*time.Millisecond), NoRenew())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-l.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("a lease without renewal outlived its ttl")
	}
	if !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("Err %v", l.Err())
	}
	var lerr *LostError
	if errors.As(l.Err(), &lerr); lerr == nil || lerr.Fence != l.Fence() {
		t.Fatalf("Err %#v", l.Err())
	}
	if err := l.Unlock(bg()); !errors.Is(err, ErrLost) {
		t.Fatalf("Unlock of a lost lease: %v", err)
	}
	// The resource is this client's to take again (the session may still
	// list it: the client sorts that out).
	eventually(t, 3*time.Second, "lock again", func() bool {
		l, err := c.Lock(bg(), r, Wait(time.Second))
		if err == nil {
			l.Unlock(bg())
		}
		return err == nil
	})
}

// A lease lost before its deadline (the daemon says so): Done closes at
// once, the lease's context is cancelled with ErrLost.
func TestLostBeforeDeadline(t *testing.T) {
	c := dial(t, Config{})
	r := res(t, "x")
	l, err := c.Lock(bg(), r, TTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ctx := l.Context(bg())
	if reply := rawLines(sharedServer(t), []string{"AUTH " + adminPassword, "FORCEUNLOCK " + r},
		2*time.Second); !strings.HasPrefix(reply[1], "OK") {
		t.Fatalf("FORCEUNLOCK: %q", reply)
	}
	select {
	case <-l.Done():
	case <-time.After(2 * time.Second):
		t.Fatal("EVENT LOST did not end the lease")
	}
	if time.Until(l.Deadline()) < 20*time.Second {
		t.Fatal("the deadline moved")
	}
	var lerr *LostError
	if !errors.As(l.Err(), &lerr) || lerr.Reason != "node" || !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("Err %v", l.Err())
	}
	<-ctx.Done()
	if !errors.Is(ctx.Err(), context.Canceled) || !errors.Is(ctx.Err(), ErrLost) {
		t.Fatalf("ctx.Err %v", ctx.Err())
	}
	// Do reports the loss when fn ignores it.
	err = c.Do(bg(), r, func(ctx context.Context) error {
		rawLines(sharedServer(t), []string{"AUTH " + adminPassword, "FORCEUNLOCK " + r}, 2*time.Second)
		<-ctx.Done()
		return nil
	})
	if !errors.Is(err, ErrLost) {
		t.Fatalf("Do: %v", err)
	}
}

func TestDoAndMutex(t *testing.T) {
	c := dial(t, Config{})
	r := res(t, "x")
	ran := false
	err := c.Do(bg(), r, func(ctx context.Context) error {
		ran = true
		if _, err := c.Lock(bg(), r); !errors.Is(err, ErrBusy) {
			t.Errorf("inside Do: %v", err)
		}
		return nil
	}, TTL(5*time.Second))
	if err != nil || !ran {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	if err := c.Do(bg(), r, func(context.Context) error { return boom }); err != boom {
		t.Fatalf("fn's error: %v", err)
	}
	if st, _ := c.Status(bg(), r); st == nil || st.Held {
		t.Fatal("Do left the lock held")
	}

	var m sync.Locker = c.Locker(r)
	n := 0
	var wg sync.WaitGroup
	for i := 0; i < 8; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < 5; j++ {
				m.Lock()
				n++ // the race detector checks that the Mutex orders these
				m.Unlock()
			}
		}()
	}
	wg.Wait()
	if n != 40 {
		t.Fatalf("n = %d", n)
	}
	mu := c.NewMutex(r)
	if err := mu.LockContext(bg()); err != nil || mu.Lease() == nil {
		t.Fatal(err)
	}
	if err := mu.UnlockContext(bg()); err != nil || mu.Lease() != nil {
		t.Fatal(err)
	}
	func() {
		defer func() {
			if recover() == nil {
				t.Error("unlock of an unlocked Mutex did not panic")
			}
		}()
		mu.Unlock()
	}()
}

func TestClose(t *testing.T) {
	c := dial(t, Config{})
	other := dial(t, Config{})
	r := res(t, "x")
	l, err := c.Lock(bg(), r)
	if err != nil {
		t.Fatal(err)
	}
	var waited atomic.Bool
	go func() {
		_, err := c.Lock(bg(), r, Wait(10*time.Second))
		waited.Store(errors.Is(err, ErrClosed))
	}()
	time.Sleep(50 * time.Millisecond)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if !closed(l.Done()) || !errors.Is(l.Err(), ErrClosed) || !errors.Is(l.Err(), ErrLost) {
		t.Fatalf("lease after Close: %v", l.Err())
	}
	eventually(t, time.Second, "the queued Lock ends with ErrClosed", waited.Load)
	// QUIT released it.
	lo, err := other.Lock(bg(), r)
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	lo.Unlock(bg())
	if _, err := c.Lock(bg(), r); !errors.Is(err, ErrClosed) {
		t.Fatalf("Lock after Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
}

// Many requests of many goroutines in flight at once on one connection.
func TestManyInFlight(t *testing.T) {
	c := dial(t, Config{})
	var wg sync.WaitGroup
	errc := make(chan error, 200)
	for i := 0; i < 200; i++ {
		i := i
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := res(t, "r") + itoa(uint64(i))
			for j := 0; j < 5; j++ {
				l, err := c.Lock(bg(), r)
				if err == nil {
					err = l.Unlock(bg())
				}
				if err != nil {
					errc <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
}
