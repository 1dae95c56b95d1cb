"""Threads sharing one Client through tagged requests: many requests in
flight on one session and one connection, each thread waiting for its own
reply; calls naming the same resource taking turns in the client; the
background refresh never behind a caller's wait; a lost connection under
requests in flight. Real redlockd and redis-server processes, and two
scripted daemons for the wire itself."""

import collections
import json
import socket
import threading
import time

import pytest

import redlockd
from harness import wait_until


def requests_of(observer, session):
    """The requests in flight of `session`, as SESSIONS shows them to
    another Client: [(command, tag, resource)]."""
    for s in observer.sessions()["sessions"]:
        if s["id"] == session:
            return [(q.get("command"), q.get("tag"), q.get("resource"))
                    for q in s.get("requests") or []]
    return []


def in_flight(observer, session, command, resource):
    """Is a tagged `command` of `resource` in flight on `session`?"""
    return any(c == command and t and r == resource
               for c, t, r in requests_of(observer, session))


class Runner:
    """Threads that record what their calls returned or raised, and when."""

    def __init__(self):
        self.out = {}
        self.threads = []

    def start(self, key, fn, *args, **kw):
        def run():
            try:
                self.out[key] = ("ok", fn(*args, **kw), time.monotonic())
            except Exception as e:      # looked at by the test
                self.out[key] = ("err", e, time.monotonic())
        t = threading.Thread(target=run, daemon=True, name=f"runner {key}")
        self.threads.append(t)
        t.start()
        return t

    def join(self, timeout):
        end = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        return [t.name for t in self.threads if t.is_alive()]


# ---- many threads, one session ---------------------------------------------

def test_fifty_threads_share_one_client(shared, res):
    """50 threads of one Client and 10 of another over 5 resources: never
    two holders of one resource at once. Threads of one Client are one
    holder, so a sibling's lock answers Held, and the thread tries again."""
    names = [f"{res}:{i}" for i in range(5)]
    inside = collections.Counter()
    guard = threading.Lock()
    overlaps, errors = [], []
    done = collections.Counter()
    sessions = set()

    def worker(c, who, i, rounds):
        try:
            for k in range(rounds):
                name = names[(i + k) % len(names)]
                while True:
                    try:
                        lease = c.lock(name, ttl=10000, wait=10000)
                        break
                    except redlockd.Held:
                        time.sleep(0.002)
                with lease:
                    assert lease.resource == name
                    with guard:
                        inside[name] += 1
                        if inside[name] != 1:
                            overlaps.append((name, who, i))
                    time.sleep(0.002)
                    lease.check()
                    with guard:
                        inside[name] -= 1
                with guard:
                    done[who] += 1
        except Exception as e:          # reported below
            errors.append((who, i, repr(e)))

    with redlockd.Client(shared.server, name="fifty") as a, \
            redlockd.Client(shared.server, name="ten") as b:
        threads = [threading.Thread(target=worker, args=(a, "a", i, 6))
                   for i in range(50)]
        threads += [threading.Thread(target=worker, args=(b, "b", i, 6))
                    for i in range(10)]
        for t in threads:
            t.start()

        def watch():            # a's session with many requests in flight
            while any(t.is_alive() for t in threads):
                sessions.add(len(requests_of(b, a.session)))
                time.sleep(0.01)
        w = threading.Thread(target=watch)
        w.start()
        for t in threads:
            t.join(60)
        w.join(5)
        assert not any(t.is_alive() for t in threads), "threads still running"
        assert not errors, errors[:5]
        assert not overlaps, overlaps[:5]
        assert done == {"a": 300, "b": 60}
        assert max(sessions) >= 2, "never two requests of a in flight at once"
        assert a.locks()["locks"] == [] and b.locks()["locks"] == []
        assert a.reconnects == 0 and b.reconnects == 0


