"""The documentation checked against the daemon itself.

1. Transcripts: every code block in README.md and docs/*.md marked
   with the HTML comment ``<!-- docs-test: transcript -->`` just before it
   is replayed line by line, on one connection, against a test daemon over
   three real redis-server nodes on free loopback ports, and each reply
   line is compared with the documented one. Only what differs from run to
   run is ignored: tokens, session ids, secrets, fences, and the
   validity/held/idle/ttl-left numbers (see normalize()).

   In a block, a line starting with ``> `` is a request (protocol.md's
   style); so is any line that does not start with OK, ERR, PONG or EVENT
   (the README's style); those are the lines the daemon sends, read in
   order. ``$ ...`` lines (the shell) are skipped; ``Connection closed by
   foreign host.`` expects the daemon to close the connection. After the
   last line the connection must have nothing more to say (a PING is
   answered next; after a QUIT, the close comes next), so a documented
   reply cannot be missing.

2. Keys and families: every config key in daemon/conf.c's table is in
   docs/configuration.md (its key tables and "The whole file" JSON) and in
   conf/redlockd.json, and nothing else is; every metric family a running
   daemon serves on /metrics is in docs/metrics.md's tables with its type,
   and nothing else is; the label values it exports are named there.

The daemon comes from $REDLOCKD_BIN (meson sets it), else the newest
build*/daemon/redlockd of this checkout.
"""

import glob
import json
import os
import re
import socket
import sys
import urllib.request

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.environ.get("SOURCE_ROOT") or os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "client", "python", "tests"))

import harness  # noqa: E402  (client/python/tests/harness.py)

MARKER = "<!-- docs-test: transcript -->"
TRANSCRIPT_DOCS = ["README.md"] + sorted(
    os.path.relpath(p, ROOT)
    for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
REPLY_RE = re.compile(r"^(OK|ERR|PONG|EVENT)( |$)")


def _daemon_bin():
    env = os.environ.get("REDLOCKD_BIN")
    if env:
        return env
    found = sorted(glob.glob(os.path.join(ROOT, "build*", "daemon", "redlockd")),
                   key=os.path.getmtime, reverse=True)
    return found[0] if found else None


@pytest.fixture(scope="module")
def daemon_bin():
    path = _daemon_bin()
    if path is None or not os.access(path, os.X_OK):
        pytest.fail(f"no redlockd binary ({path}): set REDLOCKD_BIN or build")
    if harness.REDIS_SERVER is None:
        pytest.fail("redis-server is not installed")
    return path


@pytest.fixture
def h(daemon_bin):
    hs = harness.Harness(daemon_bin)
    yield hs
    hs.cleanup()


def read_doc(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


# ---- 1. transcripts --------------------------------------------------------

def transcripts(rel):
    """[(line number of the marker, [(doc line number, text), ...])]: the
    indented code block after each marker (blank lines before it skipped;
    it ends at the first blank line)."""
    lines = read_doc(rel).split("\n")
    out = []
    for i, line in enumerate(lines):
        if line.strip() != MARKER:
            continue
        indent = len(line) - len(line.lstrip(" ")) + 4
        j = i + 1
        while j < len(lines) and not lines[j].strip():
            j += 1
        block = []
        while j < len(lines) and lines[j].strip():
            if not lines[j].startswith(" " * indent):
                raise AssertionError(
                    f"{rel}:{j + 1}: the block after the marker on line "
                    f"{i + 1} is not an indented code block")
            block.append((j + 1, lines[j][indent:]))
            j += 1
        if not block:
            raise AssertionError(f"{rel}:{i + 1}: marker without a block")
        out.append((i + 1, block))
    return out


def all_transcripts():
    params = []
    for rel in TRANSCRIPT_DOCS:
        for lineno, block in transcripts(rel):
            params.append(pytest.param(rel, block, id=f"{rel}:{lineno}"))
    return params


_NORMALIZE = [
    (re.compile(r"\bs\d+\.[0-9a-z]+\b"), "s<N>.<START>"),
    (re.compile(r"\btoken=[0-9a-f]{32}\b"), "token=<TOKEN>"),
    (re.compile(r'"token":"[0-9a-f]{32}"'), '"token":"<TOKEN>"'),
    (re.compile(r"\bsecret=\S+"), "secret=<SECRET>"),
    (re.compile(r"\bfence=\d+\b"), "fence=<FENCE>"),
    (re.compile(r"\bvalidity=\d+\b"), "validity=<MS>"),
    (re.compile(r'"(fence|validity|held_ms|idle_ms|age_ms|detached_ms|'
                r'pttl|rejoin_in_ms)":-?\d+'), r'"\1":<N>'),
]


def normalize(line):
    for rx, sub in _NORMALIZE:
        line = rx.sub(sub, line)
    return line


class Conn:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), 5)
        self.sock.settimeout(10)
        self.buf = b""

    def send(self, line):
        self.sock.sendall(line.encode() + b"\r\n")   # as telnet does

    def readline(self):
        """The next line without its LF, or None at EOF."""
        while b"\n" not in self.buf:
            try:
                data = self.sock.recv(65536)
            except ConnectionResetError:
                data = b""
            if not data:
                return None
            self.buf += data
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8", "replace").rstrip("\r")

    def close(self):
        self.sock.close()


