"""`meson install` into a DESTDIR, checked as an operator would read it.

- The man pages and the systemd units name the paths of this build (its
  sbindir and sysconfdir), not /usr/sbin and /etc when the prefix is
  another; redlockd(8) documents every signal the daemon handles and
  points to redlockd.json(5); the pages format without groff warnings.
- The tmpfiles.d and sysusers.d entries' comments name the files they
  were installed as; the unit runs as the static user sysusers.d makes.
- Every document in docs/ is installed (under docs/, so that the
  README's links hold) with the README and the licence.
- The Python client is installed where the system's python3 looks
  (meson's python module), every module of it, and imports from the
  DESTDIR with the project's version.
"""
import glob
import os
import re
import shutil
import subprocess

import pytest

ENV = ("MESON", "BUILD_ROOT", "SOURCE_ROOT", "PREFIX", "MANDIR", "DOCDIR",
       "CONF_PATH", "SBIN_PATH")


@pytest.fixture(scope="module")
def inst(tmp_path_factory):
    missing = [k for k in ENV if k not in os.environ]
    if missing:
        pytest.skip("run through meson test (no %s)" % ", ".join(missing))
    dest = tmp_path_factory.mktemp("destdir")
    run = subprocess.run([os.environ["MESON"], "install", "-C",
                          os.environ["BUILD_ROOT"], "--no-rebuild", "--quiet",
                          "--destdir", str(dest)],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return dest


def under(dest, path):
    """The installed file of an absolute install path."""
    return os.path.join(str(dest), path.lstrip("/"))


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def man(dest, section, name):
    return under(dest, os.path.join(os.environ["MANDIR"], "man%d" % section,
                                    name))


def test_man_pages_name_this_builds_paths(inst):
    conf = os.environ["CONF_PATH"]
    for page in (man(inst, 8, "redlockd.8"), man(inst, 5, "redlockd.json.5")):
        text = read(page)
        assert conf in text, page
        if conf != "/etc/redlockd/redlockd.json":
            # Not the path of another prefix, alone (not inside this one).
            assert not re.search(r"(?<![\w.-])/etc/redlockd/redlockd\.json",
                                 text), page


def test_redlockd_8_signals_and_see_also(inst):
    text = read(man(inst, 8, "redlockd.8"))
    signals = text.split(".SH SIGNALS", 1)[1].split(".SH ", 1)[0]
    for sig in ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"):
        assert sig in signals, sig
    see_also = text.split(".SH SEE ALSO", 1)[1]
    for ref in ("redlockd.json (5)", "redlockctl (1)"):
        assert ".BR " + ref in see_also, ref
    # The daemon handles exactly these (daemon/main.c).
    main_c = read(os.path.join(os.environ["SOURCE_ROOT"], "daemon", "main.c"))
    handled = set(re.findall(r"uv_signal_start\([^,]+, [^,]+, (SIG\w+)\)",
                             main_c))
    assert handled == {"SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1"}, handled


def test_man_pages_format_cleanly(inst):
    groff = shutil.which("groff")
    if not groff:
        pytest.skip("no groff")
    for page in (man(inst, 8, "redlockd.8"), man(inst, 5, "redlockd.json.5"),
                 man(inst, 1, "redlockctl.1"), man(inst, 1, "redlockd-taskq.1")):
        run = subprocess.run([groff, "-man", "-Tutf8", "-ww", "-z", page],
                             capture_output=True, text=True, timeout=60)
        assert run.returncode == 0 and run.stderr == "", page + run.stderr


def test_units_name_this_builds_paths(inst):
    conf, sbin = os.environ["CONF_PATH"], os.environ["SBIN_PATH"]
    units = glob.glob(os.path.join(str(inst), "**", "redlockd.service"),
                      recursive=True)
    assert len(units) == 1, units
    service = read(units[0])
    assert "\nExecStart=%s -c %s\n" % (sbin, conf) in service
    assert "\nExecStartPre=%s --check-config -c %s\n" % (sbin, conf) in service
    socket = read(os.path.join(os.path.dirname(units[0]), "redlockd.socket"))
    # Every path the units name, comments included, is one this install
    # uses (or a system one).
    allowed = {conf, sbin, "/bin/kill", "/run/redlockd",
               "/run/redlockd/redlockd.sock"}
    for name, text in (("service", service), ("socket", socket)):
        for path in re.findall(r"(?<![\w.])/(?:usr|etc|bin|run)[\w/.-]*", text):
            assert path.rstrip(".") in allowed, (name, path)


def entry(dest, kind):
    """The installed tmpfiles.d or sysusers.d entry, and its text, after
    checking that its comment names the file it was installed as."""
    found = glob.glob(os.path.join(str(dest), "**", kind + ".d",
                                   "redlockd.conf"), recursive=True)
    assert len(found) == 1, found
    installed_as = "/" + os.path.relpath(found[0], str(dest))
    text = read(found[0])
    assert "(installed as %s)" % installed_as in text, text
    return text


def test_tmpfiles_entry(inst):
    text = entry(inst, "tmpfiles")
    assert re.search(r"^d /run/redlockd 0755 redlockd redlockd -$", text,
                     re.M)
    assert re.search(r"^d /var/lib/redlockd 0750 redlockd redlockd -$", text,
                     re.M)


def test_sysusers_entry_makes_the_units_user(inst):
    """The unit runs as a static user (not DynamicUser), the one the
    sysusers.d entry makes, with the home the tmpfiles.d entry makes."""
    lines = [l for l in entry(inst, "sysusers").splitlines()
             if l and not l.startswith("#")]
    assert lines == ['u redlockd - "redlockd lock service" /var/lib/redlockd']
    units = glob.glob(os.path.join(str(inst), "**", "redlockd.service"),
                      recursive=True)
    service = read(units[0])
    assert "\nUser=redlockd\n" in service and "\nGroup=redlockd\n" in service
    assert not re.search(r"^DynamicUser=", service, re.M)


def test_every_doc_is_installed(inst):
    docdir = under(inst, os.environ["DOCDIR"])
    docs = glob.glob(os.path.join(os.environ["SOURCE_ROOT"], "docs", "*.md"))
    assert docs
    for doc in docs:
        assert os.path.isfile(os.path.join(docdir, "docs",
                                           os.path.basename(doc))), doc
    for name in ("README.md", "LICENSE"):
        assert os.path.isfile(os.path.join(docdir, name)), name


def test_python_client_installed(inst, tmp_path):
    python, site = os.environ.get("CLIENT_PYTHON"), os.environ.get(
        "CLIENT_PYTHON_DIR")
    if not python or not site:
        pytest.skip("the Python client is not installed by this build "
                    "(-Dpython=disabled, or no python3)")
    src = os.path.join(os.environ["SOURCE_ROOT"], "client", "python",
                       "redlockd")
    pkg = os.path.join(under(inst, site), "redlockd")
    wanted = sorted(n for n in os.listdir(src)
                    if n.endswith(".py") or n == "py.typed")
    assert sorted(os.listdir(pkg)) == wanted

    # Where the system's python3 looks, without any PYTHONPATH.
    path = subprocess.run([python, "-E", "-s", "-c",
                           "import sys; print(chr(10).join(sys.path))"],
                          capture_output=True, text=True, timeout=60)
    assert site in path.stdout.split("\n"), (site, path.stdout)

    # It imports from there (and not from the sources), with its version.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(PYTHONPATH=under(inst, site), PYTHONDONTWRITEBYTECODE="1")
    run = subprocess.run([python, "-s", "-c",
                          "import redlockd, redlockd.client; "
                          "print(redlockd.__file__, redlockd.__version__)"],
                         capture_output=True, text=True, timeout=60,
                         env=env, cwd=str(tmp_path))
    assert run.returncode == 0, run.stderr
    path, version = run.stdout.split()
    assert path == os.path.join(pkg, "__init__.py")
    assert version == os.environ["VERSION"]
