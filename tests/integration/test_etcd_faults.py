"""A replica whose etcd calls keep failing keeps its lease: a real etcd on loopback, replica A
talking to it through a fault-injecting proxy (etcd_fault_proxy.py: every watch stream closed
0.4 s after it starts, every 3rd put answered 503), replica B talking to it directly.

Every failure stops A's keepalive timer (a lease_ttl / 3 = 1 s period) and every resync starts
it again, so with a failure every ~1 s the timer never fires: only the keepalive each resync
sends at once keeps A's lease (registry_replicator.cc, start_watch). Without it, A's 3 s lease
expires and B drops A's node.
"""

import os
import time
import unittest

from etcd_fault_proxy import EtcdFaultProxy
from pdrouter_fixture import Router, TIME_SCALE
from pdr_testlib import requires
from sim_fixture import SimNode
from test_etcd_replicas import ETCD, Etcd

LEASE_TTL_S = 3


def topology(port, replica, prefix):
    return f"""
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


if __name__ == "__main__":
    unittest.main()
