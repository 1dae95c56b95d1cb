"""The redlockd client: one session with the daemon, shared by threads.

Threads of a Client
-------------------
- Threads share one Client, one session and one connection, with many
  requests in flight. Every request but HELLO, AUTH and QUIT goes out
  tagged (``#<tag> LOCK x``, the tag a counter of the connection): a thread
  writes its line (one ``sendall`` under the connection's write lock) and
  waits for the reply carrying its tag, which the daemon sends when that
  request finishes, in any order. So a ``lock(..., wait=W)`` holds up only
  its own thread (and the calls naming the same resource, next).
- Calls of one Client naming the same resource (LOCK, UNLOCK, EXTEND,
  STATUS, FORCEUNLOCK; ``command()`` of those) take turns in the client,
  first come first served (``_turn``): one is sent once the one before it
  is answered. The daemon would keep that order too, but would start the
  later request's reply clock while it still waits. A lock the Client
  holds answers another ``lock()`` of it with Held: locks belong to the
  session, whichever thread took them.
- At most ``max_inflight`` requests are in flight (the daemon's
  ``limits.max_inflight``, 1024 by default, stops reading beyond); more
  wait in the client. The last place is kept for the background thread,
  whose LOCKS and ADOPTs thus never wait behind the callers' waits.
- HELLO, AUTH and QUIT are untagged and sent alone: at (re)connection
  before anything else, and by ``auth()`` and ``close()`` once the
  requests in flight are answered (``_drain``; new ones wait meanwhile), as
  the daemon runs an untagged request alone anyway.
- After HELLO a ``#<tag> PING`` asks whether the daemon knows tags; one
  that answers it untagged (an older daemon) is used the old way: one
  request at a time, untagged, replies in order.
- One reader thread per connection reads every line the daemon sends.
  ``EVENT`` lines are handled at once (``EVENT LOST`` marks the lease lost,
  ``EVENT CLOSING`` records the reason) and never taken for replies; a
  tagged line is the reply to the request with that tag, an untagged one
  the reply to the untagged request in flight. So ``lease.lost`` turns
  True when the event arrives, even while the program makes no calls.
- The background thread keeps every lease's deadline current: it sends
  ``LOCKS`` at least every ttl/3 of each held lease and sets each deadline
  from the reply. It also retries ADOPTs and reconnects after a lost
  connection (below). One thread at a time reconnects
  (``_reconnect_lock``); until the connection is ready again, requests
  wait for it (up to ``timeout``).
- A lost connection fails every request in flight on it with
  ConnectionClosed (the one whose reply did not come in time: IOTimeout),
  as it failed the one request before tags.
- A LOCKS reply neither confirms nor loses a lease that had an EXTEND,
  UNLOCK or ADOPT in flight when it was sent, or sent after it: the
  daemon may have run those in either order (``Lease._ops``/``_seq``).

Deadlines
---------
A lease's ``deadline`` (``time.monotonic()`` seconds) is the monotonic time
the request was *sent* plus the validity its reply reported: LOCK's
``validity=``, EXTEND's, ADOPT's, or the lock's ``"validity"`` in ``LOCKS``.
Once the clock passes the deadline without a newer confirmation the lease is
lost for good ("deadline"), even if a later reply says the daemon still
holds it: the program cannot know that the lock stayed valid in between. A
reply that arrives after the deadline does not revive it.

Reconnection (``reconnect=True``, the default)
----------------------------------------------
The session is detachable (``HELLO detach=``): when its connection ends
without QUIT the daemon keeps its leases for ``detach_ms``. A lost
connection (EOF, reset, no reply in time, ``EVENT CLOSING``) is not the end
of the Client: its leases become "unconfirmed" and the client reconnects,
with backoff, in the background thread and in any blocking call:

1. ``HELLO resume=<session> secret=`` on the server the session lives on:
   the same session, its leases still held; ``LOCKS`` confirms them (and
   ``EVENT LOST`` lines name those lost meanwhile).
2. On ``ERR NOSESSION`` or an unreachable server: a new session on the next
   server (round robin, that one last) and ``ADOPT <resources> token=`` of
   every lease, one per grant, while its deadline is ahead. ADOPT gives the
   lease a new token and keeps its fence. ``ERR LOST`` loses it ("adopt").

A lease past its deadline is never adopted: it is lost ("deadline"). Every
kind of lease is adopted: an exclusive one, a shared hold, a semaphore slot
(the same slot), the resources of one multi-resource grant together.

Watching
--------
``watch()`` registers a :class:`Watch` under each of its resources
(``_watchers``) before its WATCH goes out, so that the ``EVENT HOLDER``
lines right behind the reply find it; the reader hands each event, as a
:class:`Holder`, to every Watch of its resource. A resumed session keeps
its watches (the daemon tells their states again); a new one (after a
failover) watches nothing, so ``_fresh_at`` sends WATCH again for every
resource registered, in lines no longer than one the daemon took before.
A Watch closed sends UNWATCH for the resources no other Watch wants.

TLS
---
A ``tls://HOST:PORT`` server is reached through the standard ``ssl``
module (``_tls``): the same line protocol inside TLS 1.2 or later, the
server's certificate checked against a CA and against HOST, an optional
client certificate. Reconnection, resume and ADOPT work as over TCP.
"""

import atexit
import collections
import contextlib
import os
import re
import socket
import struct
import threading
import time
import weakref

from . import _proto, _tls
from .errors import (Arg, Auth, ConnectionClosed, Error, Held, IOTimeout,
                     LockLost,
                     Lost, NoAuth, NoSession, NotHeld, ProtocolError,
                     RedlockdError, Shutdown, TransportError, Unavailable,
                     Unsupported)

__all__ = ["Client", "Lease", "Holder", "Watch"]

SERVER_ENV = "REDLOCKD_SERVER"

# Requests in flight on one connection (the daemon's default
# limits.max_inflight).
MAX_INFLIGHT = 1024
# Never tagged (the daemon refuses a tag on them).
_UNTAGGED = frozenset(("HELLO", "AUTH", "QUIT"))

# WATCH and UNWATCH name at most this many resources per line (the
# daemon's own limit per request).
WATCH_NAMES_MAX = 256

# Reconnection: the first try at once, then after these delays, doubling.
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 1.0
# A reply during a reconnection or a background refresh is waited for at
# most half the time left to the nearest lease deadline (so that another
# server can still be tried), but never less than this.
MIN_REPLY_S = 0.25

_HEX32 = re.compile(r"^[0-9a-f]{32}$")

# Clients still open: closed (QUIT) when the interpreter exits, so that a
# program that ends without close() does not leave its detached session's
# leases held for detach_ms.
_open_clients = weakref.WeakSet()


@atexit.register
def _close_at_exit():
    for c in list(_open_clients):
        try:
            c._exit_close()
        except Exception:
            pass


class _Pending:
    """One request waiting for its reply line (or for an error)."""

    __slots__ = ("done", "line", "error", "tag", "size", "tagged_reply")

    def __init__(self):
        self.done = threading.Event()
        self.line = None        # the reply, without its tag
        self.error = None
        self.tag = None
        self.size = 0           # bytes on the wire, tag and LF included
        self.tagged_reply = False


class _Turn:
    """A call's place in the queue of each resource it names."""

    __slots__ = ("resources", "go")

    def __init__(self, resources):
        self.resources = resources
        self.go = threading.Event()


