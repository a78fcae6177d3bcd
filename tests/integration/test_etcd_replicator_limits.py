"""The etcd registry replicator's two safety limits, against a real etcd (Debian's etcd-server)
on bind-probed loopback ports, and one pdrouter with registry.backend: etcd.

  * a burst: 1,000 static instances published at once all land in etcd, with never more than
    256 puts in flight (pdrouter_etcd_inflight_max: exactly 256, so the cap was reached);
  * "lease not found": the replica's lease revoked through etcd's own API (POST
    /v3/lease/revoke); the replica notices (on its next put, from etcd's gRPC code NotFound, or on
    its next keepalive), is granted a new lease and writes every entry again on it
    (pdrouter_etcd_leases_lost_total, pdrouter_etcd_lease_grants_total), instead of retrying on
    the dead lease.
"""

import base64
import json
import os
import time
import unittest
import urllib.request

from pdr_testlib import requires
from pdrouter_fixture import Router
from test_etcd_replicas import ETCD, Etcd

KEY = "etcd-limits-admin-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}


def b64(text):
    return base64.b64encode(text.encode()).decode()


def prefix_end(prefix):
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def static_instances(count):
    """`count` instances on loopback addresses nothing listens on (static: never probed)."""
    lines = ["instances:"]
    for i in range(count):
        role = "prefill" if i % 2 == 0 else "decode"
        lines.append(f'  - {{role: {role}, http_address: "127.3.{i // 250}.{i % 250 + 1}:8000"}}')
    return "\n".join(lines) + "\n"


def topology(etcd, prefix, lease_ttl_s, instances):
    return f"""
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
connectors:
  default: nixl
registry:
  backend: etcd
  etcd_endpoints: ["127.0.0.1:{etcd.client_port}"]
  etcd_prefix: "{prefix}"
  replica_id: "a"
  lease_ttl_s: {lease_ttl_s}
{static_instances(instances)}"""


@requires(os.access(ETCD, os.X_OK), "etcd-server")
class ReplicatorLimits(unittest.TestCase):
    def setUp(self):
        self.etcd = Etcd()
        self.addCleanup(self.etcd.close)
        self.prefix = f"/pdr-limits-{os.getpid()}-{time.monotonic_ns()}/"

    def etcd_call(self, path, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.etcd.client_port}{path}",
                                     data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())

    def own_keys(self):
        """{node key: lease id} of replica a's keys in etcd."""
        head = self.prefix + "nodes/a/"
        answer = self.etcd_call("/v3/kv/range", {"key": b64(head), "range_end": b64(prefix_end(head))})
        return {base64.b64decode(kv["key"]).decode()[len(head):]: kv.get("lease", "0")
                for kv in answer.get("kvs", [])}

    def start_router(self, lease_ttl_s, instances):
        router = Router(topology(self.etcd, self.prefix, lease_ttl_s, instances), env=ENV)
        self.addCleanup(router.dir.cleanup)
        self.addCleanup(router.stop)
        router.wait_for(lambda: router.status()["registry_backend"].get("etcd_reachable"), timeout=10)
        return router

    def test_a_burst_of_entries_lands_with_at_most_256_puts_in_flight(self):
        count = 1000
        router = self.start_router(10, count)
        router.wait_for(lambda: len(self.own_keys()) == count, timeout=60, interval=0.2)
        router.wait_for(lambda: router.metrics()["pdrouter_etcd_inflight"] == 0, timeout=30)
        metrics = router.metrics()
        self.assertGreaterEqual(metrics["pdrouter_etcd_puts_total"], count)
        self.assertEqual(metrics["pdrouter_etcd_inflight_max"], 256, metrics)
        # Every key is on the replica's one lease.
        self.assertEqual(len(set(self.own_keys().values())), 1)

    def revoke(self, lease):
        self.etcd_call("/v3/lease/revoke", {"ID": lease})
        # Revoking deletes every key on the lease.
        self.assertEqual(self.own_keys(), {})

    def wait_rewritten(self, router, old_lease, nodes):
        def rewritten():
            keys = self.own_keys()
            leases = set(keys.values())
            return len(keys) == nodes and len(leases) == 1 and old_lease not in leases
        router.wait_for(rewritten, timeout=20, interval=0.1)
        metrics = router.metrics()
        self.assertEqual(metrics["pdrouter_etcd_leases_lost_total"], 1)
        self.assertEqual(metrics["pdrouter_etcd_lease_grants_total"], 2)

    def test_a_put_on_a_revoked_lease_gets_a_new_lease_and_everything_rewritten(self):
        # lease_ttl_s 60: keepalives every 20 s, so the put below finds the lease gone first.
        router = self.start_router(60, 3)
        router.wait_for(lambda: len(self.own_keys()) == 3, timeout=10)
        (lease,) = set(self.own_keys().values())
        self.assertEqual(router.metrics()["pdrouter_etcd_lease_grants_total"], 1)
        self.revoke(lease)
        body = json.dumps({"role": "decode", "http_address": "127.3.9.1:8000", "connector": "nixl"}).encode()
        code, _, answer = router.request("POST", "/admin/instances", body=body, admin=True,
                                         headers={"Authorization": f"Bearer {KEY}",
                                                  "Content-Type": "application/json"})
        self.assertIn(code, (200, 201), answer)
        self.wait_rewritten(router, lease, 4)
        # Found by the put's answer (etcd's gRPC code 5, NotFound), not by a keepalive.
        self.assertIn("etcd registry: lease", router.log())
        self.assertIn("put: etcd: etcdserver: requested lease not found", router.log())

    def test_a_keepalive_of_a_revoked_lease_gets_a_new_lease_and_everything_rewritten(self):
        # lease_ttl_s 3: a keepalive every second finds the lease gone; nothing changes locally.
        router = self.start_router(3, 3)
        router.wait_for(lambda: len(self.own_keys()) == 3, timeout=10)
        (lease,) = set(self.own_keys().values())
        self.revoke(lease)
        self.wait_rewritten(router, lease, 3)
        self.assertIn("lease keepalive", router.log())


if __name__ == "__main__":
    unittest.main()
