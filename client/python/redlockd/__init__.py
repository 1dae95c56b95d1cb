"""redlockd: a Python client for the redlockd lock service.

    import redlockd

    with redlockd.Client(name="billing") as client:
        with client.lock("job:42", ttl=30000, wait=5000) as lease:
            storage.write(data, fence=lease.fence)   # the storage checks fences
            lease.check()                            # raises LockLost if lost

Standard library only. See client/python/README.md.
"""

from .client import Client, Holder, Lease, SERVER_ENV, Watch
from .errors import (Arg, Auth, Busy, ConnectionClosed, Denied, Error, Held,
                     IOTimeout,
                     Limit, LockLost, Lost, NoAuth, NoSession, NotHeld,
                     ProtocolError,
                     RedlockdError, Shutdown, Timeout, TooLong, TransportError,
                     Unavailable, Unknown, Unsupported, error_for)

__version__ = "0.1.0"

__all__ = [
    "Client", "Lease", "Holder", "Watch", "SERVER_ENV",
    "Error", "RedlockdError", "TransportError", "ConnectionClosed",
    "IOTimeout", "ProtocolError", "LockLost",
    "Arg", "Unsupported", "Unknown", "TooLong", "NoAuth", "Auth", "Busy",
    "Timeout", "Held", "NotHeld", "Lost", "Unavailable", "Limit", "Shutdown",
    "NoSession", "Denied", "error_for",
]
