package redlockd

// Holder values and watching: values set, replaced and shown on another
// daemon; Watch's first state and each change made through another Client
// and daemon (exclusive with its value, shared, a semaphore, a foreign
// Redlock client's key and its expiry); a watcher that does not read;
// leader election; a watcher across a resume, a killed and a stalled
// daemon; the end of a Watcher (ctx, Close, the Client's Close) and its
// UNWATCH; refusals.

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"syscall"
	"testing"
	"time"
)

// waitState reads w until a state of r meets cond (other states are
// skipped), within d.
func waitState(t *testing.T, w *Watcher, r string, d time.Duration, what string,
	cond func(HolderEvent) bool) HolderEvent {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	var last []HolderEvent
	for {
		select {
		case ev, ok := <-w.C():
			if !ok {
				t.Fatalf("%s: the channel closed (%v); states seen: %+v", what, w.Err(), last)
			}
			if ev.Resource != r {
				continue
			}
			if cond(ev) {
				return ev
			}
			if last = append(last, ev); len(last) > 8 {
				last = last[1:]
			}
		case <-timer.C:
			t.Fatalf("%s: not within %v; states seen: %+v", what, d, last)
		}
	}
}

func isFree(ev HolderEvent) bool { return ev.Held == 0 }

func hasValue(v string) func(HolderEvent) bool {
	return func(ev HolderEvent) bool { return ev.Held == 1 && ev.Value == v }
}

