"""Pure helpers for the redlockd line protocol: addresses, request words,
reply lines. No sockets here."""

import datetime
import ipaddress
import json
import re

from . import errors

DEFAULT_PORT = 7390
DEFAULT_SERVER = "127.0.0.1:7390"

_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")
_PORT = re.compile(r"^[0-9]{1,5}$")


def parse_server(text):
    """``("unix", path)``, ``("tcp", host, port)`` or ``("tls", host,
    port)`` for an address in the grammar of redlockd's clients:
    ``HOST:PORT``, ``tcp://HOST:PORT``, ``tls://HOST:PORT`` (TLS),
    ``[IPV6]:PORT`` (also after either scheme), ``HOST`` alone (port
    7390), ``unix:/PATH``, ``unix:///PATH`` or a bare ``/PATH``.
    ValueError otherwise."""
    if not isinstance(text, str) or not text:
        raise ValueError("empty server address")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in text):
        raise ValueError(f"control character in server address {text!r}")
    if text.startswith("unix:"):
        path = text[5:]
        if path.startswith("//"):
            path = path[2:]
            if not path.startswith("/"):
                raise ValueError(f"bad unix socket address {text!r}")
        if not path:
            raise ValueError(f"empty unix socket path in {text!r}")
        return ("unix", path)
    if text.startswith("/"):
        return ("unix", text)
    kind = "tcp"
    if text.startswith("tcp://"):
        text = text[6:]
    elif text.startswith("tls://"):
        kind = "tls"
        text = text[6:]
    if "://" in text:
        raise ValueError(f"unsupported address scheme in {text!r}")
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise ValueError(f"unterminated [ in {text!r}")
        host, rest = text[1:end], text[end + 1:]
        try:
            ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            raise ValueError(f"not an IPv6 address in brackets: {text!r}") from None
        if rest and not rest.startswith(":"):
            raise ValueError(f"bad address {text!r}")
        port = rest[1:] if rest else None
    else:
        host, sep, port = text.rpartition(":")
        if not sep:
            host, port = text, None
        if ":" in host:
            raise ValueError(f"IPv6 addresses need brackets: {text!r}")
        if not _HOST_NAME.match(host):
            raise ValueError(f"bad host in {text!r}")
        if re.fullmatch(r"[0-9.]+", host):
            try:
                ipaddress.IPv4Address(host)
            except ValueError:
                raise ValueError(f"bad IPv4 address in {text!r}") from None
    if port is None:
        return (kind, host, DEFAULT_PORT)
    if not _PORT.match(port) or not 1 <= int(port) <= 65535:
        raise ValueError(f"bad port in {text!r}")
    return (kind, host, int(port))