def test_a_waiting_lock_holds_up_no_other_thread(shared, res):
    """One thread waits in lock(wait=6000); eight others of the same Client
    lock, unlock, ping and inspect meanwhile, and are done long before the
    wait could end. The waiter gets the lock as soon as it is free."""
    busy = res + ":busy"
    with redlockd.Client(shared.server, name="b") as b, \
            redlockd.Client(shared.server, name="a", timeout=5) as a:
        blocker = b.lock(busy)
        run = Runner()
        run.start("waiter", a.lock, busy, wait=6000)
        assert wait_until(lambda: in_flight(b, a.session, "LOCK", busy), 3)

        def others(i):
            for k in range(5):
                with a.lock(f"{res}:o{i}:{k}", ttl=5000) as lease:
                    assert a.status(lease.resource)["holder"]["fence"] == \
                        lease.fence
            assert a.ping(f"p{i}") == f"p{i}"
            assert a.locks()["session"] == a.session
            return True
        t0 = time.monotonic()
        others_run = Runner()
        for i in range(8):
            others_run.start(i, others, i)
        assert not others_run.join(10)
        took = time.monotonic() - t0
        assert all(v[0] == "ok" for v in others_run.out.values()), \
            others_run.out
        assert took < 2.0, f"the others took {took:.2f} s behind a 6 s wait"
        assert "waiter" not in run.out, "the waiter did not wait"
        assert in_flight(b, a.session, "LOCK", busy)
        t_release = time.monotonic()
        blocker.release()
        assert not run.join(5)
        kind, lease, t_got = run.out["waiter"]
        assert kind == "ok", lease
        assert lease.resource == busy and lease.state == "held"
        assert t_got - t_release < 1.0
        lease.release()


def test_same_resource_calls_take_turns(shared, res):
    """Calls of one Client naming one resource go in the order called, each
    sent when the one before it is answered: a STATUS and a LOCK called
    while a LOCK of the resource waits are not sent meanwhile (the daemon
    would hold them, and their replies would time out: the Client's
    timeout is shorter than the wait). The STATUS then sees the lock
    taken, the second LOCK answers Held (the Client holds it: one session
    is one holder)."""
    with redlockd.Client(shared.server, name="b") as b, \
            redlockd.Client(shared.server, name="a", timeout=0.5) as a:
        blocker = b.lock(res)
        run = Runner()
        run.start("lock", a.lock, res, wait=3000)
        assert wait_until(lambda: in_flight(b, a.session, "LOCK", res), 2)
        run.start("status", a.status, res)
        time.sleep(0.05)
        run.start("again", a.lock, res)
        run.start("ping", a.ping, "free")     # no resource: no turn to wait
        time.sleep(1.0)     # twice a's timeout
        assert set(run.out) == {"ping"} and run.out["ping"][1] == "free"
        assert [c for c, _, r in requests_of(b, a.session) if r == res] == \
            ["LOCK"], "a later call of the resource was sent meanwhile"
        blocker.release()
        assert not run.join(5)
        kind, lease, t_lock = run.out["lock"]
        assert kind == "ok", lease
        kind, st, t_status = run.out["status"]
        assert kind == "ok", st
        assert st["holder"]["fence"] == lease.fence
        kind, err, t_again = run.out["again"]
        assert kind == "err" and isinstance(err, redlockd.Held), err
        assert t_lock <= t_status <= t_again
        assert a.connected and a.reconnects == 0
        lease.release()


def test_background_refresh_during_a_long_wait(shared, res):
    """A lease with ttl=900 stays confirmed (its deadline keeps moving)
    while another thread of the Client waits 2.5 s for a lock: the
    background LOCKS goes out beside the waiting LOCK."""
    with redlockd.Client(shared.server, name="b") as b, \
            redlockd.Client(shared.server, name="a", timeout=2) as a:
        blocker = b.lock(res + ":w")
        lease = a.lock(res + ":kept", ttl=900)
        run = Runner()
        run.start("waiter", a.lock, res + ":w", wait=2500)
        assert wait_until(lambda: in_flight(b, a.session, "LOCK",
                                            res + ":w"), 2)
        first = lease.deadline
        low = lease.remaining
        end = time.monotonic() + 2.0
        while time.monotonic() < end:
            low = min(low, lease.remaining)
            assert not lease.lost, lease.lost_reason
            time.sleep(0.01)
        assert "waiter" not in run.out
        assert lease.deadline > first + 1.5, "the deadline did not move"
        assert low > 0.2, f"only {low:.3f} s left at one point"
        assert lease.state == "held"
        assert not run.join(3)
        kind, err, _ = run.out["waiter"]
        assert kind == "err" and isinstance(err, redlockd.Timeout), err
        blocker.release()
        assert lease.release() == 1


