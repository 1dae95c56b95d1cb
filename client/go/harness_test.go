package redlockd

// Real redis-server and redlockd processes for the tests, each on a free
// loopback port in a temporary directory. A harness stops exactly the
// processes it started, by PID. The daemon is $REDLOCKD_BIN, by default
// the one `meson compile -C build` makes at the top of the checkout.

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

type proc struct {
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t testing.TB, log string, argv ...string) *proc {
	f, err := os.OpenFile(log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	// Killed with the test binary, should it die first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("start %s: %v", argv[0], err)
	}
	f.Close()
	p := &proc{cmd: cmd, log: log, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		close(p.done)
	}()
	return p
}

func (p *proc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

func (p *proc) signal(sig syscall.Signal) {
	if p.running() {
		_ = p.cmd.Process.Signal(sig)
	}
}

// stop: SIGCONT (a stopped process cannot exit), sig, then SIGKILL after
// the grace time. Returns the exit code (-1 for a signal).
func (p *proc) stop(sig syscall.Signal, grace time.Duration) int {
	p.signal(syscall.SIGCONT)
	p.signal(sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		p.signal(syscall.SIGKILL)
		<-p.done
	}
	return p.cmd.ProcessState.ExitCode()
}

func (p *proc) tail(n int) string {
	b, _ := os.ReadFile(p.log)
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

type harness struct {
	t     testing.TB
	dir   string
	mu    sync.Mutex
	procs []*proc
	ds    []*daemon
}

func newHarness(t testing.TB, dir string) *harness {
	return &harness{t: t, dir: dir}
}

func (h *harness) add(p *proc) {
	h.mu.Lock()
	h.procs = append(h.procs, p)
	h.mu.Unlock()
}

// cleanup stops what the harness started; with dump, the daemons' logs.
func (h *harness) cleanup(dump bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if dump {
		for _, d := range h.ds {
			fmt.Fprintf(os.Stderr, "---- redlockd log %s ----\n%s\n", d.p.log, d.p.tail(6000))
		}
	}
	for i := len(h.procs) - 1; i >= 0; i-- {
		h.procs[i].stop(syscall.SIGTERM, 5*time.Second)
	}
	h.procs = nil
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// rawLine sends one request on a connection of its own and returns the
// reply line (EVENT lines skipped), or "" when there is none in time.
func rawLine(addr, line string, timeout time.Duration) string {
	return rawLines(addr, []string{line}, timeout)[0]
}

func rawLines(addr string, lines []string, timeout time.Duration) []string {
	out := make([]string, len(lines))
	nc, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return out
	}
	defer nc.Close()
	_ = nc.SetDeadline(time.Now().Add(timeout))
	r := bufio.NewReader(nc)
	for i, line := range lines {
		if _, err := nc.Write([]byte(line + "\n")); err != nil {
			return out
		}
		for {
			s, err := r.ReadString('\n')
			if err != nil {
				return out
			}
			s = strings.TrimRight(s, "\r\n")
			if strings.HasPrefix(s, "EVENT ") {
				continue
			}
			out[i] = s
			break
		}
	}
	return out
}

type redisNode struct {
	port int
	p    *proc
}

func (n *redisNode) addr() string { return "127.0.0.1:" + strconv.Itoa(n.port) }

func (h *harness) redis() *redisNode {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		h.t.Fatal("redis-server not found (scripts/deps installs it)")
	}
	for attempt := 0; attempt < 5; attempt++ {
		dir, err := os.MkdirTemp(h.dir, "redis")
		if err != nil {
			h.t.Fatal(err)
		}
		port := freePort(h.t)
		p := startProc(h.t, filepath.Join(dir, "redis.log"), bin,
			"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "",
			"--appendonly", "no", "--daemonize", "no", "--dir", dir)
		h.add(p)
		n := &redisNode{port: port, p: p}
		for i := 0; i < 100 && p.running(); i++ {
			if strings.HasPrefix(rawLine(n.addr(), "PING", 300*time.Millisecond), "+PONG") {
				return n
			}
			time.Sleep(20 * time.Millisecond)
		}
		p.stop(syscall.SIGKILL, time.Second)
	}
	h.t.Fatal("redis-server did not start")
	return nil
}

func daemonBin(t testing.TB) string {
	bin := os.Getenv("REDLOCKD_BIN")
	if bin == "" {
		bin, _ = filepath.Abs("../../build/daemon/redlockd")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("no redlockd at %s: build it (meson setup build && meson compile -C build) or set REDLOCKD_BIN", bin)
	}
	return bin
}

type daemon struct {
	h        *harness
	port     int
	sock     string
	conf     string
	nodes    int
	password string // auth.password, sent before STATS
	p        *proc
}

func (d *daemon) addr() string { return "127.0.0.1:" + strconv.Itoa(d.port) }

// daemon starts redlockd over the nodes; extra is merged into its config
// (its "listen" addresses are added to the daemon's own TCP and unix ones).
func (h *harness) daemon(nodes []*redisNode, extra map[string]interface{}) *daemon {
	bin := daemonBin(h.t)
	for attempt := 0; attempt < 3; attempt++ {
		dir, err := os.MkdirTemp(h.dir, "redlockd")
		if err != nil {
			h.t.Fatal(err)
		}
		d := &daemon{h: h, port: freePort(h.t), sock: filepath.Join(dir, "redlockd.sock"),
			conf: filepath.Join(dir, "redlockd.json"), nodes: len(nodes)}
		addrs := make([]string, len(nodes))
		for i, n := range nodes {
			addrs[i] = n.addr()
		}
		listen := []string{"tcp://" + d.addr(), "unix:" + d.sock}
		if more, ok := extra["listen"].([]string); ok {
			listen = append(listen, more...)
		}
		if auth, ok := extra["auth"].(map[string]interface{}); ok {
			d.password, _ = auth["password"].(string)
		}
		conf := map[string]interface{}{
			"listen": listen,
			"redis":  map[string]interface{}{"nodes": addrs},
			"log":    map[string]interface{}{"level": "notice"},
			// A stop under held leases waits this long for their clients.
			"shutdown_timeout_ms": 1000,
		}
		merge(conf, extra)
		conf["listen"] = listen
		b, _ := json.MarshalIndent(conf, "", "  ")
		if err := os.WriteFile(d.conf, b, 0o600); err != nil {
			h.t.Fatal(err)
		}
		d.p = startProc(h.t, filepath.Join(dir, "redlockd.log"), bin, "-c", d.conf)
		h.add(d.p)
		if d.waitReady(10 * time.Second) {
			h.mu.Lock()
			h.ds = append(h.ds, d)
			h.mu.Unlock()
			return d
		}
		log := d.p.tail(4000)
		d.p.stop(syscall.SIGKILL, time.Second)
		if !strings.Contains(log, "in use") {
			h.t.Fatalf("redlockd did not start:\n%s", log)
		}
	}
	h.t.Fatal("redlockd did not start: no free port")
	return nil
}

func merge(base, extra map[string]interface{}) {
	for k, v := range extra {
		if m, ok := v.(map[string]interface{}); ok {
			if bm, ok := base[k].(map[string]interface{}); ok {
				merge(bm, m)
				continue
			}
		}
		base[k] = v
	}
}

// waitReady: the daemon answers and every node votes.
func (d *daemon) waitReady(timeout time.Duration) bool {
	end := time.Now().Add(timeout)
	for time.Now().Before(end) && d.p.running() {
		lines := []string{"STATS"}
		if d.password != "" {
			lines = []string{"AUTH " + d.password, "STATS"}
		}
		out := rawLines(d.addr(), lines, 300*time.Millisecond)
		line := out[len(out)-1]
		if strings.HasPrefix(line, "OK {") {
			var s struct {
				Voting int `json:"nodes_voting"`
			}
			if json.Unmarshal([]byte(line[3:]), &s) == nil && s.Voting == d.nodes {
				return true
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return false
}

// restart: SIGTERM, wait for the exit, start again with the same config
// (the same port), as systemctl restart does.
func (d *daemon) restart() {
	d.p.stop(syscall.SIGTERM, 10*time.Second)
	d.startAgain()
}

func (d *daemon) startAgain() {
	d.p = startProc(d.h.t, d.p.log, daemonBin(d.h.t), "-c", d.conf)
	d.h.add(d.p)
	if !d.waitReady(10 * time.Second) {
		d.h.t.Fatalf("redlockd did not start again:\n%s", d.p.tail(4000))
	}
}

// cluster: three nodes and n daemons over them.
func (h *harness) cluster(n int, extra map[string]interface{}) ([]*redisNode, []*daemon) {
	nodes := []*redisNode{h.redis(), h.redis(), h.redis()}
	ds := make([]*daemon, n)
	for i := range ds {
		ds[i] = h.daemon(nodes, extra)
	}
	return nodes, ds
}

// testHarness: a harness of the test's own, stopped when it ends (the
// daemons' logs shown if it failed).
func testHarness(t *testing.T) *harness {
	h := newHarness(t, t.TempDir())
	t.Cleanup(func() { h.cleanup(t.Failed()) })
	return h
}

// The shared cluster (three nodes, one daemon) of the tests that need no
// processes of their own, started by TestMain; $REDLOCKD_SERVER points at
// it, for the examples.
var shared struct {
	h *harness
	d *daemon
}

// sharedServer is the shared daemon's address; each test uses resource
// names of its own (res).
func sharedServer(t testing.TB) string {
	if shared.d == nil {
		t.Fatal("no shared daemon")
	}
	return shared.d.addr()
}

// res: a resource name unique to the test.
func res(t testing.TB, name string) string {
	return strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()) + ":" + name
}

// fatalTB makes the harness usable from TestMain, where there is no
// *testing.T: a failure panics (and TestMain reports it).
type fatalTB struct {
	testing.TB
}

func (fatalTB) Helper()                           {}
func (fatalTB) Name() string                      { return "TestMain" }
func (fatalTB) Fatal(args ...interface{})         { panic(fmt.Sprint(args...)) }
func (fatalTB) Fatalf(f string, a ...interface{}) { panic(fmt.Sprintf(f, a...)) }

// adminPassword is the shared daemon's auth.admin_password (FORCEUNLOCK).
const adminPassword = "admin-pw"

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "redlockd-go-test")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	h := newHarness(fatalTB{}, dir)
	code := 1
	func() {
		defer func() {
			if r := recover(); r != nil {
				fmt.Fprintln(os.Stderr, "redlockd tests: setting up:", r)
			}
		}()
		nodes := []*redisNode{h.redis(), h.redis(), h.redis()}
		shared.d = h.daemon(nodes, map[string]interface{}{
			"auth": map[string]interface{}{"admin_password": adminPassword},
		})
		shared.h = h
		os.Setenv(ServerEnv, shared.d.addr())
		code = m.Run()
	}()
	h.cleanup(code != 0)
	os.RemoveAll(dir)
	os.Exit(code)
}
