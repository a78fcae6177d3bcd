"""Helpers shared by pdrouter's integration tests (run by /usr/bin/python3 under CTest).

Everything here waits with a deadline and wakes on the event itself (condition variables, zmq poll),
never on a fixed sleep:
  * binaries: locate pdrouter / pdnode from $PDR_BIN_DIR;
  * ProcessHandle: start a command, capture stdout/stderr to files, wait for a log line, stop it;
  * FakeRouter: a ZMQ ROUTER on an ephemeral loopback port that receives discovery messages;
  * HealthServer: an HTTP server on an ephemeral port whose /health status the test switches;
  * free_port, http_get: small network utilities;
  * doc_files, doc_text, doc_blocks: the user documentation (README.md and docs/*.md) the tests
    check against the binaries.
"""

import atexit
import functools
import http.client
import http.server
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import weakref
import time

import msgpack
import zmq

# ---------------------------------------------------------------------------------------------
# Binaries


def bin_dir():
    """Directory of the pdrouter binary, from $PDR_BIN_DIR (set by CTest)."""
    path = os.environ.get("PDR_BIN_DIR")
    if not path:
        raise RuntimeError("PDR_BIN_DIR is not set (run through ctest, or export it)")
    return path


def find_binary(name, candidates):
    """First existing executable among `candidates` (paths relative to bin_dir())."""
    for relative in candidates:
        path = os.path.normpath(os.path.join(bin_dir(), relative))
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise RuntimeError("cannot find %s; looked in %s" % (
        name, ", ".join(os.path.normpath(os.path.join(bin_dir(), c)) for c in candidates)))


def requires(available, what):
    """Decorator of a test class or method that needs a tool the test machine must have (etcd,
    Prometheus, the openssl CLI): without it the test FAILS, saying what to install. It never
    skips: deploy/install-deps.sh --tests installs every such tool, and a skipped test would let a
    machine that lacks one look green. (Only hardware tests skip themselves.)"""
    def decorate(obj):
        if available:
            return obj
        message = "%s is not installed: run deploy/install-deps.sh --tests" % what
        if isinstance(obj, type):
            def fail_class(cls):
                raise AssertionError(message)
            obj.setUpClass = classmethod(fail_class)
            return obj

        @functools.wraps(obj)
        def fail(*args, **kwargs):
            raise AssertionError(message)
        return fail
    return decorate


def pdrouter_path():
    return find_binary("pdrouter", ["pdrouter"])


def pdnode_path():
    # $PDR_NODE_BIN: another build's pdnode (tests/run.sh's TSan stage runs the simulated nodes
    # from the release build). Else pdrouter lives in <build>/router, pdnode in <build>/node; also
    # accept a flat install.
    if os.environ.get("PDR_NODE_BIN"):
        return os.environ["PDR_NODE_BIN"]
    return find_binary("pdnode", ["../node/pdnode", "pdnode", "node/pdnode"])


def pdrouter_bench_path():
    if os.environ.get("PDR_BENCH_BIN"):  # as $PDR_NODE_BIN
        return os.environ["PDR_BENCH_BIN"]
    return find_binary("pdrouter-bench", ["../bench/loadgen/pdrouter-bench", "pdrouter-bench",
                                          "bench/loadgen/pdrouter-bench"])


# The endpoint lines of `pdrouter --help`, rendered from the route table (router/route_table.cc):
# "  METHOD  PATH  LISTENER  what".
HELP_ROUTE = re.compile(r"^  ([A-Z]+) +(/\S*) +(client|admin|both) +\S")


