package redlockd

// The Client's face: Dial, the session's id and server, Ping and Close.
// A Client is one session with redlockd, shared by every goroutine of the
// program; its state is core.go's, and how it follows its leases across
// lost connections and daemons is session.go's.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"
)

// Dial opens a session with the first server that answers (in the order of
// Config.Servers). ctx bounds the connection attempts; the Client lives
// until Close.
func Dial(ctx context.Context, cfg Config) (*Client, error) {
	c, err := newClient(cfg)
	if err != nil {
		return nil, err
	}
	var last error
	for i := range c.servers {
		if last = c.tryFresh(ctx, i); last == nil {
			break
		}
		var rerr *Error
		if errors.As(last, &rerr) || ctx.Err() != nil {
			break // the daemon said no (a wrong password): not a server to skip
		}
	}
	if last == nil {
		// One tagged request, so that a daemon that takes none is told
		// at once.
		c.mu.Lock()
		cn := c.cn
		c.mu.Unlock()
		if _, last = cn.roundtrip(ctx, "PING", true, c.cfg.Timeout); last != nil {
			cn.fail(last)
		}
	}
	if last != nil {
		c.cancel()
		return nil, last
	}
	go c.keeper()
	return c, nil
}

func newClient(cfg Config) (*Client, error) {
	if cfg.Timeout <= 0 {
		cfg.Timeout = defaultTimeout
	}
	var detach time.Duration
	switch {
	case cfg.Detach == 0:
		detach = defaultDetach
	case cfg.Detach > 0:
		detach = cfg.Detach
	}
	list := cfg.Servers
	if len(list) == 0 {
		if env := os.Getenv(ServerEnv); env != "" {
			list = strings.Split(env, ",")
		} else {
			list = []string{DefaultServer}
		}
	}
	var servers []serverAddr
	for _, s := range list {
		if strings.TrimSpace(s) == "" {
			continue
		}
		a, err := parseServer(s)
		if err != nil {
			return nil, err
		}
		servers = append(servers, a)
	}
	if len(servers) == 0 {
		return nil, fmt.Errorf("%w: no server address", ErrArg)
	}
	if cfg.Name != "" {
		if err := checkWord("the client name", cfg.Name, maxNameLen); err != nil {
			return nil, err
		}
	}
	if cfg.User != "" {
		if err := checkWord("the user name", cfg.User, maxNameLen); err != nil {
			return nil, err
		}
		if cfg.Password == "" {
			return nil, fmt.Errorf("%w: a user needs a password", ErrArg)
		}
	}
	if strings.ContainsAny(cfg.Password, " \t\r\n\x00") {
		return nil, fmt.Errorf("%w: a password cannot contain spaces or control characters", ErrArg)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Client{
		cfg: cfg, servers: servers, detachMs: millis(detach),
		ctx: ctx, cancel: cancel,
		poke:       make(chan struct{}, 1),
		keeperDone: make(chan struct{}),
		changed:    make(chan struct{}),
		leases:     make(map[string]*Lease),
		queues:     make(map[string][]*ticket),

		watches:      make(map[string]map[*Watcher]struct{}),
		unwatchLater: make(map[string]bool),
	}, nil
}

// Session is the id of the current session (it changes when the leases
// move to another daemon).
func (c *Client) Session() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.session
}

// Server is the address of the daemon of the current (or last) connection.
func (c *Client) Server() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[c.server].text
}

// Close ends the session (QUIT): the daemon releases every lock it holds.
// Leases still held end with a *LostError that is ErrClosed (their Done
// closes); Watchers end with ErrClosed (their channels close). If the
// connection is being re-established, Close waits for it (up to
// Config.Timeout) so that the QUIT can release the leases. A QUIT waits
// for LOCKs still waiting in the daemon (within their Wait). Idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	busy := len(c.leases) > 0
	c.mu.Unlock()
	var cn *conn
	if busy {
		var until time.Time
		cn, _ = c.readyConn(context.Background(), &until, false, nil)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	watchers := c.endWatchersLocked()
	cn = nil
	if c.ready {
		cn = c.cn
	}
	limit := c.cfg.Timeout + time.Until(c.maxWaitEnd)
	if limit < c.cfg.Timeout {
		limit = c.cfg.Timeout
	}
	c.broadcastLocked()
	c.mu.Unlock()
	for _, w := range watchers {
		w.finish(ErrClosed)
	}
	c.cancel() // the keeper stops; a reconnection under way ends
	var err error
	if cn != nil {
		if _, qerr := cn.roundtrip(context.Background(), "QUIT", false, limit); qerr != nil {
			err = qerr
		}
		cn.fail(ErrClosed)
	}
	<-c.keeperDone
	c.mu.Lock()
	if c.cn != nil {
		cn = c.cn
	}
	for _, l := range c.leases {
		c.loseLocked(l, "closed")
	}
	if c.dlTimer != nil {
		c.dlTimer.Stop()
	}
	c.mu.Unlock()
	if cn != nil {
		cn.fail(ErrClosed)
	}
	return err
}

// Ping asks the daemon for a PONG.
func (c *Client) Ping(ctx context.Context) error {
	line, err := c.request(ctx, "PING")
	if err != nil {
		return err
	}
	if head, _, err := reply(line); err != nil || head != "PONG" {
		if err == nil {
			err = protoErr("expected PONG, got %.80q", line)
		}
		return err
	}
	return nil
}
