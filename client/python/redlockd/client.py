"""The redlockd client: one connection to the daemon, shared by threads.

Threads of a Client
-------------------
- The caller's threads send requests. One request is on the connection at a
  time (``_req_lock``): a thread sends its line and waits for its reply
  before the next thread may send. A ``lock(..., wait=W)`` therefore holds
  the connection for up to W ms; use one Client per thread that waits long.
- The reader thread reads every line the daemon sends. ``EVENT`` lines are
  handled at once (``EVENT LOST`` marks the lease lost, ``EVENT SHUTDOWN``
  marks every lease lost, ``EVENT CLOSING`` records the reason) and never
  taken for replies; any other line is the reply to the request in flight.
  So ``lease.lost`` turns True when the event arrives, even while the
  program makes no calls.
- The refresh thread keeps every lease's deadline current: it sends
  ``LOCKS`` (as a normal request, in turn with the others) at least every
  ttl/3 of each held lease and sets each deadline from the reply.

Deadlines
---------
A lease's ``deadline`` (``time.monotonic()`` seconds) is the monotonic time
the request was *sent* plus the validity its reply reported: LOCK's
``validity=``, EXTEND's ``validity=``, or the lock's ``"validity"`` in
``LOCKS``. Once the clock passes the deadline without a newer confirmation
the lease is lost for good ("deadline"), even if a later reply says the
daemon still holds it: the program cannot know that the lock stayed valid
in between. A reply that arrives after the deadline does not revive it.
"""

import collections
import os
import socket
import struct
import threading
import time

from . import _proto
from .errors import (Arg, ConnectionClosed, Error, IOTimeout, LockLost, Lost,
                     NotHeld, ProtocolError, TransportError, Unsupported)

__all__ = ["Client", "Lease"]

SERVER_ENV = "REDLOCKD_SERVER"


class _Pending:
    """One request waiting for its reply line (or for an error)."""

    __slots__ = ("done", "line", "error")

    def __init__(self):
        self.done = threading.Event()
        self.line = None
        self.error = None


class Lease:
    """A lock held through a Client.

    ``resource`` (the first of ``resources``), ``token``, ``fence``, ``ttl``
    (ms), ``validity`` (ms, as last reported), ``deadline`` (monotonic
    seconds), ``mode``, ``limit`` and ``slot`` (None unless ``limit=``),
    ``renew``. ``lost`` says whether it may no longer be relied on; ``check()``
    raises :class:`LockLost` if so. As a context manager it releases the lock
    on leaving the block, and raises :class:`LockLost` there if the block
    ended normally but the lease was lost on the way (an exception from the
    block is never replaced).
    """

    def __init__(self, client, resources, token, fence, ttl, validity,
                 t_send, renew, mode, limit, slot):
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
        self._deadline = t_send + validity / 1000.0
        self._refreshed_at = t_send
        self._lost_reason = None
        self._released = False

    # ---- state (all under the client's _state lock) ----

    def _lose(self, reason):
        """Mark lost; the daemon's reasons replace the client's guesses."""
        if self._released:
            return
        if self._lost_reason is None or (
                self._lost_reason == "deadline" and
                reason in ("expired", "quorum", "node")):
            self._lost_reason = reason

    def _check_deadline(self, now):
        if (not self._released and self._lost_reason is None and
                now >= self._deadline):
            self._lost_reason = "deadline"

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
        if self._lost_reason is not None or self._released:
            return None
        return self._refreshed_at + self.ttl / 3000.0

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
    def lost(self):
        """True once EVENT LOST came for it, its deadline passed, the daemon
        announced shutdown or the connection closed. It stays True."""
        with self._client._state:
            self._check_deadline(time.monotonic())
            return self._lost_reason is not None

    @property
    def lost_reason(self):
        """Why it was lost (``expired``, ``quorum``, ``node``, ``deadline``,
        ``shutdown``, ``closed``, ``gone``, ``lost``), or None."""
        with self._client._state:
            self._check_deadline(time.monotonic())
            return self._lost_reason

    @property
    def released(self):
        with self._client._state:
            return self._released

    def check(self):
        """Raise :class:`LockLost` if the lease may no longer be relied
        on; call it before each step of the protected work."""
        reason = self.lost_reason
        if reason is not None:
            raise LockLost(self.resource, reason)

    def extend(self, ttl):
        """EXTEND every resource of the lease to `ttl` ms; the deadline
        becomes send time + the reported validity. Raises Lost (also marks
        the lease lost), NotHeld, Unavailable, Arg."""
        return self._client._extend(self, ttl)

    def release(self):
        """UNLOCK. Returns the number of nodes the key was deleted from
        (None when already released). Raises Lost if the daemon had already
        lost the lease, a TransportError if the connection is gone (the
        daemon released the lock then). A second call does nothing."""
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
        return (f"<redlockd.Lease {' '.join(self.resources)} fence={self.fence}"
                f" mode={self.mode}{' lost' if self._lost_reason else ''}>")


