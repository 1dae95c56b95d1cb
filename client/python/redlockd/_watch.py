"""Watching: who holds a resource, and the Client's watches.

``Holder`` (who holds a resource: an ``EVENT HOLDER``, or a STATUS
answer), ``Watch`` (the public iterator that ``Client.watch()`` returns;
its ``close()`` goes through its Client), and ``_Watches``: the mixin
over the Client's registry of watches (``_watchers``, resource ->
[Watch]): a Watch taken out, and the WATCH lines that a new session
(after a failover) sends again.

Above ``_conn``; below ``_failover`` (which watches again on a new
session) and ``_calls`` (``watch()``, and the UNWATCH of a Watch closed).
"""

import collections

from ._conn import _Connection, _deadline, _left
from .errors import ConnectionClosed, RedlockdError

# WATCH and UNWATCH name at most this many resources per line (the
# daemon's own limit per request).
WATCH_NAMES_MAX = 256


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


class _Watches(_Connection):
    """The Client's watches (a mixin: the state is the Client's)."""

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
