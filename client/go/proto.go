package redlockd

// The line protocol as this client reads and writes it (docs/protocol.md):
// server addresses, resource names, durations, and the reply lines.

import (
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

const (
	// DefaultServer is used when Config.Servers and $REDLOCKD_SERVER are empty.
	DefaultServer = "127.0.0.1:7390"
	// ServerEnv names the environment variable with the default servers
	// (one address, or several separated by commas).
	ServerEnv = "REDLOCKD_SERVER"

	defaultPort    = "7390"
	maxResourceLen = 1024 // the daemon's own limit is locks.max_resource_len (200)
	maxMulti       = 256  // the parser's; the daemon's is locks.max_multi (16)
	maxNameLen     = 64
	maxValueLen    = 4096 // the daemon's locks.max_value_len is 256 by default, 4096 at most
	maxDurationMs  = 4294967295
)

// serverAddr is one parsed server address.
type serverAddr struct {
	text    string // as given
	network string // "tcp" or "unix"
	addr    string // host:port or path
	host    string // for TLS: the name the certificate must carry
	tls     bool
}

// parseServer reads an address in the grammar of the daemon's
// configuration: tcp://HOST:PORT, HOST:PORT, HOST, [IPV6]:PORT,
// tls://HOST:PORT, unix:/PATH, unix:///PATH or /PATH.
func parseServer(text string) (serverAddr, error) {
	s := strings.TrimSpace(text)
	a := serverAddr{text: s}
	bad := func(why string) (serverAddr, error) {
		return serverAddr{}, fmt.Errorf("%w: bad server address %q: %s", ErrArg, text, why)
	}
	switch {
	case strings.HasPrefix(s, "unix://"):
		a.network, a.addr = "unix", strings.TrimPrefix(s, "unix://")
	case strings.HasPrefix(s, "unix:"):
		a.network, a.addr = "unix", strings.TrimPrefix(s, "unix:")
	case strings.HasPrefix(s, "/"):
		a.network, a.addr = "unix", s
	}
	if a.network == "unix" {
		if !strings.HasPrefix(a.addr, "/") || len(a.addr) < 2 {
			return bad("a unix socket path must be absolute")
		}
		return a, nil
	}
	rest := s
	if strings.HasPrefix(rest, "tls://") {
		a.tls = true
		rest = strings.TrimPrefix(rest, "tls://")
	} else {
		rest = strings.TrimPrefix(rest, "tcp://")
	}
	host, port := rest, defaultPort
	if strings.HasPrefix(rest, "[") {
		end := strings.Index(rest, "]")
		if end < 0 {
			return bad("unclosed [")
		}
		host = rest[1:end]
		after := rest[end+1:]
		if after != "" {
			if !strings.HasPrefix(after, ":") {
				return bad("junk after ]")
			}
			port = after[1:]
		}
		zone := ""
		if i := strings.IndexByte(host, '%'); i >= 0 {
			host, zone = host[:i], host[i:]
		}
		ip := net.ParseIP(host)
		if ip == nil || ip.To4() != nil && !strings.Contains(host, ":") {
			return bad("brackets are for IPv6 addresses")
		}
		host += zone
	} else {
		if i := strings.LastIndexByte(rest, ':'); i >= 0 {
			host, port = rest[:i], rest[i+1:]
		}
		if host == "" {
			return bad("no host")
		}
		for _, ch := range host {
			if !(ch >= 'a' && ch <= 'z' || ch >= 'A' && ch <= 'Z' ||
				ch >= '0' && ch <= '9' || ch == '.' || ch == '-') {
				return bad("a host is an IPv4 address or a name (IPv6 in brackets)")
			}
		}
	}
	if len(port) < 1 || len(port) > 5 {
		return bad("a port is 1 to 65535")
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 || strings.TrimLeft(port, "0123456789") != "" {
		return bad("a port is 1 to 65535")
	}
	a.network = "tcp"
	a.host = host
	a.addr = net.JoinHostPort(host, port)
	return a, nil
}

// checkWord refuses what cannot travel as one word of a request: empty,
// too long, or a byte outside visible ASCII.
func checkWord(what, w string, max int) error {
	if w == "" || len(w) > max {
		return fmt.Errorf("%w: %s must be 1 to %d bytes", ErrArg, what, max)
	}
	for i := 0; i < len(w); i++ {
		if w[i] < 0x21 || w[i] > 0x7e {
			return fmt.Errorf("%w: %s %q: only visible ASCII characters", ErrArg, what, w)
		}
	}
	return nil
}

// checkValue refuses a holder's value (Value, Lease.SetValue) the daemon
// could not take: the daemon's own limit, locks.max_value_len, may be
// lower (ERR ARG).
func checkValue(v string) error {
	if v == "" || len(v) > maxValueLen {
		return fmt.Errorf("%w: a holder's value must be 1 to %d bytes (the daemon's"+
			" locks.max_value_len, 256 by default)", ErrArg, maxValueLen)
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x21 || v[i] > 0x7e {
			return fmt.Errorf("%w: holder value %q: only visible ASCII characters, no spaces", ErrArg, v)
		}
	}
	return nil
}

func checkResource(r string) error {
	if err := checkWord("a resource name", r, maxResourceLen); err != nil {
		return err
	}
	if strings.IndexByte(r, '=') >= 0 {
		return fmt.Errorf("%w: resource name %q: a word with '=' is read as an option", ErrArg, r)
	}
	return nil
}

// millis writes a duration as the protocol's milliseconds, rounded up
// (a positive duration never becomes 0).
func millis(d time.Duration) uint64 {
	if d <= 0 {
		return 0
	}
	ms := uint64((d + time.Millisecond - 1) / time.Millisecond)
	if ms > maxDurationMs {
		ms = maxDurationMs
	}
	return ms
}

func itoa(n uint64) string { return strconv.FormatUint(n, 10) }

// fields are the "k=v k=v" words of a reply or an event, read in place
// (a reply has a handful: a map would cost more than the scans).
type fields string

// get is the value of key, and whether it is there.
func (f fields) get(key string) (string, bool) {
	s := string(f)
	for len(s) > 0 {
		var w string
		w, s, _ = strings.Cut(s, " ")
		if len(w) > len(key) && w[len(key)] == '=' && w[:len(key)] == key {
			return w[len(key)+1:], true
		}
	}
	return "", false
}

// str is the value of key, "" when it is not there.
func (f fields) str(key string) string {
	v, _ := f.get(key)
	return v
}

// uint reads a number; a protocol error when it is missing or malformed.
func (f fields) uint(key string) (uint64, error) {
	v, ok := f.get(key)
	if !ok {
		return 0, protoErr("reply without %s=", key)
	}
	n, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, protoErr("bad %s=%q", key, v)
	}
	return n, nil
}

// reply splits a reply line (its tag already taken off) into its head and
// the rest: "OK", "PONG" or an *Error for ERR.
func reply(line string) (head, rest string, err error) {
	head, rest, _ = strings.Cut(line, " ")
	switch head {
	case "OK", "PONG":
		return head, rest, nil
	case "ERR":
		return head, rest, errReply(rest)
	}
	return "", "", protoErr("unexpected line %.80q", line)
}

// okReply is the text after OK, or the ERR's error.
func okReply(line string) (string, error) {
	head, rest, err := reply(line)
	if err != nil {
		return "", err
	}
	if head != "OK" {
		return "", protoErr("expected OK, got %.80q", line)
	}
	return rest, nil
}