class _Conn:
    """One connection to one server: its socket, its reader thread and the
    requests waiting for replies on it."""

    def __init__(self, sock, index, server):
        self.sock = sock
        self.index = index
        self.server = server
        self.tags = {}                  # tag -> _Pending
        self.untagged = collections.deque()     # _Pending, in order sent
        self.inflight = 0
        self.next_tag = 0
        self.tagged = False             # the daemon knows tags (probed)
        self.session_gen = None         # Client._session_gen at its HELLO
        self.wlock = threading.Lock()   # one line at a time; the fd's life
        self.sock_closed = False
        self.dead = False
        self.message = None
        self.closing_reason = None
        self.shutdown_seen = False
        self.reader = None
        self.reader_done = False


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
        """EXTEND every resource of the lease to `ttl` ms; the deadline
        becomes send time + the reported validity. Raises Lost (also marks
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


class Holder(collections.namedtuple(
        "Holder", "resource held mode limit foreign fence name daemon value")):
    """Who holds a resource: an ``EVENT HOLDER`` of a :class:`Watch`, or
    ``Client.holder()``.

    ``held`` counts the holders: 0 (free), 1 for an exclusive holder, else
    shared holders or semaphore slots in use. ``mode`` is "exclusive",
    "shared", "semaphore" (then ``limit`` is its K) or None (free, or
    ``foreign``: a key set by another Redlock client, nothing more known).
    An exclusive holder has its ``fence``, client ``name`` (None without
    one), the ``daemon`` it holds the lock through and its ``value``
    (None without one); these are None otherwise.
    """

    __slots__ = ()

    @classmethod
    def _from_event(cls, f):
        """The fields of an EVENT HOLDER line."""
        exclusive = f.get("mode") == "exclusive"
        return cls(
            resource=f.get("resource"),
            held=int(f["held"]) if f.get("held", "").isdigit() else 0,
            mode=f.get("mode"),
            limit=int(f["limit"]) if f.get("limit", "").isdigit() else None,
            foreign=f.get("foreign") == "1",
            fence=int(f["fence"]) if f.get("fence", "").isdigit() else None,
            name=(f.get("name") or None) if exclusive else None,
            daemon=(f.get("daemon") or None) if exclusive else None,
            value=f.get("value") or None)

    @classmethod
    def _from_status(cls, resource, body):
        """What a STATUS answer says of the holders: a semaphore's slots
        ("limit", "slots_held"), shared holders, another Redlock client's
        key, or the exclusive holder (null when no one token is on a
        quorum of nodes)."""
        free = cls(resource, 0, None, None, False, None, None, None, None)
        who = body.get("holder") if isinstance(body.get("holder"), dict) \
            else {}
        if body.get("held") is not True:
            return free
        if isinstance(body.get("limit"), int):
            return free._replace(held=_count(body, "slots_held"),
                                 mode="semaphore", limit=body["limit"])
        if body.get("mode") == "shared":
            return free._replace(held=_count(body, "shared_holders"),
                                 mode="shared")
        if who.get("foreign") is True:
            return free._replace(held=1, foreign=True)
        fence = who.get("fence")
        return free._replace(
            held=1, mode="exclusive",
            fence=fence if isinstance(fence, int) else None,
            name=who.get("name") or None, daemon=who.get("daemon") or None,
            value=who.get("value") or None)


def _count(body, key):
    """A count of holders in STATUS (at least 1: it is held)."""
    n = body.get(key)
    return n if isinstance(n, int) and n > 0 else 1


class Watch:
    """The holders of some resources as they change: ``Client.watch()``.

    An iterator of :class:`Holder`: the state of each resource at once,
    then each change, through any daemon of the same Redis nodes (within
    about a round trip) or by another Redlock client (within the daemon's
    ``locks.watch_poll_ms``). States that change faster than they are read
    may be merged, never an older one last. ``get(timeout)`` returns the
    next one, or None when ``timeout`` (seconds) passes first. The events
    are kept for the Watch until read: read them, or close it.

    A context manager: leaving the block (or ``close()``) stops it (UNWATCH
    of the resources no other Watch of the Client wants); iterating then
    ends, and so it does when the Client is closed. The watches survive a
    lost connection: a resumed session keeps them, a new one (failover)
    watches again, and the daemon tells their states then.
    """

    def __init__(self, client, resources):
        self._client = client
        self.resources = tuple(resources)
        self._events = collections.deque()
        self._closed = False

    def get(self, timeout=None):
        """The next Holder; None when `timeout` seconds pass first (None:
        wait as long as it takes). Raises ConnectionClosed once the Watch
        or its Client is closed and every event is read."""
        c = self._client
        end = _deadline(timeout)
        with c._state:
            while not self._events:
                if self._closed or c._closed:
                    raise ConnectionClosed("the watch is closed" if
                                           self._closed else
                                           c._close_message or "closed")
                left = _left(end)
                if left == 0:
                    return None
                c._state.wait(None if left < 0 else left)
            return self._events.popleft()

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return self.get()
        except ConnectionClosed:
            raise StopIteration from None

    def close(self):
        """UNWATCH (of the resources no other Watch wants) and stop."""
        self._client._unwatch(self)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __repr__(self):
        return (f"<redlockd.Watch {' '.join(self.resources)}"
                f"{' closed' if self._closed else ''}>")


def _server_list(spec):
    """A tuple of server addresses from a str (comma-separated) or a list
    of them; each checked with parse_server."""
    if isinstance(spec, str):
        items = [spec]
    elif isinstance(spec, (list, tuple)):
        items = list(spec)
    else:
        raise TypeError("servers must be a str or a list of str")
    out = []
    for item in items:
        if not isinstance(item, str):
            raise TypeError(f"server address must be a str, not "
                            f"{type(item).__name__}")
        for part in item.split(","):
            part = part.strip()
            if part:
                _proto.parse_server(part)
                out.append(part)
    if not out:
        raise ValueError("no server address given")
    return tuple(out)


class Client:
    """A session with redlockd, over one connection at a time.

    ``server`` / ``servers``: one address or several, as a list or a
    comma-separated str (``HOST:PORT``, ``tcp://HOST:PORT``,
    ``[IPV6]:PORT``, ``unix:/PATH``); default ``$REDLOCKD_SERVER`` (which
    may be a comma list), else ``127.0.0.1:7390``. The first that answers
    is used; the others are for failover. ``name`` labels the session
    (HELLO name=), ``password`` is sent with AUTH (again after a failover);
    with ``user`` as ``AUTH <user> <password>``, logging in as that user of
    the daemon's ``auth.users`` (which may then touch only resources within
    its prefixes: others raise :class:`Denied`).
    ``timeout`` (seconds, None for none) bounds connecting and each reply,
    from the moment its request is sent; a LOCK's reply may take ``wait``
    longer. A reply that does not come in time raises :class:`IOTimeout`
    and drops the connection.

    TLS, for ``tls://`` servers (parameters named as libredlockd's
    options): ``tls_ca_file`` a PEM file of the CAs to trust (default
    ``$REDLOCKD_TLS_CA``, else the system's store); ``tls_cert_file`` and
    ``tls_key_file`` a client certificate and its key, for a daemon with
    ``tls.verify_clients`` (default ``$REDLOCKD_TLS_CERT`` and
    ``$REDLOCKD_TLS_KEY``; the key may be in the certificate's file);
    ``tls_server_name`` the name the server's certificate must carry (and
    the SNI) instead of the address's host; ``tls_context`` an
    ``ssl.SSLContext`` of your own instead of the files. The certificate
    must be signed by a trusted CA, be valid now and name the host (an IP
    address as an IP address). A handshake that fails raises
    :class:`TransportError` naming the reason: "unknown CA", "name
    mismatch", "expired", "does not speak TLS", "requires a client
    certificate"; a file that does not load raises ValueError.

    ``reconnect`` (default True): a lost connection is re-established, in
    the background and in blocking calls, by resuming the session or
    adopting its leases on another server (see the module's docstring).
    False: a lost connection closes the Client for good and its leases are
    lost ("closed"; "shutdown" at EVENT SHUTDOWN).
    ``detach_ms`` (default 30000; None or 0: off; only with reconnect): how
    long the daemon keeps the session's leases after the connection ends
    without QUIT, waiting for a resume. A daemon that refuses ``detach=``
    (ERR ARG) is used without.
    ``max_inflight`` (default 1024, at least 1): at most this many requests
    in flight on the connection at once, the last place kept for the
    background refresh; more wait in the client. Keep it at or below the
    daemon's ``limits.max_inflight``.

    Safe to share between threads, and meant to be: their requests are in
    flight together on the one connection (tagged), each thread waiting for
    its own reply, and calls naming the same resource take turns, first
    come first served (see the module's docstring). A context manager:
    leaving the block closes the session (QUIT), which releases every lock
    still held.
    """

    def __init__(self, server=None, name=None, password=None, timeout=5.0, *,
                 servers=None, detach_ms=30000, reconnect=True,
                 tls_ca_file=None, tls_cert_file=None, tls_key_file=None,
                 tls_server_name=None, tls_context=None, user=None,
                 max_inflight=MAX_INFLIGHT):
        if server is not None and servers is not None:
            raise ValueError("give server or servers, not both")
        spec = servers if servers is not None else server
        if spec is None:
            spec = os.environ.get(SERVER_ENV) or _proto.DEFAULT_SERVER
        self.servers = _server_list(spec)
        self._addrs = [_proto.parse_server(s) for s in self.servers]
        self._tls = None
        self._tls_name = tls_server_name
        if any(a[0] == "tls" for a in self._addrs):
            self._tls = tls_context if tls_context is not None else \
                _tls.make_context(tls_ca_file, tls_cert_file, tls_key_file)
        self.server = self.servers[0]
        self.timeout = timeout
        if detach_ms is not None:
            if isinstance(detach_ms, bool) or not isinstance(detach_ms, int):
                raise TypeError("detach_ms must be an int (milliseconds) "
                                "or None")
            if detach_ms < 0:
                raise ValueError("detach_ms must not be negative")
        if isinstance(max_inflight, bool) or not isinstance(max_inflight, int):
            raise TypeError("max_inflight must be an int")
        if max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        self.max_inflight = max_inflight
        self._auto = bool(reconnect)
        self.detach_ms = (detach_ms or None) if self._auto else None
        if name is not None:
            _proto.word(name, "client name")
        if password is not None:
            _check_password(password)
        _check_user(user, password)
        self._name = name
        self._password = password
        self._user = user
        self.session = None
        self._secret = None           # resumes the session: never shown
        self._session_index = None    # the server the session lives on
        self.server_version = None
        self.nodes = None
        self.quorum = None
        self.reconnects = 0
        self.last_reconnect = None
        # One mutex for the client's state; _state is signalled when the
        # connection, a lease or a LOCK's outcome changes, _slots when a
        # request leaves the connection (or a drain ends).
        self._mutex = threading.RLock()
        self._state = threading.Condition(self._mutex)
        self._slots = threading.Condition(self._mutex)
        self._reconnect_lock = threading.RLock()  # one reconnection at a time
        self._adopt_lock = threading.Lock()       # one ADOPT round at a time
        self._barrier_lock = threading.Lock()     # one untagged request
        self._drainer = None          # the thread sending one, or None
        self._turns = {}              # resource -> deque of _Turn
        self._locking = collections.Counter()   # resource -> LOCKs unsettled
        self._session_gen = 0         # bumped at each new session
        self._local = threading.local()     # .conn: of this thread's request
        self._conn = None
        self._graveyard = []          # dead conns whose sockets to close
        self._ready = False
        self._started = False
        self._leases = {}             # resource -> Lease
        self._early_lost = {}         # resource -> (fence, reason)
        self._watchers = {}           # resource -> [Watch], in order made
        self._watch_line_max = 0      # the longest WATCH line answered OK
        self._closed = False
        self._close_message = None
        self._closing_reason = None
        self._shutdown_seen = False
        self._backoff = 0.0
        self._next_attempt = 0.0
        self._adopt_at = 0.0
        self._last_error = None
        self._index = 0
        self._background = None
        self._pid = os.getpid()
        try:
            with self._reconnect_lock:
                self._first_connect()
        except BaseException:
            self.close()
            raise
        self._background = threading.Thread(
            target=self._background_loop, daemon=True,
            name=f"redlockd-background {self.servers[0]}")
        self._background.start()
        _open_clients.add(self)

    def _first_connect(self):
        """The first server that answers HELLO (and AUTH) in list order."""
        last = None
        for i in range(len(self._addrs)):
            conn = None
            try:
                conn = self._open(i, self.timeout)
                self._hello_on(conn, self.timeout, resume=False)
                if self._password is not None:
                    self._auth_on(conn, self.timeout)
            except TransportError as e:
                last = e
                if conn is not None:
                    self._drop(conn, f"connect failed: {e}")
                continue
            with self._state:
                if self._conn is not conn:
                    raise self._conn_error(conn)
                self._ready = True
                self._started = True
                self._index = i
                self.server = conn.server
            return
        raise last

    # ---- connection ----

    def _connect(self, index, timeout):
        addr = self._addrs[index]
        server = self.servers[index]
        try:
            if addr[0] == "unix":
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout)
                try:
                    sock.connect(addr[1])
                except BaseException:
                    sock.close()
                    raise
            else:
                sock = socket.create_connection(addr[1:], timeout=timeout)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                if addr[0] == "tls":
                    sock = self._tls_wrap(sock, addr, server)
        except OSError as e:
            raise TransportError(f"cannot connect to {server}: {e}") from e
        # The reader blocks in recv; a send that cannot go out in time fails
        # (SO_SNDTIMEO) rather than hanging the caller.
        sock.settimeout(None)
        if self.timeout is not None:
            secs = int(self.timeout)
            usecs = int((self.timeout - secs) * 1e6)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                            struct.pack("ll", secs, usecs))
        return sock

    def _tls_wrap(self, sock, addr, server):
        """The TLS handshake on a connected socket (its timeout holds)."""
        try:
            return _tls.TLSSocket(sock, self._tls,
                                  _tls.server_name(addr[1], self._tls_name),
                                  server)
        except BaseException:
            sock.close()
            raise

    def _open(self, index, timeout):
        """Connect to server `index` and make it the current connection (not
        ready yet). Caller holds _reconnect_lock."""
        self._bury()
        sock = self._connect(index, timeout)
        conn = _Conn(sock, index, self.servers[index])
        with self._state:
            if self._closed:
                sock.close()
                raise self._closed_error()
            self._conn = conn
            self._ready = False
            self._index = index
            self._closing_reason = None
            self._shutdown_seen = False
            # (An event for a LOCK whose reply is being handled stays.)
            for r in [r for r in self._early_lost if r not in self._locking]:
                del self._early_lost[r]
        conn.reader = threading.Thread(target=self._read_loop, args=(conn,),
                                       daemon=True,
                                       name=f"redlockd-reader {conn.server}")
        conn.reader.start()
        return conn

    def _bury(self):
        """Close the sockets of dead connections whose reader has ended."""
        with self._state:
            done = [c for c in self._graveyard if c.reader_done]
            self._graveyard = [c for c in self._graveyard if not c.reader_done]
        for c in done:
            self._close_sock(c)

    @staticmethod
    def _close_sock(conn):
        """Close the socket under its write lock, so that no sender is
        writing to the descriptor (or to another socket given its number)."""
        with conn.wlock:
            if conn.sock_closed:
                return
            conn.sock_closed = True
            try:
                conn.sock.close()
            except OSError:
                pass

    def _hello_on(self, conn, limit, resume):
        words = ["HELLO", "proto=1"]
        if self._name is not None:
            words.append("name=" + self._name)
        if resume:
            words += ["resume=" + self.session, "secret=" + self._secret]
            _, line = self._roundtrip(" ".join(words), limit=limit, conn=conn)
            f = _proto.fields(self._ok(line))
            if f.get("session") != self.session:
                self._drop(conn, "HELLO resume= answered for another session")
                raise ProtocolError("HELLO resume= answered for another "
                                    "session")
            self._hello_fields(f)
            conn.tagged = self._probe_tags(conn, limit)
            with self._state:
                conn.session_gen = self._session_gen
            return
        detach = self.detach_ms if self._auto else None
        f = None
        if detach:
            try:
                _, line = self._roundtrip(" ".join(words + [f"detach={detach}"]),
                                          limit=limit, conn=conn)
                f = _proto.fields(self._ok(line))
            except Arg:
                detach = None       # a daemon without detach=, or a lower max
        if f is None:
            _, line = self._roundtrip(" ".join(words), limit=limit, conn=conn)
            f = _proto.fields(self._ok(line))
        secret = f.get("secret") if detach else None
        if secret is not None and not _HEX32.match(secret):
            secret = None
        now = time.monotonic()
        with self._state:
            self.session = f.get("session")
            self._secret = secret
            self._session_index = conn.index
            self._session_gen += 1
            conn.session_gen = self._session_gen
            # The old session is left behind: its leases are to be adopted
            # by this one.
            for lease in set(self._leases.values()):
                if lease._alive(now):
                    lease._needs_adopt = True
        self._hello_fields(f)
        conn.tagged = self._probe_tags(conn, limit)

    def _probe_tags(self, conn, limit):
        """Does the daemon know tagged requests? ``#<tag> PING`` answered
        ``#<tag> PONG``: yes; answered untagged (an older daemon's ERR):
        no, and the connection carries one request at a time."""
        p, conn, _ = self._send("PING", conn=conn, urgent=True, probe=True)
        line = self._wait_reply(p, conn, "PING", limit)
        if not p.tagged_reply:
            return False
        if line != "PONG":
            self._drop(conn, f"expected PONG, got {line!r}")
            raise ProtocolError(f"expected PONG, got {line!r}")
        return True

    def _hello_fields(self, f):
        self.server_version = f.get("server")
        self.nodes = int(f["nodes"]) if f.get("nodes", "").isdigit() else None
        self.quorum = int(f["quorum"]) if f.get("quorum", "").isdigit() else None

    def _auth_line(self):
        words = ["AUTH", self._password]
        if self._user is not None:
            words.insert(1, self._user)
        return " ".join(words)

    def _auth_on(self, conn, limit):
        self._ok(self._roundtrip(self._auth_line(), limit=limit,
                                 conn=conn)[1])

    @property
    def closed(self):
        """True once the Client is closed for good (close(), or a lost
        connection with reconnect=False)."""
        with self._state:
            return self._closed

    @property
    def connected(self):
        """True while a connection is up and its session confirmed."""
        with self._state:
            return self._ready and not self._closed

    @property
    def detachable(self):
        """True when the current session can be resumed (the daemon
        accepted detach= and gave a secret)."""
        with self._state:
            return self._secret is not None

    @property
    def close_reason(self):
        """The daemon's EVENT CLOSING reason on the last connection (or
        "shutdown" after EVENT SHUTDOWN), None otherwise."""
        with self._state:
            if self._closing_reason is not None:
                return self._closing_reason
            return "shutdown" if self._shutdown_seen else None

    @property
    def shutting_down(self):
        """True once the daemon of the current connection sent EVENT
        SHUTDOWN."""
        with self._state:
            return self._shutdown_seen

    def close(self):
        """QUIT and close. The daemon releases every lock of the session.
        The QUIT waits (within `timeout`) for the requests in flight to be
        answered; if the connection is down, one resume of the session is
        tried first (within `timeout`) so that the QUIT can release its
        leases. Idempotent."""
        conn = self._close_session(self.timeout, True, None,
                                   "closed by the client")
        _open_clients.discard(self)
        me = threading.current_thread()
        if conn is not None and conn.reader is not None and me is not conn.reader:
            conn.reader.join(5.0)
        if self._background is not None and me is not self._background:
            self._background.join(5.0)
        if conn is not None:
            self._close_sock(conn)
        self._bury()

    def _exit_close(self):
        """close() for the interpreter's exit: QUIT only if the connection
        is up and its requests in flight answered within a second. Not in a
        forked child: the session is its parent's."""
        if os.getpid() != self._pid:
            return
        self._close_session(1.0, False, 1.0, "closed at the interpreter's exit")

    def _close_session(self, wait_s, resume, quit_limit, message):
        """QUIT, then closed for good. QUIT is untagged: it goes alone,
        after the requests in flight are answered; waiting for them (and
        for a reconnection under way) takes at most `wait_s` seconds
        (None: no limit), else the connection is closed without it. With
        `resume`, a session whose connection is down is resumed first.
        Returns the last connection."""
        end = _deadline(wait_s)
        got_b = self._barrier_lock.acquire(timeout=_left(end))
        got_r = got_b and self._reconnect_lock.acquire(timeout=_left(end))
        try:
            if got_r and self._started and not self.closed:
                with self._state:
                    ready = self._ready
                    busy = any(not l._released for l in self._leases.values())
                if resume and not ready and self._auto and busy:
                    try:
                        self._attempt(resume_only=True)
                    except Error:
                        pass
                if self.connected and self._drain(end):
                    try:
                        self._roundtrip("QUIT", limit=quit_limit)
                    except Error:
                        pass
            with self._state:
                conn = self._conn
            self._mark_closed(message)
            return conn
        finally:
            if got_r:
                self._reconnect_lock.release()
            if got_b:
                self._undrain()
                self._barrier_lock.release()

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        self.close()
        return False

    def __repr__(self):
        with self._state:
            state = ("closed" if self._closed else
                     "connected" if self._ready else "reconnecting")
            return (f"<redlockd.Client {self.server} session={self.session} "
                    f"{state}>")

    def _conn_error(self, conn):
        reason = conn.closing_reason
        if reason is None and conn.shutdown_seen:
            reason = "shutdown"
        msg = conn.message or "connection closed"
        if reason is not None:
            msg += f" (daemon: {reason})"
        return ConnectionClosed(msg, reason)

    def _closed_error(self):
        reason = self._closing_reason
        if reason is None and self._shutdown_seen:
            reason = "shutdown"
        msg = self._close_message or "connection closed"
        if reason is not None:
            msg += f" (daemon: {reason})"
        return ConnectionClosed(msg, reason)

    def _mark_closed(self, message):
        """Closed for good: fail the requests in flight, lose every lease."""
        with self._state:
            if not self._closed:
                self._closed = True
                self._close_message = message
                for lease in set(self._leases.values()):
                    lease._lose("closed")
            conn = self._conn
            self._state.notify_all()
            self._slots.notify_all()
        if conn is not None:
            self._drop(conn, message)

    def _drop(self, conn, message):
        """This connection is no use any more (also from the reader)."""
        with self._state:
            if conn.dead:
                return
            conn.dead = True
            conn.message = message
            err = self._conn_error(conn)
            for p in {id(p): p for p in [*conn.tags.values(),
                                         *conn.untagged]}.values():
                p.error = err
                p.done.set()
            conn.tags.clear()
            conn.untagged.clear()
            conn.inflight = 0
            self._graveyard.append(conn)
            if self._conn is conn:
                self._conn = None
                self._ready = False
                self._close_message = message
                if conn.closing_reason is not None:
                    self._closing_reason = conn.closing_reason
                if self._started and not self._closed:
                    if self._auto:
                        # First try at once, later ones with backoff.
                        self._next_attempt = time.monotonic() + self._backoff
                    else:
                        self._closed = True
                        for lease in set(self._leases.values()):
                            lease._lose("closed")
            self._state.notify_all()
            self._slots.notify_all()
        try:
            conn.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    # ---- the reader threads ----

    def _read_loop(self, conn):
        message = "connection closed by the daemon"
        try:
            f = conn.sock.makefile("rb")
            while True:
                raw = f.readline()
                if not raw:
                    break
                if not raw.endswith(b"\n"):
                    message = "connection closed by the daemon mid-line"
                    break
                line = raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8", "replace")
                if line.startswith("EVENT "):
                    self._on_event(conn, line)
                elif line and not self._on_reply(conn, line):
                    message = f"unexpected line from the daemon: {line[:80]!r}"
                    break
        except OSError as e:
            message = f"connection error: {e}"
        except Exception as e:  # a bug must not leave callers waiting
            message = f"reader failed: {e!r}"
        self._drop(conn, message)
        with self._state:
            conn.reader_done = True
        self._bury()

    def _on_reply(self, conn, line):
        """Hand a reply line to its request: a tagged one by its tag, an
        untagged one to the untagged request in flight. False for a line
        no request is waiting for."""
        with self._state:
            if line.startswith("#"):
                tag, sep, rest = line[1:].partition(" ")
                p = conn.tags.get(tag)
                if p is None or not sep:
                    return False
                p.tagged_reply = True
            elif conn.untagged:
                p, rest = conn.untagged[0], line
            else:
                p, rest = self._untagged_answer(conn, line), line
                if p is None:
                    return False
            self._settle(conn, p)
            p.line = rest
            p.done.set()
            return True

    @staticmethod
    def _untagged_answer(conn, line):
        """The tagged request an untagged line answers: only ERR TOOLONG
        comes so (the daemon could not read the tag of a line over its
        max_line, and closes the connection after it): the first request
        sent that was longer than the limit it names, else the longest."""
        if not line.startswith("ERR TOOLONG") or not conn.tags:
            return None
        m = re.search(r"longer than ([0-9]+) bytes", line)
        ps = list(conn.tags.values())       # in the order sent
        if m is not None:
            over = [p for p in ps if p.size - 1 > int(m.group(1))]
            if over:
                return over[0]
        return max(ps, key=lambda p: p.size)

    def _settle(self, conn, p):
        """p leaves the connection (answered). Caller holds _state."""
        if p.tag is not None:
            conn.tags.pop(p.tag, None)
        try:
            conn.untagged.remove(p)
        except ValueError:
            pass
        conn.inflight -= 1
        self._slots.notify_all()

    def _on_event(self, conn, line):
        name, f = _proto.event(line)
        with self._state:
            if conn is not self._conn or conn.dead:
                # A connection we left: its session's news is not ours (a
                # lease adopted elsewhere is lost there, and not here).
                return
            if name == "LOST":
                self._on_lost(f.get("resource"), f.get("fence"),
                              f.get("reason") or "lost")
            elif name == "SHUTDOWN":
                conn.shutdown_seen = True
                self._shutdown_seen = True
                if not self._auto:
                    for lease in set(self._leases.values()):
                        lease._lose("shutdown")
            elif name == "CLOSING":
                conn.closing_reason = f.get("reason") or "unknown"
                self._closing_reason = conn.closing_reason
            elif name == "HOLDER":
                holder = Holder._from_event(f)
                for w in self._watchers.get(holder.resource, ()):
                    w._events.append(holder)
                self._state.notify_all()
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

    def _send(self, line, conn=None, urgent=False, probe=False):
        """Put one request on `conn` (default: the current connection,
        which must be ready; then a drain by another thread holds it back).
        Waits for a place among the requests in flight (`urgent`: also the
        one kept for the background thread). Tagged unless the connection
        is untagged or the command never is (`probe`: tagged, and an
        untagged answer taken too). Returns (pending, conn, monotonic send
        time); a failed send drops the connection (p then has the error)."""
        p = _Pending()
        me = threading.current_thread()
        with self._state:
            while True:
                c = conn
                if c is None:
                    c = self._conn
                    if self._closed or c is None or not self._ready:
                        if self._closed or not self._auto:
                            raise self._closed_error()
                        raise ConnectionClosed(
                            f"not connected ({self._close_message})",
                            self._closing_reason)
                if c.dead:
                    raise self._conn_error(c)
                held = conn is None and self._drainer not in (None, me)
                if not held and c.inflight < self._room(c, urgent):
                    break
                self._slots.wait()
            c.inflight += 1
            untagged = _untagged(line)
            if probe or (c.tagged and not untagged):
                c.next_tag += 1
                p.tag = str(c.next_tag)
                c.tags[p.tag] = p
            if probe or p.tag is None:
                c.untagged.append(p)
            self._local.conn = c
        data = (line if p.tag is None else f"#{p.tag} {line}").encode() + b"\n"
        p.size = len(data)
        failed = None
        with c.wlock:
            t_send = time.monotonic()
            if not c.sock_closed:       # (else dropped: p has its error)
                try:
                    c.sock.sendall(data)
                except OSError as e:
                    failed = e
        if failed is not None:
            self._drop(c, f"send failed: {failed}")
        return p, c, t_send

    def _room(self, conn, urgent):
        """How many requests may be in flight on conn for this sender."""
        if not conn.tagged:
            return 1
        if urgent or self.max_inflight == 1:
            return self.max_inflight
        return self.max_inflight - 1

    def _wait_reply(self, p, conn, line, limit):
        """p's reply line; IOTimeout (and the connection dropped) when it
        does not come within `limit` seconds (None: no limit)."""
        if not p.done.wait(limit):
            self._drop(conn, f"no reply within {limit:.3g} s")
            raise IOTimeout(f"no reply from {conn.server} within {limit:.3g} s "
                            f"to {line.split()[0]}; connection closed")
        if p.error is not None:
            raise p.error
        return p.line

    def _roundtrip(self, line, wait_s=0.0, limit=None, conn=None,
                   urgent=False):
        """Send one line on `conn` (the current connection by default),
        wait for its reply. Returns (monotonic send time, reply line).
        `limit` replaces timeout + wait_s."""
        p, conn, t_send = self._send(line, conn, urgent)
        if limit is None and self.timeout is not None:
            limit = self.timeout + wait_s
        return t_send, self._wait_reply(p, conn, line, limit)

    def _request(self, line, wait_s=0.0, retry=False, resources=()):
        """One request, in its turn among the calls naming the same
        `resources`, reconnecting first if need be. With `retry` (for
        requests that change nothing) it is sent again, once, if the
        connection was lost under it. HELLO, AUTH and QUIT go alone
        (_untagged_request)."""
        if _untagged(line):
            return self._untagged_request(line)
        with self._turn(resources):
            self._ensure_ready()
            try:
                return self._roundtrip(line, wait_s)
            except IOTimeout:
                raise
            except ConnectionClosed:
                if not retry or not self._auto or self.closed:
                    raise
            self._ensure_ready()
            return self._roundtrip(line, wait_s)

    def _untagged_request(self, line):
        """An untagged request (AUTH, and HELLO or QUIT by command()): sent
        once the requests in flight are answered, new ones waiting until
        its reply is in (the daemon runs it alone anyway; waiting here
        starts its reply clock when it can run)."""
        with self._barrier_lock:
            try:
                self._ensure_ready()
                self._drain(None)
                return self._roundtrip(line)
            finally:
                self._undrain()

    def _drain(self, end):
        """Hold back new requests and wait until the current connection has
        none in flight; False if monotonic `end` (None: never) came first.
        Caller holds _barrier_lock, and calls _undrain after."""
        with self._state:
            self._drainer = threading.current_thread()
            while True:
                c = self._conn
                if c is None or c.dead or c.inflight == 0:
                    return True
                left = _left(end)
                if left == 0:
                    return False
                self._slots.wait(None if left < 0 else left)

    def _undrain(self):
        with self._state:
            if self._drainer is threading.current_thread():
                self._drainer = None
                self._slots.notify_all()

    @contextlib.contextmanager
    def _turn(self, resources):
        """The calls of this Client naming one resource take turns, first
        come first served: this one goes on once every call before it that
        names any of `resources` is done. (No deadlock: a call joins the
        queues of all its resources at once, so they all agree on order.)"""
        if not resources:
            yield
            return
        t = _Turn(frozenset(resources))
        with self._state:
            for r in t.resources:
                self._turns.setdefault(r, collections.deque()).append(t)
            if self._first_everywhere(t):
                t.go.set()
        try:
            t.go.wait()
            yield
        finally:
            with self._state:
                heads = []
                for r in t.resources:
                    q = self._turns[r]
                    q.remove(t)
                    if q:
                        heads.append(q[0])
                    else:
                        del self._turns[r]
                for h in heads:
                    if self._first_everywhere(h):
                        h.go.set()

    def _first_everywhere(self, t):
        return all(self._turns[r][0] is t for r in t.resources)

    def _trusted(self, parse, *args):
        """parse(*args); a ProtocolError also drops the connection (what
        comes after a reply we could not read cannot be trusted)."""
        try:
            return parse(*args)
        except ProtocolError as e:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                self._drop(conn, str(e))
            raise

    def _expect(self, want, line):
        head, rest = self._trusted(_proto.split_reply, line)
        if head != want:
            conn = getattr(self._local, "conn", None)
            if conn is not None:
                self._drop(conn, f"expected {want}, got {line!r}")
            raise ProtocolError(f"expected {want}, got {line!r}")
        return rest

    def _ok(self, line):
        """The text after OK; the ERR's exception; ProtocolError (and the
        connection dropped) for anything else."""
        return self._expect("OK", line)

    def _json(self, line):
        return self._trusted(_proto.json_body, self._ok(line))

    def command(self, *words):
        """Send one raw request (words joined by spaces); return the text
        after ``OK``/``PONG``. Raises the ERR's exception. It takes its
        turn with the calls naming the same resources; HELLO, AUTH and QUIT
        go untagged, alone."""
        for w in words:
            if not isinstance(w, str) or any(c in "\r\n" for c in w):
                raise ValueError(f"bad request word {w!r}")
        line = " ".join(words)
        if not line.split():
            raise ValueError("no request word")
        _, line = self._request(line, resources=_proto.resources_named(line))
        return self._trusted(_proto.split_reply, line)[1]

    def ping(self, word=None):
        """PING; returns the word echoed (or "")."""
        words = ["PING"] if word is None else ["PING", _proto.word(word, "word")]
        _, line = self._request(" ".join(words), retry=True)
        return self._expect("PONG", line)

    def auth(self, password, user=None):
        """AUTH on this session (the client password, or the admin one
        for FORCEUNLOCK; with ``user``, that user's of ``auth.users``);
        sent again on a new session after a failover."""
        _check_password(password)
        _check_user(user, password)
        words = ["AUTH"] + ([user] if user is not None else []) + [password]
        self._ok(self._request(" ".join(words))[1])
        self._password = password
        self._user = user

    # ---- reconnection ----

    def reconnect(self):
        """Drop the connection (if any) and connect again now, as after a
        lost connection: resume the session on its server, else a new
        session on the next server and ADOPT of every lease. Blocks up to
        `timeout`. Returns "resumed" or "new" (a new session). Raises
        ConnectionClosed when the Client is closed, a TransportError (or
        the last server's error) when no server could be reached in time,
        RuntimeError with reconnect=False."""
        if not self._auto:
            raise RuntimeError("this Client was made with reconnect=False")
        with self._reconnect_lock:
            with self._state:
                if self._closed:
                    raise self._closed_error()
                conn = self._conn
                self._backoff = 0.0
                self._next_attempt = 0.0
            if conn is not None:
                self._drop(conn, "reconnect() called")
            self._ensure_ready()
            return self.last_reconnect

    def _ensure_ready(self):
        """Returns once a connection is ready; reconnects (with backoff) for
        up to `timeout` if none is, or waits for the thread that does."""
        end = None
        while True:
            with self._state:
                if self._closed or (not self._ready and not self._auto):
                    raise self._closed_error()
                if self._ready:
                    return
                now = time.monotonic()
                if end is None:
                    end = float("inf") if self.timeout is None else \
                        now + self.timeout
                wait = self._next_attempt - now
                if wait > 0:
                    if now + wait > end:
                        raise self._unreachable()
                    self._state.wait(wait)
                    continue
            if not self._reconnect_lock.acquire(timeout=_left(end)):
                with self._state:
                    raise self._unreachable()
            try:
                with self._state:
                    if self._ready or self._closed:
                        continue        # another thread did it meanwhile
                try:
                    self._attempt()
                    return
                except Error as e:
                    if isinstance(e, Auth):
                        raise
                    if time.monotonic() >= end:
                        raise self._unreachable() from e
            finally:
                self._reconnect_lock.release()

    def _unreachable(self):
        err = self._last_error
        return ConnectionClosed(
            f"not connected to any of {', '.join(self.servers)}"
            + (f": {err}" if err is not None else ""),
            self._closing_reason)

    def _reply_limit(self):
        """How long to wait for a reply while leases may need to move: half
        the time left to the nearest deadline (at least MIN_REPLY_S), at
        most `timeout`."""
        now = time.monotonic()
        with self._state:
            ds = [l._deadline for l in set(self._leases.values())
                  if l._alive(now)]
        if not ds:
            return self.timeout
        lim = max(MIN_REPLY_S, (min(ds) - now) / 2)
        return lim if self.timeout is None else min(self.timeout, lim)

    def _attempt(self, resume_only=False):
        """One pass over the servers. Caller holds _reconnect_lock and there
        is no ready connection. Returns "resumed" or "new"; raises the last
        server's error (and backs off) when none would do."""
        with self._state:
            if self._conn is not None:
                conn = self._conn
            else:
                conn = None
        if conn is not None:
            self._drop(conn, "reconnecting")
        last = None
        n = len(self._addrs)
        start = self._index
        if self.session is not None and self._secret is not None:
            start = self._session_index
            try:
                self._resume_at(self._session_index)
                return self._attempt_ok("resumed")
            except NoSession as e:
                last = e
                with self._state:      # ended, expired or never here
                    self.session = None
                    self._secret = None
            except Error as e:
                last = e
            self._abandon()
        if not resume_only:
            for k in range(1, n + 1):
                i = (start + k) % n
                try:
                    self._fresh_at(i)
                    return self._attempt_ok("new")
                except Auth:
                    self._abandon()
                    self._attempt_failed(last)
                    raise
                except Error as e:
                    last = e
                self._abandon()
        self._attempt_failed(last)
        raise last if last is not None else ConnectionClosed("no server")

    def _abandon(self):
        with self._state:
            conn = self._conn
        if conn is not None:
            self._drop(conn, "reconnect attempt failed")

    def _attempt_failed(self, err):
        with self._state:
            self._last_error = err
            self._backoff = min(RECONNECT_MAX_S,
                                max(RECONNECT_MIN_S, self._backoff * 2))
            self._next_attempt = time.monotonic() + self._backoff

    def _attempt_ok(self, how):
        with self._state:
            conn = self._conn
            if conn is None or conn.dead:
                err = ConnectionClosed("the connection ended during the "
                                       "handshake")
                self._attempt_failed(err)
                raise err
            self._ready = True
            self.server = conn.server
            self._backoff = 0.0
            self._next_attempt = 0.0
            self._last_error = None
            self.reconnects += 1
            self.last_reconnect = how
            self._state.notify_all()
        return how

    def _resume_at(self, index):
        """HELLO resume= on server `index`; LOCKS confirms the leases (the
        EVENT LOST lines for those lost meanwhile come before its reply);
        what the session holds that no lease knows is given back."""
        limit = self._reply_limit()
        conn = self._open(index, limit)
        self._hello_on(conn, limit, resume=True)
        snapshot = self._snapshot()
        t_send, line = self._roundtrip("LOCKS", limit=limit, conn=conn,
                                       urgent=True)
        body = self._json(line)
        self._apply_locks(body, snapshot, t_send)
        for r in self._orphans(body, limit):
            try:                # a LOCK whose reply the lost connection ate
                self._ok(self._roundtrip("UNLOCK " + r, limit=limit,
                                         conn=conn, urgent=True)[1])
            except RedlockdError:
                pass
        self._adopt_pending(conn)

    def _orphans(self, body, limit):
        """The resources LOCKS lists that no lease knows. A LOCK of one of
        them whose reply came on the lost connection may still be on its
        way to its lease (its thread parses it): that is waited for (at
        most `limit`), so that no lock a caller is about to get is
        unlocked."""
        listed = {e["resource"] for e in body.get("locks") or []
                  if isinstance(e, dict) and isinstance(e.get("resource"), str)}
        end = _deadline(limit)
        with self._state:
            while True:
                unknown = listed - self._leases.keys()
                if not unknown & self._locking.keys():
                    return sorted(unknown)
                left = _left(end)
                if left == 0:
                    return sorted(unknown - self._locking.keys())
                self._state.wait(None if left < 0 else left)

    def _fresh_at(self, index):
        """A new session on server `index` (HELLO detach=, AUTH), ADOPT of
        every lease still within its deadline, and WATCH again."""
        limit = self._reply_limit()
        conn = self._open(index, limit)
        self._hello_on(conn, limit, resume=False)
        if self._password is not None:
            self._auth_on(conn, limit)
        self._adopt_pending(conn)
        self._rewatch(conn, limit)

    def _adopt_pending(self, conn=None, own=None):
        """ADOPT each lease that needs it, one request per grant, all in
        flight at once; on `conn` (the reconnecting thread's, not ready
        yet) or else on the current connection. One round at a time. A
        lease past its deadline is not adopted (lost, "deadline"); ERR LOST
        and other refusals lose it ("adopt"); UNAVAILABLE leaves it to be
        tried again, as does one with an EXTEND or UNLOCK in flight (but
        `own`, the caller's: release() adopts its lease itself). Returns
        whether some are left to try again. Raises TransportError, Shutdown
        and NoAuth (this server will not do), once every reply is in."""
        with self._adopt_lock:
            with self._state:
                todo = [l for l in dict.fromkeys(self._leases.values())
                        if l._needs_adopt]
            sent = []
            again = False
            fatal = None
            for lease in todo:
                with self._state:
                    if not lease._alive(time.monotonic()) or \
                            not lease._needs_adopt:
                        lease._needs_adopt = False
                        continue
                    if lease._ops and lease is not own:
                        again = True        # after its release or extend
                        continue
                    token, ttl, renew = lease.token, lease.ttl, lease.renew
                    self._op_start([lease])
                words = ["ADOPT", *lease.resources, "token=" + token,
                         f"ttl={ttl}"]
                if not renew:
                    words.append("renew=0")
                line = " ".join(words)
                try:
                    p, c, t_send = self._send(line, conn, urgent=True)
                except Exception as e:
                    self._op_done([lease])
                    fatal = e
                    break
                sent.append((lease, p, c, t_send, line, ttl))
            end = _deadline(self.timeout)
            for lease, p, c, t_send, line, ttl in sent:
                try:
                    again |= self._adopted(lease, p, c, t_send, line, ttl, end)
                except Exception as e:
                    fatal = fatal or e
                finally:
                    self._op_done([lease])
            with self._state:
                self._adopt_at = (time.monotonic() + max(RECONNECT_MIN_S,
                                                         self._backoff)
                                  if again else 0.0)
            if fatal is not None:
                raise fatal
            return again

    def _adopted(self, lease, p, conn, t_send, line, ttl, end):
        """The answer to one ADOPT; True: to be tried again."""
        left = _left(end)
        reply = self._wait_reply(p, conn, line, None if left < 0 else left)
        try:
            rest = self._ok(reply)
        except Unavailable:
            return True
        except (Shutdown, NoAuth):
            raise
        except Held:
            # This very session holds it already (an ADOPT whose reply
            # was lost, then a resume): LOCKS will say with what fence.
            with self._state:
                lease._needs_adopt = False
                lease._refreshed_at = t_send - lease.ttl / 3000.0
            return False
        except RedlockdError:
            with self._state:
                lease._lose("adopt")
            return False
        f = _proto.fields(rest)
        new_token = f.get("token")
        fence = self._trusted(_proto.int_field, f, "fence", reply)
        validity = self._trusted(_proto.int_field, f, "validity", reply)
        new_ttl = self._trusted(_proto.int_field, f, "ttl", reply, ttl)
        if not new_token:
            self._drop(conn, f"ADOPT reply without token=: {reply!r}")
            raise ProtocolError(f"ADOPT reply without token=: {reply!r}")
        with self._state:
            lease.token = new_token
            lease._needs_adopt = False
            if fence != lease.fence:
                lease._lose("adopt")
                return False
            lease._confirm(t_send, t_send + validity / 1000.0, validity,
                           new_ttl)
        return False

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

    # ---- locks ----

    def lock(self, resource, ttl=30000, wait=0, renew=True, *, mode=None,
             limit=None, value=None):
        """LOCK: returns a :class:`Lease` (also a context manager).

        `resource` is a name or a list of names (all or none, exclusive
        only). `ttl` and `wait` are ms (ttl=None: the daemon's default).
        `mode` is None (the daemon's default, exclusive), "exclusive" or
        "shared"; `limit` K makes it one of K slots of a semaphore. `value`
        (exclusive locks: 1 to the daemon's ``locks.max_value_len``, 256 by
        default, visible ASCII characters) is stored with the lock, and
        ``holder()`` and ``watch()`` show it on every daemon: a leader's
        address, say; ``Lease.set_value()`` replaces it. A daemon without
        those additions answers ARG, raised as :class:`Unsupported`.
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
        if value is not None:
            words.append("value=" + _proto.value_word(value))
            features.add("value")
        with self._turn(resources):
            self._ensure_ready()
            with self._state:
                self._locking.update(resources)
            try:
                t_send, line = self._roundtrip(" ".join(words), wait / 1000.0)
                conn = self._local.conn
                try:
                    rest = self._ok(line)
                except Arg as e:
                    raise _unsupported(e, features) from None
                lease = self._trusted(self._lease_from_reply, rest, line,
                                      resources, t_send, bool(renew), mode,
                                      limit, value)
                self._register(lease, conn)
            finally:
                with self._state:
                    self._locking.subtract(resources)
                    for r in resources:
                        if self._locking[r] <= 0:
                            del self._locking[r]
                    self._state.notify_all()    # (a resume's _orphans)
        return lease

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

    def unlock(self, *resources):
        """UNLOCK by name (several at once where the daemon allows it).
        Returns the reply's fields as a dict of str. Leases of this client
        on those names count as released."""
        if not resources:
            raise ValueError("no resource to unlock")
        for r in resources:
            _proto.word(r, "resource name")
        with self._turn(resources):
            self._ensure_ready()
            return self._unlock_in_turn(resources)

    def _unlock_in_turn(self, resources):
        """UNLOCK; the caller has the resources' turn."""
        with self._state:
            leases = {self._leases[r] for r in resources if r in self._leases}
        self._op_start(leases)
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
        except NotHeld:
            self._forget_all(leases, resources)
            raise
        except TransportError:
            # Without reconnection the daemon releases them with the
            # connection; with it they are still ours to release.
            if not self._auto:
                self._forget_all(leases, resources)
            raise
        except Arg as e:
            raise _unsupported(e, {"multi"} if len(resources) > 1 else set())
        else:
            self._forget_all(leases, resources)
        finally:
            self._op_done(leases)
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
        # Until release() is done, the lease is this call's: an UNLOCK lost
        # with its connection may have been carried out, so the LOCKS of a
        # resume must not call it lost, nor another thread ADOPT it.
        self._op_start([lease])
        try:
            return self._release_op(lease)
        finally:
            self._op_done([lease])

    def _release_op(self, lease):
        retried = False
        while True:
            with self._turn(lease.resources):
                try:
                    self._ensure_ready()
                except TransportError:
                    self._give_up(lease)
                    raise
                try:
                    with self._state:
                        pending = lease._needs_adopt
                    if pending:
                        self._adopt_pending(own=lease)
                        with self._state:
                            pending = lease._needs_adopt
                            reason = lease._lost_reason
                        if pending:
                            self._forget(lease)
                            raise Unavailable(
                                "UNAVAILABLE", "the lease could not be "
                                "adopted for its release (it expires at its "
                                "ttl)")
                        if retried and reason == "adopt":
                            self._forget(lease)
                            return None     # the first UNLOCK took the keys
                    f = self._unlock_in_turn(lease.resources)
                except NotHeld as e:
                    self._forget(lease)
                    with self._state:
                        reason = lease._lost_reason
                    if reason is not None:
                        raise LockLost(lease.resource, reason) from e
                    if retried:
                        return None     # the first UNLOCK did it
                    raise
                except TransportError as e:
                    if (isinstance(e, ConnectionClosed) and not retried and
                            self._auto and not self.closed):
                        retried = True      # lost under the UNLOCK: again
                        continue
                    self._give_up(lease)
                    raise
            nodes = f.get("nodes")
            return int(nodes) if nodes is not None and nodes.isdigit() else None

    def _give_up(self, lease):
        """release() could not reach a daemon: the lease is lost to the
        program. A later resume gives it back (UNLOCK of what the session
        holds that no lease knows); else its keys expire at its ttl."""
        with self._state:
            lease._lose("closed")
        self._forget(lease)

    def _extend(self, lease, ttl, value=None):
        """EXTEND each resource of the lease: ttl= (None: as it is) and
        value= (None: as it is). Returns the least validity reported."""
        opts = ("" if ttl is None else " ttl=" + _proto.millis(ttl, "ttl")) \
            + ("" if value is None else " value=" + value)
        with self._turn(lease.resources):
            self._ensure_ready()
            if lease._needs_adopt and self._adopt_pending() and \
                    lease._needs_adopt:
                raise Unavailable("UNAVAILABLE", "the lease is not adopted "
                                  "on this session yet")
            deadline = None
            validity = None
            t_first = None
            self._op_start([lease])
            try:
                for r in lease.resources:
                    try:
                        t_send, line = self._roundtrip(f"EXTEND {r}{opts}")
                        rest = self._ok(line)
                    except Lost as e:
                        e.resource = r
                        with self._state:
                            lease._lose("lost")
                        raise
                    except Arg as e:
                        raise _unsupported(e, {"value"} if value else set())
                    f = _proto.fields(rest)
                    v = _proto.int_field(f, "validity", line)
                    t_first = t_send if t_first is None else t_first
                    d = t_send + v / 1000.0
                    deadline = d if deadline is None else min(deadline, d)
                    validity = v if validity is None else min(validity, v)
                    new_ttl = _proto.int_field(f, "ttl", line,
                                               default=ttl or lease.ttl)
                with self._state:
                    lease._confirm(t_first, deadline, validity, new_ttl)
                    if value is not None:
                        lease.value = value
            finally:
                self._op_done([lease])
        return validity

    # ---- inspection ----

    def locks(self):
        """LOCKS as parsed JSON. Also refreshes the deadline of every lease
        of this client: send time + the validity listed; a lease the daemon
        no longer lists is marked lost."""
        self._ensure_ready()
        return self._refresh()

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

    def status(self, resource):
        """STATUS <resource> as parsed JSON."""
        _proto.word(resource, "resource name")
        return self._json(self._request("STATUS " + resource, retry=True,
                                        resources=(resource,))[1])

    def holder(self, resource):
        """Who holds `resource` now, as a :class:`Holder`: STATUS, as this
        daemon and the Redis nodes see it (a holder on another daemon of
        the same nodes too, with its value)."""
        return Holder._from_status(resource, self.status(resource))

    # ---- watching ----

    def watch(self, *resources):
        """WATCH: a :class:`Watch` of the holders of `resources` (1 to
        256), their states now and each change, until it is closed. The
        daemon's ``limits.max_watches`` counts every resource the session
        watches (Limit); with ``auth.users`` they must lie within the
        user's prefixes (Denied). A daemon without WATCH answers Unknown."""
        if not resources or len(resources) > WATCH_NAMES_MAX:
            raise ValueError(f"watch 1 to {WATCH_NAMES_MAX} resources")
        for r in resources:
            _proto.word(r, "resource name")
        w = Watch(self, dict.fromkeys(resources))
        # Known before the WATCH goes out: its events follow the reply.
        with self._state:
            for r in w.resources:
                self._watchers.setdefault(r, []).append(w)
        try:
            line = "WATCH " + " ".join(w.resources)
            self._ok(self._request(line, retry=True)[1])
        except BaseException:
            self._forget_watch(w)
            raise
        with self._state:
            self._watch_line_max = max(self._watch_line_max, len(line) + 1)
        return w

    def _forget_watch(self, w):
        """Take w out of the registry, closed; the resources no other Watch
        wants (to UNWATCH)."""
        gone = []
        with self._state:
            w._closed = True
            for r in w.resources:
                ws = self._watchers.get(r, [])
                if w in ws:
                    ws.remove(w)
                if not ws:
                    self._watchers.pop(r, None)
                    gone.append(r)
            self._state.notify_all()
        return gone

    def _unwatch(self, w):
        """Watch.close(): UNWATCH what nobody watches any more, if the
        connection is up (a new session watches nothing; a resumed one
        would tell events nobody reads, which are dropped)."""
        with self._state:
            if w._closed:
                return
        gone = self._forget_watch(w)
        if gone and self.connected:
            try:
                self._ok(self._request("UNWATCH " + " ".join(gone))[1])
            except TransportError:
                pass

    def _watch_lines(self):
        """WATCH lines for every resource watched, each no longer than the
        longest the daemon took (one name at least)."""
        with self._state:
            names = list(self._watchers)
            room = self._watch_line_max
        lines, words = [], []
        for r in names:
            if words and (len(words) == WATCH_NAMES_MAX or
                          len(" ".join(["WATCH", *words, r])) + 1 > room):
                lines.append("WATCH " + " ".join(words))
                words = []
            words.append(r)
        if words:
            lines.append("WATCH " + " ".join(words))
        return lines

    def _rewatch(self, conn, limit):
        """A new session watches nothing: WATCH again on `conn` (not ready
        yet). A line the daemon refuses (a lower limits.max_watches) leaves
        its resources unwatched there."""
        for line in self._watch_lines():
            try:
                self._ok(self._roundtrip(line, limit=limit, conn=conn,
                                         urgent=True)[1])
            except RedlockdError:
                pass

    def sessions(self):
        """SESSIONS as parsed JSON."""
        return self._json(self._request("SESSIONS", retry=True)[1])

    def stats(self):
        """STATS as parsed JSON."""
        return self._json(self._request("STATS", retry=True)[1])

    def help(self, command=None):
        """HELP: the list of command names; HELP <command>: its usage line
        (Unsupported from a daemon without per-command help)."""
        if command is None:
            return self._ok(self._request("HELP", retry=True)[1]).split()
        _proto.word(command, "command")
        try:
            return self._ok(self._request("HELP " + command, retry=True)[1])
        except Arg as e:
            raise _unsupported(e, {"help"}) from None

    def force_unlock(self, resource):
        """FORCEUNLOCK <resource> (needs ``auth(admin password)`` first).
        Returns the reply's fields."""
        _proto.word(resource, "resource name")
        return _proto.fields(self._ok(self._request(
            "FORCEUNLOCK " + resource, resources=(resource,))[1]))

    # ---- the background thread ----

    def _next_refresh(self):
        due = None
        for lease in set(self._leases.values()):
            d = lease._refresh_due()
            if d is not None and (due is None or d < due):
                due = d
        return due

    def _background_loop(self):
        while True:
            with self._state:
                if self._closed:
                    return
                now = time.monotonic()
                if not self._ready:
                    if self._next_attempt > now:
                        self._state.wait(self._next_attempt - now)
                        continue
                    action = "reconnect"
                else:
                    due = self._next_refresh()
                    action = "refresh"
                    if any(l._needs_adopt for l in self._leases.values()):
                        if due is None or self._adopt_at < due:
                            due, action = self._adopt_at, "adopt"
                    if due is None or due > now:
                        self._state.wait(None if due is None else due - now)
                        continue
            # A reconnection holds _reconnect_lock; a refresh or an ADOPT
            # round goes out alongside the callers' requests (with the
            # place kept for it).
            lock = self._reconnect_lock if action == "reconnect" else \
                contextlib.nullcontext()
            with lock:
                with self._state:
                    if self._closed:
                        return
                    ready = self._ready
                if action == "reconnect" and ready:
                    continue    # a blocking call did it meanwhile
                try:
                    if action == "reconnect":
                        self._attempt()
                    elif action == "adopt":
                        self._adopt_pending()
                    else:
                        self._refresh(limit=self._reply_limit(), urgent=True)
                except TransportError:
                    pass        # dropped: the next turn reconnects
                except Exception:   # an ERR, or a bug: do not spin on it
                    with self._state:
                        now = time.monotonic()
                        if action == "reconnect":
                            self._next_attempt = max(self._next_attempt,
                                                     now + RECONNECT_MIN_S)
                        elif action == "adopt":
                            self._adopt_at = now + RECONNECT_MAX_S
                        else:
                            # Not expected for LOCKS; do not spin on it.
                            for lease in set(self._leases.values()):
                                lease._refreshed_at = now


def _untagged(line):
    """Is this request one that is never tagged (HELLO, AUTH, QUIT)?"""
    words = line.split(None, 1)
    return bool(words) and words[0].upper() in _UNTAGGED


def _deadline(seconds):
    """The monotonic time `seconds` from now (None: no limit)."""
    return None if seconds is None else time.monotonic() + seconds


def _left(end):
    """Seconds left to monotonic `end`: at least 0, or -1 when there is no
    limit (as Lock.acquire takes it)."""
    if end is None:
        return -1
    return max(0.0, end - time.monotonic())


USER_MAX = 64


def _check_user(user, password):
    """A user name is one word of 1 to USER_MAX visible ASCII characters,
    and goes with a password."""
    if user is None:
        return
    if not isinstance(user, str) or not 1 <= len(user) <= USER_MAX or any(
            not 0x21 <= ord(c) <= 0x7E for c in user):
        raise ValueError(f"a user name is 1 to {USER_MAX} visible ASCII "
                         "characters")
    if password is None:
        raise ValueError("a user needs a password")


def _check_password(password):
    if not isinstance(password, str) or not password:
        raise ValueError("the password must be a non-empty str")
    if any(c in " \t" or ord(c) < 0x20 or ord(c) == 0x7F for c in password):
        raise ValueError("a password cannot contain spaces or control characters")


def _unsupported(err, features):
    """An ARG that refuses an addition this daemon does not know (by the
    daemon's message: the unknown option's name, or the argument count)."""
    msg = err.message.lower()
    for opt in ("mode", "limit", "value"):
        if opt in features and (f"'{opt}'" in msg or
                                ("unknown option" in msg and opt in msg)):
            return Unsupported(err.code, err.message, feature=opt)
    if "multi" in features and "number of arguments" in msg:
        return Unsupported(err.code, err.message, feature="multi")
    if "help" in features and "argument" in msg:
        return Unsupported(err.code, err.message, feature="help")
    return err
