"""Pure helpers for the redlockd line protocol: addresses, request words,
reply lines. No sockets here."""

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


def millis(value, what):
    """A duration in ms as a request number (the daemon checks the range)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be an int (milliseconds)")
    if value < 0:
        raise ValueError(f"{what} must not be negative")
    return str(value)


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
