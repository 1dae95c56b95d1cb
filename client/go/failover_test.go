package redlockd

// Leases that outlive a connection: resume on the same daemon, ADOPT on a
// restarted or another daemon while the deadline holds, loss past it; and
// many goroutines over few resources. Each test starts its own processes.

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// prober LOCKs the resource from a connection of its own on each daemon
// every 10 ms until stopped: nobody else may ever get it.
type prober struct {
	stop  chan struct{}
	done  chan struct{}
	mu    sync.Mutex
	got   []string // "OK" answers: the lock was someone else's too
	busy  int
	other map[string]int
}

func probe(t *testing.T, resource string, addrs ...string) *prober {
	p := &prober{stop: make(chan struct{}), done: make(chan struct{}), other: map[string]int{}}
	go func() {
		defer close(p.done)
		for {
			for _, a := range addrs {
				out := rawLines(a, []string{"LOCK " + resource, "UNLOCK " + resource}, 500*time.Millisecond)
				p.mu.Lock()
				switch {
				case strings.HasPrefix(out[0], "OK"):
					p.got = append(p.got, a+": "+out[0])
				case strings.HasPrefix(out[0], "ERR BUSY"):
					p.busy++
				default:
					p.other[out[0]]++
				}
				p.mu.Unlock()
			}
			select {
			case <-p.stop:
				return
			case <-time.After(10 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(p.finish)
	return p
}

func (p *prober) finish() {
	select {
	case <-p.stop:
	default:
		close(p.stop)
	}
	<-p.done
}

// check: nobody else got it, and the probes did see it held.
func (p *prober) check(t *testing.T) {
	p.finish()
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.got) > 0 {
		t.Fatalf("someone else got the lock: %v", p.got)
	}
	if p.busy == 0 {
		t.Fatalf("the probes never saw the lock held: %v", p.other)
	}
	t.Logf("probes: %d BUSY, others %v", p.busy, p.other)
}

// dropConn breaks the client's connection under it, as a network fault
// would.
func dropConn(c *Client) {
	c.mu.Lock()
	cn := c.cn
	c.mu.Unlock()
	if cn != nil {
		cn.nc.Close()
	}
}

func TestResumeSameDaemon(t *testing.T) {
	c := dial(t, Config{})
	r := res(t, "x")
	l, err := c.Lock(bg(), r, TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	session, token := c.Session(), l.Token()
	dropConn(c)
	// A request made meanwhile waits for the resumed session.
	l2, err := c.Lock(bg(), res(t, "y"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Session() != session || l.Token() != token || l.Err() != nil {
		t.Fatalf("session %s -> %s, token %s -> %s, err %v", session, c.Session(), token, l.Token(), l.Err())
	}
	st, err := c.Status(bg(), r)
	if err != nil || st.Holder == nil || st.Holder.Session != session || st.Holder.Attached == nil || !*st.Holder.Attached {
		t.Fatalf("STATUS after the resume: %v %s", err, st.Raw)
	}
	// Lost while detached: not here any more after the resume.
	dropConn(c)
	rawLines(sharedServer(t), []string{"AUTH " + adminPassword, "FORCEUNLOCK " + r}, 2*time.Second)
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("a lease lost while detached was not lost")
	}
	if !errors.Is(l.Err(), ErrLost) || l2.Err() != nil {
		t.Fatalf("Err %v / %v", l.Err(), l2.Err())
	}
	// An Unlock while the connection is down goes out on the next one.
	dropConn(c)
	if err := l2.Unlock(bg()); err != nil {
		t.Fatal(err)
	}
	other := dial(t, Config{})
	if l, err := other.Lock(bg(), l2.Resource()); err != nil {
		t.Fatalf("after the Unlock: %v", err)
	} else {
		l.Unlock(bg())
	}
}

// doThroughFault runs Do on a lease of ttl while fault() happens, and
// checks that fn is not cancelled, that the lease moves (same fence, a new
// token) and that nobody else gets the lock meanwhile (probes on probeAt).
func doThroughFault(t *testing.T, c *Client, r string, ttl time.Duration, fault func(), probeAt ...string) {
	var p *prober
	err := c.Do(bg(), r, func(ctx context.Context) error {
		l := c.leaseOf(r)
		fence, token, session := l.Fence(), l.Token(), c.Session()
		p = probe(t, r, probeAt...)
		time.Sleep(50 * time.Millisecond)
		fault()
		eventually(t, 15*time.Second, "the lease moved to a new session", func() bool {
			return l.Token() != token && c.Session() != session
		})
		if ctx.Err() != nil || l.Err() != nil || closed(l.Done()) {
			t.Errorf("cancelled: ctx %v, lease %v", ctx.Err(), l.Err())
		}
		if l.Fence() != fence {
			t.Errorf("fence %d -> %d", fence, l.Fence())
		}
		// Still held, and confirmed again: the deadline moves on.
		d := l.Deadline()
		eventually(t, ttl, "the deadline is confirmed again", func() bool {
			return l.Deadline().After(d)
		})
		time.Sleep(100 * time.Millisecond)
		p.finish() // before the release
		return ctx.Err()
	}, TTL(ttl))
	if err != nil {
		t.Fatalf("Do: %v", err)
	}
	p.check(t)
}

// leaseOf: this client's lease on r (for tests).
func (c *Client) leaseOf(r string) *Lease {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leases[r]
}

// The daemon restarts (SIGTERM: it leaves the lease on the nodes; started
// again on the same port): the client adopts the lease there.
func TestRestartDuringDo(t *testing.T) {
	h := testHarness(t)
	_, ds := h.cluster(1, nil)
	d := ds[0]
	c := dial(t, Config{Servers: []string{d.addr()}})
	r := res(t, "job")
	doThroughFault(t, c, r, 6*time.Second, d.restart, d.addr())
	// Released on the restarted daemon.
	if out := rawLine(d.addr(), "LOCK "+r, 2*time.Second); !strings.HasPrefix(out, "OK") {
		t.Fatalf("after Do: %s", out)
	}
}

// Failover: the daemon is killed (or stalls) while Do runs; the client
// adopts the lease on the other daemon of the same nodes.
func TestFailoverDuringDo(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault func(d *daemon)
	}{
		{"kill", func(d *daemon) { d.p.stop(syscall.SIGKILL, time.Second) }},
		{"stall", func(d *daemon) { d.p.signal(syscall.SIGSTOP) }},
	} {
		tc := tc
		t.Run(tc.name, func(t *testing.T) {
			h := testHarness(t)
			_, ds := h.cluster(2, nil)
			c := dial(t, Config{Servers: []string{ds[0].addr(), ds[1].addr()}, Name: "mover"})
			r := res(t, "job")
			doThroughFault(t, c, r, 4*time.Second, func() { tc.fault(ds[0]) }, ds[1].addr())
			if c.Server() != ds[1].addr() {
				t.Fatalf("on %s", c.Server())
			}
			if out := rawLine(ds[1].addr(), "LOCK "+r, 2*time.Second); !strings.HasPrefix(out, "OK") {
				t.Fatalf("after Do: %s", out)
			}
			ds[0].p.signal(syscall.SIGCONT)
		})
	}
}

// Past the deadline nothing is adopted: the lease is lost when its
// deadline passes, not later.
func TestLostAtDeadline(t *testing.T) {
	h := testHarness(t)
	_, ds := h.cluster(1, nil)
	d := ds[0]
	c := dial(t, Config{Servers: []string{d.addr()}})
	r := res(t, "x")
	l, err := c.Lock(bg(), r, TTL(1500*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	d.p.stop(syscall.SIGKILL, time.Second)
	deadline := l.Deadline()
	select {
	case <-l.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease outlived its deadline")
	}
	if late := time.Since(deadline); late < 0 || late > 200*time.Millisecond {
		t.Fatalf("Done closed %v after the deadline", late)
	}
	var lerr *LostError
	if !errors.As(l.Err(), &lerr) || lerr.Reason != "deadline" {
		t.Fatalf("Err %v", l.Err())
	}
	d.startAgain()
	// The client is back, and the resource free: nobody adopted it.
	l2, err := c.Lock(bg(), r, Wait(3*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("fence %d after %d", l2.Fence(), l.Fence())
	}
	l2.Unlock(bg())
}

// 1,000 goroutines over 50 resources, through 4 clients on 2 daemons:
// never two holders at once, fences increasing.
func TestManyGoroutinesFewResources(t *testing.T) {
	const goroutines, resources, rounds, clients = 1000, 50, 2, 4
	h := testHarness(t)
	_, ds := h.cluster(2, nil)
	cs := make([]*Client, clients)
	for i := range cs {
		cs[i] = dial(t, Config{Servers: []string{ds[i%2].addr()}})
	}
	var holders [resources]atomic.Int32
	var fenceMu [resources]sync.Mutex
	var lastFence [resources]uint64
	var cycles, violations atomic.Int64
	errc := make(chan error, goroutines)
	var wg sync.WaitGroup
	start := time.Now()
	for g := 0; g < goroutines; g++ {
		g := g
		wg.Add(1)
		go func() {
			defer wg.Done()
			c := cs[g%clients]
			for k := 0; k < rounds; k++ {
				i := (g + k*7) % resources
				r := res(t, "r") + itoa(uint64(i))
				l, err := c.Lock(bg(), r, Wait(60*time.Second), TTL(10*time.Second))
				if err != nil {
					errc <- err
					return
				}
				if holders[i].Add(1) != 1 {
					violations.Add(1)
				}
				fenceMu[i].Lock()
				if l.Fence() <= lastFence[i] {
					violations.Add(1)
				}
				lastFence[i] = l.Fence()
				fenceMu[i].Unlock()
				time.Sleep(time.Duration(g%3) * 100 * time.Microsecond)
				holders[i].Add(-1)
				if err := l.Unlock(bg()); err != nil {
					errc <- err
					return
				}
				cycles.Add(1)
			}
		}()
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if v := violations.Load(); v != 0 {
		t.Fatalf("%d times two holders at once (or a fence not above the last)", v)
	}
	if n := cycles.Load(); n != goroutines*rounds {
		t.Fatalf("%d cycles", n)
	}
	t.Logf("%d cycles in %v", cycles.Load(), time.Since(start))
}
