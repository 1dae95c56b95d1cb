package redlockd

// One connection to one daemon: the socket, the reader goroutine that
// hands each reply to the request with its tag, and the writes of many
// goroutines gathered into few system calls. It knows no Client: what is
// not a reply (an EVENT line, the connection's end) goes to its owner, a
// connOwner.
//
// Every request a user's goroutine makes is tagged ("#<tag> LOCK x"), so
// many are in flight at once and their replies come back in the order
// they finish. Only HELLO, AUTH and QUIT go untagged (the daemon never
// runs them tagged); the client sends them while nothing else is in
// flight on the connection (the handshake, and Close), so an untagged
// line that is not an EVENT is always the reply to the one untagged
// request outstanding.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
)

// maxReplyLine bounds one line from the daemon (a LOCKS of many leases is
// long: about 200 bytes a lease).
const maxReplyLine = 64 << 20

// call is one request on one connection, waiting for its reply.
type call struct {
	tag     uint64 // 0 for HELLO/AUTH/QUIT (tags count from 1)
	sent    time.Time
	limit   time.Duration // the reply is due within this (0: no limit)
	expires time.Time     // sent + limit
	done    chan struct{} // closed once reply or err is set

	reply string // the reply line without its tag
	err   error  // the connection ended first

	// hook, when set, runs exactly once before done is closed: on the
	// reader goroutine with the reply, or where the connection ends with
	// err. It keeps the client's state right whether or not the goroutine
	// that sent the request is still there to look (a ctx that ended).
	// It must not block, nor start a request while holding Client.mu.
	hook replyHook
}

// replyHook is a request's state that its reply updates (an interface
// rather than a closure: the state is allocated anyway).
type replyHook interface {
	replied(cl *call)
}

// connOwner hears what a connection has to say besides the replies to its
// calls: the daemon's EVENT lines, and that the connection ended. The
// Client owns its connections (core.go, session.go).
type connOwner interface {
	// onEvent handles an EVENT line (without "EVENT ") from cn, on cn's
	// reader goroutine.
	onEvent(cn *conn, ev string)
	// connLost: cn ended; its calls have their error already.
	connLost(cn *conn)
}

// conn is one connection; its fields under mu unless noted.
type conn struct {
	owner  connOwner
	nc     net.Conn   // (owned) closed by fail
	server serverAddr // the address dialled
	index  int        // its index in Client.servers

	wmu      sync.Mutex
	wbuf     []byte // lines waiting for the writer
	spare    []byte
	flushing bool // a goroutine is writing wbuf out

	mu       sync.Mutex
	pending  map[uint64]*call
	untagged *call
	nextTag  uint64
	dead     bool
	err      error  // why it ended
	shutdown bool   // EVENT SHUTDOWN (or ERR SHUTDOWN) seen
	closing  string // EVENT CLOSING reason
	// One timer watches the reply limits of all the calls: it fires at the
	// earliest expiry it knows of (expAt), and a call past its limit ends
	// the connection (a stalled daemon).
	expTimer *time.Timer
	expAt    time.Time
}

// dialConn connects to a, server index i of owner, TLS included (tlsBase:
// Config.TLS), within timeout (Config.Timeout) for each step, and starts
// the reader. The connection is not registered as the owner's yet.
func dialConn(ctx context.Context, owner connOwner, a serverAddr, i int, timeout time.Duration, tlsBase *tls.Config) (*conn, error) {
	d := net.Dialer{Timeout: timeout}
	nc, err := d.DialContext(ctx, a.network, a.addr)
	if err != nil {
		return nil, &ConnError{Server: a.text, Err: err}
	}
	if tc, ok := nc.(*net.TCPConn); ok {
		_ = tc.SetNoDelay(true)
	}
	if a.tls {
		cfg := tlsConfig(tlsBase, a)
		tc := tls.Client(nc, cfg)
		hctx, cancel := context.WithTimeout(ctx, timeout)
		err = tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			nc.Close()
			return nil, &ConnError{Server: a.text, Err: fmt.Errorf("TLS handshake: %w", err)}
		}
		nc = tc
	}
	cn := &conn{
		owner: owner, nc: nc, server: a, index: i,
		pending: make(map[uint64]*call),
	}
	go cn.readLoop()
	return cn, nil
}

