"""Faults: nodes stopped, the daemon paused or stopping."""

import threading
import time

import pytest

import redlockd
from harness import wait_until

FAST_NODES = {"redis": {"command_timeout_ms": 100, "reconnect_max_ms": 200}}


def test_lost_when_two_of_three_nodes_stop(h, res):
    nodes, d = h.cluster(3, FAST_NODES)
    with redlockd.Client(d.server) as a, redlockd.Client(d.server) as b:
        assert (a.nodes, a.quorum) == (3, 2)
        lease = a.lock(res, ttl=2000)
        assert wait_until(lambda: a.locks()["locks"][0]["renewals"] >= 1, 3)
        nodes[1].pause()
        nodes[2].pause()
        t_pause = time.monotonic()
        try:
            # .lost turns True by itself: the reader thread routes the event.
            assert wait_until(lambda: lease.lost, 5), "not lost in 5 s"
            assert time.monotonic() - t_pause <= 2.5
            assert wait_until(
                lambda: lease.lost_reason in ("quorum", "node"), 3), \
                f"no EVENT LOST, reason {lease.lost_reason}"
            with pytest.raises(redlockd.LockLost) as ei:
                lease.check()
            assert ei.value.reason in ("quorum", "node")
            with pytest.raises(redlockd.Lost):
                lease.release()
            # No quorum: nobody can have it. BUSY is tolerated for a moment
            # while the daemon's own release of the lost keys is in flight.
            def unavailable():
                try:
                    b.lock(res).release()
                except redlockd.Busy:
                    return False
                except redlockd.Unavailable as e:
                    return e
                raise AssertionError("locked with two of three nodes stopped")
            e = wait_until(unavailable, 3, interval=0.05)
            assert e and e.code == "UNAVAILABLE"
        finally:
            nodes[1].resume()
            nodes[2].resume()
        # Back to a quorum: the lock can be had again.
        def free():
            try:
                b.lock(res).release()
                return True
            except (redlockd.Unavailable, redlockd.Busy):
                return False
        assert wait_until(free, 5, interval=0.1)


def test_deadline_passes_while_the_daemon_is_paused(h, res):
    _, d = h.cluster(1)
    with redlockd.Client(d.server, timeout=10) as c, \
            redlockd.Client(d.server, timeout=0.3,
                            reconnect=False) as impatient:
        lease = c.lock(res, ttl=1000)
        d.pause()
        try:
            t_pause = time.monotonic()
            # Nothing can confirm the lease now; it must count as lost as
            # soon as its deadline passes, and not before.
            while not lease.lost and time.monotonic() < t_pause + 3:
                time.sleep(0.005)
            seen = time.monotonic()
            assert lease.lost, "lease not lost 3 s after the daemon paused"
            assert lease.lost_reason == "deadline"
            assert lease.deadline - 0.01 <= seen <= lease.deadline + 0.5
            assert seen - t_pause <= 1.5
            assert lease.remaining == 0.0
            with pytest.raises(redlockd.LockLost):
                lease.check()
            # A client with a short timeout gets IOTimeout and is closed.
            with pytest.raises(redlockd.IOTimeout):
                impatient.ping()
            assert impatient.closed
        finally:
            d.resume()
        # A reply that comes after the deadline does not revive it, and
        # leaving the with-block says the lease was lost.
        c.ping()
        assert lease.lost
        with pytest.raises(redlockd.LockLost):
            with lease:
                pass
        assert lease.released


def test_unavailable_when_the_only_node_stops(h, res):
    nodes, d = h.cluster(1, FAST_NODES)
    nodes[0].stop()
    with redlockd.Client(d.server) as c:
        with pytest.raises(redlockd.Unavailable) as ei:
            c.lock(res)
        assert ei.value.code == "UNAVAILABLE"


def test_shutdown(h, res):
    """EVENT SHUTDOWN marks the leases lost; a waiting LOCK cut short by
    the shutdown is answered ERR SHUTDOWN (an addition of the protocol).
    The daemon leaves the held lease to expire and closes the session once
    shutdown_timeout_ms has passed. (reconnect=False: the Client ends with
    the connection; with reconnection, test_failover.py.)"""
    _, d = h.cluster(1)
    a = redlockd.Client(d.server, reconnect=False)
    b = redlockd.Client(d.server, reconnect=False)
    try:
        lease = a.lock(res)
        out = []

        def waiter():
            try:
                out.append(b.lock(res, wait=10000))
            except redlockd.Error as e:
                out.append(e)

        t = threading.Thread(target=waiter)
        t.start()
        assert wait_until(lambda: a.status(res)["waiters"] == 1, 3)
        d.terminate()
        t.join(10)
        assert not t.is_alive()
        assert wait_until(lambda: a.closed, 5)
        assert a.shutting_down and lease.lost
        assert lease.lost_reason == "shutdown"
        assert a.close_reason in ("shutdown",)
        with pytest.raises(redlockd.ConnectionClosed):
            a.ping()
        assert d.wait(10) == 0
        if isinstance(out[0], redlockd.ConnectionClosed):
            pytest.skip("this daemon closes a waiting LOCK without ERR SHUTDOWN")
        assert isinstance(out[0], redlockd.Shutdown), out
        assert out[0].code == "SHUTDOWN"
    finally:
        a.close()
        b.close()
