"""Locks, leases, deadlines and inspection against a real daemon and node."""

import datetime
import re
import time

import pytest

import redlockd
from harness import wait_until


def test_hello_fields(shared):
    with redlockd.Client(shared.server, name="hello-test") as c:
        assert re.fullmatch(r"s\d+\.[0-9a-z]+", c.session)
        assert c.server_version.startswith("redlockd/")
        assert (c.nodes, c.quorum) == (1, 1)
        assert c.ping() == ""
        assert c.ping("hi") == "hi"
        assert "LOCK" in c.help()


def test_unix_socket_and_env(shared, res, monkeypatch):
    with redlockd.Client(shared.unix_server) as c:
        with c.lock(res) as lease:
            assert lease.fence > 0
    monkeypatch.setenv("REDLOCKD_SERVER", shared.server)
    with redlockd.Client(name="from-env") as c:
        assert c.server == shared.server
        c.lock(res).release()


def test_lock_reply_and_deadline(shared, res):
    with redlockd.Client(shared.server) as c:
        t0 = time.monotonic()
        lease = c.lock(res, ttl=10000)
        t1 = time.monotonic()
        assert lease.resource == res and lease.resources == (res,)
        assert re.fullmatch(r"[0-9a-f]{32}", lease.token)
        assert isinstance(lease.fence, int) and lease.fence > 0
        assert lease.ttl == 10000
        assert 0 < lease.validity <= 10000
        assert (lease.mode, lease.limit, lease.slot) == ("exclusive", None, None)
        # The deadline is the send time plus the reported validity.
        v = lease.validity / 1000.0
        assert t0 + v <= lease.deadline <= t1 + v
        assert not lease.lost and lease.lost_reason is None
        lease.check()
        assert 9.0 < lease.remaining <= 10.0
        assert lease.release() == 1
        assert lease.released and not lease.lost
        assert lease.release() is None           # a second release does nothing


def test_fences_increase(shared, res):
    with redlockd.Client(shared.server) as c:
        fences = []
        for _ in range(3):
            with c.lock(res) as lease:
                fences.append(lease.fence)
        assert fences == sorted(fences) and len(set(fences)) == 3


def test_with_block_releases(shared, res):
    with redlockd.Client(shared.server) as a, redlockd.Client(shared.server) as b:
        with a.lock(res, wait=5000) as lease:
            st = b.status(res)
            assert st["held"] is True
            assert st["holder"]["session"] == a.session
            assert st["holder"]["fence"] == lease.fence
            with pytest.raises(redlockd.Busy):
                b.lock(res)
        assert lease.released
        assert b.status(res)["held"] is False
        b.lock(res).release()


def test_with_block_releases_on_exception(shared, res):
    with redlockd.Client(shared.server) as a:
        with pytest.raises(KeyError):
            with a.lock(res):
                raise KeyError("boom")
        assert a.status(res)["held"] is False


def test_client_context_manager_closes_and_releases(shared, res):
    with redlockd.Client(shared.server) as a:
        lease = a.lock(res)
    assert a.closed
    assert lease.lost and lease.lost_reason == "closed"
    with pytest.raises(redlockd.ConnectionClosed):
        a.ping()
    with redlockd.Client(shared.server) as b:
        b.lock(res, wait=2000).release()


def test_background_refresh_moves_the_deadline(shared, res):
    with redlockd.Client(shared.server) as c:
        lease = c.lock(res, ttl=1000)
        first = lease.deadline
        time.sleep(1.5)             # past the first deadline: refreshes moved it
        assert not lease.lost, lease.lost_reason
        assert lease.deadline > first + 0.5
        assert lease.deadline > time.monotonic()
        lease.release()


def test_extend(shared, res):
    with redlockd.Client(shared.server) as c:
        with c.lock(res, ttl=2000) as lease:
            t0 = time.monotonic()
            validity = lease.extend(20000)
            t1 = time.monotonic()
            assert lease.ttl == 20000
            assert validity == lease.validity and 0 < validity <= 20000
            assert t0 + validity / 1000 <= lease.deadline <= t1 + validity / 1000
            assert c.locks()["locks"][0]["ttl"] == 20000


