"""etcd faults between replica A and a real etcd on loopback (A talks to it through
etcd_fault_proxy.py, replica B directly):

  * A's etcd calls keep failing (every watch stream closed 0.4 s after it starts, every 3rd put
    answered 503) and A keeps its lease;
  * A's watch is slow (2 s late): another replica's take of a conversation entry, and its newer
    entry, reach A after A stored a newer one of its own, and A keeps its own.

A's lease:
Every failure stops A's keepalive timer (a lease_ttl / 3 = 1 s period) and every resync starts
it again, so with a failure every ~1 s the timer never fires: only the keepalive each resync
sends at once keeps A's lease (registry_replicator.cc, start_watch). Without it, A's 3 s lease
expires and B drops A's node.
"""

import base64
import json
import os
import time
import unittest
import urllib.request

from etcd_fault_proxy import EtcdFaultProxy
from pdrouter_fixture import Router, TIME_SCALE
from pdr_testlib import requires
from sim_fixture import SimNode
from test_etcd_replicas import ETCD, Etcd

LEASE_TTL_S = 3


def topology(port, replica, prefix, multi_turn=False):
    return f"""
multi_turn:
  enabled: {"true" if multi_turn else "false"}
connectors:
  default: nixl
discovery:
  ttl_ms: 3000
registry:
  backend: etcd
  etcd_endpoints: ["127.0.0.1:{port}"]
  etcd_prefix: "{prefix}"
  replica_id: "{replica}"
  lease_ttl_s: {LEASE_TTL_S}
"""


@requires(os.access(ETCD, os.X_OK), "etcd-server")
class EtcdFaults(unittest.TestCase):
    def setUp(self):
        self.etcd = Etcd()
        self.addCleanup(self.etcd.close)
        self.proxy = EtcdFaultProxy(self.etcd.client_port, put_fail_every=3, watch_close_after_s=0.4)
        self.addCleanup(self.proxy.close)
        prefix = f"/pdr-faults-{os.getpid()}-{time.monotonic_ns()}/"
        self.a = Router(topology_yaml=topology(self.proxy.port, "a", prefix))
        self.addCleanup(self.a.stop)
        self.b = Router(topology_yaml=topology(self.etcd.client_port, "b", prefix))
        self.addCleanup(self.b.stop)
        self.b.wait_for(lambda: self.b.status()["registry_backend"].get("etcd_reachable"), timeout=10)

    def state_on(self, router, node):
        inst = router.instance(node.http_address)
        return None if inst is None else (inst["state"], inst["source"])

    def test_a_replica_whose_etcd_calls_keep_failing_never_loses_its_lease(self):
        nodes = []
        for role in ("prefill", "decode"):
            node = SimNode("--role", role, "--connector", "nixl", "--register", self.a.discovery,
                           "--register-interval-ms", "200")
            self.addCleanup(node.kill)
            nodes.append(node)
        self.b.wait_for(lambda: all(self.state_on(self.b, n) == ("up", "replica") for n in nodes),
                        timeout=20)
        before = self.a.metrics()
        proxy_before = self.proxy.counters()
        # Several lease TTLs of failures; B must see A's nodes throughout (a lost lease deletes
        # them in etcd, and B with them).
        deadline = time.monotonic() + 4 * LEASE_TTL_S
        while time.monotonic() < deadline:
            for n in nodes:
                self.assertEqual(self.state_on(self.b, n), ("up", "replica"),
                                 "A's lease was lost: %r" % self.a.status()["registry_backend"])
            time.sleep(0.1)  # a poll period, not a synchronisation
        after = self.a.metrics()
        proxy_after = self.proxy.counters()
        self.assertEqual(after["pdrouter_etcd_leases_lost_total"], 0)
        self.assertEqual(after["pdrouter_etcd_lease_grants_total"], 1)
        # The faults did happen, several per lease TTL (fewer on a very loaded machine).
        closed = proxy_after["watches_closed"] - proxy_before["watches_closed"]
        self.assertGreaterEqual(closed, 4 / TIME_SCALE, proxy_after)
        self.assertGreaterEqual(after["pdrouter_etcd_failures_total"] - before["pdrouter_etcd_failures_total"],
                                4 / TIME_SCALE)
        self.assertGreater(after["pdrouter_etcd_keepalives_total"], before["pdrouter_etcd_keepalives_total"])
        self.assertGreaterEqual(proxy_after["puts"], 2)