def word(value, what):
    """A request word: non-empty, no space, control byte or '='."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__}")
    if not value:
        raise ValueError(f"empty {what}")
    for c in value:
        if c in " \t=" or ord(c) < 0x20 or ord(c) == 0x7F:
            raise ValueError(f"{what} {value!r} contains {c!r}, which the "
                             "line protocol cannot carry")
    return value


# A holder's value (LOCK/EXTEND value=): the most any daemon's
# locks.max_value_len allows, and its default.
VALUE_MAX = 4096
VALUE_DEFAULT_MAX = 256


def value_word(text):
    """A holder's value: 1 to VALUE_MAX visible ASCII characters ('=' too:
    the daemon reads up to the first); the daemon checks its own
    locks.max_value_len."""
    if not isinstance(text, str):
        raise TypeError(f"a value must be a str, not {type(text).__name__}")
    if not 1 <= len(text) <= VALUE_MAX or any(
            not 0x21 <= ord(c) <= 0x7E for c in text):
        raise ValueError(f"a value is 1 to {VALUE_DEFAULT_MAX} visible ASCII "
                         "characters (the daemon's locks.max_value_len), no "
                         f"spaces: {text!r}")
    return text


# Durations (docs/protocol.md, "Numbers"; proto/num.c
# proto_parse_duration): a bare number is milliseconds, or a number with
# a unit, an optional fraction of at most 9 digits; whole milliseconds, at
# most DURATION_MAX_MS.
DURATION_MAX_MS = 4294967295
_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60 * 1000, "h": 60 * 60 * 1000}
_DIGITS = "0123456789"      # ASCII only: str.isdigit() takes other scripts'


def _digits(text, i):
    while i < len(text) and text[i] in _DIGITS:
        i += 1
    return i


def _parse_duration(text):
    """Milliseconds, or what is wrong with `text` (the daemon's words, in
    the same order of checks)."""
    if not text:
        return "has no number"
    if text[0] in "+-":
        return "has a sign (durations are never negative)"
    i = _digits(text, 0)
    whole, frac = text[:i], ""
    if i < len(text) and text[i] == ".":
        j = _digits(text, i + 1)
        frac = text[i + 1:j]
        if not 1 <= len(frac) <= 9:
            return "has no number" if not whole else \
                "is not a number (a fraction needs a unit)"
        i = j
    if not whole:
        return "has no number"
    if len(whole) > 10:
        return f"is more than {DURATION_MAX_MS} ms"
    unit = text[i:]
    if not unit:
        if frac:
            return "is not a number (a fraction needs a unit)"
        mult = 1
    elif unit in _DURATION_UNITS:
        mult = _DURATION_UNITS[unit]
    elif unit[0] == ".":
        return "is not a number (a fraction needs a unit)"
    else:
        return "has an unknown unit (use ms, s, m or h)"
    scale = 10 ** len(frac)
    part = int(frac or "0") * mult
    if part % scale:
        return "is not a whole number of milliseconds"
    ms = int(whole) * mult + part // scale
    if ms > DURATION_MAX_MS:
        return f"is more than {DURATION_MAX_MS} ms"
    return ms


def duration_ms(value, what):
    """A duration as an int of milliseconds: an int (milliseconds), a str
    in the protocol's grammar ("500" is ms, "500ms", "1.5s", "2m", "1h"),
    or a datetime.timedelta. ValueError naming `what` for a negative one,
    a str the daemon would refuse, or a part of a millisecond; TypeError
    for anything else. The daemon checks its own bounds (locks.min_ttl_ms
    and the like)."""
    if isinstance(value, str):
        ms = _parse_duration(value)
        if isinstance(ms, str):
            raise ValueError(f"{what} must be milliseconds, or a number with "
                             f"ms, s, m or h ('500', '500ms', '1.5s', '2m'):"
                             f" {value!r} {ms}")
        return ms
    if isinstance(value, datetime.timedelta):
        if value < datetime.timedelta(0):
            raise ValueError(f"{what} must not be negative: {value!r}")
        ms, rest = divmod(value, datetime.timedelta(milliseconds=1))
        if rest:
            raise ValueError(f"{what} {value!r} is not a whole number of "
                             "milliseconds")
        return ms
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int (milliseconds), a str such "
                        "as '1.5s' or a datetime.timedelta, not "
                        f"{type(value).__name__}")
    if value < 0:
        raise ValueError(f"{what} must not be negative")
    return value


def millis(value, what):
    """A duration (see duration_ms) as a request number: milliseconds,
    which every daemon takes."""
    return str(duration_ms(value, what))


# The commands whose order among one session's requests the daemon keeps
# by resource: every name they give, or the first.
_NAMES_ALL = frozenset(("LOCK", "UNLOCK", "ADOPT"))
_NAMES_FIRST = frozenset(("EXTEND", "STATUS", "FORCEUNLOCK"))


def resources_named(line):
    """The resources a request line names (its words without ``=``), for
    the commands that name some; () for the others."""
    words = line.split()
    if not words:
        return ()
    cmd = words[0].upper()
    names = tuple(w for w in words[1:] if "=" not in w)
    if cmd in _NAMES_ALL:
        return names
    if cmd in _NAMES_FIRST:
        return names[:1]
    return ()


def split_reply(line):
    """``("OK", rest)``, ``("PONG", rest)`` or raise the ERR's exception.

    ProtocolError for any other line."""
    head, _, rest = line.partition(" ")
    if head in ("OK", "PONG"):
        return head, rest
    if head == "ERR":
        code, _, message = rest.partition(" ")
        if not code:
            raise errors.ProtocolError(f"ERR without a code: {line!r}")
        raise errors.error_for(code, message)
    raise errors.ProtocolError(f"unexpected line from the daemon: {line!r}")


def fields(rest):
    """The ``key=value`` words of an OK reply as a dict of str."""
    out = {}
    for w in rest.split():
        key, sep, value = w.partition("=")
        if sep:
            out[key] = value
    return out


def json_body(rest):
    """The JSON object after ``OK ``."""
    if not rest.startswith("{"):
        raise errors.ProtocolError(f"expected JSON after OK, got {rest!r}")
    try:
        value = json.loads(rest)
    except ValueError as e:
        raise errors.ProtocolError(f"bad JSON from the daemon: {e}") from None
    if not isinstance(value, dict):
        raise errors.ProtocolError("expected a JSON object from the daemon")
    return value


def int_field(f, key, line, default=None):
    v = f.get(key)
    if v is None:
        if default is not None:
            return default
        raise errors.ProtocolError(f"reply lacks {key}=: {line!r}")
    if not v.isdigit():
        raise errors.ProtocolError(f"{key}= is not a number: {line!r}")
    return int(v)


def event(line):
    """``(name, fields)`` of an ``EVENT <NAME> k=v ...`` line."""
    parts = line.split(None, 2)
    name = parts[1] if len(parts) > 1 else ""
    return name, fields(parts[2] if len(parts) > 2 else "")
