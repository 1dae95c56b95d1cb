"""TLS for ``tls://`` servers, through the standard ``ssl`` module.

The client reads on one thread (the connection's reader) while callers
write on others. OpenSSL does not allow one SSL object to be used by two
threads at once, so the TLS state is an ``ssl.SSLObject`` over memory BIOs
(``SSLContext.wrap_bio``), used only under a lock, and the raw socket
carries the bytes: the reader waits in ``recv`` on the socket without the
lock, and a writer never waits for the reader. :class:`TLSSocket` has the
few socket methods the client uses (``sendall``, ``makefile("rb")``,
``shutdown``, ``close``, ``setsockopt``, ``settimeout``).

Failures name their reason as libredlockd's do: "unknown CA", "name
mismatch", "expired", "does not speak TLS", "requires a client
certificate".
"""

import io
import os
import ssl
import threading

CA_ENV = "REDLOCKD_TLS_CA"
CERT_ENV = "REDLOCKD_TLS_CERT"
KEY_ENV = "REDLOCKD_TLS_KEY"

_READ = 65536

# X509_V_ERR_* codes and what they mean to a user.
_VERIFY_WORDS = {
    2: "unknown CA",    # UNABLE_TO_GET_ISSUER_CERT
    18: "unknown CA",   # DEPTH_ZERO_SELF_SIGNED_CERT
    19: "unknown CA",   # SELF_SIGNED_CERT_IN_CHAIN
    20: "unknown CA",   # UNABLE_TO_GET_ISSUER_CERT_LOCALLY
    21: "unknown CA",   # UNABLE_TO_VERIFY_LEAF_SIGNATURE
    27: "unknown CA",   # CERT_UNTRUSTED
    62: "name mismatch",    # HOSTNAME_MISMATCH
    64: "name mismatch",    # IP_ADDRESS_MISMATCH
    10: "expired",      # CERT_HAS_EXPIRED
    9: "not yet valid",  # CERT_NOT_YET_VALID
}

_NOT_TLS = ("WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL",
            "PACKET_LENGTH_TOO_LONG", "HTTP_REQUEST")
_CLIENT_CERT_REFUSED = ("SSLV3_ALERT_BAD_CERTIFICATE", "TLSV1_ALERT_UNKNOWN_CA",
                        "SSLV3_ALERT_CERTIFICATE_EXPIRED",
                        "SSLV3_ALERT_CERTIFICATE_UNKNOWN",
                        "TLSV1_ALERT_ACCESS_DENIED")


def _from_env(value, env):
    if value is not None:
        return value
    return os.environ.get(env) or None


def make_context(ca_file=None, cert_file=None, key_file=None):
    """The client context: TLS 1.2 or later, the server's certificate
    checked against ``ca_file`` (else $REDLOCKD_TLS_CA, else the system's
    store) and against its name, ``cert_file``/``key_file`` (else
    $REDLOCKD_TLS_CERT/_KEY) as the client certificate. ValueError names
    a file that does not load."""
    ca_file = _from_env(ca_file, CA_ENV)
    cert_file = _from_env(cert_file, CERT_ENV)
    key_file = _from_env(key_file, KEY_ENV)
    if key_file is not None and cert_file is None:
        raise ValueError("tls_key_file without tls_cert_file")
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
    except (OSError, ssl.SSLError) as e:
        raise ValueError(f"tls_ca_file {ca_file}: {_file_error(e)}") from None
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if cert_file is not None:
        try:
            ctx.load_cert_chain(cert_file, key_file)
        except (OSError, ssl.SSLError) as e:
            what = "tls_cert_file" if key_file is None else \
                "tls_cert_file/tls_key_file"
            raise ValueError(f"{what} {cert_file}"
                             f"{'' if key_file is None else ', ' + key_file}: "
                             f"{_file_error(e)}") from None
    return ctx


def _file_error(e):
    if isinstance(e, ssl.SSLError):
        return f"cannot load: {e.reason or e}"
    return e.strerror or str(e)


