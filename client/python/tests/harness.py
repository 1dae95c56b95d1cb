"""Real redis-server and redlockd processes for the Python client's tests.

Every process runs on a free loopback port in its own temporary directory
and is started through ``setpriv --pdeathsig KILL`` when available, so it
dies with the test run even if pytest is killed. A Harness remembers what it
started and stops exactly those processes, by PID, waiting a bounded time.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time

REDIS_SERVER = shutil.which("redis-server")
_SETPRIV = shutil.which("setpriv")


class StartError(Exception):
    """A process did not start; the message carries its log."""


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout, interval=0.01):
    """Poll predicate() until true or `timeout` seconds; its last value."""
    end = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() >= end:
            return value
        time.sleep(interval)


def _tail(path, limit=4000):
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return "(no log)"
    return data[-limit:].decode("utf-8", "replace")


def _merge(base, extra):
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
    return base


class _Proc:
    def __init__(self, argv, log_path):
        if _SETPRIV is not None:
            argv = [_SETPRIV, "--pdeathsig", "KILL", "--", *argv]
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                                      stdout=self._log, stderr=self._log,
                                      close_fds=True)
        self.pid = self.popen.pid

    def running(self):
        return self.popen.poll() is None

    def send(self, sig):
        if self.popen.poll() is None:
            os.kill(self.pid, sig)

    def stop(self, sig=signal.SIGTERM, timeout=5.0):
        """Signal and wait; SIGKILL after `timeout`. Returns the exit code."""
        if self.popen.poll() is None:
            try:
                os.kill(self.pid, signal.SIGCONT)   # a paused one cannot exit
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(5.0)
        self._log.close()
        return self.popen.returncode


def answers(port, request, want):
    """Does 127.0.0.1:port answer `request` with a line starting `want`?"""
    try:
        with socket.create_connection(("127.0.0.1", port), 0.3) as s:
            s.settimeout(0.5)
            s.sendall(request)
            return s.recv(16).startswith(want)
    except OSError:
        return False


class _Signals:
    """pause/resume for a process started by the harness (self.proc)."""

    def pause(self):
        self.proc.send(signal.SIGSTOP)

    def resume(self):
        self.proc.send(signal.SIGCONT)


class Redis(_Signals):
    def __init__(self, harness):
        self.dir = harness.mkdtemp("redis")
        self.log_path = os.path.join(self.dir, "redis.log")
        self.port = None
        self.proc = None
        for _ in range(5):
            self.port = free_port()
            self.proc = _Proc([REDIS_SERVER, "--port", str(self.port),
                               "--bind", "127.0.0.1", "--save", "",
                               "--appendonly", "no", "--daemonize", "no",
                               "--dir", self.dir, "--logfile", self.log_path],
                              self.log_path)
            harness.procs.append(self.proc)
            if wait_until(lambda: self._ping() or not self.proc.running(), 5.0) \
                    and self.proc.running():
                return
            self.proc.stop(signal.SIGKILL)
        raise StartError(f"redis-server did not start:\n{_tail(self.log_path)}")

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def _ping(self):
        return answers(self.port, b"PING\r\n", b"+PONG")

    def stop(self):
        self.proc.stop()


class Daemon(_Signals):
    def __init__(self, harness, bin_path, nodes, extra=None):
        self.harness = harness
        self.bin_path = bin_path
        self.dir = harness.mkdtemp("redlockd")
        self.log_path = os.path.join(self.dir, "redlockd.log")
        self.conf_path = os.path.join(self.dir, "redlockd.json")
        self.sock_path = os.path.join(self.dir, "redlockd.sock")
        self.proc = None
        self.tls_port = None
        for _ in range(3):
            self.port = free_port()
            conf = {
                "listen": [f"tcp://127.0.0.1:{self.port}", f"unix:{self.sock_path}"],
                "redis": {"nodes": [n.addr for n in nodes]},
                "log": {"level": "debug"},
                # A stop under held leases waits this long for their
                # clients to release them (the daemon's default is 5000).
                "shutdown_timeout_ms": 1000,
            }
            _merge(conf, json.loads(json.dumps(extra or {})))
            # A certificate and no tls:// address of the test's own: listen
            # on one too (as the C harness does).
            if (conf.get("tls") or {}).get("cert_file") and not any(
                    a.startswith("tls://") for a in conf["listen"]):
                self.tls_port = free_port()
                conf["listen"].append(f"tls://127.0.0.1:{self.tls_port}")
            with open(self.conf_path, "w") as f:
                json.dump(conf, f, indent=2)
            self.proc = _Proc([bin_path, "-c", self.conf_path], self.log_path)
            harness.procs.append(self.proc)
            if wait_until(lambda: self._ready() or not self.proc.running(), 5.0) \
                    and self.proc.running():
                harness.daemons.append(self)
                return
            self.proc.stop(signal.SIGKILL)
            if "in use" not in _tail(self.log_path):
                break
        raise StartError(f"redlockd did not start:\n{_tail(self.log_path)}")

    @property
    def server(self):
        return f"127.0.0.1:{self.port}"

    @property
    def tls_server(self):
        return f"tls://127.0.0.1:{self.tls_port}"

    @property
    def unix_server(self):
        return f"unix:{self.sock_path}"

    def _ready(self):
        if not answers(self.port, b"PING\n", b"PONG"):
            return False
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.settimeout(0.3)
                s.connect(self.sock_path)
            return True
        except OSError:
            return False

    def terminate(self):
        """SIGTERM, without waiting."""
        self.proc.send(signal.SIGTERM)

    def kill(self):
        """SIGKILL, and wait for it to be gone."""
        self.proc.stop(signal.SIGKILL)

    def start_again(self, timeout=5.0):
        """Start the same binary with the same config (the same port and
        socket), as systemctl restart does; the old one must have exited."""
        if self.proc.running():
            raise StartError("redlockd is still running")
        self.proc = _Proc([self.bin_path, "-c", self.conf_path], self.log_path)
        self.harness.procs.append(self.proc)
        if wait_until(lambda: self._ready() or not self.proc.running(),
                      timeout) and self.proc.running():
            return
        self.proc.stop(signal.SIGKILL)
        raise StartError(f"redlockd did not start again:\n{_tail(self.log_path)}")

    def restart(self, stop_timeout=10.0):
        """SIGTERM, wait for the exit (its exit code is returned), start
        again on the same port and config."""
        code = self.proc.stop(signal.SIGTERM, stop_timeout)
        self.start_again()
        return code

    def wait(self, timeout=10.0):
        try:
            return self.proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def log(self):
        return _tail(self.log_path, 20000)


class Harness:
    """What one test (or one session fixture) started."""

    def __init__(self, bin_path):
        self.bin_path = bin_path
        self.procs = []
        self.daemons = []
        self.dirs = []

    def mkdtemp(self, what):
        d = tempfile.mkdtemp(prefix=f"rl-py-{what}-")
        self.dirs.append(d)
        return d

    def redis(self, n=1):
        return [Redis(self) for _ in range(n)]

    def daemon(self, nodes, extra=None):
        return Daemon(self, self.bin_path, nodes, extra)

    def cluster(self, n=1, extra=None):
        """n redis nodes and a daemon over them."""
        nodes = self.redis(n)
        return nodes, self.daemon(nodes, extra)

    def cleanup(self, dump_logs=False):
        if dump_logs:
            for d in self.daemons:
                print(f"---- redlockd log {d.log_path} ----\n{d.log()[-6000:]}")
        for p in reversed(self.procs):
            p.stop(signal.SIGTERM, 5.0)
        for d in self.dirs:
            shutil.rmtree(d, ignore_errors=True)
