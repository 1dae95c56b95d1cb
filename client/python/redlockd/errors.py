"""The exceptions of the redlockd client.

Three families, all under :class:`Error`:

- :class:`RedlockdError`: the daemon answered ``ERR <CODE> <message>``. It
  carries ``.code`` (the protocol word, e.g. ``"BUSY"``) and ``.message``
  (for people). Every code of the protocol has its own subclass; a code this
  client does not know (from a newer daemon) raises :class:`RedlockdError`
  itself, with that code.
- :class:`TransportError`: the connection failed (refused, reset, closed by
  the daemon, no reply in time, a line that is not the protocol). After one
  of these that connection is gone. A Client made with ``reconnect=True``
  (the default) connects again and keeps its leases (resume or ADOPT); with
  ``reconnect=False`` the locks are gone with the connection.
- :class:`LockLost`: a lease is no longer safe to rely on
  (:meth:`redlockd.Lease.check`). :class:`Lost` (``ERR LOST`` from the
  daemon) is both a :class:`RedlockdError` and a :class:`LockLost`, so
  ``except LockLost`` catches every way of learning of a loss.
"""

__all__ = [
    "Error", "RedlockdError", "TransportError", "ConnectionClosed",
    "IOTimeout", "ProtocolError", "LockLost",
    "Arg", "Unsupported", "Unknown", "TooLong", "NoAuth", "Auth", "Busy",
    "Timeout", "Held", "NotHeld", "Lost", "Unavailable", "Limit", "Shutdown",
    "NoSession", "Denied", "error_for",
]


class Error(Exception):
    """Anything the redlockd client raises (besides ValueError/TypeError
    for arguments it refuses before sending)."""


class RedlockdError(Error):
    """The daemon answered ``ERR <code> <message>``."""

    code = None

    def __init__(self, code=None, message=""):
        if code is not None:
            self.code = code
        self.message = message
        Exception.__init__(self, f"{self.code} {message}".rstrip())


class TransportError(Error):
    """The connection to the daemon failed (or no server could be reached
    in time). Without reconnection its locks are gone with it."""


class ConnectionClosed(TransportError):
    """The connection is closed (by us, by the daemon, or by an error), or
    none could be made again within the client's timeout.

    ``.reason`` is the daemon's ``EVENT CLOSING reason=`` when it sent one,
    ``"shutdown"`` after ``EVENT SHUTDOWN``, else None."""

    def __init__(self, message="connection closed", reason=None):
        self.reason = reason
        super().__init__(message)


class IOTimeout(TransportError):
    """No reply within the client's timeout (plus ``wait`` for LOCK).

    The connection is closed: a late reply could not be told apart from the
    reply to the next request."""


class ProtocolError(TransportError):
    """The daemon sent a line that does not fit the protocol; the
    connection is closed."""


class LockLost(Error):
    """A lease was lost: ``EVENT LOST``, its deadline passed, an ADOPT on
    another daemon failed, the daemon stopped, or the connection closed.
    ``.resource`` and ``.reason`` (``"expired"``, ``"quorum"``, ``"node"``
    from the daemon; ``"deadline"``, ``"adopt"``, ``"shutdown"``,
    ``"closed"``, ``"gone"`` from the client)."""

    def __init__(self, resource=None, reason=None, message=None):
        self.resource = resource
        self.reason = reason
        if message is None:
            message = f"the lease on {resource} was lost ({reason})"
        Exception.__init__(self, message)


class Arg(RedlockdError):
    """ARG: malformed request (option, number, name, range)."""
    code = "ARG"


class Unsupported(Arg):
    """ARG for an addition this daemon does not know yet (``mode=``,
    ``limit=``, several resources, ``HELP <command>``). Still an
    :class:`Arg`; ``.feature`` names what was refused."""

    def __init__(self, code=None, message="", feature=None):
        self.feature = feature
        super().__init__(code, message)


class Lost(RedlockdError, LockLost):
    """LOST: the lease had already been lost when UNLOCK/EXTEND came."""
    code = "LOST"

    def __init__(self, code=None, message="", resource=None):
        RedlockdError.__init__(self, code, message)
        self.resource = resource
        self.reason = "lost"


def _code_class(name, code, doc):
    """One RedlockdError subclass per protocol code."""
    return type(name, (RedlockdError,), {
        "code": code, "__doc__": f"{code}: {doc}", "__module__": __name__})


# name, code, meaning (docs/protocol.md "Error codes").
_CODES = (
    ("Unknown", "UNKNOWN", "the daemon does not know the command."),
    ("TooLong", "TOOLONG", "the request line was too long; the daemon "
                           "closes the connection after this reply."),
    ("NoAuth", "NOAUTH", "a password is required and was not sent (or the "
                         "client is not local in protected mode, or "
                         "FORCEUNLOCK without the admin password)."),
    ("Auth", "AUTH", "wrong password."),
    ("Busy", "BUSY", "held by someone else and ``wait`` was 0."),
    ("Timeout", "TIMEOUT", "``wait`` ran out before the lock could be had."),
    ("Held", "HELD", "this connection already holds the resource."),
    ("NotHeld", "NOTHELD", "this connection does not hold the resource."),
    ("Unavailable", "UNAVAILABLE", "a quorum of Redis nodes could not be "
                                   "reached in time."),
    ("Limit", "LIMIT", "a configured limit was hit."),
    ("Shutdown", "SHUTDOWN", "the daemon is stopping and takes no new "
                             "locks."),
    ("NoSession", "NOSESSION", "``HELLO resume=``: no such session to "
                               "resume, or a wrong secret."),
    ("Denied", "DENIED", "the user logged in (``auth.users``) may not do "
                         "that to that resource: it lies outside the "
                         "user's prefixes, or FORCEUNLOCK by a user that "
                         "is not an admin."),
)

for _name, _code, _doc in _CODES:
    globals()[_name] = _code_class(_name, _code, _doc)
del _name, _code, _doc

_BY_CODE = {cls.code: cls for cls in [Arg, Lost] + [
    globals()[name] for name, _, _ in _CODES]}


def error_for(code, message):
    """The exception for ``ERR <code> <message>``."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return RedlockdError(code, message)
    return cls(code, message)