// tlsConfig: base (nil: the system's CAs) for server a, with its host as
// ServerName by default and TLS 1.2 at least.
func tlsConfig(base *tls.Config, a serverAddr) *tls.Config {
	var cfg *tls.Config
	if base != nil {
		cfg = base.Clone()
	} else {
		cfg = &tls.Config{}
	}
	if cfg.ServerName == "" {
		cfg.ServerName = strings.SplitN(a.host, "%", 2)[0]
	}
	if cfg.MinVersion < tls.VersionTLS12 {
		cfg.MinVersion = tls.VersionTLS12
	}
	return cfg
}

// start registers a request and writes its line. A tagged request gets
// the next tag of the connection. Its reply is due within limit (0: no
// limit); a reply that does not come in time ends the connection. The
// call is returned even when the connection is already dead: its err
// says so (and its hook has run).
func (cn *conn) start(line string, tagged bool, limit time.Duration, hook replyHook) *call {
	// The deadline rule counts from before the write (the daemon measures
	// the validity from a moment after it); taken before the request is
	// registered, so the reader sees it set.
	cl := &call{done: make(chan struct{}), hook: hook, sent: time.Now(), limit: limit}
	if limit > 0 {
		cl.expires = cl.sent.Add(limit)
	}
	cn.mu.Lock()
	if cn.dead {
		err := cn.err
		cn.mu.Unlock()
		cl.finish("", err)
		return cl
	}
	if tagged {
		cn.nextTag++
		cl.tag = cn.nextTag
		cn.pending[cl.tag] = cl
	} else {
		if cn.untagged != nil {
			cn.mu.Unlock()
			cl.finish("", errors.New("redlockd: internal error: two untagged requests"))
			return cl
		}
		cn.untagged = cl
	}
	if limit > 0 && (cn.expAt.IsZero() || cl.expires.Before(cn.expAt)) {
		cn.armLocked(cl.expires)
	}
	cn.mu.Unlock()

	cn.write(cl.tag, line)
	return cl
}

// write appends a request line ("#<tag> " first when tagged: the tag in
// base 36) to the output; the first goroutine to find no write going on
// writes everything gathered meanwhile, in a loop, so that many
// goroutines' requests leave in one system call.
func (cn *conn) write(tag uint64, line string) {
	cn.wmu.Lock()
	if tag != 0 {
		cn.wbuf = append(cn.wbuf, '#')
		cn.wbuf = strconv.AppendUint(cn.wbuf, tag, 36)
		cn.wbuf = append(cn.wbuf, ' ')
	}
	cn.wbuf = append(cn.wbuf, line...)
	cn.wbuf = append(cn.wbuf, '\n')
	if cn.flushing {
		cn.wmu.Unlock()
		return
	}
	cn.flushing = true
	// Let the goroutines that are ready to run add their lines first (the
	// ones a batch of replies just woke, say): one write for all of them.
	cn.wmu.Unlock()
	runtime.Gosched()
	cn.wmu.Lock()
	for len(cn.wbuf) > 0 {
		out := cn.wbuf
		cn.wbuf = cn.spare[:0]
		cn.wmu.Unlock()
		_, err := cn.nc.Write(out)
		cn.wmu.Lock()
		cn.spare = out[:0]
		if err != nil {
			cn.wbuf = nil
			cn.flushing = false
			cn.wmu.Unlock()
			cn.fail(fmt.Errorf("write: %w", err))
			return
		}
	}
	cn.flushing = false
	cn.wmu.Unlock()
}

func (cl *call) finish(reply string, err error) {
	cl.reply, cl.err = reply, err
	if cl.hook != nil {
		cl.hook.replied(cl)
	}
	close(cl.done)
}

// wait waits for the reply, or until ctx ends (then ctx's error; the
// request stays in flight and its hook runs when it ends).
func (cn *conn) wait(ctx context.Context, cl *call) error {
	select {
	case <-cl.done:
		return cl.err
	case <-ctx.Done():
		select {
		case <-cl.done:
			return cl.err
		default:
		}
		return ctx.Err()
	}
}

// roundtrip: start, then wait.
func (cn *conn) roundtrip(ctx context.Context, line string, tagged bool, limit time.Duration) (*call, error) {
	cl := cn.start(line, tagged, limit, nil)
	return cl, cn.wait(ctx, cl)
}

func (cn *conn) armLocked(at time.Time) {
	cn.expAt = at
	d := time.Until(at)
	if cn.expTimer == nil {
		cn.expTimer = time.AfterFunc(d, cn.checkExpired)
	} else {
		cn.expTimer.Reset(d)
	}
}

