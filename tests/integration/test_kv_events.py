"""KV cache events end to end: a fake vLLM publisher (ZMQ XPUB on 127.0.0.1, frames and msgpack as
vllm/distributed/kv_events.py sends them; docs/design/kv-events.md) feeds a real pdrouter,
which answers GET /debug/cache and shows the counts in /status and /metrics."""
import json
import time
import unittest

import msgpack
import zmq

from pdrouter_fixture import TIME_SCALE, Router

KEY = "kv-events-test-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
BLOCK = 4


def topology(instances):
    return f"""
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
kv_events:
  enabled: true
instances:
{instances}
"""


def stored_map(hashes, parent, tokens):
    """BlockStored in the map encoding (vLLM >= 0.26)."""
    return {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent,
            "token_ids": tokens, "block_size": BLOCK, "lora_id": None, "medium": "GPU",
            "lora_name": None}


def stored_array(hashes, parent, tokens):
    """BlockStored in the positional (array) encoding of older vLLM."""
    return ["BlockStored", hashes, parent, tokens, BLOCK, None, "GPU", None]


def batch(*events):
    return msgpack.packb([time.time(), list(events), 0])


class Publisher:
    """vLLM's per-rank publisher: binds, sends [topic, seq (8 bytes big-endian), payload]. An XPUB,
    so the test can wait for pdrouter's subscription instead of sleeping."""

    def __init__(self, ctx, host="127.0.0.1"):
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.bind(f"tcp://{host}:0")
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()

    def await_subscriber(self, timeout=10.0):
        assert self.sock.poll(int(timeout * TIME_SCALE * 1000), zmq.POLLIN), "pdrouter never subscribed"
        assert self.sock.recv() == b"\x01"  # subscribe, empty topic

    def publish(self, seq, payload):
        self.sock.send_multipart([b"", seq.to_bytes(8, "big"), payload])


class KvEventsTest(unittest.TestCase):
    def setUp(self):
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)
        self.pub = Publisher(self.ctx)
        self.addCleanup(self.pub.sock.close, 0)
        self.node = "127.0.0.1:18551"
        instances = (f'  - {{role: decode, http_address: "{self.node}", connector: nixl, '
                     f'kv_events_endpoint: "{self.pub.endpoint}"}}')
        self.router = Router(topology(instances), env=ENV)
        self.addCleanup(self.router.stop)
        self.pub.await_subscriber()

    def cache(self, tokens, **headers):
        query = ",".join(str(t) for t in tokens)
        code, _, body = self.router.request("GET", f"/debug/cache?tokens={query}",
                                            headers=headers or AUTH, admin=True)
        return code, json.loads(body)

    def matched(self, tokens):
        code, doc = self.cache(tokens)
        self.assertEqual(code, 200, doc)
        for node in doc["nodes"]:
            if node["node"] == self.node:
                return node["matched_blocks"]
        return 0

    def kv_status(self):
        return self.router.instance(self.node)["kv_events"]

    def test_events_fill_the_index_and_a_gap_drops_it(self):
        inst = self.router.instance(self.node)
        self.assertEqual(inst["kv_events_endpoint"], self.pub.endpoint)
        self.assertEqual(inst["kv_events"]["subscribed_ranks"], 1)

        tokens = list(range(100, 112))  # 3 blocks
        self.pub.publish(0, batch(stored_map([11, 12], None, tokens[:8])))
        self.pub.publish(1, batch(stored_array([13], 12, tokens[8:12])))
        self.router.wait_for(lambda: self.matched(tokens) == 3)
        code, doc = self.cache(tokens + [1, 2])
        self.assertEqual(doc["nodes"], [{"node": self.node, "matched_blocks": 3, "gpu_blocks": 3,
                                         "block_size": BLOCK, "matched_tokens": 12, "cached_tokens": 12}])
        self.assertEqual(doc["tokens"], 14)
        self.assertEqual(self.matched([999] + tokens), 0, "a different first block matches nothing")

        # Each worker re-renders /status at most once a second for an unchanged registry: wait
        # for one rendering that shows everything.
        expected = {"events": 2, "batches": 2, "blocks_indexed": 3, "gaps": 0, "ranks_seen": 1,
                    "endpoint": self.pub.endpoint, "replay_endpoint": None}
        self.router.wait_for(lambda: all(self.kv_status()[k] == v for k, v in expected.items()),
                             timeout=5)
        metrics = self.router.metrics()
        self.assertEqual(metrics["pdrouter_kv_events_events_total"], 2)
        self.assertEqual(metrics["pdrouter_kv_events_index_entries"], 3)
        self.assertEqual(metrics["pdrouter_kv_events_nodes"], 1)

        # Seq 2 never comes; 3 does: no replay endpoint, so the node's entries are dropped.
        self.pub.publish(3, batch(stored_map([21], None, [7, 7, 7, 7])))
        self.router.wait_for(lambda: self.matched([7, 7, 7, 7]) == 1)
        self.assertEqual(self.matched(tokens), 0)
        self.router.wait_for(lambda: self.kv_status()["gaps"] == 1, timeout=5)
        self.assertEqual(self.router.metrics()["pdrouter_kv_events_gaps_total"], 1)

    def test_debug_cache_needs_the_admin_key_and_good_tokens(self):
        code, doc = self.cache([1, 2], **{"Authorization": "Bearer wrong"})
        self.assertEqual(code, 401)
        for query, message in [("tokens=1,x", "tokens[1]: 'x' is not an integer 0..4294967295"),
                               ("tokens=4294967296", "is not an integer 0..4294967295"),
                               ("", "tokens: missing")]:
            code, _, body = self.router.request("GET", "/debug/cache?" + query, headers=AUTH,
                                                admin=True)
            self.assertEqual(code, 400, query)
            error = json.loads(body)["error"]
            self.assertEqual(error["code"], "bad_tokens")
            self.assertIn(message, error["message"])

    def test_bad_messages_are_counted_not_fatal(self):
        self.pub.sock.send_multipart([b"", b"short"])
        self.pub.publish(0, b"\xc1")
        self.router.wait_for(lambda: self.router.metrics().get("pdrouter_kv_events_decode_errors_total") == 1)
        self.assertEqual(self.router.metrics()["pdrouter_kv_events_bad_messages_total"], 1)
        self.pub.publish(1, batch(stored_map([1], None, [5, 6, 7, 8])))
        self.router.wait_for(lambda: self.matched([5, 6, 7, 8]) == 1)