// watchingOf: how many resources the client's session watches, as the
// daemon's SESSIONS says.
func watchingOf(t *testing.T, c *Client) int {
	t.Helper()
	raw, err := c.jsonRequest(bg(), "SESSIONS")
	if err != nil {
		t.Fatal(err)
	}
	var body struct {
		Sessions []struct {
			ID       string `json:"id"`
			Watching int    `json:"watching"`
		} `json:"sessions"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		t.Fatal(err)
	}
	for _, s := range body.Sessions {
		if s.ID == c.Session() {
			return s.Watching
		}
	}
	t.Fatalf("no session %s in SESSIONS", c.Session())
	return 0
}

func TestValue(t *testing.T) {
	h := testHarness(t)
	_, ds := h.cluster(2, nil)
	a := dial(t, Config{Servers: []string{ds[0].addr()}, Name: "alice"})
	b := dial(t, Config{Servers: []string{ds[1].addr()}})
	r := res(t, "leader")
	l, err := a.Lock(bg(), r, Value("http://10.0.0.7:8080/a?b=c"), TTL(8*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l.Value() != "http://10.0.0.7:8080/a?b=c" {
		t.Fatalf("Value %q", l.Value())
	}
	// The other daemon reads it off the nodes; LOCKS shows it.
	st, err := b.Status(bg(), r)
	if err != nil || st.Holder == nil || st.Holder.Value != l.Value() || st.Holder.Name != "alice" ||
		st.Holder.Fence != l.Fence() {
		t.Fatalf("STATUS on the other daemon: %v %s", err, st.Raw)
	}
	if locks, err := a.Locks(bg()); err != nil || len(locks) != 1 || locks[0].Value != l.Value() {
		t.Fatalf("LOCKS: %+v %v", locks, err)
	}

	// Replaced in place: the token, fence and ttl stay; the deadline moves.
	token, d := l.Token(), l.Deadline()
	time.Sleep(20 * time.Millisecond)
	if err := l.SetValue(bg(), "10.0.0.8:8080"); err != nil {
		t.Fatal(err)
	}
	if l.Value() != "10.0.0.8:8080" || l.Token() != token || l.TTL() != 8*time.Second ||
		!l.Deadline().After(d) {
		t.Fatalf("after SetValue: value %q token %s ttl %v deadline +%v",
			l.Value(), l.Token(), l.TTL(), l.Deadline().Sub(d))
	}
	for _, c := range []*Client{a, b} {
		if st, err := c.Status(bg(), r); err != nil || st.Holder == nil || st.Holder.Value != "10.0.0.8:8080" ||
			st.Holder.Fence != l.Fence() {
			t.Fatalf("STATUS after SetValue on %s: %v %s", c.Server(), err, st.Raw)
		}
	}

	// Refused before anything is sent, or by the daemon (its limit).
	for _, v := range []string{"", "a b", "tab\there", strings.Repeat("x", 5000)} {
		if err := l.SetValue(bg(), v); !errors.Is(err, ErrArg) {
			t.Errorf("SetValue(%.20q): %v", v, err)
		}
	}
	var rerr *Error
	if err := l.SetValue(bg(), strings.Repeat("x", 300)); !errors.As(err, &rerr) || rerr.Code != "ARG" {
		t.Errorf("a value over locks.max_value_len: %v", err)
	}
	if _, err := b.Lock(bg(), res(t, "long"), Value(strings.Repeat("x", 300))); !errors.Is(err, ErrArg) {
		t.Errorf("LOCK with a value over locks.max_value_len: %v", err)
	}
	if l.Value() != "10.0.0.8:8080" || l.Err() != nil {
		t.Fatalf("after the refusals: %q %v", l.Value(), l.Err())
	}
	if err := l.Unlock(bg()); err != nil {
		t.Fatal(err)
	}
	if err := l.SetValue(bg(), "late"); !errors.Is(err, ErrReleased) {
		t.Fatalf("SetValue after Unlock: %v", err)
	}

	// Several resources: each carries it. A shared lease has none.
	x, y := res(t, "x"), res(t, "y")
	m, err := a.Lock(bg(), x, Also(y), Value("both"))
	if err != nil {
		t.Fatal(err)
	}
	if err := m.SetValue(bg(), "both-2"); err != nil {
		t.Fatal(err)
	}
	for _, r := range []string{x, y} {
		if st, err := b.Status(bg(), r); err != nil || st.Holder == nil || st.Holder.Value != "both-2" {
			t.Fatalf("STATUS %s: %v %s", r, err, st.Raw)
		}
	}
	m.Unlock(bg())
	s, err := a.Lock(bg(), x, Shared())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetValue(bg(), "v"); !errors.Is(err, ErrArg) {
		t.Fatalf("SetValue of a shared lease: %v", err)
	}
	s.Unlock(bg())
}

func TestWatch(t *testing.T) {
	h := testHarness(t)
	nodes, ds := h.cluster(2, map[string]interface{}{
		"locks": map[string]interface{}{"watch_poll_ms": 200}})
	c := dial(t, Config{Servers: []string{ds[0].addr()}, Name: "observer"})
	bob := dial(t, Config{Servers: []string{ds[1].addr()}, Name: "bob"})
	carol := dial(t, Config{Servers: []string{ds[1].addr()}, Name: "carol"})
	x, sh, sem, f := res(t, "x"), res(t, "shared"), res(t, "sem"), res(t, "foreign")
	const within = 2 * time.Second

	// A semaphore held before the watch: its state comes first.
	k, err := carol.Lock(bg(), sem, Limit(3))
	if err != nil {
		t.Fatal(err)
	}
	w, err := c.Watch(bg(), x, sh, sem, f)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if got := w.Resources(); len(got) != 4 || got[0] != x {
		t.Fatalf("Resources %v", got)
	}
	firsts := map[string]HolderEvent{}
	for len(firsts) < 4 {
		select {
		case ev := <-w.C():
			firsts[ev.Resource] = ev
		case <-time.After(within):
			t.Fatalf("first states: only %+v", firsts)
		}
	}
	if ev := firsts[x]; ev != (HolderEvent{Resource: x}) {
		t.Fatalf("first state of a free resource: %+v", ev)
	}
	if ev := firsts[sem]; ev.Held != 1 || ev.Mode != "semaphore" || ev.Limit != 3 {
		t.Fatalf("first state of the semaphore: %+v", ev)
	}

	// Exclusive, through another client on the other daemon: who, with
	// what value; a new value; the release.
	l, err := bob.Lock(bg(), x, Value("10.0.0.9:80"))
	if err != nil {
		t.Fatal(err)
	}
	ev := waitState(t, w, x, within, "bob's lock", hasValue("10.0.0.9:80"))
	if ev.Mode != "exclusive" || ev.Fence != l.Fence() || ev.Name != "bob" || ev.Daemon == "" || ev.Foreign {
		t.Fatalf("bob's lock: %+v", ev)
	}
	if err := l.SetValue(bg(), "10.0.0.9:81"); err != nil {
		t.Fatal(err)
	}
	ev = waitState(t, w, x, within, "bob's new value", hasValue("10.0.0.9:81"))
	if ev.Fence != l.Fence() {
		t.Fatalf("the fence changed with the value: %+v", ev)
	}
	l.Unlock(bg())
	waitState(t, w, x, within, "bob's release", isFree)

	// Shared holders counted; a semaphore's slots.
	s1, err := bob.Lock(bg(), sh, Shared())
	if err != nil {
		t.Fatal(err)
	}
	s2, err := carol.Lock(bg(), sh, Shared())
	if err != nil {
		t.Fatal(err)
	}
	ev = waitState(t, w, sh, within, "two shared holders", func(ev HolderEvent) bool { return ev.Held == 2 })
	if ev.Mode != "shared" || ev.Value != "" || ev.Fence != 0 {
		t.Fatalf("shared: %+v", ev)
	}
	s1.Unlock(bg())
	s2.Unlock(bg())
	waitState(t, w, sh, within, "no shared holder", isFree)
	k2, err := bob.Lock(bg(), sem, Limit(3))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w, sem, within, "two slots", func(ev HolderEvent) bool {
		return ev.Held == 2 && ev.Mode == "semaphore" && ev.Limit == 3
	})
	k.Unlock(bg())
	k2.Unlock(bg())
	waitState(t, w, sem, within, "no slot", isFree)

	// A plain SET NX client's key on every node, and its expiry.
	for _, n := range nodes {
		if out := rawLine(n.addr(), "SET lock:"+f+" 0123456789abcdef NX PX 1500", time.Second); out != "+OK" {
			t.Fatalf("SET on %s: %q", n.addr(), out)
		}
	}
	ev = waitState(t, w, f, within, "the foreign key", func(ev HolderEvent) bool { return ev.Held == 1 })
	if !ev.Foreign || ev.Mode != "" || ev.Name != "" {
		t.Fatalf("foreign: %+v", ev)
	}
	waitState(t, w, f, 3*time.Second, "the foreign key's expiry", isFree)

	// A dropped connection: the session is resumed, and the daemon tells
	// the states again (a change made meanwhile included).
	session := c.Session()
	dropConn(c)
	l, err = bob.Lock(bg(), x, Value("while-away"))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w, x, 5*time.Second, "the state after the resume", hasValue("while-away"))
	if c.Session() != session {
		t.Fatalf("a new session %s, not a resume of %s", c.Session(), session)
	}
	l.Unlock(bg())
	waitState(t, w, x, within, "the release after the resume", isFree)
	if w.Err() != nil {
		t.Fatal(w.Err())
	}
}

// A watcher that does not read stalls nothing: its client goes on taking
// locks, and the watcher then reads the latest state (at most one older
// one first: the state its goroutine was handing over).
func TestWatchNotRead(t *testing.T) {
	c := dial(t, Config{})
	other := dial(t, Config{})
	r, q := res(t, "x"), res(t, "y")
	w, err := c.Watch(bg(), r, q)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	start := time.Now()
	var last *Lease
	for i := 0; i < 100; i++ {
		l, err := c.Lock(bg(), r, Value("v"+itoa(uint64(i))))
		if err != nil {
			t.Fatal(err)
		}
		if i == 99 {
			last = l
			break
		}
		if err := l.Unlock(bg()); err != nil {
			t.Fatal(err)
		}
		if err := c.Ping(bg()); err != nil {
			t.Fatal(err)
		}
	}
	lq, err := other.Lock(bg(), q, Value("q"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("100 cycles in %v, nobody reading", time.Since(start))
	eventually(t, 3*time.Second, "the last states are pending", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.pending[r].Value == "v99" && w.pending[q].Value == "q"
	})
	w.mu.Lock()
	n := len(w.pending)
	w.mu.Unlock()
	if n != 2 {
		t.Fatalf("%d states pending for 2 resources", n)
	}
	var got []HolderEvent
	for len(got) < 4 {
		select {
		case ev := <-w.C():
			got = append(got, ev)
			continue
		case <-time.After(300 * time.Millisecond):
		}
		break
	}
	var seenR, seenQ bool
	for i, ev := range got {
		if ev.Resource == r {
			seenR = ev.Value == "v99" && ev.Fence == last.Fence()
			if i > 0 && got[i-1].Resource == r && got[i-1].Fence > ev.Fence {
				t.Fatalf("an older state after a newer: %+v", got)
			}
		} else {
			seenQ = ev.Value == "q" && ev.Fence == lq.Fence()
		}
	}
	if !seenR || !seenQ || len(got) > 3 {
		t.Fatalf("states read: %+v", got)
	}
	last.Unlock(bg())
	lq.Unlock(bg())
}

// Leader election: two candidates campaign with Lock(Wait, Value); an
// observer watches. The leader's Unlock makes the other the leader, and
// the observer hears its value. The other waited longer than its ttl: its
// grant is confirmed (LOCKS) before Lock returns, not lost at once by a
// deadline counted from the LOCK's send time.
func TestLeaderElection(t *testing.T) {
	h := testHarness(t)
	_, ds := h.cluster(2, nil)
	r := res(t, "leader")
	obs := dial(t, Config{Servers: []string{ds[1].addr()}, Name: "observer"})
	w, err := obs.Watch(bg(), r)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waitState(t, w, r, 2*time.Second, "no leader yet", isFree)

	type term struct {
		value string
		lease *Lease
	}
	leading := make(chan term, 2)
	errc := make(chan error, 2)
	resign := map[string]chan struct{}{}
	ctx, cancel := context.WithCancel(bg())
	defer cancel()
	for i, value := range []string{"10.0.0.7:5432", "10.0.0.8:5432"} {
		value, quit := value, make(chan struct{})
		resign[value] = quit
		c := dial(t, Config{Servers: []string{ds[i].addr()}, Name: "db-" + itoa(uint64(i))})
		go func() {
			l, err := c.Lock(ctx, r, Wait(20*time.Second), Value(value), TTL(time.Second))
			if err != nil {
				errc <- err
				return
			}
			leading <- term{value, l}
			select {
			case <-quit:
			case <-ctx.Done():
			}
			errc <- l.Unlock(bg())
		}()
	}
	var first, second term
	select {
	case first = <-leading:
	case err := <-errc:
		t.Fatal(err)
	case <-time.After(10 * time.Second):
		t.Fatal("no leader")
	}
	ev := waitState(t, w, r, 2*time.Second, "the first leader", hasValue(first.value))
	if ev.Fence != first.lease.Fence() || !strings.HasPrefix(ev.Name, "db-") {
		t.Fatalf("first leader: %+v", ev)
	}
	select {
	case t2 := <-leading:
		t.Fatalf("two leaders: %s and %s", first.value, t2.value)
	case <-time.After(300 * time.Millisecond):
	}

	time.Sleep(1500 * time.Millisecond) // the other waits longer than its ttl
	if first.lease.Err() != nil {
		t.Fatalf("the first leader's lease: %v", first.lease.Err())
	}
	close(resign[first.value])
	select {
	case second = <-leading:
	case err := <-errc:
		if err != nil {
			t.Fatal(err)
		}
		second = <-leading
	case <-time.After(10 * time.Second):
		t.Fatal("no second leader")
	}
	if second.value == first.value || second.lease.Fence() <= first.lease.Fence() {
		t.Fatalf("second leader %s fence %d after %s fence %d", second.value, second.lease.Fence(),
			first.value, first.lease.Fence())
	}
	ev = waitState(t, w, r, 2*time.Second, "the second leader", hasValue(second.value))
	if ev.Fence != second.lease.Fence() {
		t.Fatalf("second leader: %+v", ev)
	}
	if d := time.Until(second.lease.Deadline()); d < 500*time.Millisecond || second.lease.Err() != nil {
		t.Fatalf("the second leader's lease: deadline in %v, %v", d, second.lease.Err())
	}
	time.Sleep(1500 * time.Millisecond) // renewed, and confirmed by the keeper
	if second.lease.Err() != nil {
		t.Fatalf("the second leader's lease: %v", second.lease.Err())
	}
	for _, d := range ds {
		st := rawLine(d.addr(), "STATUS "+r, 2*time.Second)
		if !strings.Contains(st, `"value":"`+second.value+`"`) {
			t.Fatalf("STATUS on %s: %s", d.addr(), st)
		}
	}
	close(resign[second.value])
	waitState(t, w, r, 2*time.Second, "no leader", isFree)
}

// A watcher follows its Client to another daemon: the daemon is killed,
// or stalls (noticed by the keeper's PING); the new session watches again
// and the states keep coming.
func TestWatchFailover(t *testing.T) {
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		fault   func(d *daemon)
	}{
		{"kill", 0, func(d *daemon) { d.p.stop(syscall.SIGKILL, time.Second) }},
		{"stall", time.Second, func(d *daemon) { d.p.signal(syscall.SIGSTOP) }},
	} {
		tc := tc
		t.Run(tc.name, func(t *testing.T) {
			h := testHarness(t)
			_, ds := h.cluster(2, nil)
			c := dial(t, Config{Servers: []string{ds[0].addr(), ds[1].addr()}, Name: "watcher",
				Timeout: tc.timeout})
			other := dial(t, Config{Servers: []string{ds[1].addr()}, Name: "changer"})
			r := res(t, "x")
			w, err := c.Watch(bg(), r)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			waitState(t, w, r, 2*time.Second, "the first state", isFree)
			l, err := other.Lock(bg(), r, Value("before"), TTL(10*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			waitState(t, w, r, 2*time.Second, "before the fault", hasValue("before"))
			// The watcher's own lease, with a value: ADOPT keeps it.
			mine, err := c.Lock(bg(), res(t, "mine"), Value("mine"), TTL(6*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			token := mine.Token()

			session := c.Session()
			tc.fault(ds[0])
			defer ds[0].p.signal(syscall.SIGCONT)
			eventually(t, 15*time.Second, "a new session on the other daemon", func() bool {
				return c.Server() == ds[1].addr() && c.Session() != session && c.Session() != ""
			})
			// The new session's WATCH tells the state now; then each change.
			waitState(t, w, r, 3*time.Second, "the state on the new session", hasValue("before"))
			if err := l.SetValue(bg(), "after"); err != nil {
				t.Fatal(err)
			}
			waitState(t, w, r, 2*time.Second, "a change after the failover", hasValue("after"))
			l.Unlock(bg())
			waitState(t, w, r, 2*time.Second, "the release after the failover", isFree)
			if w.Err() != nil || watchingOf(t, c) != 1 {
				t.Fatalf("Err %v, watching %d", w.Err(), watchingOf(t, c))
			}
			eventually(t, 5*time.Second, "the lease adopted", func() bool { return mine.Token() != token })
			st, err := other.Status(bg(), mine.Resource())
			if err != nil || mine.Err() != nil || mine.Value() != "mine" || st.Holder == nil ||
				st.Holder.Value != "mine" || st.Holder.Session != c.Session() {
				t.Fatalf("the adopted lease: %v %v %q %s", err, mine.Err(), mine.Value(), st.Raw)
			}
		})
	}
}

// How a Watcher ends: its ctx, Close, the Client's Close; UNWATCH only
// when no other Watcher of the Client watches the resource. Refusals.
func TestWatchEnds(t *testing.T) {
	c := dial(t, Config{})
	other := dial(t, Config{})
	r, q := res(t, "x"), res(t, "y")

	ctx, cancel := context.WithCancel(bg())
	w1, err := c.Watch(ctx, r, q)
	if err != nil {
		t.Fatal(err)
	}
	w2, err := c.Watch(bg(), r)
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w2, r, 2*time.Second, "w2's first state", isFree)
	if n := watchingOf(t, c); n != 2 {
		t.Fatalf("watching %d", n)
	}
	// w1 is not read: cancelling its ctx closes its channel all the same.
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	cancel()
	for range w1.C() {
	}
	if d := time.Since(start); d > time.Second {
		t.Fatalf("the channel closed %v after the cancel", d)
	}
	if !errors.Is(w1.Err(), context.Canceled) {
		t.Fatalf("Err after the cancel: %v", w1.Err())
	}
	// q is no longer watched; r still is, for w2.
	eventually(t, 2*time.Second, "UNWATCH of q", func() bool { return watchingOf(t, c) == 1 })
	l, err := other.Lock(bg(), r, Value("still"))
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, w2, r, 2*time.Second, "w2 after w1 ended", hasValue("still"))
	l.Unlock(bg())
	w2.Close()
	w2.Close()
	if _, ok := <-w2.C(); ok {
		// A state handed over before the Close may still come; then it closes.
		if _, ok := <-w2.C(); ok {
			t.Fatal("the channel is open after Close")
		}
	}
	if !errors.Is(w2.Err(), ErrClosed) {
		t.Fatalf("Err after Close: %v", w2.Err())
	}
	eventually(t, 2*time.Second, "UNWATCH of r", func() bool { return watchingOf(t, c) == 0 })

	// Closed while the connection is down: the UNWATCH goes out once the
	// session is resumed.
	w4, err := c.Watch(bg(), q)
	if err != nil {
		t.Fatal(err)
	}
	session := c.Session()
	dropConn(c)
	w4.Close()
	eventually(t, 5*time.Second, "UNWATCH after the resume", func() bool {
		return watchingOf(t, c) == 0 && c.Session() == session
	})

	// Refused: before anything is sent, or by the daemon (over its
	// limits.max_watches, 1024: all or none, in several lines).
	for _, bad := range [][]string{nil, {""}, {"a b"}, {"a=b"}, {r, r}} {
		if _, err := c.Watch(bg(), bad...); !errors.Is(err, ErrArg) {
			t.Errorf("Watch(%q): %v", bad, err)
		}
	}
	many := make([]string, 1025)
	for i := range many {
		many[i] = res(t, "m") + itoa(uint64(i))
	}
	if _, err := c.Watch(bg(), many...); !errors.Is(err, ErrLimit) {
		t.Fatalf("1025 resources: %v", err)
	}
	eventually(t, 2*time.Second, "nothing watched after the refusal", func() bool { return watchingOf(t, c) == 0 })
	w3, err := c.Watch(bg(), many[:1024]...)
	if err != nil {
		t.Fatalf("1024 resources: %v", err)
	}
	if n := watchingOf(t, c); n != 1024 {
		t.Fatalf("watching %d", n)
	}
	ctx, cancel = context.WithCancel(bg())
	cancel()
	if _, err := c.Watch(ctx, r); !errors.Is(err, context.Canceled) {
		t.Fatalf("a cancelled ctx: %v", err)
	}

	// The Client's Close ends every Watcher.
	c.Close()
	for range w3.C() {
	}
	if !errors.Is(w3.Err(), ErrClosed) {
		t.Fatalf("Err after the Client's Close: %v", w3.Err())
	}
	if _, err := c.Watch(bg(), r); !errors.Is(err, ErrClosed) {
		t.Fatalf("Watch after Close: %v", err)
	}
}
