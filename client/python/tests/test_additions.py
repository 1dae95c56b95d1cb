"""The protocol's additions: shared locks, semaphores, several resources,
FORCEUNLOCK, HELP <command>, EVENT CLOSING.

A daemon that does not know an addition answers ERR ARG (the client raises
Unsupported), ERR UNKNOWN, or refuses the config key; then the test is
skipped, so these tests turn on by themselves once the daemon has them."""

import pytest

import redlockd
import harness
from harness import wait_until


def _or_skip(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except redlockd.Unsupported as e:
        pytest.skip(f"daemon does not support {e.feature}: {e.message}")


def test_shared_mode(shared, res):
    with redlockd.Client(shared.server) as a, \
            redlockd.Client(shared.server) as b, \
            redlockd.Client(shared.server) as c:
        la = _or_skip(a.lock, res, mode="shared")
        lb = b.lock(res, mode="shared")
        assert la.mode == lb.mode == "shared"
        assert la.fence != lb.fence
        with pytest.raises(redlockd.Busy):
            c.lock(res)
        with pytest.raises(redlockd.Busy):
            c.lock(res, mode="exclusive")
        assert {e["resource"] for e in a.locks()["locks"]} == {res}
        la.release()
        lb.release()
        with c.lock(res, mode="exclusive", wait=2000) as lx:
            assert lx.mode == "exclusive"
            assert lx.fence > max(la.fence, lb.fence)
            with pytest.raises(redlockd.Busy):
                a.lock(res, mode="shared")


def test_semaphore(shared, res):
    with redlockd.Client(shared.server) as a, \
            redlockd.Client(shared.server) as b, \
            redlockd.Client(shared.server) as c:
        la = _or_skip(a.lock, res, limit=2)
        lb = b.lock(res, limit=2)
        assert la.limit == lb.limit == 2
        assert {la.slot, lb.slot} == {0, 1}
        with pytest.raises(redlockd.Busy):
            c.lock(res, limit=2)
        with pytest.raises(redlockd.Arg):
            c.lock(res, limit=3)            # every holder must use the same K
        lb.release()
        with c.lock(res, limit=2, wait=2000) as lc:
            assert lc.slot == lb.slot
        la.release()


def test_several_resources(shared, res):
    r1, r2 = res + ":1", res + ":2"
    with redlockd.Client(shared.server) as a, redlockd.Client(shared.server) as b:
        lease = _or_skip(a.lock, [r1, r2], ttl=5000)
        assert lease.resources == (r1, r2) and lease.resource == r1
        assert len(lease.token) == 32
        with pytest.raises(redlockd.Busy):
            b.lock(r2)
        with pytest.raises(redlockd.Held):
            a.lock([r2, res + ":3"])
        with pytest.raises(redlockd.Arg):
            b.lock([res + ":4", res + ":4"])
        assert {e["resource"] for e in a.locks()["locks"]} == {r1, r2}
        assert not lease.lost
        assert lease.extend(8000) > 0
        lease.release()
        assert a.locks()["locks"] == []
        with b.lock([r2, r1]) as other:     # the other order: no deadlock
            assert other.fence > lease.fence


def test_force_unlock(h, res):
    try:
        _, d = h.cluster(1, {"auth": {"admin_password": "adm1n"}})
    except harness.StartError as e:
        if "admin_password" in str(e):
            pytest.skip("daemon does not know auth.admin_password")
        raise
    with redlockd.Client(d.server) as holder, \
            redlockd.Client(d.server) as op, \
            redlockd.Client(d.server) as admin:
        lease = holder.lock(res, ttl=1000)
        try:
            op.force_unlock(res)
        except redlockd.Unknown:
            pytest.skip("daemon does not know FORCEUNLOCK")
        except redlockd.NoAuth:
            pass
        else:
            raise AssertionError("FORCEUNLOCK without the admin password worked")
        admin.auth("adm1n")
        assert int(admin.force_unlock(res)["nodes"]) == 1
        assert wait_until(lambda: lease.lost_reason == "node", 3), lease.lost_reason
        admin.lock(res).release()


def test_help_for_one_command(shared):
    with redlockd.Client(shared.server) as c:
        usage = _or_skip(c.help, "LOCK")
        assert usage.startswith("LOCK ")
        assert "ttl=" in usage and "wait=" in usage


def test_event_closing(h, res):
    """Without reconnection the daemon's close is the end of the Client
    (with it, test_failover.py: the session is resumed)."""
    _, d = h.cluster(1, {"limits": {"idle_timeout_ms": 300}})
    c = redlockd.Client(d.server, reconnect=False)
    try:
        lease = c.lock(res, ttl=60000)      # no refresh within 300 ms
        assert wait_until(lambda: c.closed, 3), "idle connection not closed"
        assert lease.lost and lease.lost_reason == "closed"
        with pytest.raises(redlockd.ConnectionClosed) as ei:
            c.ping()
        if c.close_reason is None:
            pytest.skip("daemon closes without EVENT CLOSING")
        assert c.close_reason == "idle"
        assert ei.value.reason == "idle"
    finally:
        c.close()
