"""scripts/run as a new user runs it: three nodes and the daemon.

The script is run with REDLOCKD_BIN (the build's daemon: no scripts/deps,
no build) on free ports, and checked for what the README promises:

- the nodes keep an append-only file with appendfsync always in the run
  directory, as production nodes should, so the daemon starts without
  warning that a restarted node may not vote (or that nodes lack
  appendfsync always);
- the user's first session is s1: the script's readiness check opens no
  connection to the daemon;
- SIGTERM stops the daemon and the nodes and removes the run directory.
"""
import os
import re
import signal
import socket
import subprocess
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(REPO, "scripts", "run")


def free_ports(n):
    """n ports nobody listens on now (bound once, then released)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = pred()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail("timed out waiting for " + what)


def redis_config(port, name):
    out = subprocess.run(["redis-cli", "-p", str(port), "CONFIG", "GET", name],
                         capture_output=True, text=True, timeout=10).stdout
    lines = out.split()
    return lines[1] if len(lines) == 2 else out


@pytest.fixture
def run_script(tmp_path):
    daemon = os.environ.get("REDLOCKD_BIN")
    if not daemon:
        pytest.skip("REDLOCKD_BIN is not set (run through meson test)")
    port, *nodes = free_ports(4)
    err = open(tmp_path / "run.err", "w+")
    env = dict(os.environ, REDLOCKD_BIN=daemon, REDLOCKD_PORT=str(port),
               REDIS_PORTS=" ".join(map(str, nodes)), TMPDIR=str(tmp_path))
    proc = subprocess.Popen(["bash", SCRIPT], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=err, env=env,
                            start_new_session=True)

    def stderr_text():
        err.flush()
        with open(tmp_path / "run.err") as f:
            return f.read()

    try:
        wait_for(lambda: "redlockd is running" in stderr_text()
                 or proc.poll() is not None, 60, "scripts/run to start")
        assert proc.poll() is None, "scripts/run exited: " + stderr_text()
        yield proc, port, stderr_text
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        err.close()


def test_run_script(run_script):
    proc, port, stderr_text = run_script
    text = stderr_text()
    nodes = re.search(r"redis nodes +(.*)", text).group(1).split()
    rundir = re.search(r"config +(\S+)/redlockd\.json", text).group(1)
    assert len(nodes) == 3

    # Production-like nodes, and nothing to warn about at start.
    for node in nodes:
        p = int(node.rsplit(":", 1)[1])
        assert redis_config(p, "appendonly") == "yes", node
        assert redis_config(p, "appendfsync") == "always", node
        assert os.path.isdir(os.path.join(rundir, "redis-%d" % p,
                                          "appendonlydir")), node
    assert "may not vote" not in text, text
    assert "appendfsync" not in text, text

    # The first session anyone opens is s1.
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        f = s.makefile("rw", newline="\n")
        f.write("HELLO name=me\n")
        f.flush()
        hello = f.readline()
        assert re.match(r"OK proto=1 session=s1\.\S+ server=redlockd/", hello), hello
        f.write("QUIT\n")
        f.flush()
        assert f.readline() == "OK bye\n"

    # SIGTERM: everything stops, the run directory goes.
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0, stderr_text()
    assert not os.path.exists(rundir)
    for node in nodes:
        p = int(node.rsplit(":", 1)[1])
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", p), timeout=2).close()