def test_max_inflight(shared, res):
    """max_inflight=3: at most two callers' requests in flight (the third
    place is the background refresh's); the others wait in the client and
    go out as places free up."""
    names = [f"{res}:{i}" for i in range(4)]
    with pytest.raises(ValueError):
        redlockd.Client(shared.server, max_inflight=0)
    with pytest.raises(TypeError):
        redlockd.Client(shared.server, max_inflight="8")
    with redlockd.Client(shared.server, name="b") as b, \
            redlockd.Client(shared.server, name="a", max_inflight=3) as a:
        assert a.max_inflight == 3
        blockers = [b.lock(n) for n in names]
        kept = a.lock(res + ":kept", ttl=900)
        run = Runner()
        for n in names:
            run.start(n, a.lock, n, wait=8000)
        assert wait_until(lambda: len(requests_of(b, a.session)) == 2, 2)
        first = kept.deadline
        seen = set()
        end = time.monotonic() + 1.2
        while time.monotonic() < end:
            seen.add(sum(1 for c, _, _ in requests_of(b, a.session)
                         if c == "LOCK"))
            time.sleep(0.02)
        assert seen == {2}, seen
        assert kept.deadline > first + 0.5 and not kept.lost
        for blocker in blockers:
            blocker.release()
        assert not run.join(5)
        leases = [run.out[n] for n in names]
        assert all(kind == "ok" for kind, _, _ in leases), leases
        for _, lease, _ in leases:
            lease.release()


# ---- a lost connection with requests in flight ------------------------------

def test_blip_with_requests_in_flight(h, res):
    """The connection is shut while three threads wait in lock() and
    others lock, unlock and ping (then twice more): the waiters get
    ConnectionClosed (as a lone request did before tags), the others carry
    on after the resume, nothing hangs, and the resumed session holds no
    lock that no lease knows (a LOCK granted as the connection went is
    unlocked by the resume; a release whose UNLOCK went with it is done
    again, not taken for a lost lease)."""
    _, d = h.cluster(1)
    busy = [f"{res}:busy{i}" for i in range(3)]
    with redlockd.Client(d.server, name="b") as b, \
            redlockd.Client(d.server, name="a", timeout=3) as a:
        blockers = [b.lock(r) for r in busy]
        kept = a.lock(res + ":kept", ttl=5000)
        session, token = a.session, kept.token
        stop = threading.Event()
        errors, closed = [], collections.Counter()

        def churn(i):
            n = 0
            while not stop.is_set() or n < 3:
                try:
                    with a.lock(f"{res}:c{i}", ttl=5000):
                        pass
                    assert a.ping(f"{i}") == f"{i}"
                    n += 1
                except redlockd.ConnectionClosed:
                    closed[i] += 1
                except Exception as e:      # reported below
                    errors.append(repr(e))
                    return
        run = Runner()
        for r in busy:
            run.start(r, a.lock, r, wait=8000)
        churners = [threading.Thread(target=churn, args=(i,)) for i in range(6)]
        for t in churners:
            t.start()
        assert wait_until(lambda: all(in_flight(b, session, "LOCK", r)
                                      for r in busy), 3)
        a._conn.sock.shutdown(socket.SHUT_RDWR)
        t_cut = time.monotonic()
        assert not run.join(2), "a waiter still waits after the cut"
        for r in busy:
            kind, err, t = run.out[r]
            assert kind == "err" and isinstance(err, redlockd.ConnectionClosed)
            assert t - t_cut < 1.0
        assert wait_until(lambda: a.reconnects >= 1 and a.connected, 3)
        for k in (2, 3):            # again, under the churn alone
            time.sleep(0.15)
            a._conn.sock.shutdown(socket.SHUT_RDWR)
            assert wait_until(lambda: a.reconnects >= k and a.connected, 3)
        time.sleep(0.15)
        stop.set()
        for t in churners:
            t.join(10)
        assert not any(t.is_alive() for t in churners)
        assert not errors, errors[:5]
        assert a.session == session and a.last_reconnect == "resumed"
        assert kept.state == "held" and kept.token == token
        held = {e["resource"] for e in a.locks()["locks"]}
        assert held == {kept.resource}, held
        for i in range(6):          # nobody holds what the churn locked
            b.lock(f"{res}:c{i}").release()
        for blocker in blockers:
            blocker.release()
        assert kept.release() == 1


