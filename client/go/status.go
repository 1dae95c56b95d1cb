package redlockd

// Inspection: STATUS of a resource, LOCKS of the session.

import (
	"context"
	"encoding/json"
)

// Status is what the daemon and the Redis nodes know of one resource
// (STATUS). Fields the daemon does not send stay zero.
type Status struct {
	Resource string `json:"resource"`
	Key      string `json:"key"`
	Held     bool   `json:"held"`
	// Mode: "exclusive", "shared", or "" when free.
	Mode string `json:"mode"`
	// Holder: one holder, wherever it is (nil when nobody holds it, or
	// when no single holder is known: see docs/protocol.md).
	Holder *Holder `json:"holder"`
	// Holders: this daemon's holders (the first 64).
	Holders       []Holder     `json:"holders"`
	HoldersHere   int          `json:"holders_here"`
	SharedHolders int          `json:"shared_holders"`
	Waiters       int          `json:"waiters"`
	Limit         int          `json:"limit"`
	SlotsHeld     int          `json:"slots_held"`
	Nodes         []NodeStatus `json:"nodes"`
	// Raw is the whole JSON object, with what this version does not read.
	Raw json.RawMessage `json:"-"`
}

// Holder is one holder of a resource as STATUS shows it.
type Holder struct {
	Daemon   string `json:"daemon"`
	Session  string `json:"session"`
	Name     string `json:"name"`
	Fence    uint64 `json:"fence"`
	HeldMs   int64  `json:"held_ms"`
	Validity int64  `json:"validity"`
	Mode     string `json:"mode"`
	Attached *bool  `json:"attached"`
	Slot     *int   `json:"slot"`
	// Value: the holder's value (Value, Lease.SetValue), "" without one;
	// from the nodes, so the same on every daemon.
	Value string `json:"value"`
	// Foreign: the key was set by another Redlock client.
	Foreign bool `json:"foreign"`
}

// NodeStatus is one Redis node's view of the resource.
type NodeStatus struct {
	Node   string `json:"node"`
	Up     bool   `json:"up"`
	Voting bool   `json:"voting"`
	PTTL   int64  `json:"pttl"`
	Shared int    `json:"shared"`
}

// Status asks the daemon about a resource (STATUS). For a semaphore the
// daemon does not know yet, give its Limit; other options are ignored.
// The exclusive holder's value (a leader's address) is Holder.Value.
func (c *Client) Status(ctx context.Context, resource string, opts ...Option) (*Status, error) {
	if err := checkResource(resource); err != nil {
		return nil, err
	}
	var o lockOptions
	for _, f := range opts {
		f(&o)
	}
	line := "STATUS " + resource
	if o.limit > 0 {
		line += " limit=" + itoa(uint64(o.limit))
	}
	raw, err := c.jsonRequest(ctx, line)
	if err != nil {
		return nil, err
	}
	s := &Status{Raw: raw}
	if err := json.Unmarshal(raw, s); err != nil {
		return nil, protoErr("STATUS reply: %v", err)
	}
	return s, nil
}

// LockInfo is one lease of the session as LOCKS shows it.
type LockInfo struct {
	Resource string `json:"resource"`
	Fence    uint64 `json:"fence"`
	TTL      int64  `json:"ttl"`      // ms
	Validity int64  `json:"validity"` // ms left, as the daemon sees it
	HeldMs   int64  `json:"held_ms"`
	Renew    bool   `json:"renew"`
	Renewals int64  `json:"renewals"`
	Mode     string `json:"mode"`
	Limit    int    `json:"limit"`
	Slot     *int   `json:"slot"`
	Value    string `json:"value"` // the holder's value, "" without one
}

// Locks lists the session's leases as the daemon sees them (LOCKS).
func (c *Client) Locks(ctx context.Context) ([]LockInfo, error) {
	raw, err := c.jsonRequest(ctx, "LOCKS")
	if err != nil {
		return nil, err
	}
	var body struct {
		Locks []LockInfo `json:"locks"`
	}
	if err := json.Unmarshal(raw, &body); err != nil {
		return nil, protoErr("LOCKS reply: %v", err)
	}
	return body.Locks, nil
}

func (c *Client) jsonRequest(ctx context.Context, line string) (json.RawMessage, error) {
	r, err := c.request(ctx, line)
	if err != nil {
		return nil, err
	}
	rest, err := okReply(r)
	if err != nil {
		return nil, err
	}
	if len(rest) == 0 || rest[0] != '{' {
		return nil, protoErr("expected JSON, got %.80q", rest)
	}
	return json.RawMessage(rest), nil
}
