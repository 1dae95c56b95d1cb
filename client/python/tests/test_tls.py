"""The client over tls:// against the daemon's TLS listener, with a PKI
made by tests/tools/mkcerts.sh (its header lists the files) for the run.

Each failure is checked for the reason its message names: an unknown CA, a
name mismatch, an expired certificate, a client certificate the daemon
requires, a plain port, a plain client on the TLS port (the daemon's own
line); and failover between two tls:// daemons."""

import os
import ssl
import subprocess

import pytest

import redlockd

MKCERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                       "..", "..", "..", "tests", "tools", "mkcerts.sh")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not os.path.exists(MKCERTS):
        pytest.skip("tests/tools/mkcerts.sh is not in this checkout")
    d = tmp_path_factory.mktemp("certs")
    subprocess.run([MKCERTS, str(d)], check=True)
    return lambda name: str(d / name)


@pytest.fixture(autouse=True)
def no_tls_env(monkeypatch):
    for var in ("REDLOCKD_TLS_CA", "REDLOCKD_TLS_CERT", "REDLOCKD_TLS_KEY"):
        monkeypatch.delenv(var, raising=False)


def tls_daemon(h, certs, name="server", nodes=None, **tls):
    conf = {"cert_file": certs(name + ".crt"), "key_file": certs(name + ".key")}
    conf.update(tls)
    if nodes is None:
        nodes = h.redis(1)
    return h.daemon(nodes, {"tls": conf, "shutdown_timeout_ms": 300})


def connect_fails(server, match, **kw):
    with pytest.raises(redlockd.TransportError, match=match) as e:
        redlockd.Client(server, timeout=3.0, **kw)
    print(e.value)


def test_lock_unlock(h, certs, res, monkeypatch):
    d = tls_daemon(h, certs)
    with redlockd.Client(d.tls_server, name="py-tls",
                         tls_ca_file=certs("ca.crt")) as c, \
            redlockd.Client(d.server, name="plain") as other:
        assert c.server == d.tls_server
        with c.lock(res, ttl=10000) as lease:
            assert lease.fence > 0
            with pytest.raises(redlockd.Busy):
                other.lock(res)
            c.ping()
            assert res in str(c.locks())
        other.lock(res).release()
    # By name, the CA from the environment.
    monkeypatch.setenv("REDLOCKD_TLS_CA", certs("ca.crt"))
    with redlockd.Client(f"tls://localhost:{d.tls_port}") as c:
        c.lock(res).release()
    # A context of one's own.
    ctx = ssl.create_default_context(cafile=certs("ca.crt"))
    with redlockd.Client(d.tls_server, tls_context=ctx) as c:
        c.lock(res).release()


def test_unknown_ca(h, certs):
    d = tls_daemon(h, certs)
    connect_fails(d.tls_server, "unknown CA", tls_ca_file=certs("other-ca.crt"))
    d2 = tls_daemon(h, certs, "other")
    connect_fails(d2.tls_server, "unknown CA", tls_ca_file=certs("ca.crt"))


def test_wrong_name(h, certs, res):
    d = tls_daemon(h, certs, "wrongname")
    connect_fails(d.tls_server, "name mismatch.*127.0.0.1",
                  tls_ca_file=certs("ca.crt"))
    connect_fails(f"tls://localhost:{d.tls_port}", "name mismatch",
                  tls_ca_file=certs("ca.crt"))
    with redlockd.Client(d.tls_server, tls_ca_file=certs("ca.crt"),
                         tls_server_name="elsewhere.test") as c:
        c.lock(res).release()


def test_expired(h, certs):
    d = tls_daemon(h, certs, "expired")
    connect_fails(d.tls_server, "expired", tls_ca_file=certs("ca.crt"))


def test_client_certificate(h, certs, res):
    d = tls_daemon(h, certs, ca_file=certs("ca.crt"), verify_clients=True)
    connect_fails(d.tls_server, "requires a client certificate",
                  tls_ca_file=certs("ca.crt"))
    connect_fails(d.tls_server, "refused our client certificate",
                  tls_ca_file=certs("ca.crt"), tls_cert_file=certs("other.crt"),
                  tls_key_file=certs("other.key"))
    with redlockd.Client(d.tls_server, tls_ca_file=certs("ca.crt"),
                         tls_cert_file=certs("client.crt"),
                         tls_key_file=certs("client.key")) as c:
        c.lock(res).release()


def test_plain_port(h, certs):
    d = tls_daemon(h, certs)
    connect_fails(f"tls://127.0.0.1:{d.port}", "does not speak TLS",
                  tls_ca_file=certs("ca.crt"))


def test_plain_client_on_tls_port(h, certs):
    """The daemon answers a plain client on its TLS port with ``ERR ARG
    this port speaks TLS: ...`` and closes: that is the error raised,
    whether the HELLO asked for detach= (and a plain HELLO would follow)
    or not."""
    d = tls_daemon(h, certs)
    plain = f"127.0.0.1:{d.tls_port}"
    for kw in ({}, {"reconnect": False}):
        with pytest.raises(redlockd.Arg, match="this port speaks TLS") as e:
            redlockd.Client(plain, timeout=3.0, **kw)
        assert e.value.code == "ARG"
        assert "tls://" in e.value.message
        print(repr(e.value))
    # First in a list: the mistake is shown, not skipped for the next.
    with pytest.raises(redlockd.Arg, match="this port speaks TLS"):
        redlockd.Client(servers=[plain, d.server], timeout=3.0)


def test_bad_files(certs):
    with pytest.raises(ValueError, match="tls_ca_file /nonexistent"):
        redlockd.Client("tls://127.0.0.1:1", tls_ca_file="/nonexistent/ca.crt")
    with pytest.raises(ValueError, match="tls_ca_file"):
        redlockd.Client("tls://127.0.0.1:1", tls_ca_file=certs("bad.crt"))
    with pytest.raises(ValueError, match="tls_cert_file"):
        redlockd.Client("tls://127.0.0.1:1", tls_ca_file=certs("ca.crt"),
                        tls_cert_file=certs("client.crt"),
                        tls_key_file=certs("other.key"))
    with pytest.raises(ValueError, match="without tls_cert_file"):
        redlockd.Client("tls://127.0.0.1:1", tls_key_file=certs("client.key"))


def test_failover(h, certs, res):
    nodes = h.redis(3)
    d1 = tls_daemon(h, certs, nodes=nodes)
    d2 = tls_daemon(h, certs, nodes=nodes)
    with redlockd.Client(servers=[d1.tls_server, d2.tls_server],
                         tls_ca_file=certs("ca.crt")) as c:
        lease = c.lock(res, ttl=30000)
        fence, token = lease.fence, lease.token
        d1.kill()
        c.reconnect()
        assert c.server == d2.tls_server
        assert lease.state == "held"
        assert lease.fence == fence and lease.token != token
        lease.release()
    # The first server down: the second answers.
    with redlockd.Client(servers=[d1.tls_server, d2.tls_server],
                         tls_ca_file=certs("ca.crt")) as c:
        assert c.server == d2.tls_server
        c.lock(res).release()
