"""Replicas sharing one registry through etcd (registry.backend: etcd), end to end: a real etcd
(Debian's etcd-server) on bind-probed loopback ports, two pdrouter processes, simulated nodes
registering over ZMQ with one replica.

  * a node registering with replica A is routable from replica B within 1 s (a real request
    through B is served by the nodes); a node's goodbye removes it everywhere;
  * three replicas: a node registered with any one is up on the other two within 1 s, and each
    replica serves a request;
  * an admin drain on A is honoured by B;
  * etcd killed: both replicas keep routing, /status and /metrics say etcd is unreachable, and
    after etcd comes back they resync (a node registered meanwhile reaches the other replica);
  * replica A killed: the entries of a node that talked to A only expire with A's lease on B;
    nodes that re-register with B (`pdnode register`) stay up on B throughout and serve;
  * a `connector: none` render node added on A (admin API) is a none node on B too: it serves
    render calls through B and is never paired for P/D there.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import unittest
import urllib.request

from pdrouter_fixture import Router, TIME_SCALE
from pdr_testlib import ProcessHandle, pdnode_path, requires
from sim_fixture import SimNode

ETCD = "/usr/bin/etcd"
KEY = "etcd-test-admin-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}


def probe_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """etcd on two free loopback ports (etcd cannot take port 0: bind-probe, retry on a clash)."""

    SCHEME = "http"

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="pdr-etcd-it-")
        self.proc = None
        self.client_port = None
        self.peer_port = None
        for _ in range(5):
            self.client_port, self.peer_port = probe_port(), probe_port()
            if self.client_port != self.peer_port and self.start():
                return
        raise AssertionError("etcd did not start:\n" + self.log())

    def log(self):
        try:
            with open(os.path.join(self.dir, "etcd.log")) as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def extra_args(self):
        """etcd flags a subclass adds (TLS)."""
        return []

    def ssl_context(self):
        """The context the health probe uses (None: plain HTTP)."""
        return None

    def start(self, timeout=20):
        client = f"{self.SCHEME}://127.0.0.1:{self.client_port}"
        peer = f"http://127.0.0.1:{self.peer_port}"
        log = open(os.path.join(self.dir, "etcd.log"), "a")
        self.proc = subprocess.Popen(
            [ETCD, "--data-dir", os.path.join(self.dir, "data"), "--listen-client-urls", client,
             "--advertise-client-urls", client, "--listen-peer-urls", peer,
             "--initial-advertise-peer-urls", peer, "--initial-cluster", "default=" + peer,
             *self.extra_args(), "--log-level", "warn"], stdout=log, stderr=log)
        log.close()
        context = self.ssl_context()
        deadline = time.monotonic() + timeout * TIME_SCALE
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.proc = None
                return False
            try:
                with urllib.request.urlopen(client + "/health", timeout=0.5, context=context) as resp:
                    if b"true" in resp.read():
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        return False

    def kill(self):
        if self.proc is not None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
            self.proc = None

    def close(self):
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


def topology(etcd, replica, prefix):
    return f"""
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
connectors:
  default: nixl
discovery:
  ttl_ms: 3000
registry:
  backend: etcd
  etcd_endpoints: ["127.0.0.1:{etcd.client_port}"]
  etcd_prefix: "{prefix}"
  replica_id: "{replica}"
  lease_ttl_s: 2
