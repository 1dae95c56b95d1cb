"""Reply parsing for what today's daemon cannot produce yet (mode=, limit=,
slot=, resources=) and event routing corner cases, against a scripted
fake daemon on loopback. The real-daemon tests are the others."""

import json
import socket
import threading
import time

import pytest

import redlockd
from harness import wait_until

TOKEN = "0123456789abcdef0123456789abcdef"


class FakeDaemon:
    """Answers each request line with script(line) -> list of lines."""

    def __init__(self, script):
        self.script = script
        self.requests = []
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(4)
        self.server = "127.0.0.1:%d" % self.srv.getsockname()[1]
        self.conn = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        try:
            self.conn, _ = self.srv.accept()
            f = self.conn.makefile("rb")
            for raw in f:
                line = raw.decode().rstrip("\n")
                self.requests.append(line)
                for out in self.script(line):
                    self.conn.sendall(out.encode() + b"\n")
        except OSError:
            pass

    def send(self, line):
        self.conn.sendall(line.encode() + b"\n")

    def close(self):
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.conn.close()
        self.srv.close()
        self.thread.join(3)


def base(line, locks=None):
    cmd = line.split()[0]
    if cmd == "HELLO":
        return ["OK proto=1 session=s9 server=redlockd/9.9 nodes=3 quorum=2"]
    if cmd == "QUIT":
        return ["OK bye"]
    if cmd == "LOCKS":
        return ["OK " + json.dumps({"session": "s9", "locks": locks or [],
                                    "lost": []})]
    if cmd == "PING":
        return ["PONG"]
    return ["ERR UNKNOWN unknown command"]


@pytest.fixture
def fake():
    made = []

    def make(script):
        d = FakeDaemon(script)
        made.append(d)
        return d
    yield make
    for d in made:
        d.close()


def lock_reply(fake, words):
    """A fake daemon answering LOCK with an OK carrying `words` too."""
    def script(line):
        if line.startswith("LOCK "):
            return [f"OK resource=r token={TOKEN} {words}"]
        return base(line)
    return fake(script)


def test_shared_reply(fake):
    d = lock_reply(fake, "fence=5 ttl=3000 validity=2990 mode=shared")
    with redlockd.Client(d.server, timeout=2) as c:
        lease = c.lock("r", ttl=3000, mode="shared")
        assert d.requests[-1] == "LOCK r ttl=3000 mode=shared"
        assert (lease.mode, lease.fence, lease.validity) == ("shared", 5, 2990)


def test_semaphore_reply(fake):
    d = lock_reply(fake, "fence=6 ttl=3000 validity=2990 limit=4 slot=3")
    with redlockd.Client(d.server, timeout=2) as c:
        lease = c.lock("r", ttl=3000, wait=100, limit=4)
        assert d.requests[-1] == "LOCK r ttl=3000 wait=100 limit=4"
        assert (lease.limit, lease.slot, lease.mode) == (4, 3, "exclusive")


def test_several_resources_reply_refresh_and_event(fake):
    entries = [{"resource": r, "fence": 7, "ttl": 900, "validity": 890,
                "held_ms": 1, "renew": True} for r in ("a", "b")]

    def script(line):
        if line.startswith("LOCK "):
            return [f"OK resources=2 token={TOKEN} fence=7 ttl=900 validity=880"]
        if line.startswith("UNLOCK"):
            return ["ERR LOST the lease on a was lost"]
        return base(line, entries)
    d = fake(script)
    with redlockd.Client(d.server, timeout=2) as c:
        lease = c.lock(["a", "b"], ttl=900)
        assert d.requests[-1] == "LOCK a b ttl=900"
        assert lease.resources == ("a", "b") and lease.fence == 7
        first = lease.deadline
        # The refresh thread sends LOCKS every ttl/3 and moves the deadline.
        assert wait_until(lambda: lease.deadline > first + 0.2, 2)
        assert d.requests.count("LOCKS") >= 1
        # An event for one of the set loses the lease; a stale fence does not.
        d.send("EVENT LOST resource=b fence=6 reason=node")
        c.ping()
        assert not lease.lost
        d.send("EVENT LOST resource=b fence=7 reason=quorum")
        assert wait_until(lambda: lease.lost, 2)
        assert lease.lost_reason == "quorum"
        with pytest.raises(redlockd.Lost):
            lease.release()
        assert d.requests[-1] == "UNLOCK a b"


def test_event_right_after_the_reply(fake):
    """EVENT LOST that the reader sees before the caller registered the
    lease still reaches it; an unknown event is ignored."""
    def script(line):
        if line.startswith("LOCK "):
            return ["EVENT FUTURE x=1",
                    f"OK resource=r token={TOKEN} fence=8 ttl=3000 validity=2990",
                    "EVENT LOST resource=r fence=8 reason=expired"]
        return base(line)
    d = fake(script)
    with redlockd.Client(d.server, timeout=2) as c:
        lease = c.lock("r", ttl=3000)
        assert wait_until(lambda: lease.lost, 2)
        assert lease.lost_reason == "expired"


def test_unlisted_lease_is_lost(fake):
    def script(line):
        if line.startswith("LOCK "):
            return [f"OK resource=r token={TOKEN} fence=9 ttl=300 validity=290"]
        return base(line, [])          # LOCKS no longer lists it
    with redlockd.Client(fake(script).server, timeout=2) as c:
        lease = c.lock("r", ttl=300)
        assert wait_until(lambda: lease.lost, 2)
        assert lease.lost_reason == "gone"


def test_reply_without_request_closes(fake):
    d = fake(base)
    with redlockd.Client(d.server, timeout=2, reconnect=False) as c:
        d.send("OK stray")
        assert wait_until(lambda: c.closed, 2)
        with pytest.raises(redlockd.ConnectionClosed):
            c.ping()


def test_no_reply_times_out_and_closes(fake):
    def script(line):
        return [] if line.startswith("PING") else base(line)
    d = fake(script)
    c = redlockd.Client(d.server, timeout=0.3, reconnect=False)
    t0 = time.monotonic()
    with pytest.raises(redlockd.IOTimeout):
        c.ping()
    assert 0.25 < time.monotonic() - t0 < 2
    assert c.closed
    c.close()
