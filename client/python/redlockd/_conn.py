"""The connection layer of a Client: one connection to one server.

It holds the socket (TCP, a Unix socket, or TLS through ``_tls``) and
what is its own: the reader thread of each connection (``_read_loop``),
which hands each reply line to the request waiting for it, by its tag or,
untagged, in the order sent (``_on_reply``; ``_Pending``, ``_Conn``);
putting a request on the wire within the connection's places in flight
(``_send``, ``_roundtrip``, ``_wait_reply``); holding new requests back
while an untagged one waits to go alone (``_drain``); the turns of the
calls naming the same resource (``_turn``, ``_Turn``); reading a reply
that must be trusted (``_ok``, ``_json``: a line it cannot read drops the
connection); and dropping a connection (``_drop``), which fails every
request in flight on it.

The bottom layer of the Client (the layers: client.py's docstring).
``_Connection`` is a mixin over the state that ``Client.__init__`` sets
up. It imports and calls nothing of the layers above but one hook: the
reader hands each ``EVENT`` line to ``self._on_event(conn, line)``, which
the Client defines. It touches the lease table's state where a connection
that ends or starts changes it (with ``reconnect=False`` a dropped
connection loses every lease; a new one forgets the last one's early
``EVENT LOST`` lines).
"""

import collections
import contextlib
import re
import socket
import struct
import threading
import time

from . import _proto, _tls
from .errors import ConnectionClosed, IOTimeout, ProtocolError, TransportError

# Requests in flight on one connection (the daemon's default
# limits.max_inflight).
MAX_INFLIGHT = 1024
# Never tagged (the daemon refuses a tag on them).
_UNTAGGED = frozenset(("HELLO", "AUTH", "QUIT"))


def _closed_error(reason, shutdown_seen, message):
    """ConnectionClosed for a connection that ended: the daemon's closing
    reason (or "shutdown" after EVENT SHUTDOWN) after its message."""
    if reason is None and shutdown_seen:
        reason = "shutdown"
    msg = message or "connection closed"
    if reason is not None:
        msg += f" (daemon: {reason})"
    return ConnectionClosed(msg, reason)


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


class _Connection:
    """The Client's connection layer (a mixin: the state is the
    Client's)."""

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

    def _conn_error(self, conn):
        return _closed_error(conn.closing_reason, conn.shutdown_seen,
                             conn.message)

    def _closed_error(self):
        return _closed_error(self._closing_reason, self._shutdown_seen,
                             self._close_message)

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
