"""The package installs with pip from its directory, and with the
README's venv command, and imports from there."""

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


def test_readme_venv_command(tmp_path):
    """The README's venv command, as it stands (less the path of Debian's
    python3), offline: a venv that sees Debian's setuptools and wheel, and
    pip without build isolation."""
    if importlib.util.find_spec("ensurepip") is None:
        pytest.skip("no ensurepip for this python (Debian: python3-venv)")
    for mod in ("setuptools", "wheel"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip("no %s for this python (Debian: python3-%s)"
                        % (mod, mod))
    top = os.path.dirname(os.path.dirname(PKG_ROOT))
    with open(os.path.join(top, "README.md")) as f:
        text = f.read()
    marker = "<!-- venv-install -->\n"
    line = text[text.index(marker) + len(marker):].split("\n", 1)[0]
    command = line.strip()
    # Debian's python3 by its path: a pyenv or other python3 first on PATH
    # may lack Debian's setuptools and wheel. Here this test's python plays
    # it (below), so the path is taken off.
    assert command.startswith("/usr/bin/python3 -m venv "), command
    command = command[len("/usr/bin/"):]
    # From a copy of the checkout's client/python: pip builds in the tree.
    shutil.copytree(PKG_ROOT, tmp_path / "client" / "python",
                    ignore=shutil.ignore_patterns("tests", "build",
                                                  "*.egg-info", "__pycache__"))
    # This python plays Debian's python3; no network, no pip config.
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV"))}
    env.update(PATH=str(bindir) + os.pathsep + env.get("PATH", ""),
               PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1")
    r = _run(["sh", "-c", command], env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    r = _run([str(tmp_path / "venv" / "bin" / "python"), "-c",
              "import redlockd, redlockd.client; "
              "print(redlockd.__file__, redlockd.__version__)"],
             env=env, cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr
    path, version = r.stdout.split()
    assert path.startswith(str(tmp_path / "venv")) and version == "0.1.0"


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