def test_durations_with_units(shared, res):
    """ttl=, wait=, extend() and detach_ms take "2s", "500ms", "1.5s",
    "2m" (bare: ms) and timedelta, as the daemon and redlockctl do; ints
    stay milliseconds. Bad ones are a ValueError naming the argument,
    before anything is sent."""
    def ttl_in_locks(c):
        return [e for e in c.locks()["locks"] if e["resource"] == res][0]["ttl"]

    with redlockd.Client(shared.server) as a, \
            redlockd.Client(shared.server) as b:
        with a.lock(res, ttl="2s") as lease:
            assert lease.ttl == 2000 and ttl_in_locks(a) == 2000
            assert 0 < lease.validity <= 2000
            lease.extend("1.5m")
            assert lease.ttl == 90000 and ttl_in_locks(a) == 90000
            lease.extend(datetime.timedelta(seconds=3))
            assert lease.ttl == 3000 and ttl_in_locks(a) == 3000
            lease.extend("2500")
            assert lease.ttl == 2500 and ttl_in_locks(a) == 2500
            t0 = time.monotonic()
            with pytest.raises(redlockd.Timeout):
                b.lock(res, wait="300ms")
            assert time.monotonic() - t0 >= 0.25
            with pytest.raises(redlockd.Timeout):
                b.lock(res, wait=datetime.timedelta(milliseconds=100))
            for bad in ("5d", "1.5", "-1s", "1.5ms", ""):
                with pytest.raises(ValueError, match="^ttl "):
                    lease.extend(bad)
            assert ttl_in_locks(a) == 2500
        with a.lock(res, ttl=datetime.timedelta(minutes=1), wait="0s") as lease:
            assert lease.ttl == 60000 and ttl_in_locks(a) == 60000
        with a.lock(res, ttl="700") as lease:
            assert lease.ttl == 700
        for kw, name in (({"ttl": "5 s"}, "ttl"), ({"wait": "2x"}, "wait"),
                         ({"ttl": "4294968s"}, "ttl")):
            with pytest.raises(ValueError, match=f"^{name} "):
                a.lock(res, **kw)
        assert a.status(res)["held"] is False
        assert a.ping("still") == "still"
    with redlockd.Client(shared.server, detach_ms="10s") as c:
        assert c.detach_ms == 10000 and c.detachable
    with pytest.raises(ValueError, match="^detach_ms "):
        redlockd.Client(shared.server, detach_ms="10 s")


def test_inspection(shared, res):
    with redlockd.Client(shared.server, name="inspector") as c:
        with c.lock(res) as lease:
            locks = c.locks()
            assert locks["session"] == c.session
            entry = [e for e in locks["locks"] if e["resource"] == res][0]
            assert entry["fence"] == lease.fence
            st = c.status(res)
            assert st["resource"] == res and st["key"] == "lock:" + res
            assert st["nodes"][0]["pttl"] > 0
            sessions = c.sessions()["sessions"]
            mine = [s for s in sessions if s["id"] == c.session][0]
            assert mine["name"] == "inspector" and mine["locks"] == 1
            stats = c.stats()
            assert stats["locks_held"] >= 1
            assert stats["acquisitions"]["ok"] >= 1


def test_lost_by_expiry_between_replies(shared, res):
    """EVENT LOST arrives while requests and replies go back and forth: it
    is routed to the lease, and no reply is taken for it or lost."""
    with redlockd.Client(shared.server) as c:
        lease = c.lock(res, ttl=300, renew=False)
        end = time.monotonic() + 3
        n = 0
        while lease.lost_reason != "expired" and time.monotonic() < end:
            assert c.ping(f"p{n}") == f"p{n}"
            n += 1
        assert lease.lost and lease.lost_reason == "expired"
        with pytest.raises(redlockd.LockLost) as ei:
            lease.check()
        assert ei.value.resource == res and ei.value.reason == "expired"
        assert c.locks()["lost"] == [res]
        with pytest.raises(redlockd.Lost) as ei:
            lease.release()
        assert ei.value.code == "LOST" and isinstance(ei.value, redlockd.LockLost)
        assert lease.released


def test_with_block_raises_lock_lost(shared, res):
    with redlockd.Client(shared.server) as c:
        with pytest.raises(redlockd.LockLost):
            with c.lock(res, ttl=200, renew=False) as lease:
                assert wait_until(lambda: lease.lost, 3)
        assert c.locks()["locks"] == []