// checkExpired: the timer fired. A call past its limit ends the
// connection; else the timer waits for the earliest expiry left.
func (cn *conn) checkExpired() {
	cn.mu.Lock()
	if cn.dead {
		cn.mu.Unlock()
		return
	}
	now := time.Now()
	var earliest time.Time
	var late *call
	check := func(cl *call) {
		if cl == nil || cl.limit == 0 || late != nil {
			return
		}
		if !now.Before(cl.expires) {
			late = cl
		} else if earliest.IsZero() || cl.expires.Before(earliest) {
			earliest = cl.expires
		}
	}
	check(cn.untagged)
	for _, cl := range cn.pending {
		check(cl)
	}
	if late == nil {
		cn.expAt = time.Time{}
		if !earliest.IsZero() {
			cn.armLocked(earliest)
		}
		cn.mu.Unlock()
		return
	}
	cn.mu.Unlock()
	cn.fail(&replyTimeout{late.limit})
}

// replyTimeout ends a connection whose daemon did not answer in time (a
// stalled daemon, or the network to it).
type replyTimeout struct{ limit time.Duration }

func (e *replyTimeout) Error() string { return fmt.Sprintf("no reply within %v", e.limit) }
func (e *replyTimeout) Timeout() bool { return true }

func (cn *conn) readLoop() {
	r := bufio.NewReaderSize(cn.nc, 64<<10)
	var long []byte
	for {
		frag, err := r.ReadSlice('\n')
		if err == bufio.ErrBufferFull {
			if len(long)+len(frag) > maxReplyLine {
				cn.fail(protoErr("a line longer than %d bytes", maxReplyLine))
				return
			}
			long = append(long, frag...)
			continue
		}
		if err != nil {
			if err == io.EOF {
				err = errors.New("connection closed by the daemon")
				if len(frag) > 0 || len(long) > 0 {
					err = errors.New("connection closed by the daemon mid-line")
				}
			}
			cn.fail(err)
			return
		}
		var line string
		if long != nil {
			line = string(append(long, frag...))
			long = nil
		} else {
			line = string(frag)
		}
		line = strings.TrimSuffix(strings.TrimSuffix(line, "\n"), "\r")
		if line == "" {
			continue
		}
		if err := cn.dispatch(line); err != nil {
			cn.fail(err)
			return
		}
	}
}

func (cn *conn) dispatch(line string) error {
	if strings.HasPrefix(line, "EVENT ") {
		cn.owner.onEvent(cn, line[len("EVENT "):])
		return nil
	}
	var cl *call
	rest := line
	cn.mu.Lock()
	if line[0] == '#' {
		var tag string
		tag, rest, _ = strings.Cut(line[1:], " ")
		if n, err := strconv.ParseUint(tag, 36, 64); err == nil {
			cl = cn.pending[n]
			delete(cn.pending, n)
		}
	} else {
		cl = cn.untagged
		cn.untagged = nil
	}
	cn.mu.Unlock()
	if cl == nil {
		if strings.HasPrefix(line, "ERR UNKNOWN") && strings.Contains(line, "'#") {
			return fmt.Errorf("%w: this daemon does not take tagged requests (it is older than"+
				" them): %s", ErrUnsupported, line)
		}
		return protoErr("a reply to no request: %.80q", line)
	}
	cl.finish(rest, nil)
	return nil
}

// fail ends the connection: every request in flight gets err, the socket
// is closed, the owner hears of it. Only the first call does anything.
func (cn *conn) fail(err error) {
	cn.mu.Lock()
	if cn.dead {
		cn.mu.Unlock()
		return
	}
	cn.dead = true
	if cn.closing != "" {
		err = fmt.Errorf("%w (the daemon said: closing, %s)", err, cn.closing)
	}
	cerr := &ConnError{Server: cn.server.text, Err: err}
	cn.err = cerr
	calls := make([]*call, 0, len(cn.pending)+1)
	for _, cl := range cn.pending {
		calls = append(calls, cl)
	}
	if cn.untagged != nil {
		calls = append(calls, cn.untagged)
	}
	cn.pending = nil
	cn.untagged = nil
	if cn.expTimer != nil {
		cn.expTimer.Stop()
	}
	cn.mu.Unlock()
	cn.nc.Close()
	for _, cl := range calls {
		cl.finish("", cerr)
	}
	cn.owner.connLost(cn)
}

func (cn *conn) isDead() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.dead
}

func (cn *conn) setShutdown() {
	cn.mu.Lock()
	cn.shutdown = true
	cn.mu.Unlock()
}

func (cn *conn) isShutdown() bool {
	cn.mu.Lock()
	defer cn.mu.Unlock()
	return cn.shutdown
}
