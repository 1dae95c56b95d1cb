"""Fixtures for the redlockd Python client tests.

The daemon comes from $REDLOCKD_BIN (set by the meson test registration to
the built binary); run by hand, the nearest build*/daemon/redlockd of the
checkout is used. The package is imported from this checkout, not from an
installed copy.
"""

import glob
import os
import sys
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_ROOT = os.path.dirname(HERE)
sys.path.insert(0, PKG_ROOT)
sys.path.insert(0, HERE)

import harness  # noqa: E402


def _daemon_bin():
    env = os.environ.get("REDLOCKD_BIN")
    if env:
        return env
    top = os.path.dirname(os.path.dirname(PKG_ROOT))
    found = sorted(glob.glob(os.path.join(top, "build*", "daemon", "redlockd")),
                   key=os.path.getmtime, reverse=True)
    return found[0] if found else None


@pytest.fixture(scope="session")
def daemon_bin():
    path = _daemon_bin()
    if os.environ.get("REDLOCKD_BIN") and not os.access(path, os.X_OK):
        pytest.fail(f"REDLOCKD_BIN={path} is not an executable")
    if path is None:
        pytest.skip("no redlockd binary: set REDLOCKD_BIN or build with meson")
    if harness.REDIS_SERVER is None:
        pytest.skip("redis-server is not installed")
    return path


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed:
        item.rl_failed = True


@pytest.fixture
def h(request, daemon_bin):
    """A Harness for this test: what it starts is stopped after it."""
    hs = harness.Harness(daemon_bin)
    yield hs
    hs.cleanup(dump_logs=getattr(request.node, "rl_failed", False))


@pytest.fixture(scope="session")
def shared(daemon_bin):
    """One redis node and a daemon shared by the tests that do not stop
    anything; they use distinct resource names."""
    hs = harness.Harness(daemon_bin)
    try:
        _, d = hs.cluster(1)
        yield d
    finally:
        hs.cleanup()


@pytest.fixture
def res():
    """A resource-name prefix unique to this test."""
    return "py:" + uuid.uuid4().hex[:12]


def pytest_sessionfinish(session, exitstatus):
    # Exit status 5 (no tests collected) must never pass for success or
    # hide as "no tests": a run that collected nothing is a failure.
    if session.testscollected == 0:
        session.exitstatus = 1