def server_name(host, override=None):
    """The name the certificate must carry (an IP address is checked as
    one; ssl sends no SNI for it)."""
    return override if override is not None else host.split("%", 1)[0]


def explain(e, server, received):
    """A message naming the reason of a TLS failure (``received``: bytes
    the server sent before it)."""
    if isinstance(e, ssl.SSLCertVerificationError):
        word = _VERIFY_WORDS.get(e.verify_code, "not trusted")
        return (f"certificate of {server} refused: {word} "
                f"({e.verify_message})")
    reason = getattr(e, "reason", None) or ""
    if reason in _NOT_TLS:
        return (f"TLS with {server}: the server does not speak TLS (a plain "
                f"tcp:// listener?) ({reason})")
    if reason == "TLSV13_ALERT_CERTIFICATE_REQUIRED":
        return (f"TLS with {server}: the server requires a client "
                "certificate (tls_cert_file, tls_key_file)")
    if reason in _CLIENT_CERT_REFUSED:
        return (f"TLS with {server}: the server refused our client "
                f"certificate ({reason})")
    if isinstance(e, (ssl.SSLEOFError, EOFError)) and not received:
        return (f"TLS with {server}: the server closed the connection without "
                "a TLS answer: it does not speak TLS (a plain tcp:// "
                "listener?)")
    return f"TLS with {server}: {e}"


class TLSError(OSError):
    """A TLS failure, its message naming the reason."""


class _Raw(io.RawIOBase):
    def __init__(self, tls):
        self._tls = tls

    def readable(self):
        return True

    def readinto(self, b):
        data = self._tls.recv(len(b))
        b[:len(data)] = data
        return len(data)


class TLSSocket:
    """A connected socket with TLS over it (see the module's docstring).
    The handshake happens here, bounded by the socket's timeout."""

    def __init__(self, sock, context, hostname, server):
        self._sock = sock
        self._server = server
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=False,
                                     server_hostname=hostname)
        self._lock = threading.Lock()
        self._received = 0
        self._handshake()

    def _flush(self):
        data = self._out.read()
        if data:
            self._sock.sendall(data)

    def _feed(self):
        data = self._sock.recv(_READ)
        if not data:
            return False
        self._received += len(data)
        self._in.write(data)
        return True

    def _handshake(self):
        while True:
            try:
                self._obj.do_handshake()
                self._flush()
                return
            except ssl.SSLWantReadError:
                self._flush()
                if not self._feed():
                    raise TLSError(explain(EOFError(), self._server,
                                           self._received)) from None
            except ssl.SSLError as e:
                try:
                    self._flush()   # the alert, for the server's log
                except OSError:
                    pass
                raise TLSError(explain(e, self._server, self._received)) \
                    from None

    def sendall(self, data):
        with self._lock:
            self._obj.write(data)
            self._flush()

    def recv(self, n):
        """Up to n bytes of plain text; b"" at the end."""
        while True:
            with self._lock:
                try:
                    data = self._obj.read(n)
                    self._flush()
                    return data
                except ssl.SSLWantReadError:
                    self._flush()
                except (ssl.SSLZeroReturnError, ssl.SSLEOFError):
                    return b""
                except ssl.SSLError as e:
                    raise TLSError(explain(e, self._server, self._received)) \
                        from None
            # Without the lock: a writer must not wait for the daemon.
            data = self._sock.recv(_READ)
            with self._lock:
                if not data:
                    self._in.write_eof()
                else:
                    self._received += len(data)
                    self._in.write(data)

    def makefile(self, mode="rb"):
        if mode != "rb":
            raise ValueError("TLSSocket.makefile: only 'rb'")
        return io.BufferedReader(_Raw(self))

    def shutdown(self, how):
        self._sock.shutdown(how)

    def close(self):
        self._sock.close()

    def setsockopt(self, *args):
        self._sock.setsockopt(*args)

    def settimeout(self, t):
        self._sock.settimeout(t)