"""


def completion(router):
    body = json.dumps({"model": "sim-model", "prompt": "Hello there", "max_tokens": 2}).encode()
    return router.request("POST", "/v1/completions", body=body, timeout=10,
                          headers={"Content-Type": "application/json"})


@requires(os.access(ETCD, os.X_OK), "etcd-server")
class EtcdReplicas(unittest.TestCase):
    def setUp(self):
        self.cleanup = []
        self.etcd = Etcd()
        self.addCleanup(self.etcd.close)
        prefix = f"/pdr-it-{os.getpid()}-{time.monotonic_ns()}/"
        self.prefix = prefix
        self.a = Router(topology_yaml=topology(self.etcd, "a", prefix), env=ENV)
        self.addCleanup(self.a.stop)
        self.b = Router(topology_yaml=topology(self.etcd, "b", prefix), env=ENV)
        self.addCleanup(self.b.stop)
        for r in (self.a, self.b):
            r.wait_for(lambda r=r: r.status()["registry_backend"].get("etcd_reachable"), timeout=10)

    def node(self, role, router):
        node = SimNode("--role", role, "--connector", "nixl", "--handshake-port", "0",
                       "--notify-port", "0", "--kv-port", "0", "--kv-backends", "tcp", "--register", router.discovery,
                       "--register-interval-ms", "200")
        self.addCleanup(node.kill)
        return node

    def state_on(self, router, node):
        inst = router.instance(node.http_address)
        return None if inst is None else (inst["state"], inst["source"])

    def test_a_node_registered_with_one_replica_is_routable_from_the_other(self):
        prefill, decode = self.node("prefill", self.a), self.node("decode", self.a)
        self.a.wait_for(lambda: self.state_on(self.a, decode) == ("up", "registered")
                        and self.state_on(self.a, prefill) == ("up", "registered"), timeout=10)
        _, waited = self.b.wait_for(lambda: self.state_on(self.b, decode) == ("up", "replica")
                                    and self.state_on(self.b, prefill) == ("up", "replica"),
                                    timeout=1.0)
        self.assertLess(waited, 1.0 * TIME_SCALE)
        status = self.b.status()["registry_backend"]
        self.assertEqual((status["backend"], status["replica_id"], status["replica_entries"]),
                         ("etcd", "b", 2))
        code, _, body = completion(self.b)
        self.assertEqual(code, 200, body)
        self.assertEqual(self.b.request("GET", "/ready")[0], 200)
        # Written on change only: heartbeats every 200 ms for 1 s add no puts on A.
        puts = self.a.metrics()["pdrouter_etcd_puts_total"]
        time.sleep(1.0)  # a lower bound: nothing must happen during it
        self.assertEqual(self.a.metrics()["pdrouter_etcd_puts_total"], puts)
        # Goodbye (SIGTERM): gone on A and on B.
        decode.stop()
        self.b.wait_for(lambda: self.state_on(self.b, decode) is None, timeout=5)
        self.assertIsNone(self.state_on(self.a, decode))

    def test_three_replicas_see_a_node_registered_with_any_of_them(self):
        c = Router(topology_yaml=topology(self.etcd, "c", self.prefix), env=ENV)
        self.addCleanup(c.stop)
        c.wait_for(lambda: c.status()["registry_backend"].get("etcd_reachable"), timeout=10)
        on_a, on_c = self.node("decode", self.a), self.node("prefill", c)
        c.wait_for(lambda: self.state_on(c, on_c) == ("up", "registered"), timeout=10)
        self.a.wait_for(lambda: self.state_on(self.a, on_a) == ("up", "registered"), timeout=10)
        for r, node in ((self.b, on_a), (c, on_a), (self.a, on_c), (self.b, on_c)):
            r.wait_for(lambda r=r, node=node: self.state_on(r, node) == ("up", "replica"),
                       timeout=1.0)
        for r in (self.a, self.b, c):
            code, _, body = completion(r)
            self.assertEqual(code, 200, body)

    def test_admin_drain_on_one_replica_is_honoured_by_the_other(self):
        decode = self.node("decode", self.a)
        self.b.wait_for(lambda: self.state_on(self.b, decode) == ("up", "replica"), timeout=10)
        code, _, body = self.a.request("POST", f"/admin/instances/{decode.http_address}/drain",
                                       headers=AUTH, admin=True)
        self.assertEqual(code, 200, body)
        self.b.wait_for(lambda: self.state_on(self.b, decode) == ("draining", "replica"), timeout=5)
        code, _, body = self.a.request("POST", f"/admin/instances/{decode.http_address}/undrain",
                                       headers=AUTH, admin=True)
        self.assertEqual(code, 200, body)
        self.b.wait_for(lambda: self.state_on(self.b, decode) == ("up", "replica"), timeout=5)

    def test_etcd_killed_replicas_keep_routing_and_resync_when_it_returns(self):
        prefill, decode = self.node("prefill", self.a), self.node("decode", self.a)
        self.b.wait_for(lambda: self.state_on(self.b, decode) == ("up", "replica")
                        and self.state_on(self.b, prefill) == ("up", "replica"), timeout=10)
        self.etcd.kill()
        for r in (self.a, self.b):
            r.wait_for(lambda r=r: not r.status()["registry_backend"]["etcd_reachable"], timeout=10)
            self.assertEqual(r.metrics()["pdrouter_etcd_up"], 0)
        self.b.wait_for(lambda: self.b.status()["registry_backend"]["last_error"] != "", timeout=5)
        # B routes on its last view, A on what it learns itself.
        for r in (self.a, self.b):
            self.assertEqual(r.request("GET", "/ready")[0], 200)
            code, _, body = completion(r)
            self.assertEqual(code, 200, body)
        # A node that registers with B while etcd is down reaches A once etcd is back.
        late = self.node("decode", self.b)
        self.b.wait_for(lambda: self.state_on(self.b, late) == ("up", "registered"), timeout=10)
        self.assertTrue(self.etcd.start(), self.etcd.log())
        for r in (self.a, self.b):
            r.wait_for(lambda r=r: r.status()["registry_backend"]["etcd_reachable"], timeout=15)
        self.a.wait_for(lambda: self.state_on(self.a, late) == ("up", "replica"), timeout=10)
        self.assertEqual(self.state_on(self.b, decode), ("up", "replica"))

    def sidecar(self, node, role, router):
        """`pdnode register` for `node` with `router`: the node re-pointed at another replica."""
        proc = ProcessHandle([pdnode_path(), "register", "--router", router.discovery, "--role", role,
                              "--http-address", node.http_address, "--connector", "nixl",
                              "--interval-ms", "200"], name="pdnode-register")
        self.addCleanup(proc.stop)
        return proc

    def test_a_killed_replicas_entries_expire_and_nodes_moving_over_have_no_gap(self):
        prefill, decode = self.node("prefill", self.a), self.node("decode", self.a)
        gone = self.node("decode", self.a)  # talks to A only: really gone when A dies
        self.b.wait_for(lambda: all(self.state_on(self.b, n) == ("up", "replica")
                                    for n in (prefill, decode, gone)), timeout=10)
        # prefill and decode now (also) register with B, which takes their entries over.
        self.sidecar(prefill, "prefill", self.b)
        self.sidecar(decode, "decode", self.b)
        self.b.wait_for(lambda: self.state_on(self.b, decode) == ("up", "registered")
                        and self.state_on(self.b, prefill) == ("up", "registered"), timeout=10)
        self.a.process.send_signal(signal.SIGKILL)
        # Until A's lease (2 s) ends and takes `gone` with it, B never loses the moved nodes.
        deadline = time.monotonic() + 10 * TIME_SCALE
        while self.state_on(self.b, gone) is not None:
            self.assertLess(time.monotonic(), deadline, "A's entries outlived its lease on B")
            self.assertEqual(self.state_on(self.b, decode), ("up", "registered"))
            self.assertEqual(self.state_on(self.b, prefill), ("up", "registered"))
            time.sleep(0.05)
        code, _, body = completion(self.b)
        self.assertEqual(code, 200, body)

    def test_a_node_without_connector_added_on_one_replica_is_one_on_the_other(self):
        prefill, decode = self.node("prefill", self.a), self.node("decode", self.a)
        render = SimNode("--role", "decode", "--connector", "nixl")
        self.addCleanup(render.stop)
        address = "127.0.0.1:%d" % render.port
        # A zmq_address too: without "none" on the wire, B would infer P2P-NCCL from it.
        body = json.dumps({"role": "decode", "http_address": address, "connector": "none",
                           "zmq_address": "127.0.0.1:1", "labels": {"serves": "render"}}).encode()
        code, _, raw = self.a.request("POST", "/admin/instances", body=body, admin=True,
                                      headers={**AUTH, "Content-Type": "application/json"})
        self.assertEqual(code, 201, raw)
        self.b.wait_for(lambda: all(self.state_on(self.b, n) == ("up", "replica")
                                    for n in (prefill, decode))
                        and self.b.instance(address) is not None, timeout=10)
        for r in (self.a, self.b):
            inst = r.instance(address)
            self.assertEqual((inst["dialect"], inst["zmq_address"], inst["labels"]),
                             ("none", "127.0.0.1:1", {"serves": "render"}), r)
        self.assertEqual(self.b.instance(address)["source"], "replica")
        image_chat = json.dumps({"model": "sim-model", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            {"type": "text", "text": "What color is this image?"}]}]}).encode()
        for _ in range(3):
            code, _, raw = self.b.request("POST", "/v1/chat/completions/render", body=image_chat,
                                          timeout=10, headers={"Content-Type": "application/json"})
            self.assertEqual(code, 200, raw)
            code, _, raw = completion(self.b)
            self.assertEqual(code, 200, raw)

        def served(node, path):
            return sum(1 for r in node.sim_requests()["requests"] if r["path"] == path)
        self.assertEqual(served(render, "/v1/chat/completions/render"), 3)
        self.assertEqual(served(render, "/v1/completions"), 0)
        self.assertEqual(served(decode, "/v1/completions"), 3)

if __name__ == "__main__":
    unittest.main()