def test_daemon_killed_with_requests_in_flight(h, res):
    """Two daemons over one node; the first is SIGKILLed while threads
    wait in lock() and ping: the waiters get ConnectionClosed, nothing
    hangs, the leases are adopted on the second (same fences), and the
    threads' next calls work there."""
    nodes = h.redis(1)
    da, db = h.daemon(nodes), h.daemon(nodes)
    with redlockd.Client(db.server, name="b") as b, \
            redlockd.Client(servers=[da.server, db.server], name="a",
                            timeout=2) as a:
        blockers = [b.lock(f"{res}:busy{i}") for i in range(3)]
        leases = [a.lock(f"{res}:k{i}", ttl=4000) for i in range(3)]
        fences = [l.fence for l in leases]
        run = Runner()
        for i in range(3):
            run.start(i, a.lock, f"{res}:busy{i}", wait=8000)
        with redlockd.Client(da.server) as look:
            assert wait_until(lambda: len(requests_of(look, a.session)) == 3,
                              3)
        da.kill()
        assert not run.join(3), "a waiter still waits after the kill"
        for i in range(3):
            kind, err, _ = run.out[i]
            assert kind == "err" and isinstance(err, redlockd.ConnectionClosed)
        assert wait_until(lambda: a.server == db.server and
                          all(l.state == "held" for l in leases), 3), \
            [(l.state, l.lost_reason) for l in leases]
        assert [l.fence for l in leases] == fences
        pings = Runner()
        for i in range(5):
            pings.start(i, a.ping, f"x{i}")
        assert not pings.join(3)
        assert [pings.out[i][1] for i in range(5)] == [f"x{i}" for i in range(5)]
        for lease in leases:
            assert lease.release() == 1
        for blocker in blockers:
            blocker.release()


# ---- the wire, against scripted daemons ------------------------------------

class LineDaemon:
    """One connection. HELLO, QUIT and the client's tag probe are answered
    here (the probe untagged, as an older daemon does, with tags=False);
    script(tag, request, send) answers the rest (tag None for an untagged
    line; send writes a line), from the reading thread."""

    def __init__(self, script, tags=True):
        self.script = script
        self.tags = tags
        self.requests = []
        self.srv = socket.socket()
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(1)
        self.server = "127.0.0.1:%d" % self.srv.getsockname()[1]
        self.conn = None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def send(self, line):
        with self.lock:
            self.conn.sendall(line.encode() + b"\n")

    def _answer(self, line):
        if line.startswith("HELLO"):
            self.send("OK proto=1 session=s1 server=redlockd/9 nodes=1 "
                      "quorum=1")
        elif line == "QUIT":
            self.send("OK bye")
        elif not line.startswith("#"):
            self.script(None, line, self.send)
        elif not self.tags:
            self.send("ERR UNKNOWN unknown command")
        else:
            tag, _, rest = line.partition(" ")
            if rest == "PING":
                self.send(f"{tag} PONG")
            else:
                self.script(tag, rest, self.send)

    def _run(self):
        try:
            self.conn, _ = self.srv.accept()
            for raw in self.conn.makefile("rb"):
                line = raw.decode().rstrip("\n")
                self.requests.append(line)
                self._answer(line)
        except OSError:
            pass

    def close(self):
        if self.conn is not None:
            try:
                self.conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.conn.close()
        self.srv.close()
        self.thread.join(3)


