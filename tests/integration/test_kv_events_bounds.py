"""KV events subscriber bounds against a real pdrouter (kv_events.enabled, default bounds); a node's
KV events publisher is untrusted input:

  * 3,000 sequence gaps in a row are counted, but logged a few lines a second;
  * one registration with dp_size 1024 gets a capped number of subscriptions, and a node
    registered after it is still subscribed.

(A node flooding large batches: test_kv_events_flood.py.)
"""
import re
import time
import unittest

import msgpack
import zmq

from pdrouter_fixture import TIME_SCALE, Router

KEY = "kv-events-bounds-test-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
WAIT_S = 15.0

TOPOLOGY = """
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
kv_events:
  enabled: true
instances: []
"""


def publisher(ctx, sndhwm=1000):
    """vLLM's per-rank publisher, played by the test: an XPUB (so the test can wait for pdrouter's
    subscription) on an ephemeral loopback port. SNDHWM is set before bind: connections take the
    bind's options."""
    sock = ctx.socket(zmq.XPUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.bind("tcp://127.0.0.1:0")
    return sock, sock.getsockopt(zmq.LAST_ENDPOINT).decode()


class KvEventsGapLogTest(unittest.TestCase):
    def setUp(self):
        self.router = Router(TOPOLOGY, env=ENV)
        self.addCleanup(self.router.dir.cleanup)
        self.addCleanup(self.router.stop)
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)

    def test_a_gap_flood_is_logged_a_few_lines_a_second(self):
        """3,000 gaps in a row (every other seq missing, no replay socket): each drops the rank's
        entries and is counted, but the log gets a few lines a second (proto/base/log_limiter.h), not
        one line per gap."""
        sock, endpoint = publisher(self.ctx, sndhwm=0)  # queue here, drop nothing
        self.addCleanup(sock.close, 0)
        node = "127.0.0.1:18672"
        self.router.send({"type": "D", "http_address": node, "pdr_v": 1, "connector": "nixl",
                          "dp_size": 1, "kv_events_endpoint": endpoint, "ttl_ms": 120000})
        self.assertTrue(sock.poll(int(WAIT_S * TIME_SCALE * 1000), zmq.POLLIN), "never subscribed")
        self.assertEqual(sock.recv(), b"\x01")
        gaps = 3000
        for i in range(gaps + 1):
            sock.send_multipart([b"", (2 * i).to_bytes(8, "big"),
                                 msgpack.packb([time.time(), [["BlockStored", [i + 1], None,
                                                               [1, 2, 3, 4], 4]], 0])])
        self.router.wait_for(
            lambda: self.router.metrics().get("pdrouter_kv_events_gaps_total") == gaps, WAIT_S)
        lines = len(re.findall(r"missed: the rank's entries dropped", self.router.log()))
        self.assertGreaterEqual(lines, 1)
        self.assertLessEqual(lines, 100, f"{lines} log lines for {gaps} gaps")


class KvEventsRankCapTest(unittest.TestCase):
    def test_a_huge_dp_size_cannot_lock_out_later_nodes(self):
        """A registration with dp_size 1024 used to take libzmq's 1,023 sockets: a node registered
        after it was never subscribed (and never retried). Now it gets max_ranks_per_node (64)."""
        router = Router(TOPOLOGY, env=ENV)
        self.addCleanup(router.dir.cleanup)
        self.addCleanup(router.stop)
        attacker = "127.0.0.1:18681"
        # Ports 30000..31023 need no listener: a SUB socket connects in the background.
        router.send({"type": "D", "http_address": attacker, "pdr_v": 1, "connector": "nixl",
                     "dp_size": 1024, "kv_events_endpoint": "tcp://127.0.0.1:30000",
                     "ttl_ms": 120000})
        router.wait_for(lambda: ((router.instance(attacker) or {}).get("kv_events") or {})
                        .get("subscribed_ranks"), WAIT_S)

        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, 0)
        pub, endpoint = publisher(ctx)
        self.addCleanup(pub.close, 0)
        node = "127.0.0.1:18682"
        router.send({"type": "D", "http_address": node, "pdr_v": 1, "connector": "nixl",
                     "dp_size": 1, "kv_events_endpoint": endpoint, "ttl_ms": 120000})
        subscribed = pub.poll(int(WAIT_S * TIME_SCALE * 1000), zmq.POLLIN)
        kv = router.instance(attacker)["kv_events"]
        self.assertTrue(subscribed, f"the node after the dp_size-1024 one was never subscribed; "
                                    f"attacker: {kv}\n{router.log()[-2000:]}")
        self.assertEqual(pub.recv(), b"\x01")
        pub.send_multipart([b"", (0).to_bytes(8, "big"),
                            msgpack.packb([time.time(), [["BlockStored", [1], None, [5, 6, 7, 8], 4,
                                                          None, "GPU", None]], 0])])
        router.wait_for(lambda: ((router.instance(node) or {}).get("kv_events") or {})
                        .get("blocks_indexed") == 1, WAIT_S)
        self.assertEqual(kv["wanted_ranks"], 1024)
        self.assertEqual(kv["subscribed_ranks"], 64)
        self.assertEqual(kv["ranks_over_cap"], 960)
        metrics = router.metrics()
        self.assertEqual(metrics["pdrouter_kv_events_ranks_over_cap_total"], 960)
        self.assertEqual(metrics["pdrouter_kv_events_subscribed_ranks"], 65)
        self.assertEqual(metrics["pdrouter_kv_events_unsubscribed_ranks"], 960)


if __name__ == "__main__":
    unittest.main()
