"""A running pdrouter process for integration tests, plus ZMQ and HTTP helpers.

Starts the real binary on ephemeral ports (--http 127.0.0.1:0, --discovery tcp://127.0.0.1:0),
learns the bound addresses from its start-up line, and talks to it the way vLLM nodes and
operators do: msgpack over a ZMQ DEALER, JSON over HTTP. Every wait has a deadline.
"""
import json
import os
import re
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import msgpack
import zmq

LISTENING = re.compile(rb"pdrouter listening http=(\S+) discovery=(\S+)")


def binary(name):
    """Path of a built binary: PDR_BIN_DIR holds pdrouter; pdnode sits in ../node."""
    bin_dir = os.environ.get("PDR_BIN_DIR")
    if not bin_dir:
        raise RuntimeError("PDR_BIN_DIR is not set (run through ctest)")
    for candidate in (os.path.join(bin_dir, name), os.path.join(bin_dir, "..", "node", name)):
        if os.access(candidate, os.X_OK):
            return os.path.abspath(candidate)
    raise RuntimeError(f"{name} not found near {bin_dir}")


class Router:
    """One pdrouter process. Use as a context manager."""

    def __init__(self, topology_yaml=None, extra_args=()):
        self.dir = tempfile.TemporaryDirectory(prefix="pdr-it-")
        self.config = None
        if topology_yaml is not None:
            self.config = os.path.join(self.dir.name, "topology.yaml")
            self.write_topology(topology_yaml)
        args = [binary("pdrouter"), "--http", "127.0.0.1:0", "--discovery", "tcp://127.0.0.1:0",
                "--workers", "2", "--log-level", "debug"]
        if self.config:
            args += ["--config", self.config]
        args += list(extra_args)
        self.stderr_path = os.path.join(self.dir.name, "stderr.log")
        self.stderr = open(self.stderr_path, "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.stderr)
        line = self._read_start_line(deadline=time.monotonic() + 10)
        match = LISTENING.search(line)
        if not match:
            self.stop()
            raise RuntimeError(f"pdrouter did not start: {line!r}\n{self.log()}")
        self.http = match.group(1).decode()
        self.discovery = match.group(2).decode()
        self.ctx = zmq.Context()
        self.sockets = []  # kept open until stop(): LINGER 0 would drop unsent frames on close

    def _read_start_line(self, deadline):
        # stdout carries exactly one line; block on it with a deadline via select.
        import select
        buf = b""
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            chunk = os.read(self.proc.stdout.fileno(), 4096)
            if not chunk:
                break
            buf += chunk
            if b"\n" in buf:
                return buf
        return buf

    def write_topology(self, text):
        # Write then rename, as editors and config managers do.
        tmp = self.config + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, self.config)

    def log(self):
        self.stderr.flush()
        with open(self.stderr_path, "rb") as f:
            return f.read().decode(errors="replace")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    def stop(self, timeout=10):
        """SIGTERM, wait; SIGKILL if it does not exit in time. Returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if hasattr(self, "ctx"):
            for sock in self.sockets:
                sock.close(linger=0)
            self.ctx.term()
        self.proc.stdout.close()
        self.stderr.close()
        return self.proc.returncode

    # --- HTTP -------------------------------------------------------------------------------
    def request(self, method, path, body=None, timeout=5):
        """Returns (status, headers dict with lower-case names, body bytes)."""
        req = urllib.request.Request(f"http://{self.http}{path}", data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def status(self):
        code, _, body = self.request("GET", "/status")
        assert code == 200, code
        return json.loads(body)

    def metrics(self):
        code, _, body = self.request("GET", "/metrics")
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

    def wait_for(self, predicate, timeout=5.0, interval=0.005):
        """Polls predicate() until it returns a truthy value; returns (value, seconds waited)."""
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
