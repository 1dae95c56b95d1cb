"""Leases that outlive a connection: detachable sessions, resume on the same
daemon, ADOPT on another (or the restarted) one, and the deadline that
bounds it all. Real daemons and redis-server nodes from the harness; each
test stops only what it started."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

import redlockd
from harness import wait_until

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- helpers ----------------------------------------------------------------

def probe(server, resource):
    """One LOCK from a connection of its own (raw socket, no client
    library): "BUSY", "OK" (then released at once), another ERR code, or
    None when the daemon cannot be reached or does not answer."""
    host, port = server.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), 0.5) as s:
            s.settimeout(1.0)
            f = s.makefile("rb")
            s.sendall(f"LOCK {resource}\n".encode())
            line = f.readline().decode().strip()
            while line.startswith("EVENT "):
                line = f.readline().decode().strip()
            if line.startswith("OK "):
                s.sendall(f"UNLOCK {resource}\nQUIT\n".encode())
                return "OK"
            if line.startswith("ERR "):
                return line.split()[1]
            return None
    except OSError:
        return None


class Prober(threading.Thread):
    """Probes the resource on every server every 20 ms until stopped:
    nobody else may ever get it ("OK")."""

    def __init__(self, servers, resource, lease):
        super().__init__(daemon=True)
        self.servers = servers
        self.resource = resource
        self.lease = lease
        self.answers = []
        self.states = set()
        self.halt = threading.Event()

    def run(self):
        while not self.halt.is_set():
            self.states.add(self.lease.state)
            for server in self.servers:
                self.answers.append(probe(server, self.resource))
            self.halt.wait(0.01)

    def finish(self):
        self.halt.set()
        self.join(5)
        return self.answers


def client_socket(c):
    return c._conn.sock


def watch_states(lease, seconds, until):
    """Sample lease.state every 5 ms until until() or `seconds`."""
    seen = []
    end = time.monotonic() + seconds
    while time.monotonic() < end and not until():
        s = lease.state
        if not seen or seen[-1] != s:
            seen.append(s)
        time.sleep(0.005)
    return seen


# ---- addresses, options -----------------------------------------------------

def test_server_lists(shared, monkeypatch):
    dead = "127.0.0.1:1"            # nothing listens on port 1
    with redlockd.Client(servers=[dead, shared.server]) as c:
        assert c.servers == (dead, shared.server)
        assert c.server == shared.server
        assert c.ping("x") == "x"
    with redlockd.Client(f"{dead}, {shared.server}") as c:
        assert c.servers == (dead, shared.server)
        assert c.server == shared.server
    monkeypatch.setenv("REDLOCKD_SERVER", f"{shared.server},{dead}")
    with redlockd.Client() as c:
        assert c.servers == (shared.server, dead)
        assert c.server == shared.server
    with pytest.raises(ValueError):
        redlockd.Client(server=shared.server, servers=[shared.server])
    with pytest.raises(ValueError):
        redlockd.Client(servers=[" , "])
    with pytest.raises(ValueError):
        redlockd.Client(servers=[shared.server, "host:0"])
    with pytest.raises(redlockd.TransportError):
        redlockd.Client(servers=[dead, "127.0.0.1:2"], timeout=1)


def test_detach_by_default_and_secret_kept_private(shared, res):
    with redlockd.Client(shared.server) as c:
        assert c.detach_ms == 30000 and c.detachable
        secret = c._secret
        assert secret and len(secret) == 32
        lease = c.lock(res)
        assert lease.state == "held"
        mine = [s for s in c.sessions()["sessions"] if s["id"] == c.session][0]
        assert mine.get("attached") is True
        for text in (repr(c), str(c), repr(lease), str(c.sessions()),
                     str(c.status(res)), str(c.locks())):
            assert secret not in text
        lease.release()
        assert lease.state == "released"
    with redlockd.Client(shared.server, detach_ms=None) as c:
        assert not c.detachable and c.detach_ms is None
    with redlockd.Client(shared.server, reconnect=False) as c:
        assert not c.detachable     # nobody would resume it


def test_daemon_refusing_detach(h, res):
    """A daemon with detach turned off answers ERR ARG to detach=: the
    client carries on without."""
    _, d = h.cluster(1, {"limits": {"max_detach_ms": 0}})
    with redlockd.Client(d.server) as c:
        assert not c.detachable
        with c.lock(res) as lease:
            assert lease.state == "held"


# ---- the four failovers -----------------------------------------------------

def test_restart_keeps_the_lease(h, res):
    """SIGTERM and a start on the same port and config while a Client holds
    a lock: nobody else gets it at any time; the lease is unconfirmed
    meanwhile, then held again (ADOPT on the restarted daemon, a new
    session): same fence, new token; UNLOCK works."""
    _, d = h.cluster(1)
    c = redlockd.Client(d.server, name="holder", timeout=2)
    try:
        lease = c.lock(res, ttl=6000)
        fence, token, session = lease.fence, lease.token, c.session
        assert probe(d.server, res) == "BUSY"
        prober = Prober([d.server], res, lease)
        prober.start()
        try:
            d.restart()
            assert not lease.lost, lease.lost_reason
            back = wait_until(lambda: c.reconnects >= 1 and
                              lease.state == "held", 5)
            after = [probe(d.server, res) for _ in range(3)]
        finally:
            answers = prober.finish()
        assert back, f"not held again: {lease.state} {lease.lost_reason}"
        assert "OK" not in answers, "someone else got the lock meanwhile"
        assert after == ["BUSY"] * 3
        assert prober.states == {"held", "unconfirmed"}, prober.states
        assert lease.fence == fence
        assert lease.token != token and len(lease.token) == 32
        assert c.session != session and c.last_reconnect == "new"
        assert c.connected and lease.remaining > 1.0
        lease.check()
        assert lease.release() == 1
        assert probe(d.server, res) == "OK"
    finally:
        c.close()


def test_sigkill_adopts_on_the_second_daemon(h, res):
    """Two daemons over the same node; the first is SIGKILLed. The client
    adopts each lease on the second (one ADOPT per grant, a multi-resource
    lock in one, a shared hold, a semaphore slot): the same fence (and
    slot), a new token."""
    nodes = h.redis(1)
    da, db = h.daemon(nodes), h.daemon(nodes)
    one, two, three, sh, sem = (res + ":1", res + ":2", res + ":3",
                                res + ":sh", res + ":sem")
    c = redlockd.Client(servers=[da.server, db.server], timeout=2)
    try:
        single = c.lock(one, ttl=4000)
        multi = c.lock([two, three], ttl=4000)
        shared = c.lock(sh, ttl=4000, mode="shared")
        slot = c.lock(sem, ttl=4000, limit=2)
        every = (single, multi, shared, slot)
        before = {l: (l.fence, l.token) for l in every}
        slot_before = slot.slot
        assert c.server == da.server
        da.kill()
        assert wait_until(lambda: c.reconnects >= 1 and
                          all(l.state == "held" for l in every), 3), \
            [(l.state, l.lost_reason) for l in every]
        assert c.server == db.server and c.last_reconnect == "new"
        for lease, (fence, token) in before.items():
            assert lease.fence == fence and lease.token != token
            lease.check()
        assert multi.resources == (two, three)
        assert slot.slot == slot_before and slot.limit == 2
        for r in (one, two, three, sh):
            assert probe(db.server, r) == "BUSY"
        held = {e["resource"]: e["fence"] for e in c.locks()["locks"]}
        assert held == {one: single.fence, two: multi.fence,
                        three: multi.fence, sh: shared.fence,
                        sem: slot.fence}
        assert shared.release() == 1
        assert slot.release() == 1
        assert probe(db.server, sh) == "OK"
        assert single.release() == 1
        assert multi.release() == 1
        assert probe(db.server, one) == "OK"
        assert probe(db.server, three) == "OK"
    finally:
        c.close()


def test_blip_resumes_the_same_session(h, res):
    """The client's socket is shut under it: the daemon detaches the
    session, the client resumes it (HELLO resume=) on the same daemon.
    Same session, same token, never free for anyone else."""
    _, d = h.cluster(1)
    c = redlockd.Client(d.server, timeout=2)
    try:
        lease = c.lock(res, ttl=3000)
        session, token, fence = c.session, lease.token, lease.fence
        client_socket(c).shutdown(socket.SHUT_RDWR)
        assert wait_until(lambda: c.reconnects >= 1 and c.connected, 3)
        assert not lease.lost, lease.lost_reason
        assert lease.state == "held"
        assert c.session == session and c.last_reconnect == "resumed"
        assert (lease.token, lease.fence) == (token, fence)
        assert probe(d.server, res) == "BUSY"
        mine = [s for s in c.sessions()["sessions"] if s["id"] == session]
        assert len(mine) == 1 and mine[0]["attached"] is True
        assert mine[0]["locks"] == 1
        # Again, from a blocking call this time, and by reconnect().
        client_socket(c).shutdown(socket.SHUT_RDWR)
        assert c.ping("again") == "again"
        assert c.reconnect() == "resumed"
        assert c.session == session and lease.state == "held"
        assert lease.release() == 1
        assert probe(d.server, res) == "OK"
    finally:
        c.close()


def test_paused_past_the_deadline_is_lost_not_adopted(h, res):
    """The only daemon SIGSTOPped past the lease's deadline: the lease is
    lost ("deadline") at its deadline and stays lost when the daemon runs
    again and the client reconnects; it is neither resumed to "held" nor
    adopted (its token never changes)."""
    _, d = h.cluster(1)
    c = redlockd.Client(d.server, timeout=1)
    try:
        lease = c.lock(res, ttl=1000)
        token = lease.token
        d.pause()
        t_pause = time.monotonic()
        try:
            seen = watch_states(lease, 3, lambda: lease.lost)
            t_lost = time.monotonic()
            assert lease.lost, "not lost 3 s after the daemon stopped"
            assert lease.lost_reason == "deadline"
            assert t_lost <= lease.deadline + 0.5
            assert t_lost - t_pause <= 1.5
            assert set(seen) <= {"held", "unconfirmed"}, seen
            assert lease.state == "lost"
            # Past the client's timeout: a client without reconnection is
            # closed by now.
            time.sleep(max(0.0, t_pause + 1.6 - time.monotonic()))
        finally:
            d.resume()
        assert c.ping("back") == "back"
        assert c.connected
        time.sleep(0.3)
        assert lease.lost and lease.state == "lost"
        assert lease.lost_reason in ("deadline", "expired", "node", "quorum")
        assert lease.token == token          # never adopted
        with pytest.raises(redlockd.LockLost):
            lease.release()
        assert wait_until(lambda: probe(d.server, res) == "OK", 3)
    finally:
        c.close()


# ---- more ways to lose or keep a lease -------------------------------------

def test_adopt_refused_loses_the_lease(h, res):
    """The first daemon stopped, the lease's key deleted from the node, the
    daemon killed: ADOPT on the second answers LOST, the lease is lost
    ("adopt")."""
    nodes = h.redis(1)
    da, db = h.daemon(nodes), h.daemon(nodes)
    c = redlockd.Client(servers=[da.server, db.server], timeout=2)
    try:
        lease = c.lock(res, ttl=5000)
        da.pause()                  # no renewal from now on
        with socket.create_connection(("127.0.0.1", nodes[0].port), 1) as s:
            key = f"lock:{res}".encode()
            s.sendall(b"*2\r\n$3\r\nDEL\r\n$%d\r\n%s\r\n" % (len(key), key))
            assert s.recv(16).startswith(b":1")
        da.kill()
        assert wait_until(lambda: lease.lost, 3), lease.state
        assert lease.lost_reason == "adopt" and lease.state == "lost"
        assert c.server == db.server and c.connected
        with pytest.raises(redlockd.LockLost) as ei:
            lease.release()
        assert ei.value.reason == "adopt"
    finally:
        c.close()


def test_stalled_daemon_fails_over_before_the_deadline(h, res):
    """The first daemon SIGSTOPped, a second one up: the refresh gets no
    answer, the client gives up on the first well before the deadline and
    adopts the lease on the second in time."""
    nodes = h.redis(1)
    da, db = h.daemon(nodes), h.daemon(nodes)
    c = redlockd.Client(servers=[da.server, db.server], timeout=5)
    try:
        lease = c.lock(res, ttl=2000)
        fence = lease.fence
        da.pause()
        try:
            assert wait_until(lambda: c.server == db.server and
                              lease.state == "held", 3), \
                (lease.state, lease.lost_reason)
            assert lease.fence == fence and not lease.lost
            assert probe(db.server, res) == "BUSY"
        finally:
            da.resume()
        assert lease.release() == 1
    finally:
        c.close()


def test_idle_close_resumes(h, res):
    """The daemon closes the idle connection (EVENT CLOSING reason=idle):
    the session is resumed, the lease kept."""
    _, d = h.cluster(1, {"limits": {"idle_timeout_ms": 300}})
    with redlockd.Client(d.server) as c:
        lease = c.lock(res, ttl=60000)      # no refresh within 300 ms
        session = c.session
        assert wait_until(lambda: c.reconnects >= 1, 3)
        assert c.ping() == ""
        assert c.session == session and lease.state == "held"
        assert probe(d.server, res) == "BUSY"
        assert lease.release() == 1


WORKER = r"""
import sys, time
import redlockd
c = redlockd.Client(sys.argv[1])
lease = c.lock(sys.argv[2], ttl=10000)
print(c.session, flush=True)
if sys.argv[3] == "hang":
    time.sleep(60)
