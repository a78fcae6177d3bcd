"""Trust across pdrouter replicas sharing one registry through a real etcd (Debian's etcd-server on
bind-probed loopback ports), with real ZMQ registrations:

  * a node registered over CURVE on replica A keeps its class on replica B ("curve" in B's
    /status, not "operator"), and a sender admitted by address on B can neither replace nor
    change it; when the weaker sender registered on B first, A's stronger entry replaces B's;
  * bad data under <prefix>nodes/ (a 1.2 MiB value, a value that is not a registry entry, a key
    outside the layout) is skipped and counted as bad entries on every replica: etcd stays
    "reachable", nothing fails, replication goes on, and a replica started afterwards reads its
    range past them;
  * while etcd is down, retries back off (the wait doubles) instead of one every 500 ms.
"""

import base64
import json
import os
import tempfile
import unittest
import urllib.request

import msgpack
import zmq

from pdr_testlib import ProcessHandle, free_port, pdnode_path, requires
from pdrouter_fixture import TIME_SCALE, Router, recv_with_deadline
from test_etcd_replicas import ETCD, Etcd, topology

KEY = "etcd-test-admin-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}


def ack_of(sock):
    raw = recv_with_deadline(sock, 5 * TIME_SCALE)
    assert raw is not None, "no ack"
    return msgpack.unpackb(raw)


def b64(text):
    return base64.b64encode(text if isinstance(text, bytes) else text.encode()).decode()


