"""Every ERR code that can be provoked, and the transport errors.

LOST is in test_locks.py, UNAVAILABLE and SHUTDOWN in test_faults.py."""

import socket
import threading
import time

import pytest

import redlockd
from harness import free_port, wait_until


def test_arg(shared, res):
    with redlockd.Client(shared.server) as c:
        with pytest.raises(redlockd.Arg) as ei:
            c.lock(res, ttl=50)             # below locks.min_ttl_ms
        assert ei.value.code == "ARG" and ei.value.message
        assert not isinstance(ei.value, redlockd.Unsupported)
        with pytest.raises(redlockd.Arg):
            c.lock("r" * 201)               # above locks.max_resource_len
        with pytest.raises(redlockd.Arg):
            c.lock("caf\u00e9")             # not visible ASCII
        with pytest.raises(redlockd.Arg):
            c.command("LOCK", res, "TTL=5")
        # Words that would change the request are refused before sending.
        with pytest.raises(ValueError):
            c.lock("two words")
        with pytest.raises(TypeError):
            c.lock(res, ttl=1.5)
        assert c.ping("still") == "still"


def test_unknown(shared):
    with redlockd.Client(shared.server) as c:
        with pytest.raises(redlockd.Unknown) as ei:
            c.command("FROB", "x")
        assert ei.value.code == "UNKNOWN"


def test_toolong_closes_the_connection(shared, res):
    with redlockd.Client(shared.server, reconnect=False) as c:
        lease = c.lock(res)
        with pytest.raises(redlockd.TooLong):
            c.command("PING", "x" * 5000)
        assert wait_until(lambda: c.closed, 3)
        assert lease.lost and lease.lost_reason == "closed"
        with pytest.raises(redlockd.ConnectionClosed):
            c.ping()


def test_busy_timeout_held_notheld(shared, res):
    with redlockd.Client(shared.server) as a, redlockd.Client(shared.server) as b:
        with a.lock(res):
            with pytest.raises(redlockd.Held) as ei:
                a.lock(res)
            assert ei.value.code == "HELD"
            with pytest.raises(redlockd.Busy) as ei:
                b.lock(res)
            assert ei.value.code == "BUSY"
            t0 = time.monotonic()
            with pytest.raises(redlockd.Timeout) as ei:
                b.lock(res, wait=200)
            assert ei.value.code == "TIMEOUT"
            assert 0.18 <= time.monotonic() - t0 < 3
            with pytest.raises(redlockd.NotHeld) as ei:
                b.unlock(res)               # not b's lock
            assert ei.value.code == "NOTHELD"
        with pytest.raises(redlockd.NotHeld):
            a.unlock(res + ":never")


def test_waiter_gets_the_lock_on_release(shared, res):
    with redlockd.Client(shared.server) as a, redlockd.Client(shared.server) as b:
        lease = a.lock(res)
        t0 = time.monotonic()
        threading.Timer(0.2, lease.release).start()
        with b.lock(res, wait=5000) as got:
            assert got.fence > lease.fence
        assert 0.15 < time.monotonic() - t0 < 3


def test_noauth_and_auth(h, res):
    _, d = h.cluster(1, {"auth": {"password": "s3cret"}})
    with redlockd.Client(d.server) as c:
        assert c.ping() == ""               # allowed before AUTH
        with pytest.raises(redlockd.NoAuth) as ei:
            c.lock(res)
        assert ei.value.code == "NOAUTH"
    with pytest.raises(redlockd.Auth) as ei:
        redlockd.Client(d.server, password="wrong")
    assert ei.value.code == "AUTH"
    with redlockd.Client(d.server, password="s3cret") as c:
        c.lock(res).release()


def test_limit(h, res):
    _, d = h.cluster(1, {"limits": {"max_locks_per_session": 1}})
    with redlockd.Client(d.server) as c:
        c.lock(res + ":1")
        with pytest.raises(redlockd.Limit) as ei:
            c.lock(res + ":2")
        assert ei.value.code == "LIMIT"


def test_transport_errors():
    port = free_port()                      # nothing listens there
    with pytest.raises(redlockd.TransportError) as ei:
        redlockd.Client(f"127.0.0.1:{port}", timeout=2)
    assert not isinstance(ei.value, redlockd.RedlockdError)
    with pytest.raises(redlockd.TransportError):
        redlockd.Client("unix:/nonexistent/redlockd.sock", timeout=2)


def test_protocol_error_from_a_non_daemon():
    """A peer that answers with something that is not the protocol."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    port = srv.getsockname()[1]

    def serve():
        conn, _ = srv.accept()
        conn.recv(100)
        conn.sendall(b"+PONG\r\n")
        time.sleep(0.5)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(redlockd.TransportError):
            redlockd.Client(f"127.0.0.1:{port}", timeout=2)
    finally:
        t.join(3)
        srv.close()