@pytest.mark.parametrize("rel,block", all_transcripts())
def test_transcript(h, rel, block):
    _, d = h.cluster(3)
    c = Conn(d.port)
    closed = False
    last = ""
    try:
        for lineno, text in block:
            where = f"{rel}:{lineno}"
            if text.startswith("$ "):
                continue
            if text == "Connection closed by foreign host.":
                got = c.readline()
                assert got is None, f"{where}: expected the close, got {got!r}"
                closed = True
                continue
            assert not closed, f"{where}: a line after the connection closed"
            if text.startswith("> "):
                last = text[2:]
                c.send(last)
            elif REPLY_RE.match(text):
                got = c.readline()
                assert got is not None, (
                    f"{where}: expected {text!r}, the connection closed")
                assert normalize(got) == normalize(text), (
                    f"{where}: the daemon's line differs from the doc's\n"
                    f"  doc:    {text}\n  daemon: {got}")
            else:
                last = text
                c.send(last)
        if not closed and last.split()[:1] in (["QUIT"], ["quit"]):
            got = c.readline()
            assert got is None, (
                f"{rel}:{block[-1][0]}: after QUIT the daemon sent a line "
                f"the doc does not show: {got!r}")
        elif not closed:
            # Nothing documented may be left unread: the next line must be
            # the answer to this PING (or the close after a QUIT).
            c.send("PING docs-test-end")
            got = c.readline()
            assert got in ("PONG docs-test-end", None), (
                f"{rel}:{block[-1][0]}: the daemon sent a line the doc "
                f"does not show: {got!r}")
    finally:
        c.close()


def test_transcripts_found():
    # The documents that had them keep them, wherever they moved to.
    for rel in ("README.md", "docs/protocol.md", "docs/tour.md"):
        assert transcripts(rel), f"{rel}: no {MARKER} blocks"


# ---- 2. config keys --------------------------------------------------------

def conf_keys_in_code():
    src = read_doc("daemon/conf.c")
    start = src.index("static const struct conf_key")
    table = src[start:src.index("};", start)]
    keys = re.findall(r'K_[A-Z]+\(\s*"([a-z_.]+)"', table)
    keys += re.findall(r'\.key\s*=\s*"([a-z_.]+)"', table)
    assert len(keys) > 30, "daemon/conf.c: the key table was not found"
    return set(keys)


def flatten(obj, prefix=""):
    out = {}
    for k, v in obj.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, path + "."))
        else:
            out[path] = v
    return out


def whole_file_in_docs():
    doc = read_doc("docs/configuration.md")
    m = re.search(r"^## The whole file.*?^```json\n(.*?)^```", doc,
                  re.M | re.S)
    assert m, "docs/configuration.md: no ```json block under \"The whole file\""
    return json.loads(m.group(1))


def test_config_keys_in_configuration_md():
    code = conf_keys_in_code()
    doc = read_doc("docs/configuration.md")
    body = doc[:doc.index("\n## Addresses")]
    tabled = set(re.findall(r"^\| `([a-z_][a-z_.]*)` \|", body, re.M))
    assert code - tabled == set(), "keys missing from the key tables"
    assert tabled - code == set(), "key table rows for keys the daemon lacks"
    whole = set(flatten(whole_file_in_docs()))
    assert code - whole == set(), "keys missing from \"The whole file\""
    assert whole - code == set(), "\"The whole file\" has unknown keys"


