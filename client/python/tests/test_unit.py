"""Pure parts: addresses, replies, durations, the exception classes. No
processes."""

import datetime
import re

import pytest

import redlockd
from redlockd import _proto


@pytest.mark.parametrize("text,want", [
    ("127.0.0.1:7390", ("tcp", "127.0.0.1", 7390)),
    ("tcp://10.0.0.1:1", ("tcp", "10.0.0.1", 1)),
    ("localhost", ("tcp", "localhost", 7390)),
    ("redlock.internal:7391", ("tcp", "redlock.internal", 7391)),
    ("[::1]:7390", ("tcp", "::1", 7390)),
    ("[::1]", ("tcp", "::1", 7390)),
    ("unix:/run/redlockd/redlockd.sock", ("unix", "/run/redlockd/redlockd.sock")),
    ("unix:///run/r.sock", ("unix", "/run/r.sock")),
    ("unix:rel.sock", ("unix", "rel.sock")),
    ("/run/r.sock", ("unix", "/run/r.sock")),
    ("tls://127.0.0.1:7391", ("tls", "127.0.0.1", 7391)),
    ("tls://locks.example.com", ("tls", "locks.example.com", 7390)),
    ("tls://[::1]:1", ("tls", "::1", 1)),
])
def test_server_addresses(text, want):
    assert _proto.parse_server(text) == want


@pytest.mark.parametrize("text", [
    "", "http://x:1", "1.2.3:7390", "::1:7390", "[nothost]:1", "host:0",
    "host:65536", "host:12a", "host:", "unix:", "a b:1", "h\n:1", "unix://x/p",
    "tls://", "tls://tcp://x:1", "TLS://x:1", "tls://x:0",
])
def test_bad_server_addresses(text):
    with pytest.raises(ValueError):
        _proto.parse_server(text)


def test_env_server_is_used_when_none_given(monkeypatch):
    monkeypatch.setenv("REDLOCKD_SERVER", "256.1.1.1:1")
    with pytest.raises(ValueError, match="256.1.1.1"):
        redlockd.Client()


@pytest.mark.parametrize("code,cls", [
    ("ARG", redlockd.Arg), ("UNKNOWN", redlockd.Unknown),
    ("TOOLONG", redlockd.TooLong), ("NOAUTH", redlockd.NoAuth),
    ("AUTH", redlockd.Auth), ("BUSY", redlockd.Busy),
    ("TIMEOUT", redlockd.Timeout), ("HELD", redlockd.Held),
    ("NOTHELD", redlockd.NotHeld), ("LOST", redlockd.Lost),
    ("UNAVAILABLE", redlockd.Unavailable), ("LIMIT", redlockd.Limit),
    ("SHUTDOWN", redlockd.Shutdown),
])
def test_error_codes_map_to_classes(code, cls):
    with pytest.raises(cls) as ei:
        _proto.split_reply(f"ERR {code} some words here")
    e = ei.value
    assert isinstance(e, redlockd.RedlockdError)
    assert isinstance(e, redlockd.Error)
    assert not isinstance(e, redlockd.TransportError)
    assert e.code == code
    assert e.message == "some words here"


def test_unknown_code_is_the_base_class():
    with pytest.raises(redlockd.RedlockdError) as ei:
        _proto.split_reply("ERR FROBBED newer daemon")
    assert type(ei.value) is redlockd.RedlockdError
    assert ei.value.code == "FROBBED"


def test_hierarchy():
    assert issubclass(redlockd.Lost, redlockd.LockLost)
    assert issubclass(redlockd.Unsupported, redlockd.Arg)
    for cls in (redlockd.ConnectionClosed, redlockd.IOTimeout,
                redlockd.ProtocolError):
        assert issubclass(cls, redlockd.TransportError)
        assert not issubclass(cls, redlockd.RedlockdError)
    assert not issubclass(redlockd.LockLost, redlockd.RedlockdError)


