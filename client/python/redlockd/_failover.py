"""Sessions and failover: HELLO, AUTH, reconnection, resume and ADOPT.

``_Failover``: the mixin that makes the session and keeps it. The first
connection (``_first_connect``); the HELLO (``detach=``, or ``resume=``)
and AUTH handshakes, and the probe for tags; a request that reconnects
first if need be (``_request``, ``_untagged_request``); ``reconnect()``;
and a reconnection's pass over the servers (``_attempt``), with backoff:
the session resumed on its server (``_resume_at``: a LOCKS round confirms
its leases, UNLOCK gives back what no lease knows), else a new session on
the next server (``_fresh_at``) with ADOPT of every lease
(``_adopt_pending``) and WATCH again.

Above ``_lease`` and ``_watch`` (the lease table and the watches that a
session carries) and ``_conn``; below ``_calls``.
"""

import re
import time

from . import _proto
from ._conn import _deadline, _left, _untagged
from ._lease import _LeaseTable
from ._watch import _Watches
from .errors import (Arg, Auth, ConnectionClosed, Error, Held, IOTimeout,
                     NoAuth, NoSession, ProtocolError, RedlockdError,
                     Shutdown, TransportError, Unavailable)

# Reconnection: the first try at once, then after these delays, doubling.
RECONNECT_MIN_S = 0.05
RECONNECT_MAX_S = 1.0
# A reply during a reconnection or a background refresh is waited for at
# most half the time left to the nearest lease deadline (so that another
# server can still be tried), but never less than this.
MIN_REPLY_S = 0.25

_HEX32 = re.compile(r"^[0-9a-f]{32}$")


class _Failover(_LeaseTable, _Watches):
    """The Client's session and its failover (a mixin: the state is the
    Client's)."""

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

    # ---- the handshake ----

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
        refused = None
        if detach:
            try:
                _, line = self._roundtrip(" ".join(words + [f"detach={detach}"]),
                                          limit=limit, conn=conn)
                f = _proto.fields(self._ok(line))
            except Arg as e:
                detach = None       # a daemon without detach=, or a lower max
                refused = e
        if f is None:
            try:
                _, line = self._roundtrip(" ".join(words), limit=limit,
                                          conn=conn)
            except ConnectionClosed:
                # The ERR ARG refused the connection, not detach=, and the
                # daemon closed it: a plain client on a tls:// port reads
                # "ERR ARG this port speaks TLS: ...". That is the error.
                if refused is not None and conn.dead:
                    raise refused from None
                raise
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

    # ---- requests ----

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