class KvEventsRegistrationTest(unittest.TestCase):
    def test_a_registered_node_names_its_publisher(self):
        ctx = zmq.Context()
        self.addCleanup(ctx.destroy, 0)
        pub = Publisher(ctx)
        self.addCleanup(pub.sock.close, 0)
        router = Router(topology("  []"), env=ENV)
        self.addCleanup(router.stop)
        node = "127.0.0.1:18552"
        router.send({"type": "D", "http_address": node, "pdr_v": 1, "connector": "nixl",
                     "dp_size": 1, "kv_events_endpoint": pub.endpoint})
        pub.await_subscriber()
        pub.publish(5, batch(stored_array([1, 2], None, list(range(8)))))
        router.wait_for(lambda: (router.instance(node) or {}).get("kv_events", {}) and
                        router.instance(node)["kv_events"]["blocks_indexed"] == 2, timeout=5)
        self.assertEqual(router.instance(node)["kv_events_endpoint"], pub.endpoint)

        # A registration naming the publisher's bind form is refused and counted, never applied.
        router.send({"type": "D", "http_address": "127.0.0.1:18553", "pdr_v": 1,
                     "connector": "nixl", "kv_events_endpoint": "tcp://*:5557"})
        router.wait_for(lambda: router.metrics().get(
            'pdrouter_registrations_rejected_total{reason="bad_address"}') == 1)
        self.assertIsNone(router.instance("127.0.0.1:18553"))

        # A node that does not authenticate may not aim the router's sockets at another host.
        # "Another host" needs a non-loopback address: the rule (discovery/config/admission.h
        # check_registered_address) counts every 127.0.0.0/8 address as this one machine. 192.0.2.9 is
        # TEST-NET-1 (RFC 5737, never assigned), and nothing connects to it: the registration is
        # refused before any socket is made, which is what this asserts.
        router.send({"type": "D", "http_address": "127.0.0.1:18555", "pdr_v": 1,
                     "connector": "nixl", "kv_events_endpoint": "tcp://192.0.2.9:5557"})
        router.wait_for(lambda: router.metrics().get(
            'pdrouter_registrations_rejected_total{reason="not_own_address"}') == 1)
        self.assertIsNone(router.instance("127.0.0.1:18555"))

        # Another loopback address is the same host: a node registered as 127.0.0.1 may name a
        # publisher on 127.0.0.9, and the router subscribes to it.
        other = Publisher(ctx, host="127.0.0.9")
        self.addCleanup(other.sock.close, 0)
        router.send({"type": "D", "http_address": "127.0.0.1:18556", "pdr_v": 1,
                     "connector": "nixl", "kv_events_endpoint": other.endpoint})
        other.await_subscriber()
        self.assertEqual(router.instance("127.0.0.1:18556")["kv_events_endpoint"], other.endpoint)
        self.assertEqual(router.metrics().get(
            'pdrouter_registrations_rejected_total{reason="not_own_address"}'), 1)


if __name__ == "__main__":
    unittest.main()
