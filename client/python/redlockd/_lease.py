"""Leases and the Client's lease table.

``Lease``: a lock held through a Client, with its deadline and its state
(the public object; its ``extend()``, ``set_value()`` and ``release()``
go through its Client). ``_LeaseTable``: the mixin over the Client's
table of leases (``_leases``, resource -> Lease): ``EVENT LOST``
(``_on_lost``; the event kept for a LOCK whose lease is not registered
yet), a lease made from a LOCK's reply, registered and forgotten, the
EXTEND, UNLOCK and ADOPT in flight on a lease (``_op_start``,
``_op_done``) that a LOCKS round must not overrule, and the LOCKS round
itself (``_refresh``, ``_apply_locks``) with the time the next is due.

Above ``_conn`` (LOCKS goes out on the connection); below ``_failover``,
whose resume confirms the leases with a LOCKS round and which ADOPTs
them on a new session.
"""

import time

from . import _proto
from ._conn import _Connection
from .errors import Error, LockLost, NotHeld, ProtocolError, TransportError


class Lease:
    """A lock held through a Client.

    ``resource`` (the first of ``resources``), ``token`` (a new one after an
    ADOPT), ``fence``, ``ttl`` (ms), ``validity`` (ms, as last reported),
    ``deadline`` (monotonic seconds), ``mode``, ``limit`` and ``slot`` (None
    unless ``limit=``), ``renew``, ``value`` (the holder's value given to
    ``lock()`` or ``set_value()``, or None). ``state`` is "held",
    "unconfirmed" (the connection is being re-established), "lost" or
    "released". ``lost``
    says whether it may no longer be relied on; ``check()`` raises
    :class:`LockLost` if so. As a context manager it releases the lock on
    leaving the block, and raises :class:`LockLost` there if the block ended
    normally but the lease was lost on the way (an exception from the block
    is never replaced).
    """

    def __init__(self, client, resources, token, fence, ttl, validity,
                 t_send, renew, mode, limit, slot, value=None):
        self._client = client
        self.resources = tuple(resources)
        self.resource = self.resources[0]
        self.token = token
        self.fence = fence
        self.ttl = ttl
        self.validity = validity
        self.renew = renew
        self.mode = mode
        self.limit = limit
        self.slot = slot
        self.value = value
        self._deadline = t_send + validity / 1000.0
        self._refreshed_at = t_send
        self._lost_reason = None
        self._released = False
        self._needs_adopt = False   # its session is gone: ADOPT it
        self._ops = 0               # its EXTEND/UNLOCK/ADOPT in flight
        self._seq = 0               # bumped as each of them starts

    # ---- state (all under the client's _state lock) ----

    def _lose(self, reason):
        """Mark lost; the daemon's reasons replace the client's guesses."""
        if self._released:
            return
        self._needs_adopt = False
        if self._lost_reason is None or (
                self._lost_reason == "deadline" and
                reason in ("expired", "quorum", "node")):
            self._lost_reason = reason

    def _check_deadline(self, now):
        if (not self._released and self._lost_reason is None and
                now >= self._deadline):
            self._lost_reason = "deadline"
            self._needs_adopt = False

    def _alive(self, now):
        self._check_deadline(now)
        return self._lost_reason is None and not self._released

    def _confirm(self, t_send, deadline, validity=None, ttl=None):
        """A reply to a request sent at t_send vouches for `deadline`."""
        self._check_deadline(time.monotonic())
        if self._lost_reason is not None or self._released:
            return
        self._deadline = deadline
        self._refreshed_at = max(self._refreshed_at, t_send)
        if validity is not None:
            self.validity = validity
        if ttl is not None:
            self.ttl = ttl

    def _refresh_due(self):
        if (self._lost_reason is not None or self._released or
                self._needs_adopt or self._ops):
            return None     # (an op in flight confirms it or ends it)
        return self._refreshed_at + self.ttl / 3000.0

    def _state_locked(self):
        self._check_deadline(time.monotonic())
        if self._lost_reason is not None:
            return "lost"
        if self._released:
            return "released"
        if not self._client._ready or self._needs_adopt:
            return "unconfirmed"
        return "held"

    # ---- public ----

    @property
    def deadline(self):
        """Monotonic time (``time.monotonic()``) until which the lease is
        known to be valid."""
        with self._client._state:
            return self._deadline

    @property
    def remaining(self):
        """Seconds left before the deadline (0.0 once it passed or the
        lease was lost)."""
        with self._client._state:
            self._check_deadline(time.monotonic())
            if self._lost_reason is not None:
                return 0.0
            return max(0.0, self._deadline - time.monotonic())

    @property
    def state(self):
        """``"held"``: confirmed on the current connection.
        ``"unconfirmed"``: the connection was lost and is being
        re-established (resume or ADOPT); still valid until ``deadline``.
        ``"lost"``: see ``lost_reason``. ``"released"``: given back."""
        with self._client._state:
            return self._state_locked()

    @property
    def lost(self):
        """True once EVENT LOST came for it, its deadline passed, an ADOPT
        failed, or the connection closed for good. It stays True."""
        with self._client._state:
            self._check_deadline(time.monotonic())
            return self._lost_reason is not None

    @property
    def lost_reason(self):
        """Why it was lost (``expired``, ``quorum``, ``node``, ``deadline``,
        ``adopt``, ``shutdown``, ``closed``, ``gone``, ``lost``), or None."""
        with self._client._state:
            self._check_deadline(time.monotonic())
            return self._lost_reason

    @property
    def released(self):
        with self._client._state:
            return self._released

    def check(self):
        """Raise :class:`LockLost` if the lease may no longer be relied
        on; call it before each step of the protected work. An
        "unconfirmed" lease passes until its deadline."""
        reason = self.lost_reason
        if reason is not None:
            raise LockLost(self.resource, reason)

    def extend(self, ttl):
        """EXTEND every resource of the lease to `ttl` (a duration as for
        ``Client.lock``: ms, "1.5s", a timedelta); the deadline becomes
        send time + the reported validity. Raises Lost (also marks
        the lease lost), NotHeld, Unavailable, Arg."""
        return self._client._extend(self, ttl)

    def set_value(self, value):
        """EXTEND value=: replace the holder's value that STATUS and WATCH
        show on every daemon, without giving the lock up (the same token
        and fence; the ttl stays). The deadline moves on as for
        ``extend()``; returns the validity (ms). Raises Arg for a lease
        that takes no value (shared, a semaphore slot) or a value over the
        daemon's ``locks.max_value_len``, Lost, NotHeld, Unavailable."""
        return self._client._extend(self, None, _proto.value_word(value))

    def release(self):
        """UNLOCK (reconnecting first if need be, and once more if the
        connection is lost under it). Returns the number of nodes the key
        was deleted from (None when already released or not known). Raises
        LockLost if the lease had been lost, a TransportError if no daemon
        could be reached within the client's timeout (the lease then counts
        as lost, "closed"). A second call does nothing."""
        return self._client._release(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        try:
            self.release()
        except Error as e:
            if exc_type is not None:
                return False        # the block's own exception wins
            if isinstance(e, LockLost):
                raise
            if isinstance(e, TransportError):
                raise LockLost(self.resource, "closed") from e
            if isinstance(e, NotHeld):
                raise LockLost(self.resource, "gone") from e
            raise
        if exc_type is None:
            with self._client._state:
                reason = self._lost_reason
            if reason is not None:
                raise LockLost(self.resource, reason)
        return False

    def __repr__(self):
        with self._client._state:
            state = self._state_locked()
        return (f"<redlockd.Lease {' '.join(self.resources)} fence={self.fence}"
                f" mode={self.mode} {state}>")


class _LeaseTable(_Connection):
    """The Client's lease table (a mixin: the state is the Client's)."""

    def _on_lost(self, resource, fence, reason):
        lease = self._leases.get(resource)
        if lease is not None and (fence is None or fence == str(lease.fence)):
            lease._lose(reason)
        else:
            # The LOCK reply may be read before its caller registers the
            # lease; keep the event for it.
            self._early_lost[resource] = (fence, reason)

    # ---- requests on leases in flight ----

    def _op_start(self, leases):
        """EXTEND, UNLOCK or ADOPT of these leases goes out: a LOCKS sent
        before its answer is in no longer speaks for them."""
        with self._state:
            for lease in leases:
                lease._ops += 1
                lease._seq += 1

    def _op_done(self, leases):
        with self._state:
            for lease in leases:
                lease._ops -= 1
            self._state.notify_all()    # a refresh or an ADOPT may be due

    def _snapshot(self):
        """The leases a LOCKS sent now speaks for, with their _seq."""
        with self._state:
            return [(l, l._seq) for l in set(self._leases.values())
                    if not l._needs_adopt and not l._ops]

    # ---- the table ----

    def _lease_from_reply(self, rest, line, resources, t_send, renew, mode,
                          limit, value):
        f = _proto.fields(rest)
        if "resources" in f:
            n = _proto.int_field(f, "resources", line)
            if n != len(resources):
                raise ProtocolError(f"asked for {len(resources)} resources, "
                                    f"got resources={n}")
        elif f.get("resource") != resources[0] or len(resources) != 1:
            raise ProtocolError(f"LOCK reply for another resource: {line!r}")
        token = f.get("token")
        if not token:
            raise ProtocolError(f"LOCK reply without token=: {line!r}")
        return Lease(
            self, resources, token,
            fence=_proto.int_field(f, "fence", line),
            ttl=_proto.int_field(f, "ttl", line),
            validity=_proto.int_field(f, "validity", line),
            t_send=t_send, renew=renew,
            mode=f.get("mode", mode or "exclusive"),
            limit=_proto.int_field(f, "limit", line) if "limit" in f else limit,
            slot=_proto.int_field(f, "slot", line) if "slot" in f else None,
            value=value)

    def _register(self, lease, conn):
        """A lease LOCK granted on conn. If the session changed since (a
        new one after a lost connection), the lease is its old session's:
        the background thread ADOPTs it."""
        with self._state:
            for r in lease.resources:
                self._leases[r] = lease
                early = self._early_lost.pop(r, None)
                if early is not None and early[0] in (None, str(lease.fence)):
                    lease._lose(early[1])
            if self._closed:
                lease._lose("closed")
            elif conn.session_gen != self._session_gen and \
                    lease._alive(time.monotonic()):
                lease._needs_adopt = True
                self._adopt_at = 0.0
            self._state.notify_all()

    def _forget(self, lease):
        with self._state:
            lease._released = True
            lease._needs_adopt = False
            for r in lease.resources:
                if self._leases.get(r) is lease:
                    del self._leases[r]

    def _forget_all(self, leases, resources):
        for lease in leases:
            if all(r in resources for r in lease.resources):
                self._forget(lease)

    # ---- the LOCKS round ----

    def _refresh(self, limit=None, urgent=False):
        snapshot = self._snapshot()
        t_send, line = self._roundtrip("LOCKS", limit=limit, urgent=urgent)
        body = self._json(line)
        self._apply_locks(body, snapshot, t_send)
        return body

    def _apply_locks(self, body, snapshot, t_send):
        """What LOCKS (sent at t_send) says of the leases of `snapshot`
        (_snapshot() before it was sent): each listed one's deadline moves,
        an unlisted one is lost. A lease with an EXTEND, UNLOCK or ADOPT
        sent since is left alone: the daemon may have run it first."""
        held = {}
        for entry in body.get("locks") or []:
            if isinstance(entry, dict) and "resource" in entry:
                held[entry["resource"]] = entry
        lost = set(x for x in body.get("lost") or [] if isinstance(x, str))
        with self._state:
            for lease, seq in snapshot:
                if lease._seq != seq or lease._ops:
                    continue
                deadline = validity = ttl = None
                for r in lease.resources:
                    e = held.get(r)
                    if e is None or e.get("fence", lease.fence) != lease.fence:
                        lease._lose("lost" if r in lost else "gone")
                        break
                    v = e.get("validity")
                    if not isinstance(v, int):
                        continue
                    d = t_send + v / 1000.0
                    deadline = d if deadline is None else min(deadline, d)
                    validity = v if validity is None else min(validity, v)
                    if isinstance(e.get("ttl"), int):
                        ttl = e["ttl"]
                if deadline is not None:
                    lease._confirm(t_send, deadline, validity, ttl)
                else:
                    lease._refreshed_at = max(lease._refreshed_at, t_send)

    def _next_refresh(self):
        due = None
        for lease in set(self._leases.values()):
            d = lease._refresh_due()
            if d is not None and (due is None or d < due):
                due = d
        return due
