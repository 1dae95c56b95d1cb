"""Holders' values and watching (protocol.md, "Watching a lock"): LOCK
value=, Lease.set_value (EXTEND value=), Client.holder (STATUS) and
Client.watch (WATCH, EVENT HOLDER), against real daemons and redis-server
nodes: through a second daemon on the same node, across a resume and a
failover, and with threads sharing the Client."""

import threading

import pytest

import redlockd
from harness import wait_until


def next_of(watch, resource, held=None, timeout=3.0):
    """The next event of `resource` (with `held` holders, if given) within
    `timeout` seconds; events of other resources (or states before the one
    wanted) are skipped."""
    while True:
        h = watch.get(timeout)
        assert h is not None, f"no EVENT HOLDER for {resource} in {timeout} s"
        if h.resource == resource and (held is None or h.held == held):
            return h


def test_value_shown_replaced(h, res):
    nodes = h.redis(1)
    da, db = h.daemon(nodes), h.daemon(nodes)
    with redlockd.Client(da.server, name="leader-a") as a, \
            redlockd.Client(db.server) as b:
        lease = a.lock(res, value="http://10.0.0.7:8080/?a=b")
        assert lease.value == "http://10.0.0.7:8080/?a=b"
        who = b.holder(res)
        assert (who.resource, who.held, who.mode) == (res, 1, "exclusive")
        assert (who.fence, who.name) == (lease.fence, "leader-a")
        assert who.value == "http://10.0.0.7:8080/?a=b"
        assert who.daemon and not who.foreign and who.limit is None
        assert b.status(res)["holder"]["value"] == lease.value

        token, deadline = lease.token, lease.deadline
        assert lease.set_value("10.0.0.8:8080") > 0
        assert lease.value == "10.0.0.8:8080"
        assert (lease.token, lease.state) == (token, "held")
        assert lease.deadline > deadline
        assert b.holder(res).value == "10.0.0.8:8080"
        assert b.holder(res).fence == lease.fence

        with pytest.raises(ValueError):
            lease.set_value("two words")
        with pytest.raises(ValueError):
            a.lock(res + ":x", value="")
        with pytest.raises(redlockd.Arg):
            a.lock(res + ":sh", mode="shared", value="x")
        with a.lock(res + ":sh", mode="shared") as sh:
            with pytest.raises(redlockd.Arg):
                sh.set_value("x")
            who = b.holder(res + ":sh")
            assert (who.held, who.mode, who.value) == (1, "shared", None)
        with a.lock(res + ":sem", limit=3):
            who = a.holder(res + ":sem")    # (its own daemon knows K)
            assert (who.held, who.mode, who.limit) == (1, "semaphore", 3)
        lease.release()
        assert b.holder(res) == redlockd.Holder(res, 0, None, None, False,
                                                None, None, None, None)


def test_watch_changes_through_another_daemon(h, res):
    one, two = res + ":1", res + ":2"
    nodes = h.redis(1)
    da, db = h.daemon(nodes), h.daemon(nodes)
    with redlockd.Client(da.server) as w, \
            redlockd.Client(db.server, name="leader-a") as a:
        with w.watch(one, two) as watch:
            assert {next_of(watch, one).held, next_of(watch, two).held} == {0}
            lease = a.lock(one, value="10.0.0.9:80")
            e = next_of(watch, one, held=1)
            assert (e.mode, e.fence, e.name) == ("exclusive", lease.fence,
                                                 "leader-a")
            assert e.value == "10.0.0.9:80" and e.daemon
            lease.set_value("10.0.0.9:81")
            assert next_of(watch, one).value == "10.0.0.9:81"
            with a.lock(two, mode="shared"):
                e = next_of(watch, two, held=1)
                assert (e.mode, e.value, e.fence) == ("shared", None, None)
            assert next_of(watch, two).held == 0
            lease.release()
            e = next_of(watch, one)
            assert (e.held, e.mode, e.value) == (0, None, None)

            # A second Watch of one resource: both hear it; closing one
            # leaves the other watching.
            other = w.watch(one)
            assert next_of(other, one).held == 0
            other.close()
            with a.lock(one):
                assert next_of(watch, one, held=1).held == 1
            assert list(other) == []
        # Closed: what was heard is still read, then iteration ends.
        assert all(e.resource in (one, two) for e in watch)


def test_watch_survives_resume_and_failover(h, res):
    nodes = h.redis(1)
    da, db = h.daemon(nodes), h.daemon(nodes)
    with redlockd.Client(servers=[da.server, db.server], timeout=2) as w, \
            redlockd.Client(db.server) as a:
        watch = w.watch(res)
        assert next_of(watch, res).held == 0
        session = w.session
        assert w.reconnect() == "resumed" and w.session == session
        assert next_of(watch, res).held == 0     # told again
        with a.lock(res, value="on-b"):
            assert next_of(watch, res, held=1).value == "on-b"

        da.kill()
        assert wait_until(lambda: w.reconnects >= 2 and w.connected, 5)
        assert w.last_reconnect == "new" and w.server == db.server
        lease = a.lock(res, value="after-failover")
        assert next_of(watch, res, held=1).value == "after-failover"
        lease.release()
        assert next_of(watch, res).held == 0
        watch.close()


def test_threads_share_a_watching_client(shared, res):
    """Threads lock and release through the Client whose Watch the main
    thread reads: each resource's events come in fence order, with the
    values set, and end on the last state."""
    names = [f"{res}:{i}" for i in range(4)]
    with redlockd.Client(shared.server) as c:
        watch = c.watch(*names)
        first = {watch.get(3.0) for _ in names}
        assert {(e.resource, e.held) for e in first} == {(n, 0) for n in names}

        def churn(name):
            for k in range(10):
                c.lock(name, wait=5000, value=f"{name}-{k}").release()

        threads = [threading.Thread(target=churn, args=(n,)) for n in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        seen = {n: [] for n in names}
        while (e := watch.get(1.0)) is not None:
            seen[e.resource].append(e)
        for n in names:
            assert seen[n] and seen[n][-1].held == 0, seen[n]
            grants = [e for e in seen[n] if e.held == 1]
            assert all(e.value.startswith(n + "-") for e in grants)
            fences = [e.fence for e in grants]
            assert fences == sorted(fences)
        watch.close()
        with pytest.raises(redlockd.ConnectionClosed):
            watch.get(0)


def test_watch_limits(h, res):
    _, d = h.cluster(1, {"limits": {"max_watches": 2}})
    with redlockd.Client(d.server) as c:
        with pytest.raises(redlockd.Limit):
            c.watch(res + ":1", res + ":2", res + ":3")
        w = c.watch(res + ":1", res + ":2")
        with pytest.raises(ValueError):
            c.watch()
        with pytest.raises(ValueError):
            c.watch("two words")
        w.close()
        w.close()                       # twice: nothing more
        c.watch(res + ":3").close()
