"""The package installs with pip from its directory and imports from it."""

import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

PKG_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(argv, env=None, cwd=None):
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_importable_from_the_directory(tmp_path):
    env = dict(os.environ, PYTHONPATH=PKG_ROOT, PYTHONDONTWRITEBYTECODE="1")
    r = _run([sys.executable, "-c",
              "import redlockd; print(redlockd.__file__)"], env=env,
             cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == os.path.join(PKG_ROOT, "redlockd", "__init__.py")


def test_pip_install(tmp_path):
    if _run([sys.executable, "-m", "pip", "--version"]).returncode != 0:
        pytest.skip("pip is not installed for this python")
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools is not installed for this python")
    # Build from a copy: pip and setuptools write build files in the tree.
    src = tmp_path / "src"
    shutil.copytree(PKG_ROOT, src, ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__"))
    site = tmp_path / "site"
    env = dict(os.environ, PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1",
               PYTHONDONTWRITEBYTECODE="1")
    r = _run([sys.executable, "-m", "pip", "install", "--no-deps",
              "--no-build-isolation", "--target", str(site), str(src)], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    env["PYTHONPATH"] = str(site)
    r = _run([sys.executable, "-c", "import redlockd, redlockd.client; "
              "print(redlockd.__file__, redlockd.__version__)"],
             env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    path, version = r.stdout.split()
    assert path.startswith(str(site)) and version == "0.1.0"
    assert (site / "redlockd" / "py.typed").exists()
    assert not (site / "tests").exists()


def test_readme_example_runs(shared):
    """The Python block of the project README, run against a daemon."""
    top = os.path.dirname(os.path.dirname(PKG_ROOT))
    with open(os.path.join(top, "README.md")) as f:
        text = f.read()
    start = text.index("```python\nimport redlockd\n") + len("```python\n")
    code = text[start:text.index("```", start)]
    env = dict(os.environ, PYTHONPATH=PKG_ROOT, PYTHONDONTWRITEBYTECODE="1",
               REDLOCKD_SERVER=shared.server)
    r = _run([sys.executable, "-c", code], env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("got example:job fence ")
