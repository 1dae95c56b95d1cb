"""One Client shared by threads; two processes competing for one lock."""

import os
import subprocess
import sys
import threading

import pytest

import redlockd

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)


def test_threads_share_a_client(shared, res):
    errors = []
    counts = {}
    with redlockd.Client(shared.server, name="threads") as c:
        def locker(i):
            try:
                n = 0
                for k in range(15):
                    r = f"{res}:{i}:{k % 3}"
                    with c.lock(r, ttl=5000) as lease:
                        assert lease.resource == r
                        st = c.status(r)
                        assert st["resource"] == r
                        assert st["holder"]["fence"] == lease.fence
                    n += 1
                counts[i] = n
            except Exception as e:       # reported by the main thread
                errors.append(e)

        def inspector():
            try:
                for k in range(30):
                    assert c.ping(f"w{k}") == f"w{k}"
                    assert c.stats()["sessions"] >= 1
                    assert c.locks()["session"] == c.session
            except Exception as e:
                errors.append(e)

        threads = [threading.Thread(target=locker, args=(i,)) for i in range(4)]
        threads.append(threading.Thread(target=inspector))
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert not any(t.is_alive() for t in threads)
        assert not errors, errors
        assert counts == {i: 15 for i in range(4)}
        assert c.locks()["locks"] == []


def test_threads_of_one_client_are_one_session(shared, res):
    """Locks belong to the connection: a second thread of the same Client
    asking for a lock the Client holds gets HELD, not a wait."""
    with redlockd.Client(shared.server) as c:
        with c.lock(res):
            out = []
            t = threading.Thread(target=lambda: out.append(
                pytest.raises(redlockd.Held, c.lock, res, wait=2000)))
            t.start()
            t.join(5)
            assert out and out[0].value.code == "HELD"


WORKER = r"""
import os, sys, time
import redlockd

server, resource, marker, log, n = sys.argv[1:6]
with redlockd.Client(server, name=f"worker-{os.getpid()}") as c:
    for _ in range(int(n)):
        with c.lock(resource, ttl=5000, wait=20000) as lease:
            # Nobody else may be inside: the marker is created exclusively.
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            with open(log, "a") as f:
                f.write(f"{os.getpid()} {lease.fence}\n")
            time.sleep(0.02)
            lease.check()
            os.close(fd)
            os.unlink(marker)
print("done")
"""


def test_two_processes_compete_for_one_lock(shared, res, tmp_path):
    marker = str(tmp_path / "inside")
    log = str(tmp_path / "log")
    env = dict(os.environ, PYTHONPATH=PKG_ROOT, PYTHONDONTWRITEBYTECODE="1")
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, shared.server, res,
                               marker, log, "10"], env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
             for _ in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=30))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(5)
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err.decode()
        assert out.decode().strip() == "done"
    with open(log) as f:
        rows = [line.split() for line in f]
    assert len(rows) == 20
    pids = {pid for pid, _ in rows}
    assert len(pids) == 2
    fences = [int(fence) for _, fence in rows]
    # In lock order, every holder's fence is above the one before.
    assert fences == sorted(fences) and len(set(fences)) == 20