@requires(os.access(ETCD, os.X_OK), "etcd-server")
class EtcdTrust(unittest.TestCase):
    def setUp(self):
        self.etcd = Etcd()
        self.addCleanup(self.etcd.close)
        self.prefix = f"/pdr-trust-{os.getpid()}-{id(self)}/"
        self.keys = tempfile.mkdtemp(prefix="pdr-curve-")
        for name in ("router", "node"):
            keygen = ProcessHandle([pdnode_path(), "keygen", os.path.join(self.keys, name)], name="keygen")
            self.assertEqual(keygen.wait(10), 0, keygen.output())
        with open(os.path.join(self.keys, "clients.txt"), "w") as f, \
                open(os.path.join(self.keys, "node.pub")) as pub:
            f.write(pub.read())
        self.curve_port = free_port()
        # A also has a CURVE endpoint (its keys go in topology()'s own discovery: block).
        a_yaml = topology(self.etcd, "a", self.prefix).replace(
            "discovery:\n",
            f'listeners:\n  discovery_curve: "tcp://127.0.0.1:{self.curve_port}"\n'
            f"discovery:\n  curve:\n    secret_key_file: {self.keys}/router.key\n"
            f"    allowed_client_keys_file: {self.keys}/clients.txt\n")
        self.a = self.replica("a", a_yaml)
        self.b = self.replica("b")

    def replica(self, name, yaml=None):
        # A 10 s lease: a slow (sanitizer) run must not lose a lease between two keepalives.
        yaml = (yaml or topology(self.etcd, name, self.prefix)).replace("lease_ttl_s: 2", "lease_ttl_s: 10")
        router = Router(topology_yaml=yaml, env=ENV)
        self.addCleanup(router.stop)
        router.wait_for(lambda: router.status()["registry_backend"].get("etcd_reachable"), timeout=10)
        return router

    # --- helpers --------------------------------------------------------------------------------
    def curve_dealer(self):
        """A DEALER on A's CURVE endpoint holding the listed node key."""
        def z85(path, field):
            with open(path) as f:
                return [line.split('"')[1] for line in f if field in line][0].encode()
        sock = self.a.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.curve_serverkey = z85(os.path.join(self.keys, "router.pub"), "public-key")
        sock.curve_publickey = z85(os.path.join(self.keys, "node.pub"), "public-key")
        sock.curve_secretkey = z85(os.path.join(self.keys, "node.key"), "secret-key")
        sock.connect(f"tcp://127.0.0.1:{self.curve_port}")
        self.a.sockets.append(sock)
        return sock

    def etcd_call(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.etcd.client_port}{path}",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def etcd_put(self, key, value):
        self.etcd_call("/v3/kv/put", {"key": b64(key), "value": b64(value)})

    def node_keys(self):
        """The keys under <prefix>nodes/, relative to it."""
        head = self.prefix + "nodes/"
        end = head[:-1] + chr(ord(head[-1]) + 1)
        answer = self.etcd_call("/v3/kv/range", {"key": b64(head), "range_end": b64(end), "keys_only": True})
        return sorted(base64.b64decode(kv["key"]).decode()[len(head):] for kv in answer.get("kvs", []))

    @staticmethod
    def shown(router, address):
        inst = router.instance(address)
        return None if inst is None else (inst["source"], inst["admission"], inst["role"], inst["model"])

    @staticmethod
    def registration(address, **extra):
        return {"type": "D", "pdr_v": 1, "http_address": address, "connector": "nixl", "model": "m",
                "ttl_ms": 120000, **extra}

    def weaker_rejections(self, router):
        return router.metrics().get('pdrouter_registrations_rejected_total{reason="weaker_sender"}', 0.0)

    # --- the tests ------------------------------------------------------------------------------
    def test_a_weaker_sender_on_another_replica_cannot_replace_a_curve_node(self):
        x = "127.0.0.1:48950"
        sock = self.curve_dealer()
        sock.send(msgpack.packb(self.registration(x, epoch=5)))
        ack = ack_of(sock)
        self.assertTrue(ack["ok"], ack)
        self.assertEqual(self.shown(self.a, x), ("registered", "curve", "decode", "m"))
        self.b.wait_for(lambda: self.shown(self.b, x) is not None, timeout=5)
        # An address-admitted sender on B: pdrouter format (acked) and vLLM's MoRIIO format.
        evil = dict(self.registration(x, epoch=9), type="P", model="evil")
        ack = ack_of(self.b.send(evil))
        self.assertFalse(ack["ok"], ack)
        self.assertIn("stronger credentials", ack["reason"])
        self.b.send({"type": "P", "http_address": x, "zmq_address": "host:127.0.0.1,handshake:6301,notify:61005",
                     "dp_size": 1, "tp_size": 1, "transfer_mode": "WRITE"})
        self.b.wait_for(lambda: self.weaker_rejections(self.b) == 2)
        # B shows how A admitted it (not "operator").
        self.assertEqual(self.shown(self.b, x), ("replica", "curve", "decode", "m"))
        self.assertEqual(self.shown(self.a, x), ("registered", "curve", "decode", "m"))
        # B wrote nothing for x: a node B registers afterwards reaches A (B's writes are in
        # order), and etcd holds A's entry for x only.
        z = "127.0.0.1:48951"
        self.assertTrue(ack_of(self.b.send(self.registration(z)))["ok"])
        self.a.wait_for(lambda: self.shown(self.a, z) == ("replica", "address", "decode", "m"), timeout=5)
        self.assertEqual(self.node_keys(), [f"a/{x}", f"b/{z}"])

    def test_a_stronger_entry_replaces_a_weaker_one_registered_first_on_another_replica(self):
        y = "127.0.0.1:48952"
        # The weaker sender gets to B first: B holds it as its own, and A learns it from B.
        ack = ack_of(self.b.send(dict(self.registration(y), type="P", model="evil")))
        self.assertTrue(ack["ok"], ack)
        self.a.wait_for(lambda: (self.shown(self.a, y) or ())[2:] == ("prefill", "evil"), timeout=5)
        # The node itself registers with A over CURVE: as strong as any class, it takes A's
        # replica entry over, and B gives its weaker entry up for A's.
        sock = self.curve_dealer()
        sock.send(msgpack.packb(self.registration(y, epoch=5)))
        ack = ack_of(sock)
        self.assertTrue(ack["ok"], ack)
        self.assertEqual(self.shown(self.a, y), ("registered", "curve", "decode", "m"))
        self.b.wait_for(lambda: (self.shown(self.b, y) or ())[2:] == ("decode", "m"), timeout=5)
        self.assertEqual(self.shown(self.b, y), ("replica", "curve", "decode", "m"))
        self.b.wait_for(lambda: self.node_keys() == [f"a/{y}"], timeout=5)
        # The weaker sender's next heartbeat on B is refused.
        ack = ack_of(self.b.send(dict(self.registration(y), type="P", model="evil")))
        self.assertFalse(ack["ok"], ack)
        self.assertEqual(self.shown(self.b, y), ("replica", "curve", "decode", "m"))

    def test_bad_values_under_the_nodes_prefix_are_skipped_and_replication_goes_on(self):
        # Both replicas watch the prefix: these reach them as watch events.
        self.etcd_put(self.prefix + "nodes/zz/127.0.0.1:1", b"x" * (1200 * 1024))  # over the 1 MiB limit
        self.etcd_put(self.prefix + "nodes/zz/127.0.0.1:2", b"not a registry entry")
        self.etcd_put(self.prefix + "nodes/no-node-part", b"x")
        for r in (self.a, self.b):
            r.wait_for(lambda r=r: r.metrics()["pdrouter_etcd_bad_entries_total"] >= 3, timeout=5)
        n = "127.0.0.1:48953"
        self.assertTrue(ack_of(self.a.send(self.registration(n)))["ok"])
        self.b.wait_for(lambda: self.shown(self.b, n) == ("replica", "address", "decode", "m"), timeout=5)
        # A replica started now reads the whole prefix, bad values included, in its range.
        c = self.replica("c")
        c.wait_for(lambda: self.shown(c, n) == ("replica", "address", "decode", "m"), timeout=5)
        for r in (self.a, self.b, c):
            # (/status is rendered at most once a second per worker: wait for a fresh one.)
            backend, _ = r.wait_for(lambda r=r: (lambda b: b if b["etcd_reachable"] and b["bad_entries"] >= 3 else None)(
                r.status()["registry_backend"]))
            # No failure came from the bad data (before the fix: "range: etcd answer: value over
            # 1048576 bytes", on every replica).
            self.assertNotIn("value over", backend["last_error"], backend)
            self.assertIn("nodes/", backend["last_bad_entry"], backend)
            self.assertEqual(r.metrics()["pdrouter_etcd_up"], 1)
        self.assertIn("value over 1048576 bytes", "\n".join(r.log() for r in (self.a, self.b, c)))
        self.assertEqual(c.status()["registry_backend"]["replica_entries"], 1)

    def test_retries_back_off_while_etcd_is_down(self):
        failures = self.b.metrics()["pdrouter_etcd_failures_total"]
        self.etcd.kill()
        # The wait doubles from 0.5 s with each failure in a row: at 4 s after a handful of
        # failures (a retry every 500 ms would have failed ~8 times by then, and never waits 4 s).
        self.b.wait_for(lambda: self.b.metrics().get("pdrouter_etcd_retry_delay_seconds", 0) >= 4, timeout=15)
        self.assertLessEqual(self.b.metrics()["pdrouter_etcd_failures_total"] - failures, 6)
        self.assertFalse(self.b.status()["registry_backend"]["etcd_reachable"])
        self.assertTrue(self.etcd.start(), self.etcd.log())
        self.b.wait_for(lambda: self.b.status()["registry_backend"]["etcd_reachable"], timeout=15)
        self.assertEqual(self.b.metrics()["pdrouter_etcd_retry_delay_seconds"], 0)


if __name__ == "__main__":
    unittest.main()
