package redlockd

// What the session holds that no lease knows, passwords across a failover,
// TLS, and a LOCK refused by a daemon that is stopping.

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A LOCK the session holds without a lease (its reply lost, say): the next
// Lock of it meets ERR HELD, gives it back and takes it anew; the keeper's
// next LOCKS gives back one nobody here wants.
func TestOrphansGivenBack(t *testing.T) {
	c := dial(t, Config{})
	x, y := res(t, "x"), res(t, "y")
	c.mu.Lock()
	cn := c.cn
	c.mu.Unlock()
	for _, r := range []string{x, y} {
		if cl, err := cn.roundtrip(bg(), "LOCK "+r, true, time.Second); err != nil || !strings.HasPrefix(cl.reply, "OK") {
			t.Fatalf("a LOCK behind the client's back: %v %q", err, cl.reply)
		}
	}
	l, err := c.Lock(bg(), x)
	if err != nil {
		t.Fatalf("Lock of what the session holds already: %v", err)
	}
	l.Unlock(bg())
	// y: given back at the next refresh (a short lease brings it soon).
	s, err := c.Lock(bg(), res(t, "short"), TTL(600*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	other := dial(t, Config{})
	eventually(t, 3*time.Second, "y given back", func() bool {
		l, err := other.Lock(bg(), y)
		if err == nil {
			l.Unlock(bg())
		}
		return err == nil
	})
	s.Unlock(bg())
}

// Config.Password is sent on every session: after a failover too.
func TestPasswordAcrossFailover(t *testing.T) {
	h := testHarness(t)
	_, ds := h.cluster(2, map[string]interface{}{
		"auth": map[string]interface{}{"password": "s3cret"}})
	servers := []string{ds[0].addr(), ds[1].addr()}
	_, err := Dial(bg(), Config{Servers: servers, Password: "wrong"})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("a wrong password: %v", err)
	}
	if _, err := dial(t, Config{Servers: servers}).Lock(bg(), res(t, "x")); !errors.Is(err, ErrNoAuth) {
		t.Fatalf("no password: %v", err)
	}
	c := dial(t, Config{Servers: servers, Password: "s3cret"})
	l, err := c.Lock(bg(), res(t, "x"), TTL(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ds[0].p.stop(syscall.SIGKILL, time.Second)
	eventually(t, 5*time.Second, "adopted on the other daemon", func() bool {
		return c.Server() == ds[1].addr() && l.Token() != "" && c.leaseOf(l.Resource()) == l &&
			!l.needsAdoptNow()
	})
	if l.Err() != nil {
		t.Fatalf("lost: %v", l.Err())
	}
	if err := l.Unlock(bg()); err != nil {
		t.Fatal(err)
	}
}

func (l *Lease) needsAdoptNow() bool {
	l.c.mu.Lock()
	defer l.c.mu.Unlock()
	return l.needsAdopt || !l.c.ready
}

func TestTLS(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Fatal("openssl not found (scripts/deps installs it)")
	}
	certs := t.TempDir()
	if out, err := exec.Command("../../tests/tools/mkcerts.sh", certs).CombinedOutput(); err != nil {
		t.Fatalf("mkcerts.sh: %v\n%s", err, out)
	}
	h := testHarness(t)
	port := freePort(t)
	nodes := []*redisNode{h.redis()}
	h.daemon(nodes, map[string]interface{}{
		"tls": map[string]interface{}{
			"cert_file": filepath.Join(certs, "server.crt"),
			"key_file":  filepath.Join(certs, "server.key"),
		},
		"listen": []string{"tls://127.0.0.1:" + strconv.Itoa(port)},
	})
	pem, err := os.ReadFile(filepath.Join(certs, "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	server := "tls://127.0.0.1:" + strconv.Itoa(port)
	c := dial(t, Config{Servers: []string{server}, TLS: &tls.Config{RootCAs: pool}})
	l, err := c.Lock(bg(), res(t, "x"))
	if err != nil {
		t.Fatal(err)
	}
	l.Unlock(bg())
	if c2 := dial(t, Config{Servers: []string{"tls://localhost:" + strconv.Itoa(port)},
		TLS: &tls.Config{RootCAs: pool}}); c2.Ping(bg()) != nil {
		t.Fatal("by name")
	}
	// Not trusted: the system's CAs do not know the test CA.
	_, err = Dial(bg(), Config{Servers: []string{server}, Timeout: 2 * time.Second})
	var uerr x509.UnknownAuthorityError
	if !errors.As(err, &uerr) || !errors.Is(err, ErrConnection) {
		t.Fatalf("an unknown CA: %v", err)
	}
}

// A daemon that is stopping answers LOCK with ERR SHUTDOWN while it waits
// for its clients to release their leases: the LOCK goes to the next
// daemon once the connection moves, and the lease held moves with it.
func TestShutdownMovesLocks(t *testing.T) {
	h := testHarness(t)
	_, ds := h.cluster(2, map[string]interface{}{"shutdown_timeout_ms": 1500})
	c := dial(t, Config{Servers: []string{ds[0].addr(), ds[1].addr()}})
	held, err := c.Lock(bg(), res(t, "held"), TTL(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	ds[0].p.signal(syscall.SIGTERM)
	eventually(t, 2*time.Second, "EVENT SHUTDOWN", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.cn != nil && c.cn.isShutdown()
	})
	start := time.Now()
	l, err := c.Lock(bg(), res(t, "new"), Wait(5*time.Second))
	if err != nil {
		t.Fatalf("Lock while the daemon stops: %v", err)
	}
	t.Logf("granted after %v on %s", time.Since(start), c.Server())
	if c.Server() != ds[1].addr() || held.Err() != nil {
		t.Fatalf("on %s, held: %v", c.Server(), held.Err())
	}
	l.Unlock(bg())
	held.Unlock(bg())
}

// A daemon older than tagged requests answers them ERR UNKNOWN, untagged:
// Dial says so at once. (A stand-in that speaks those two lines.)
func TestDaemonWithoutTags(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer nc.Close()
				r := bufio.NewReader(nc)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					word := strings.Fields(line)[0]
					if strings.HasPrefix(word, "#") {
						fmt.Fprintf(nc, "ERR UNKNOWN unknown command '%s'\n", word)
					} else {
						fmt.Fprintf(nc, "OK proto=1 session=s1.x server=redlockd/0.0.1 nodes=1 quorum=1\n")
					}
				}
			}()
		}
	}()
	_, err = Dial(bg(), Config{Servers: []string{ln.Addr().String()}, Timeout: 2 * time.Second})
	if !errors.Is(err, ErrUnsupported) || !strings.Contains(err.Error(), "tagged") {
		t.Fatalf("want ErrUnsupported, got %v", err)
	}
}

// A function that panics in Do leaves the lock released.
func TestDoPanics(t *testing.T) {
	c := dial(t, Config{})
	r := res(t, "x")
	func() {
		defer func() {
			if recover() == nil {
				t.Fatal("no panic")
			}
		}()
		c.Do(bg(), r, func(context.Context) error { panic("boom") })
	}()
	l, err := c.Lock(bg(), r)
	if err != nil {
		t.Fatalf("after a panic in Do: %v", err)
	}
	l.Unlock(bg())
}
