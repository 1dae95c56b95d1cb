"""Users of auth.users: ``Client(user=, password=)`` logs in as one, and
what lies outside its prefixes raises :class:`redlockd.Denied`."""

import pytest

import redlockd

USERS = {"auth": {"users": [
    {"name": "alice", "password": "alice-pw", "prefixes": ["invoice:"]},
    {"name": "ops", "password": "ops-pw", "prefixes": ["invoice:"],
     "admin": True},
]}}


def test_user_prefixes(h):
    _, d = h.cluster(1, USERS)
    with redlockd.Client(d.server, user="alice", password="alice-pw") as c:
        with c.lock("invoice:1") as lease:
            assert lease.fence > 0
            assert c.status("invoice:1")["held"] is True
        with pytest.raises(redlockd.Denied) as ei:
            c.lock("job:1")
        assert ei.value.code == "DENIED"
        assert "alice" in ei.value.message
        with pytest.raises(redlockd.Denied):
            c.status("job:1")
        with pytest.raises(redlockd.Denied):   # not an admin
            c.force_unlock("invoice:1")
    # An admin user forces a release within its prefixes only.
    with redlockd.Client(d.server, user="alice", password="alice-pw") as a, \
            redlockd.Client(d.server, user="ops", password="ops-pw") as op:
        a.lock("invoice:2")
        assert int(op.force_unlock("invoice:2")["nodes"]) == 1
        with pytest.raises(redlockd.Denied):
            op.force_unlock("job:2")


def test_user_login_errors(h):
    _, d = h.cluster(1, USERS)
    # A wrong password and an unknown name are the same ERR AUTH.
    msgs = []
    for user, pw in (("alice", "wrong"), ("nobody", "alice-pw")):
        with pytest.raises(redlockd.Auth) as ei:
            redlockd.Client(d.server, user=user, password=pw)
        msgs.append(ei.value.message)
    assert msgs[0] == msgs[1]
    # Without a login nothing but the handshake commands work.
    with redlockd.Client(d.server) as c:
        with pytest.raises(redlockd.NoAuth):
            c.lock("invoice:3")
        c.auth("alice-pw", user="alice")
        c.lock("invoice:3").release()
    with pytest.raises(ValueError):
        redlockd.Client(d.server, user="alice")          # no password
    with pytest.raises(ValueError):
        redlockd.Client(d.server, user="a b", password="x")