def test_wire_replies_matched_by_tag():
    """A daemon that holds the replies to three PINGs and sends them in
    reverse order: each thread gets its own word. The lines are tagged
    (one tag each), HELLO and QUIT are not."""
    held = []

    def script(tag, request, send):
        if request.startswith("PING "):
            held.append((tag, request.split()[1]))
            if len(held) == 3:
                for t, w in reversed(held):
                    send(f"{t} PONG {w}")
        else:
            send(f"{tag} ERR UNKNOWN ?")
    d = LineDaemon(script)
    try:
        c = redlockd.Client(d.server, timeout=3)
        run = Runner()
        for w in ("one", "two", "three"):
            run.start(w, c.ping, w)
        assert not run.join(5)
        assert {k: v[1] for k, v in run.out.items()} == \
            {"one": "one", "two": "two", "three": "three"}
        c.close()
        lines = d.requests
        assert lines[0].startswith("HELLO ") and lines[-1] == "QUIT"
        tagged = lines[1:-1]
        assert all(x.startswith("#") for x in tagged), tagged
        assert len({x.split()[0] for x in tagged}) == len(tagged)
    finally:
        d.close()


def test_wire_daemon_without_tags():
    """A daemon that answers the probe untagged (it does not know tags)
    gets untagged requests, one at a time, and the client works."""
    state = {"busy": False, "overlap": False}

    def script(tag, request, send):
        if state["busy"]:
            state["overlap"] = True
        if request.startswith("PING "):
            state["busy"] = True
            word = request.split()[1]

            def later():
                time.sleep(0.05)
                state["busy"] = False
                send(f"PONG {word}")
            threading.Thread(target=later, daemon=True).start()
        else:
            send("ERR UNKNOWN ?")
    d = LineDaemon(script, tags=False)
    try:
        with redlockd.Client(d.server, timeout=3) as c:
            run = Runner()
            for w in ("one", "two", "three"):
                run.start(w, c.ping, w)
            assert not run.join(5)
            assert {k: v[1] for k, v in run.out.items()} == \
                {"one": "one", "two": "two", "three": "three"}
        assert not state["overlap"], "two requests in flight untagged"
        assert [x for x in d.requests if x.startswith("#")] == \
            [d.requests[1]]     # only the probe
    finally:
        d.close()


def test_wire_locks_reply_does_not_lose_a_lease_being_released():
    """A LOCKS sent before an UNLOCK and answered while the UNLOCK is in
    flight (the daemon ran the UNLOCK first: the lock is not listed) does
    not make the lease lost: release() finishes cleanly, no LockLost."""
    token = "0123456789abcdef0123456789abcdef"
    pending = []

    def script(tag, request, send):
        if request.startswith("LOCK "):
            send(f"{tag} OK resource=r token={token} fence=3 ttl=30000 "
                 "validity=29000")
        elif request == "LOCKS":
            pending.append(tag)                 # answered after the UNLOCK
        elif request == "UNLOCK r":
            send(f"{pending.pop()} OK " +
                 json.dumps({"session": "s1", "locks": []}))
            time.sleep(0.2)
            send(f"{tag} OK resource=r nodes=1")
        else:
            send(f"{tag} ERR UNKNOWN ?")
    d = LineDaemon(script)
    try:
        with redlockd.Client(d.server, timeout=3) as c:
            run = Runner()
            with c.lock("r") as lease:
                run.start("locks", c.locks)
                assert wait_until(lambda: pending, 2)
            assert not run.join(3)
            assert run.out["locks"][0] == "ok"
            assert run.out["locks"][1]["locks"] == []
            assert lease.state == "released" and not lease.lost
    finally:
        d.close()
