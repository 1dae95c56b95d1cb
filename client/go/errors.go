package redlockd

import (
	"errors"
	"fmt"
	"strings"
)

// Errors to compare with errors.Is. The daemon's ERR codes map to one each
// (an *Error carries the code and the daemon's message); the others are the
// client's own.
var (
	ErrArg         = errors.New("redlockd: ARG")         // malformed request, or a value out of the daemon's range
	ErrUnknown     = errors.New("redlockd: UNKNOWN")     // unknown command
	ErrTooLong     = errors.New("redlockd: TOOLONG")     // request line over the daemon's max_line
	ErrNoAuth      = errors.New("redlockd: NOAUTH")      // a password is needed (Config.Password)
	ErrAuth        = errors.New("redlockd: AUTH")        // wrong password or user
	ErrBusy        = errors.New("redlockd: BUSY")        // held by someone else, and no Wait
	ErrTimeout     = errors.New("redlockd: TIMEOUT")     // the Wait ran out
	ErrHeld        = errors.New("redlockd: HELD")        // this session holds it already
	ErrNotHeld     = errors.New("redlockd: NOTHELD")     // this session does not hold it
	ErrLost        = errors.New("redlockd: LOST")        // the lease could not be kept
	ErrUnavailable = errors.New("redlockd: UNAVAILABLE") // no quorum of Redis nodes, or no daemon reachable
	ErrLimit       = errors.New("redlockd: LIMIT")       // a configured limit of the daemon
	ErrShutdown    = errors.New("redlockd: SHUTDOWN")    // the daemon is stopping
	ErrNoSession   = errors.New("redlockd: NOSESSION")   // resume refused
	ErrDenied      = errors.New("redlockd: DENIED")      // outside the user's prefixes

	// ErrClosed: the Client was closed (its leases end with a *LostError
	// that is also ErrClosed; its Watchers' Err is ErrClosed), or the
	// Watcher was.
	ErrClosed = errors.New("redlockd: client closed")
	// ErrReleased: Lease.Err after Unlock.
	ErrReleased = errors.New("redlockd: lease released")
	// ErrConnection: no connection to any server could be made or kept
	// (a *ConnError, which is also ErrUnavailable).
	ErrConnection = errors.New("redlockd: no connection")
	// ErrProtocol: the daemon sent something this client cannot read.
	ErrProtocol = errors.New("redlockd: protocol error")
	// ErrUnsupported: an option this client or the daemon does not offer yet.
	ErrUnsupported = errors.New("redlockd: not supported")
)

var codeErrors = map[string]error{
	"ARG": ErrArg, "UNKNOWN": ErrUnknown, "TOOLONG": ErrTooLong,
	"NOAUTH": ErrNoAuth, "AUTH": ErrAuth, "BUSY": ErrBusy,
	"TIMEOUT": ErrTimeout, "HELD": ErrHeld, "NOTHELD": ErrNotHeld,
	"LOST": ErrLost, "UNAVAILABLE": ErrUnavailable, "LIMIT": ErrLimit,
	"SHUTDOWN": ErrShutdown, "NOSESSION": ErrNoSession, "DENIED": ErrDenied,
}

// Error is an ERR reply of the daemon: its code and its message, as sent.
// errors.Is(err, ErrBusy) and the like compare the code; a code this
// client does not know (from a newer daemon) matches no sentinel.
type Error struct {
	Code    string // BUSY, TIMEOUT, ...
	Message string // for people; may change between versions
}

func (e *Error) Error() string {
	if e.Message == "" {
		return "redlockd: " + e.Code
	}
	return "redlockd: " + e.Code + " " + e.Message
}

// Unwrap gives the sentinel of the code (ErrBusy for BUSY), or nil.
func (e *Error) Unwrap() error { return codeErrors[e.Code] }

// LostError ends a lease that was not released by its holder: the daemon
// said so (EVENT LOST, ERR LOST, a refused ADOPT), its deadline passed
// unconfirmed, or the Client was closed. errors.Is(err, ErrLost) holds for
// all of them, errors.Is(err, ErrClosed) for the last.
type LostError struct {
	Resources []string
	Fence     uint64
	// Reason: the daemon's (expired, quorum, node), or the client's:
	// deadline (not confirmed in time), adopt (another daemon refused to
	// take it over), gone (the session no longer lists it), closed.
	Reason string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("redlockd: lease on %s (fence %d) lost: %s",
		strings.Join(e.Resources, " "), e.Fence, e.Reason)
}

// Is makes a LostError ErrLost, and ErrClosed when the Client was closed.
func (e *LostError) Is(target error) bool {
	return target == ErrLost || (target == ErrClosed && e.Reason == "closed")
}

// ConnError: a server could not be reached, or its connection broke and no
// other could be had in time. It is ErrConnection and ErrUnavailable.
type ConnError struct {
	Server string
	Err    error
}

func (e *ConnError) Error() string {
	if e.Server == "" {
		return "redlockd: " + e.Err.Error()
	}
	return "redlockd: " + e.Server + ": " + e.Err.Error()
}

func (e *ConnError) Unwrap() error { return e.Err }

// Is makes a ConnError ErrConnection and ErrUnavailable.
func (e *ConnError) Is(target error) bool {
	return target == ErrConnection || target == ErrUnavailable
}

func protoErr(format string, args ...interface{}) error {
	return fmt.Errorf("%w: "+format, append([]interface{}{ErrProtocol}, args...)...)
}

// errReply makes the error of an "ERR CODE message" reply.
func errReply(rest string) *Error {
	code, msg, _ := strings.Cut(rest, " ")
	return &Error{Code: code, Message: msg}
}