"""


def test_process_end(shared, res, tmp_path):
    """A program that ends without close() releases its locks at once (the
    Client is closed at the interpreter's exit); one killed with SIGKILL
    leaves its session detached, its lock held, for a resume."""
    env = dict(os.environ, PYTHONPATH=PKG_ROOT, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run([sys.executable, "-c", WORKER, shared.server,
                        res + ":exit", "exit"], env=env, capture_output=True,
                       text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert probe(shared.server, res + ":exit") == "OK"
    p = subprocess.Popen([sys.executable, "-c", WORKER, shared.server,
                          res + ":kill", "hang"], env=env,
                         stdout=subprocess.PIPE, text=True)
    try:
        session = p.stdout.readline().strip()
        assert session
    finally:
        p.kill()
        p.wait(5)
        p.stdout.close()
    with redlockd.Client(shared.server) as c:
        def detached():
            return [s for s in c.sessions()["sessions"]
                    if s["id"] == session and s.get("attached") is False]
        assert wait_until(detached, 3)
        assert detached()[0]["locks"] == 1
        assert probe(shared.server, res + ":kill") == "BUSY"


# ---- the wire, against a scripted daemon -----------------------------------

class ScriptedDaemon:
    """Accepts any number of connections; answers each request line with
    script(conn_number, line) -> list of lines. Records (conn, line)."""

    def __init__(self, script):
        self.script = script
        self.requests = []
        self.conns = []
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(8)
        self.server = "127.0.0.1:%d" % self.srv.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                conn, _ = self.srv.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._serve, daemon=True,
                             args=(conn, len(self.conns))).start()

    def _serve(self, conn, n):
        try:
            for raw in conn.makefile("rb"):
                line = raw.decode().rstrip("\n")
                self.requests.append((n, line))
                for out in self.script(n, line):
                    conn.sendall(out.encode() + b"\n")
        except OSError:
            pass

    def close(self):
        self.srv.close()
        for c in self.conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            c.close()


SECRET1 = "11" * 16
SECRET2 = "22" * 16
OLD_TOKEN = "aa" * 16
NEW_TOKEN = "bb" * 16


def test_wire_resume_refused_then_adopt_retried():
    """Connection 1 gets the lease; it drops; connection 2's resume is
    refused (NOSESSION); connection 3 is a new session whose first ADOPT
    answers UNAVAILABLE and the second OK: the lease is held again with the
    new token, the same fence."""
    adopts = []

    def script(n, line):
        cmd = line.split()[0]
        if cmd == "HELLO" and "resume=" in line:
            return ["ERR NOSESSION no such session"]
        if cmd == "HELLO":
            sess, secret = ("s1", SECRET1) if n == 1 else ("s2", SECRET2)
            return [f"OK proto=1 session={sess} server=redlockd/9 nodes=3 "
                    f"quorum=2 secret={secret}"]
        if cmd == "LOCK":
            return [f"OK resource=r token={OLD_TOKEN} fence=7 ttl=3000 "
                    f"validity=2990"]
        if cmd == "ADOPT":
            adopts.append(line)
            if len(adopts) == 1:
                return ["ERR UNAVAILABLE no quorum yet"]
            return [f"OK resource=r token={NEW_TOKEN} fence=7 ttl=3000 "
                    f"validity=2980"]
        if cmd == "LOCKS":
            locks = [{"resource": "r", "fence": 7, "ttl": 3000,
                      "validity": 2900}] if adopts else []
            return ["OK " + json.dumps({"locks": locks, "lost": []})]
        if cmd == "UNLOCK":
            return ["OK resource=r nodes=3"]
        if cmd == "QUIT":
            return ["OK bye"]
        return ["PONG"] if cmd == "PING" else ["ERR UNKNOWN ?"]

    d = ScriptedDaemon(script)
    try:
        c = redlockd.Client(d.server, name="w", timeout=2, detach_ms=5000)
        lease = c.lock("r", ttl=3000)
        assert c.session == "s1" and c.detachable
        d.conns[0].shutdown(socket.SHUT_RDWR)       # the daemon side drops
        seen = watch_states(lease, 3, lambda: len(adopts) >= 2 and
                            lease.state == "held")
        assert lease.state == "held", (seen, lease.lost_reason)
        assert "unconfirmed" in seen
        assert (lease.token, lease.fence) == (NEW_TOKEN, 7)
        assert c.session == "s2" and c.last_reconnect == "new"
        lines = [line for _, line in d.requests]
        assert lines[0] == "HELLO proto=1 name=w detach=5000"
        assert f"HELLO proto=1 name=w resume=s1 secret={SECRET1}" in lines
        assert adopts == [f"ADOPT r token={OLD_TOKEN} ttl=3000"] * 2
        # The secret goes nowhere but into HELLO resume=.
        assert all(SECRET1 not in x and SECRET2 not in x
                   for x in lines if not x.startswith("HELLO"))
        assert SECRET2 not in repr(c) and SECRET2 not in repr(lease)
        assert lease.release() == 3
        c.close()
        assert d.requests[-1][1] == "QUIT"
    finally:
        d.close()
