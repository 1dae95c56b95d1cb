"""The Client's calls: locking, releasing, inspecting and watching.

``_Calls``: the mixin of the public requests, on top of the session:
``command()``, ``ping()``, ``auth()``; ``lock()``, ``unlock()``, and a
lease's UNLOCK and EXTEND (where ``Lease.release()``, ``extend()`` and
``set_value()`` end); ``locks()``, ``status()``, ``holder()``,
``sessions()``, ``stats()``, ``help()``, ``force_unlock()``; ``watch()``
and the UNWATCH of a Watch closed. Also the checks of a user name and a
password, and the ARG of a daemon without an addition read as
``Unsupported``.

Above ``_failover`` (each call reconnects first if need be); below
``client``.
"""

import time

from . import _proto
from ._failover import _Failover
from ._watch import WATCH_NAMES_MAX, Holder, Watch
from .errors import (Arg, ConnectionClosed, LockLost, Lost, NotHeld,
                     TransportError, Unavailable, Unsupported)


class _Calls(_Failover):
    """The Client's public requests (a mixin: the state is the
    Client's)."""

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

    # ---- locks ----

    def lock(self, resource, ttl=30000, wait=0, renew=True, *, mode=None,
             limit=None, value=None):
        """LOCK: returns a :class:`Lease` (also a context manager).

        `resource` is a name or a list of names (all or none, exclusive
        only). `ttl` and `wait` are durations: an int of milliseconds, a
        str as the daemon and redlockctl take it ("500" is ms, "500ms",
        "1.5s", "2m", "1h") or a datetime.timedelta; a str the daemon
        would refuse raises ValueError naming the argument (ttl=None: the
        daemon's default).
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
        wait_ms = _proto.duration_ms(wait, "wait")
        if wait_ms:
            words.append(f"wait={wait_ms}")
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
                t_send, line = self._roundtrip(" ".join(words), wait_ms / 1000.0)
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