def test_reply_parsing():
    assert _proto.split_reply("OK") == ("OK", "")
    assert _proto.split_reply("PONG hi") == ("PONG", "hi")
    f = _proto.fields("resource=a token=ff fence=3 ttl=10 validity=9 mode=shared")
    assert f["mode"] == "shared" and f["fence"] == "3"
    assert _proto.json_body('{"a":1}') == {"a": 1}
    with pytest.raises(redlockd.ProtocolError):
        _proto.split_reply("WHAT")
    with pytest.raises(redlockd.ProtocolError):
        _proto.json_body("{bad")
    assert _proto.event("EVENT LOST resource=a fence=2 reason=node") == \
        ("LOST", {"resource": "a", "fence": "2", "reason": "node"})
    assert _proto.event("EVENT SHUTDOWN") == ("SHUTDOWN", {})


@pytest.mark.parametrize("bad", ["", "a b", "a\tb", "a=b", "a\nb", "a\x00"])
def test_request_words_that_would_break_the_line(bad):
    with pytest.raises(ValueError):
        _proto.word(bad, "resource name")


@pytest.mark.parametrize("line,want", [
    ("LOCK a b ttl=100 wait=5", ("a", "b")),
    ("lock a", ("a",)),
    ("UNLOCK a b", ("a", "b")),
    ("ADOPT a b token=00 ttl=1", ("a", "b")),
    ("EXTEND a ttl=100", ("a",)),
    ("STATUS a", ("a",)),
    ("FORCEUNLOCK a", ("a",)),
    ("PING a", ()),
    ("LOCKS", ()),
    ("", ()),
])
def test_resources_named(line, want):
    """What a request's turn in the client is taken on (the daemon's own
    per-resource order)."""
    assert _proto.resources_named(line) == want


# Durations: ttl=, wait=, extend()'s ttl and detach_ms take what the daemon
# and redlockctl take (docs/protocol.md, "Numbers"), and timedelta.
@pytest.mark.parametrize("value,want", [
    (0, 0), (500, 500), (30000, 30000),
    ("0", 0), ("30000", 30000), ("007", 7), ("4294967295", 4294967295),
    ("30s", 30000), ("0.5m", 30000), ("500ms", 500), ("0.5s", 500),
    ("1.5s", 1500), ("2m", 120000), ("1h", 3600000), ("0s", 0),
    ("4294967s", 4294967000), ("0.001s", 1), ("1.000000000s", 1000),
    (datetime.timedelta(seconds=1.5), 1500),
    (datetime.timedelta(minutes=2), 120000),
    (datetime.timedelta(0), 0),
    (datetime.timedelta(microseconds=2000), 2),
])
def test_durations(value, want):
    got = _proto.duration_ms(value, "ttl")
    assert got == want and type(got) is int
    assert _proto.millis(value, "ttl") == str(want)


@pytest.mark.parametrize("text,why", [
    ("-5s", "has a sign"), ("+1", "has a sign"),
    ("5d", "unknown unit"), ("5S", "unknown unit"), ("5sec", "unknown unit"),
    ("1m30s", "unknown unit"), ("1e3", "unknown unit"),
    ("0x10", "unknown unit"), ("5 s", "unknown unit"),
    ("", "has no number"), ("s", "has no number"), (".5s", "has no number"),
    (" 5s", "has no number"), ("\u0665s", "has no number"),
    ("1.5", "is not a number"), ("1.", "is not a number"),
    ("1..5s", "is not a number"), ("1.0000000001s", "is not a number"),
    ("1.5ms", "not a whole number of milliseconds"),
    ("0.0001s", "not a whole number of milliseconds"),
    ("4294968s", "more than 4294967295 ms"),
    ("1194h", "more than 4294967295 ms"),
    ("00000000001", "more than 4294967295 ms"),
    ("4294967296", "more than 4294967295 ms"),
])
def test_bad_duration_strings(text, why):
    with pytest.raises(ValueError, match=r"^wait .*" + re.escape(why)) as e:
        _proto.duration_ms(text, "wait")
    assert repr(text) in str(e.value)


def test_bad_durations():
    with pytest.raises(ValueError, match="^ttl .*negative"):
        _proto.duration_ms(-1, "ttl")
    with pytest.raises(ValueError, match="^ttl .*negative"):
        _proto.duration_ms(datetime.timedelta(seconds=-1), "ttl")
    with pytest.raises(ValueError, match="^ttl .*whole number of milli"):
        _proto.duration_ms(datetime.timedelta(microseconds=1500), "ttl")
    for bad in (1.5, True, None, b"5s", [5]):
        with pytest.raises(TypeError, match="^ttl must be"):
            _proto.duration_ms(bad, "ttl")