@requires(os.access(ETCD, os.X_OK), "etcd-server")
class EtcdSlowWatch(unittest.TestCase):
    DELAY_S = 2.0 * TIME_SCALE

    def setUp(self):
        self.etcd = Etcd()
        self.addCleanup(self.etcd.close)
        self.proxy = EtcdFaultProxy(self.etcd.client_port, watch_delay_s=self.DELAY_S)
        self.addCleanup(self.proxy.close)
        self.prefix = f"/pdr-slow-{os.getpid()}-{time.monotonic_ns()}/"
        self.a = Router(topology_yaml=topology(self.proxy.port, "a", self.prefix, multi_turn=True))
        self.addCleanup(self.a.stop)
        self.b = Router(topology_yaml=topology(self.etcd.client_port, "b", self.prefix, multi_turn=True))
        self.addCleanup(self.b.stop)
        self.nodes = [SimNode("--role", role, "--connector", "nixl", "--handshake-port", "0", "--notify-port", "0",
                              "--kv-port", "0", "--kv-backends", "tcp", "--bidirectional-kv-xfer",
                              "--register", self.a.discovery, "--register-interval-ms", "200")
                      for role in ("prefill", "decode")]
        for n in self.nodes:
            self.addCleanup(n.kill)
        for r in (self.a, self.b):
            r.wait_for(lambda r=r: all((r.instance(n.http_address) or {}).get("state") == "up" for n in self.nodes)
                       and r.request("GET", "/ready")[0] == 200
                       and r.status()["registry_backend"].get("etcd_reachable"), timeout=15 + self.DELAY_S)

    def ok_turn(self, router, text):
        body = json.dumps({"model": "sim-model", "conversation_id": "conv-x", "max_tokens": 3,
                           "messages": [{"role": "user", "content": text}]}).encode()
        code, _, raw = router.request("POST", "/v1/chat/completions", body=body, timeout=10,
                                      headers={"Content-Type": "application/json"})
        self.assertEqual(code, 200, raw)

    def wait_metric(self, router, name, value):
        router.wait_for(lambda: router.metrics()[name] == value, timeout=10 + self.DELAY_S)

    def entries(self, router):
        return router.status()["registry_backend"]["conversation_entries"]

    def test_a_late_take_of_another_replica_never_removes_a_newer_local_entry(self):
        self.ok_turn(self.a, "turn 1")  # A stores X
        self.wait_metric(self.a, "pdrouter_etcd_conversation_puts_total", 1)
        self.wait_metric(self.b, "pdrouter_multi_turn_entries", 1)
        self.ok_turn(self.b, "turn 2 on B")  # B takes X (deletes it) and stores its own X
        self.wait_metric(self.b, "pdrouter_etcd_conversation_puts_total", 1)
        # A's watch has not shown B's take yet: A still holds X, takes it (the documented race:
        # a recompute at worst) and stores a newer X of its own, before the late events arrive.
        self.ok_turn(self.a, "turn 2 on A")
        self.wait_metric(self.a, "pdrouter_etcd_conversation_puts_total", 2)
        self.wait_metric(self.a, "pdrouter_etcd_conversation_deletes_total", 1)
        # A marker behind every one of those events on A's watch: a value A rejects and counts.
        # Once counted, A has applied B's delete and put and its own take's delete, all older
        # than its last put.
        key = self.prefix + "conversations/bWFya2Vy"  # id "marker"
        body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                           "value": base64.b64encode(b"{not json").decode()}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.etcd.client_port}/v3/kv/put", data=body,
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            self.assertEqual(resp.status, 200)
        self.wait_metric(self.a, "pdrouter_etcd_conversation_rejected_total", 1)
        self.assertEqual(self.a.metrics()["pdrouter_multi_turn_entries"], 1)
        self.a.wait_for(lambda: self.entries(self.a) == {"local": 1, "mirrored": 0}, timeout=5)
        # B's delete and put, and A's own take's delete: older than A's last put.
        self.assertGreaterEqual(self.a.metrics()["pdrouter_etcd_conversation_stale_total"], 2)
        # etcd holds A's entry, and B mirrors it.
        self.b.wait_for(lambda: self.entries(self.b) == {"local": 0, "mirrored": 1}, timeout=10)


if __name__ == "__main__":
    unittest.main()