def test_config_keys_in_shipped_file(daemon_bin):
    path = os.path.join(ROOT, "conf", "redlockd.json")
    with open(path, encoding="utf-8") as f:
        shipped = json.load(f)
    keys = set(flatten(shipped))
    code = conf_keys_in_code()
    assert code - keys == set(), "keys missing from conf/redlockd.json"
    assert keys - code == set(), "conf/redlockd.json has unknown keys"
    # The page says the shipped file lists every key with its default:
    # the same file as the page's.
    assert flatten(shipped) == flatten(whole_file_in_docs()), \
        "conf/redlockd.json and docs/configuration.md's whole file differ"
    r = harness.subprocess.run([daemon_bin, "--check-config", "-c", path],
                               capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


# ---- 2. metric families ----------------------------------------------------

def families_in_code():
    """{family: type} from daemon/stats.h's tables (what metrics.c
    exports: the table's prefix, the name, "_total" for a counter) and the
    families metrics.c writes by hand."""
    src = read_doc("daemon/stats.h")
    out = {}
    for codec, prefix in (("STATS_CODEC", "redlockd_"),
                          ("STATS_NODE_CODEC", "redlockd_"),
                          ("STATS_CLASS_CODEC", "redlockd_"),
                          ("STATS_PROCESS_CODEC", "process_")):
        m = re.search(r"^#define " + codec + r"\(X\)(.*?)(?:\n\n|\n/\*)",
                      src, re.M | re.S)
        assert m, f"daemon/stats.h: no {codec}"
        rows = re.findall(r'X\(\w+, (GAUGE|COUNTER|HISTOGRAM), \w+, '
                          r'(?:\w+, )?"(\w+)"', m.group(1))
        assert rows, f"daemon/stats.h: {codec} has no rows"
        for kind, name in rows:
            fam = prefix + name + ("_total" if kind == "COUNTER" else "")
            out[fam] = kind.lower()
    for fam, kind in re.findall(r"# TYPE (\w+) (\w+)\\n",
                                read_doc("daemon/metrics.c")):
        out[fam] = kind
    return out


def test_metric_families_in_metrics_md(h):
    mport = harness.free_port()
    _, d = h.cluster(1, {"metrics": {"listen": f"127.0.0.1:{mport}"}})
    with urllib.request.urlopen(f"http://127.0.0.1:{mport}/metrics",
                                timeout=10) as r:
        body = r.read().decode()
    served = dict(re.findall(r"^# TYPE (\S+) (\S+)$", body, re.M))
    assert len(served) > 20, body[:2000]
    code = families_in_code()
    # The tables are read right: what a daemon serves is in them (some
    # families are served only at times: rejoin_in while a node recovers,
    # process_max_fds when RLIMIT_NOFILE is not unlimited).
    assert {f: t for f, t in served.items() if code.get(f) != t} == {}, \
        "served families not found in daemon/stats.h and metrics.c"
    known = {**code, **served}
    doc = read_doc("docs/metrics.md")
    tabled = dict(re.findall(
        r"^\| `((?:redlockd|process)_[a-z_]+)` \| (counter|gauge|histogram) \|",
        doc, re.M))
    missing = {f: t for f, t in known.items() if f not in tabled}
    assert missing == {}, "families missing from docs/metrics.md's tables"
    wrong = {f: (tabled[f], t) for f, t in known.items() if tabled[f] != t}
    assert wrong == {}, "documented type differs: (doc, daemon)"
    extra = set(tabled) - set(known)
    assert extra == set(), "families documented that the daemon lacks"
    # Label values are exported from the start, zeros included: every one
    # of the enumerated labels is named on the page.
    for label, where in (("command", "`command` is a command word"),
                         ("code", "`code` is an error code"),
                         ("result", "`redlockd_acquisitions_total` |"),
                         ("cause", "`redlockd_wakeups_total` |")):
        values = set(re.findall(r'\{' + label + r'="([^"]+)"\}', body))
        assert values, f"no {label} label in /metrics"
        assert where in doc, f"docs/metrics.md: no {where!r}"
        para = doc[doc.index(where):].split("\n\n", 1)[0]
        unnamed = {v for v in values if f"`{v}`" not in para}
        assert unnamed == set(), \
            f"{label} values not named in docs/metrics.md ({where!r})"