class Client:
    """A connection to redlockd.

    ``server``: ``HOST:PORT``, ``tcp://HOST:PORT``, ``[IPV6]:PORT``,
    ``unix:/PATH``; default ``$REDLOCKD_SERVER``, else ``127.0.0.1:7390``.
    ``name`` labels the session (HELLO name=), ``password`` is sent with
    AUTH. ``timeout`` (seconds, None for none) bounds connecting and each
    reply; a LOCK's reply may take ``wait`` longer. A reply that does not
    come in time raises :class:`IOTimeout` and closes the connection.

    Safe to share between threads: one request is on the connection at a
    time. A context manager: leaving the block closes the connection
    (QUIT), which releases every lock still held.
    """

    def __init__(self, server=None, name=None, password=None, timeout=5.0):
        if server is None:
            server = os.environ.get(SERVER_ENV) or _proto.DEFAULT_SERVER
        self.server = server
        self.timeout = timeout
        self._addr = _proto.parse_server(server)
        if name is not None:
            _proto.word(name, "client name")
        if password is not None:
            _check_password(password)
        self.session = None
        self.server_version = None
        self.nodes = None
        self.quorum = None
        self._req_lock = threading.Lock()
        self._state = threading.Condition()
        self._pending = collections.deque()
        self._leases = {}           # resource -> Lease
        self._early_lost = {}       # resource -> (fence, reason)
        self._closed = False
        self._close_message = None
        self._closing_reason = None
        self._shutdown_seen = False
        self._sock = self._connect()
        self._reader = threading.Thread(target=self._read_loop, daemon=True,
                                        name=f"redlockd-reader {server}")
        self._reader.start()
        try:
            self._hello(name)
            if password is not None:
                self.auth(password)
        except BaseException:
            self.close()
            raise
        self._refresher = threading.Thread(target=self._refresh_loop,
                                           daemon=True,
                                           name=f"redlockd-refresh {server}")
        self._refresher.start()

    # ---- connection ----

    def _connect(self):
        try:
            if self._addr[0] == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(self.timeout)
                try:
                    sock.connect(self._addr[1])
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection(self._addr[1:],
                                                timeout=self.timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError as e:
            raise TransportError(f"cannot connect to {self.server}: {e}") from e
        # The reader blocks in recv; a send that cannot go out in time fails
        # (SO_SNDTIMEO) rather than hanging the caller.
        sock.settimeout(None)
        if self.timeout is not None:
            secs = int(self.timeout)
            usecs = int((self.timeout - secs) * 1e6)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                            struct.pack("ll", secs, usecs))
        return sock

    def _hello(self, name):
        words = ["HELLO", "proto=1"]
        if name is not None:
            words.append("name=" + name)
        rest = self._ok(self._request(" ".join(words))[1])
        f = _proto.fields(rest)
        self.session = f.get("session")
        self.server_version = f.get("server")
        self.nodes = int(f["nodes"]) if f.get("nodes", "").isdigit() else None
        self.quorum = int(f["quorum"]) if f.get("quorum", "").isdigit() else None

    @property
    def closed(self):
        with self._state:
            return self._closed

    @property
    def close_reason(self):
        """The daemon's EVENT CLOSING reason (or "shutdown" after EVENT
        SHUTDOWN), None otherwise."""
        with self._state:
            if self._closing_reason is not None:
                return self._closing_reason
            return "shutdown" if self._shutdown_seen else None

    @property
    def shutting_down(self):
        """True once the daemon sent EVENT SHUTDOWN."""
        with self._state:
            return self._shutdown_seen

    def close(self):
        """QUIT (when the connection is idle within `timeout`) and close.
        The daemon releases every lock of the session. Idempotent."""
        got = self._req_lock.acquire(
            timeout=-1 if self.timeout is None else self.timeout)
        try:
            if got and not self.closed:
                try:
                    self._roundtrip("QUIT")
                except Error:
                    pass
        finally:
            if got:
                self._req_lock.release()
        self._mark_closed("closed by the client")
        if threading.current_thread() is not self._reader:
            self._reader.join(5.0)
        refresher = getattr(self, "_refresher", None)
        if refresher is not None and threading.current_thread() is not refresher:
            refresher.join(5.0)
        try:
            self._sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def _closed_error(self):
        reason = self._closing_reason
        if reason is None and self._shutdown_seen:
            reason = "shutdown"
        msg = self._close_message or "connection closed"
        if reason is not None:
            msg += f" (daemon: {reason})"
        return ConnectionClosed(msg, reason)

    def _mark_closed(self, message):
        """Closed for good: fail the waiting request, lose every lease."""
        with self._state:
            if self._closed:
                return
            self._closed = True
            self._close_message = message
            for lease in set(self._leases.values()):
                lease._lose("closed")
            err = self._closed_error()
            while self._pending:
                p = self._pending.popleft()
                p.error = err
                p.done.set()
            self._state.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---- the reader thread ----

    def _read_loop(self):
        message = "connection closed by the daemon"
        try:
            f = self._sock.makefile("rb")
            while True:
                raw = f.readline()
                if not raw:
                    break
                if not raw.endswith(b"\n"):
                    message = "connection closed by the daemon mid-line"
                    break
                line = raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8", "replace")
                if line.startswith("EVENT "):
                    self._on_event(line)
                elif line:
                    self._on_reply(line)
        except OSError as e:
            message = f"connection error: {e}"
        except Exception as e:  # a bug must not leave callers waiting
            message = f"reader failed: {e!r}"
        self._mark_closed(message)

    def _on_reply(self, line):
        with self._state:
            if not self._pending:
                bad = True
            else:
                bad = False
                p = self._pending.popleft()
                p.line = line
                p.done.set()
        if bad:
            self._mark_closed(f"unexpected line from the daemon: {line[:80]!r}")

    def _on_event(self, line):
        name, f = _proto.event(line)
        with self._state:
            if name == "LOST":
                self._on_lost(f.get("resource"), f.get("fence"),
                              f.get("reason") or "lost")
            elif name == "SHUTDOWN":
                self._shutdown_seen = True
                for lease in set(self._leases.values()):
                    lease._lose("shutdown")
            elif name == "CLOSING":
                self._closing_reason = f.get("reason") or "unknown"
            # Other events: ignored, as the protocol asks.

    def _on_lost(self, resource, fence, reason):
        lease = self._leases.get(resource)
        if lease is not None and (fence is None or fence == str(lease.fence)):
            lease._lose(reason)
        else:
            # The LOCK reply may be read before its caller registers the
            # lease; keep the event for it.
            self._early_lost[resource] = (fence, reason)

    # ---- requests ----

    def _roundtrip(self, line, wait_s=0.0):
        """Send one line, wait for its reply. Caller holds _req_lock.
        Returns (monotonic send time, reply line)."""
        data = line.encode("utf-8") + b"\n"
        p = _Pending()
        with self._state:
            if self._closed:
                raise self._closed_error()
            self._pending.append(p)
        t_send = time.monotonic()
        try:
            self._sock.sendall(data)
        except OSError as e:
            self._mark_closed(f"send failed: {e}")
        limit = None if self.timeout is None else self.timeout + wait_s
        if not p.done.wait(limit):
            self._mark_closed(f"no reply within {limit:.3g} s")
            raise IOTimeout(f"no reply from {self.server} within {limit:.3g} s "
                            f"to {line.split()[0]}; connection closed")
        if p.error is not None:
            raise p.error
        return t_send, p.line

    def _request(self, line, wait_s=0.0):
        with self._req_lock:
            return self._roundtrip(line, wait_s)

    def _trusted(self, parse, *args):
        """parse(*args); a ProtocolError also closes the connection (what
        comes after a reply we could not read cannot be trusted)."""
        try:
            return parse(*args)
        except ProtocolError as e:
            self._mark_closed(str(e))
            raise

    def _expect(self, want, line):
        head, rest = self._trusted(_proto.split_reply, line)
        if head != want:
            self._mark_closed(f"expected {want}, got {line!r}")
            raise ProtocolError(f"expected {want}, got {line!r}")
        return rest

    def _ok(self, line):
        """The text after OK; the ERR's exception; ProtocolError (and the
        connection closed) for anything else."""
        return self._expect("OK", line)

    def _json(self, line):
        return self._trusted(_proto.json_body, self._ok(line))

    def command(self, *words):
        """Send one raw request (words joined by spaces); return the text
        after ``OK``/``PONG``. Raises the ERR's exception."""
        for w in words:
            if not isinstance(w, str) or any(c in "\r\n" for c in w):
                raise ValueError(f"bad request word {w!r}")
        _, line = self._request(" ".join(words))
        return self._trusted(_proto.split_reply, line)[1]

    def ping(self, word=None):
        """PING; returns the word echoed (or "")."""
        words = ["PING"] if word is None else ["PING", _proto.word(word, "word")]
        _, line = self._request(" ".join(words))
        return self._expect("PONG", line)

    def auth(self, password):
        """AUTH on this connection (the client password, or the admin one
        for FORCEUNLOCK)."""
        _check_password(password)
        self._ok(self._request("AUTH " + password)[1])

    # ---- locks ----

    def lock(self, resource, ttl=30000, wait=0, renew=True, *, mode=None,
             limit=None):
        """LOCK: returns a :class:`Lease` (also a context manager).

        `resource` is a name or a list of names (all or none, exclusive
        only). `ttl` and `wait` are ms (ttl=None: the daemon's default).
        `mode` is None (the daemon's default, exclusive), "exclusive" or
        "shared"; `limit` K makes it one of K slots of a semaphore. A daemon
        without those additions answers ARG, raised as :class:`Unsupported`.
        Raises Busy, Timeout, Held, Unavailable, Limit, Shutdown, Arg, ...
        """
        resources = [resource] if isinstance(resource, str) else list(resource)
        if not resources:
            raise ValueError("no resource to lock")
        for r in resources:
            _proto.word(r, "resource name")
        words = ["LOCK", *resources]
        features = {"multi"} if len(resources) > 1 else set()
        if ttl is not None:
            words.append("ttl=" + _proto.millis(ttl, "ttl"))
        if _proto.millis(wait, "wait") != "0":
            words.append(f"wait={wait}")
        if not renew:
            words.append("renew=0")
        if mode is not None:
            if mode not in ("shared", "exclusive"):
                raise ValueError("mode must be 'shared' or 'exclusive'")
            words.append("mode=" + mode)
            features.add("mode")
        if limit is not None:
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError("limit must be an int >= 1")
            words.append(f"limit={limit}")
            features.add("limit")
        with self._req_lock:
            t_send, line = self._roundtrip(" ".join(words), wait / 1000.0)
            try:
                rest = self._ok(line)
            except Arg as e:
                raise _unsupported(e, features) from None
            lease = self._trusted(self._lease_from_reply, rest, line,
                                  resources, t_send, bool(renew), mode, limit)
            self._register(lease)
        return lease

    def _lease_from_reply(self, rest, line, resources, t_send, renew, mode,
                          limit):
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
            slot=_proto.int_field(f, "slot", line) if "slot" in f else None)

    def _register(self, lease):
        with self._state:
            for r in lease.resources:
                self._leases[r] = lease
                early = self._early_lost.pop(r, None)
                if early is not None and early[0] in (None, str(lease.fence)):
                    lease._lose(early[1])
            if self._closed:
                lease._lose("closed")
            self._state.notify_all()

    def _forget(self, lease):
        with self._state:
            lease._released = True
            for r in lease.resources:
                if self._leases.get(r) is lease:
                    del self._leases[r]

    def _forget_all(self, leases, resources):
        for lease in leases:
            if all(r in resources for r in lease.resources):
                self._forget(lease)

    def unlock(self, *resources):
        """UNLOCK by name (several at once where the daemon allows it).
        Returns the reply's fields as a dict of str. Leases of this client
        on those names count as released."""
        if not resources:
            raise ValueError("no resource to unlock")
        for r in resources:
            _proto.word(r, "resource name")
        with self._req_lock:
            with self._state:
                leases = {self._leases[r] for r in resources if r in self._leases}
            try:
                _, line = self._roundtrip("UNLOCK " + " ".join(resources))
                rest = self._ok(line)
            except Lost as e:
                e.resource = resources[0]
                with self._state:
                    for lease in leases:
                        lease._lose("lost")
                self._forget_all(leases, resources)
                raise
            except (NotHeld, TransportError):
                # Not held (any more) by this connection either way.
                self._forget_all(leases, resources)
                raise
            except Arg as e:
                raise _unsupported(e, {"multi"} if len(resources) > 1 else set())
            self._forget_all(leases, resources)
        return _proto.fields(rest)

    def _release(self, lease):
        with self._state:
            if lease._released:
                return None
            lease._check_deadline(time.monotonic())
            closed = self._closed
        if closed:
            self._forget(lease)
            with self._state:
                raise self._closed_error()
        try:
            f = self.unlock(*lease.resources)
        except (NotHeld, TransportError):
            self._forget(lease)
            raise
        nodes = f.get("nodes")
        return int(nodes) if nodes is not None and nodes.isdigit() else None

    def _extend(self, lease, ttl):
        words_ttl = "ttl=" + _proto.millis(ttl, "ttl")
        with self._req_lock:
            deadline = None
            validity = None
            t_first = None
            for r in lease.resources:
                try:
                    t_send, line = self._roundtrip(f"EXTEND {r} {words_ttl}")
                    rest = self._ok(line)
                except Lost as e:
                    e.resource = r
                    with self._state:
                        lease._lose("lost")
                    raise
                f = _proto.fields(rest)
                v = _proto.int_field(f, "validity", line)
                t_first = t_send if t_first is None else t_first
                d = t_send + v / 1000.0
                deadline = d if deadline is None else min(deadline, d)
                validity = v if validity is None else min(validity, v)
                new_ttl = _proto.int_field(f, "ttl", line, default=ttl)
            with self._state:
                lease._confirm(t_first, deadline, validity, new_ttl)
        return validity

    # ---- inspection ----

    def locks(self):
        """LOCKS as parsed JSON. Also refreshes the deadline of every lease
        of this client: send time + the validity listed; a lease the daemon
        no longer lists is marked lost."""
        with self._req_lock:
            with self._state:
                snapshot = set(self._leases.values())
            t_send, line = self._roundtrip("LOCKS")
            body = self._json(line)
            self._apply_locks(body, snapshot, t_send)
        return body

    def _apply_locks(self, body, snapshot, t_send):
        held = {}
        for entry in body.get("locks") or []:
            if isinstance(entry, dict) and "resource" in entry:
                held[entry["resource"]] = entry
        lost = set(x for x in body.get("lost") or [] if isinstance(x, str))
        with self._state:
            for lease in snapshot:
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

    def status(self, resource):
        """STATUS <resource> as parsed JSON."""
        _proto.word(resource, "resource name")
        return self._json(self._request("STATUS " + resource)[1])

    def sessions(self):
        """SESSIONS as parsed JSON."""
        return self._json(self._request("SESSIONS")[1])

    def stats(self):
        """STATS as parsed JSON."""
        return self._json(self._request("STATS")[1])

    def help(self, command=None):
        """HELP: the list of command names; HELP <command>: its usage line
        (Unsupported from a daemon without per-command help)."""
        if command is None:
            return self._ok(self._request("HELP")[1]).split()
        _proto.word(command, "command")
        try:
            return self._ok(self._request("HELP " + command)[1])
        except Arg as e:
            raise _unsupported(e, {"help"}) from None

    def force_unlock(self, resource):
        """FORCEUNLOCK <resource> (needs ``auth(admin password)`` first).
        Returns the reply's fields."""
        _proto.word(resource, "resource name")
        return _proto.fields(self._ok(self._request("FORCEUNLOCK " + resource)[1]))

    # ---- the refresh thread ----

    def _next_refresh(self):
        due = None
        for lease in set(self._leases.values()):
            d = lease._refresh_due()
            if d is not None and (due is None or d < due):
                due = d
        return due

    def _refresh_loop(self):
        while True:
            with self._state:
                if self._closed:
                    return
                due = self._next_refresh()
                now = time.monotonic()
                if due is None or due > now:
                    self._state.wait(None if due is None else due - now)
                    continue
            try:
                self.locks()
            except TransportError:
                return
            except Error:
                # Not expected for LOCKS; do not spin on it.
                with self._state:
                    for lease in set(self._leases.values()):
                        lease._refreshed_at = time.monotonic()


def _check_password(password):
    if not isinstance(password, str) or not password:
        raise ValueError("the password must be a non-empty str")
    if any(c in " \t" or ord(c) < 0x20 or ord(c) == 0x7F for c in password):
        raise ValueError("a password cannot contain spaces or control characters")


def _unsupported(err, features):
    """An ARG that refuses an addition this daemon does not know (by the
    daemon's message: the unknown option's name, or the argument count)."""
    msg = err.message.lower()
    for opt in ("mode", "limit"):
        if opt in features and (f"'{opt}'" in msg or
                                ("unknown option" in msg and opt in msg)):
            return Unsupported(err.code, err.message, feature=opt)
    if "multi" in features and "number of arguments" in msg:
        return Unsupported(err.code, err.message, feature="multi")
    if "help" in features and "argument" in msg:
        return Unsupported(err.code, err.message, feature="help")
    return err