def pdrouter_help_routes():
    """[(method, path, listener)] of every route `pdrouter --help` lists, in its order."""
    done = subprocess.run([pdrouter_path(), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    routes = [m.groups() for m in map(HELP_ROUTE.match, done.stdout.splitlines()) if m]
    assert routes, done.stdout
    return routes


def allow_by_path(routes):
    """{path: "GET, HEAD, POST"} from pdrouter_help_routes(): the Allow header each path's 405
    carries (HEAD is served wherever GET is, and named right after it)."""
    allow = {}
    for method, path, _ in routes:
        if method == "GET":
            method = "GET, HEAD"
        allow[path] = allow[path] + ", " + method if path in allow else method
    return allow


# ---------------------------------------------------------------------------------------------
# The user documentation: README.md and docs/*.md (not docs/design/, the developers' notes)

REPO_ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def doc_files():
    """Paths relative to the repository of README.md, then docs/*.md in name order."""
    docs = os.path.join(REPO_ROOT, "docs")
    names = sorted(n for n in os.listdir(docs) if n.endswith(".md")) if os.path.isdir(docs) else []
    return ["README.md"] + ["docs/" + n for n in names]


def doc_file_text(relative):
    with open(os.path.join(REPO_ROOT, relative), encoding="utf-8") as f:
        return f.read()


def doc_text():
    """README.md and docs/*.md as one text, each file starting on a line of its own."""
    return "\n".join(doc_file_text(name).rstrip("\n") + "\n" for name in doc_files())


class DocLine(int):
    """A line number in one documentation file: an int (arithmetic keeps the file) that prints
    as FILE:LINE, so a failure names where the text is."""

    def __new__(cls, number, path):
        line = super().__new__(cls, number)
        line.path = path
        return line

    def __add__(self, other):
        return DocLine(int(self) + other, self.path)

    __radd__ = __add__

    def __str__(self):
        return "%s:%d" % (self.path, int(self))

    __repr__ = __str__

    def source_line(self):
        return doc_file_text(self.path).splitlines()[int(self) - 1]


def doc_blocks(language):
    """[(DocLine of the opening fence, body)] of every ```<language> fenced block in the
    documentation, file by file in doc_files() order."""
    blocks = []
    for name in doc_files():
        body, start, fence = None, 0, None
        for number, line in enumerate(doc_file_text(name).splitlines(True), 1):
            if body is None:
                m = re.match(r"```(\w*)\s*$", line)
                if m:
                    fence, body, start = m.group(1), [], DocLine(number, name)
            elif line.startswith("```"):
                if fence == language:
                    blocks.append((start, "".join(body)))
                body = None
            else:
                body.append(line)
    return blocks


# ---------------------------------------------------------------------------------------------
# Network utilities


def free_port(host="127.0.0.1"):
    """A TCP port that was free a moment ago. Prefer binding to port 0 where the program allows."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def http_get(host, port, path, timeout=2.0, headers=None):
    """GET http://host:port/path; returns (status, body bytes). Raises OSError on network errors."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# Processes


# Every ProcessHandle not yet garbage; at exit, a child still running is a test's leak: it is
# killed (a leaked node keeps registering with, and taking traffic from, whatever reuses its
# router's port) and named on stderr so the leak can be found.
_LIVE_HANDLES = weakref.WeakSet()


@atexit.register
def _kill_leaked_children():
    for handle in list(_LIVE_HANDLES):
        if handle.proc.poll() is None:
            sys.stderr.write("pdr_testlib: %s (pid %d) was left running; killed: %s\n"
                             % (handle.name, handle.proc.pid, " ".join(handle.args)))
            handle.proc.kill()
            handle.proc.wait()


class ProcessHandle:
    """A child process whose stdout/stderr are captured line by line into files.

    Reader threads copy each stream to <log_dir>/<name>.stdout|.stderr and keep the lines in memory,
    so a test can wait for a line matching a regex with a deadline. Use as a context manager, or
    call stop() in tearDown: a test never leaves a process behind.
    """

    def __init__(self, args, name="proc", env=None, log_dir=None):
        self.args = list(args)
        self.name = name
        self.log_dir = log_dir or tempfile.mkdtemp(prefix="pdr-%s-" % name)
        self.lines = {"stdout": [], "stderr": []}
        self._cond = threading.Condition()
        self._closed = {"stdout": False, "stderr": False}
        full_env = dict(os.environ)
        full_env.update(env or {})
        self.proc = subprocess.Popen(self.args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, env=full_env)
        self._readers = [
            threading.Thread(target=self._pump, args=(stream, self.proc.stdout if stream == "stdout"
                                                     else self.proc.stderr), daemon=True)
            for stream in ("stdout", "stderr")
        ]
        for reader in self._readers:
            reader.start()
        _LIVE_HANDLES.add(self)

    def log_path(self, stream):
        return os.path.join(self.log_dir, "%s.%s" % (self.name, stream))

    def _pump(self, stream, pipe):
        with open(self.log_path(stream), "w", encoding="utf-8") as out:
            for raw in iter(pipe.readline, b""):
                line = raw.decode("utf-8", "replace").rstrip("\n")
                out.write(line + "\n")
                out.flush()
                with self._cond:
                    self.lines[stream].append(line)
                    self._cond.notify_all()
        pipe.close()
        with self._cond:
            self._closed[stream] = True
            self._cond.notify_all()

    def wait_for_line(self, pattern, timeout, streams=("stdout", "stderr"), start=None):
        """First line (from index `start[stream]`, default 0) matching `pattern`, or None when the
        deadline passes or the streams close first."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = dict((s, (start or {}).get(s, 0)) for s in streams)
        with self._cond:
            while True:
                for stream in streams:
                    lines = self.lines[stream]
                    for line in lines[seen[stream]:]:
                        if regex.search(line):
                            return line
                    seen[stream] = len(lines)
                if all(self._closed[s] for s in streams):
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(left)

    def mark(self):
        """Current line counts, to pass as `start` so a later wait only sees newer lines."""
        with self._cond:
            return dict((s, len(v)) for s, v in self.lines.items())

    def output(self, stream="stderr"):
        with self._cond:
            return "\n".join(self.lines[stream])

    def send_signal(self, signum):
        if self.proc.poll() is None:
            self.proc.send_signal(signum)

    def wait(self, timeout):
        """Exit code, or None if still running after `timeout` seconds."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None
        for reader in self._readers:
            reader.join(timeout=2)
        return code

    def stop(self, timeout=5.0):
        """SIGTERM, then SIGKILL after `timeout`; returns the exit code."""
        if self.proc.poll() is None:
            self.send_signal(signal.SIGTERM)
            code = self.wait(timeout)
            if code is not None:
                return code
            self.proc.kill()
        return self.wait(timeout)

    @property
    def returncode(self):
        return self.proc.poll()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
        return False


# ---------------------------------------------------------------------------------------------
# Fake peers


class FakeRouter:
    """The router side of discovery: a ZMQ ROUTER bound to tcp://127.0.0.1:<ephemeral>.

    accept: None, or a predicate on a decoded payload; receive() then skips the messages it
    refuses (counted in `skipped`). The ephemeral port may be one that a node of another test,
    whose router has gone, still reconnects to every 100 ms (ZMQ does): its heartbeats arrive
    here too, and a test that expects its own node's messages should accept only those."""

    def __init__(self, accept=None):
        self.accept = accept
        self.skipped = 0
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind("tcp://127.0.0.1:*")
        self.endpoint = self.socket.getsockopt_string(zmq.LAST_ENDPOINT)
        self.poller = zmq.Poller()
        self.poller.register(self.socket, zmq.POLLIN)

    def receive_frames(self, timeout):
        """Next multipart message as a list of bytes frames, or None after `timeout` seconds."""
        if not self.poller.poll(max(0, int(timeout * 1000))):
            return None
        return self.socket.recv_multipart()

    def receive(self, timeout):
        """Next message as (identity, decoded msgpack payload), or None after `timeout` seconds.
        Asserts the [identity, payload] shape every discovery sender produces."""
        deadline = time.monotonic() + timeout
        while True:
            frames = self.receive_frames(deadline - time.monotonic())
            if frames is None:
                return None
            if len(frames) != 2:
                raise AssertionError("expected [identity, payload], got %d frames" % len(frames))
            payload = msgpack.unpackb(frames[1], raw=False)
            if self.accept is None or self.accept(payload):
                return frames[0], payload
            self.skipped += 1

    def receive_until(self, predicate, timeout):
        """First decoded payload satisfying `predicate` within `timeout` seconds, or None."""
        deadline = time.monotonic() + timeout
        while True:
            message = self.receive(deadline - time.monotonic())
            if message is None:
                return None
            if predicate(message[1]):
                return message[1]

    def drain(self, quiet):
        """Receives until `quiet` seconds pass with nothing; returns how many arrived."""
        count = 0
        while self.receive_frames(quiet) is not None:
            count += 1
        return count

    def close(self):
        self.socket.close(0)
        self.context.term()


class HealthServer:
    """HTTP server on 127.0.0.1:<ephemeral> answering GET /health with a switchable status (as a
    vLLM node does: 200 when the engine is alive). Other paths answer 404."""

    def __init__(self, status=200):
        self.status = status
        self.requests = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                owner.requests += 1
                code = owner.status if self.path == "/health" else 404
                self.send_response(code)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.address = "127.0.0.1:%d" % self.port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def set_status(self, status):
        self.status = status

    def close(self):
        self.server.shutdown()
        self.server.server_close()
