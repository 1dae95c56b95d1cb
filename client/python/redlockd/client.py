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

Where the code lives
--------------------
The Client is one class made of mixins in layers, each module importing
only those below it (lowest first):

- ``_proto`` (the protocol's words and replies), ``_tls`` (TLS over the
  ``ssl`` module), ``errors``;
- ``_conn``: the connection, its reader thread, tags, turns, dropping;
- ``_lease`` (Lease, the lease table, the LOCKS round) and ``_watch``
  (Holder, Watch, the registry of watches), side by side;
- ``_failover``: HELLO and AUTH, reconnection, resume, ADOPT;
- ``_calls``: the public requests (lock, unlock, inspection, watch);
- ``client`` (here): the Client itself: its state and start, close, the
  events the reader hands up (``_on_event``), the background thread.

A layer calls the methods of those below it through ``self``, and none
above but the reader's hook ``_on_event``; a Lease's and a Watch's
methods go to their Client's. ``redlockd.client`` still offers every
name it did (``Lease``, ``Holder``, ``Watch`` and the constants).
"""

import atexit
import collections
import contextlib
import os
import threading
import time
import weakref

from . import _proto, _tls
from ._calls import _Calls, _check_password, _check_user
from ._conn import MAX_INFLIGHT, _deadline, _left
from ._failover import RECONNECT_MAX_S, RECONNECT_MIN_S
from ._lease import Lease
from ._watch import Holder, Watch
from .errors import Error, TransportError

__all__ = ["Client", "Lease", "Holder", "Watch"]

SERVER_ENV = "REDLOCKD_SERVER"

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


class Client(_Calls):
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
    certificate"; a file that does not load raises ValueError. A plain
    address of the daemon's TLS port raises :class:`Arg` with the
    daemon's line ("this port speaks TLS: connect with tls:// ...").

    ``reconnect`` (default True): a lost connection is re-established, in
    the background and in blocking calls, by resuming the session or
    adopting its leases on another server (see the module's docstring).
    False: a lost connection closes the Client for good and its leases are
    lost ("closed"; "shutdown" at EVENT SHUTDOWN).
    ``detach_ms`` (default 30000; None or 0: off; only with reconnect): how
    long the daemon keeps the session's leases after the connection ends
    without QUIT, waiting for a resume; a duration as ``lock()``'s ``ttl``
    (ms, "30s", a timedelta), kept in ``.detach_ms`` as ms. A daemon that
    refuses ``detach=`` (ERR ARG) is used without.
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
            detach_ms = _proto.duration_ms(detach_ms, "detach_ms")
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

    # ---- events ----

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

    # ---- the background thread ----

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
