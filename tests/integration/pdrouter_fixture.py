"""A running pdrouter process for integration tests, plus ZMQ and HTTP helpers.

Starts the real binary on ephemeral ports (--http 127.0.0.1:0, --discovery tcp://127.0.0.1:0),
learns the bound addresses from its start-up line, and talks to it the way vLLM nodes and
operators do: msgpack over a ZMQ DEALER, JSON over HTTP. Every wait has a deadline.
"""
import json
import os
import re
import tempfile
import time
import urllib.error
import urllib.request

import msgpack
import zmq

from pdr_testlib import ProcessHandle, pdrouter_path

LISTENING = r"pdrouter listening http=(\S+) discovery=(\S+)"

# Upper time bounds are multiplied by this (tests/run.sh sets it per sanitizer stage); lower
# bounds never are.
TIME_SCALE = max(1.0, float(os.environ.get("PDR_TIME_SCALE", "1")))


class Router:
    """One pdrouter process. Use as a context manager, or call stop()."""

    def __init__(self, topology_yaml=None, extra_args=(), env=None, nofile=None,
                 discovery="tcp://127.0.0.1:0", ssl_context=None, admin_ssl_context=None):
        # ssl_context / admin_ssl_context: an ssl.SSLContext for the client / operator listener
        # when it speaks TLS (listeners.tls, listeners.admin_tls); request() then uses https.
        self.ssl_context = ssl_context
        self.admin_ssl_context = admin_ssl_context if admin_ssl_context is not None else ssl_context
        self.dir = tempfile.TemporaryDirectory(prefix="pdr-it-")
        self.config = None
        if topology_yaml is not None:
            self.config = os.path.join(self.dir.name, "topology.yaml")
            self.write_topology(topology_yaml)
        # discovery: a restarted router may take its predecessor's address (nodes reconnect).
        args = [pdrouter_path(), "--http", "127.0.0.1:0", "--discovery", discovery,
                "--workers", "2", "--log-level", "debug"]
        if self.config:
            args += ["--config", self.config]
        args += list(extra_args)
        if nofile is not None:
            # Soft and hard open-file limit for pdrouter alone (prlimit execs it: same pid).
            args = ["prlimit", "--nofile=%d:%d" % (nofile, nofile), "--"] + args
        self.process = ProcessHandle(args, name="pdrouter", env=env, log_dir=self.dir.name)
        line = self.process.wait_for_line(LISTENING, timeout=10 * TIME_SCALE, streams=("stdout",))
        if line is None:
            self.process.stop()
            raise RuntimeError("pdrouter did not start:\n" + self.log())
        match = re.search(LISTENING, line)
        self.http, self.discovery = match.group(1), match.group(2)
        # listeners.admin: the operator endpoints (/status, /metrics, /admin/...) live there.
        admin = re.search(r" admin=(\S+)", line)
        self.admin_http = admin.group(1) if admin else self.http
        self.ctx = zmq.Context()
        self.sockets = []  # kept open until stop(): LINGER 0 would drop unsent frames on close

    def write_topology(self, text):
        # Write then rename, as editors and config managers do.
        tmp = self.config + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.config)

    def log(self):
        return self.process.output("stderr")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self, timeout=10):
        """SIGTERM, then SIGKILL if it does not exit within `timeout` seconds (scaled: a sanitizer
        build exits slower on a busy machine). Returns the exit code."""
        if self.ctx is not None:
            for sock in self.sockets:
                sock.close(linger=0)
            self.ctx.term()
            self.ctx = None
        return self.process.stop(timeout * TIME_SCALE)

    # --- HTTP -------------------------------------------------------------------------------
    def request(self, method, path, body=None, timeout=None, headers=None, admin=False):
        """Returns (status, headers dict with lower-case names, body bytes). admin=True: on the
        operator listener (the same as the client one unless listeners.admin is set). timeout:
        seconds for the connect and each read; by default 5 scaled by PDR_TIME_SCALE (a sanitizer
        build on a busy machine answers a /metrics poll slower), a caller's own value as given."""
        if timeout is None:
            timeout = 5 * TIME_SCALE
        base = self.admin_http if admin else self.http
        context = (self.admin_ssl_context if admin and self.admin_http != self.http
                   else self.ssl_context)
        scheme = "https" if context is not None else "http"
        req = urllib.request.Request(f"{scheme}://{base}{path}", data=body, method=method,
                                     headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=context) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def status(self):
        code, _, body = self.request("GET", "/status", admin=True)
        assert code == 200, code
        return json.loads(body)

    def metrics(self):
        code, _, body = self.request("GET", "/metrics", admin=True)
        assert code == 200, code
        values = {}
        for line in body.decode().splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                values[name] = float(value)
        return values

    def instance(self, http_address):
        for inst in self.status()["instances"]:
            if inst["http_address"] == http_address:
                return inst
        return None

    @staticmethod
    def is_routable(inst):
        """Whether pairing may pick `inst` (a /status instance) now: up, not drained by the
        operator, not ejected after failed connects."""
        return (inst["state"] == "up" and not inst.get("operator_drain")
                and not inst.get("ejected_for_ms"))

    def wait_routable(self, addresses=(), prefills=0, decodes=0, timeout=10.0):
        """Waits until /status shows every one of `addresses` routable and at least `prefills`
        prefills and `decodes` decodes routable; returns {"prefill": [...], "decode": [...]}, the
        routable instances. A test that needs nodes to route to waits here, on the registry's own
        state, rather than sending as soon as the nodes started (their registration, the next
        registry snapshot and, after a failed connect, the end of an ejection all come later)."""
        wanted = set(addresses)

        def routable():
            by_role = {"prefill": [], "decode": []}
            for inst in self.status()["instances"]:
                if self.is_routable(inst):
                    by_role.setdefault(inst["role"], []).append(inst)
            listed = {i["http_address"] for group in by_role.values() for i in group}
            if (wanted <= listed and len(by_role["prefill"]) >= prefills
                    and len(by_role["decode"]) >= decodes):
                return by_role
            return None

        try:
            return self.wait_for(routable, timeout)[0]
        except AssertionError:
            raise AssertionError("not routable within %.0fs: wanted %s, %d prefill(s), %d decode(s); "
                                 "/status instances: %s" % (
                                     timeout * TIME_SCALE, sorted(wanted), prefills, decodes,
                                     [(i["role"], i["http_address"], i["state"], i.get("operator_drain"),
                                       i.get("ejected_for_ms")) for i in self.status()["instances"]]))

    def wait_for(self, predicate, timeout=5.0, interval=0.005):
        """Polls predicate() until it returns a truthy value; returns (value, seconds waited)."""
        timeout *= TIME_SCALE
        start = time.monotonic()
        while True:
            value = predicate()
            if value:
                return value, time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise AssertionError(f"condition not met within {timeout}s\n{self.log()[-4000:]}")
            time.sleep(interval)

    # --- ZMQ --------------------------------------------------------------------------------
    def dealer(self, identity=None):
        """A DEALER connected to the discovery socket, shaped like vLLM's (LINGER 0)."""
        sock = self.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDTIMEO, 1000)
        if identity is not None:
            sock.setsockopt(zmq.IDENTITY, identity.encode() if isinstance(identity, str) else identity)
        sock.connect(self.discovery)
        self.sockets.append(sock)
        return sock

    def send(self, payload, identity=None):
        """Sends one msgpack payload (dict) or raw bytes from a fresh DEALER; returns the socket."""
        sock = self.dealer(identity)
        sock.send(payload if isinstance(payload, bytes) else msgpack.packb(payload))
        return sock


def recv_with_deadline(sock, timeout=2.0):
    if sock.poll(int(timeout * 1000), zmq.POLLIN):
        return sock.recv()
    return None
