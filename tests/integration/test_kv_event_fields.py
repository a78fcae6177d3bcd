"""The newer fields of vLLM's KV cache events, end to end against a real pdrouter.

SimKvGroupsTest: real `pdnode sim` prefills publish a hybrid model's KV cache groups and a CPU
offload tier (--kv-events-groups, --kv-events-cpu-tier): blocks published in sliding-window or
Mamba groups do not attract cache-aware routing, blocks of a full-attention group do, a
sliding-window group sliding past its blocks leaves the full-attention ones in the index, and a
block evicted from the GPU but kept by the CPU tier (announced as the offloading connector's
tokenless placeholder) still counts, at a discount.

KvEventsShapesTest: a fake vLLM >= 0.26 publisher (ZMQ, vLLM's frames) sends what the sims do not:
empty batches in every envelope (the batch struct encoded as a map among them) and a LoRA
adapter's blocks, whose extra keys carry the adapter's name."""
import json
import time
import unittest

import msgpack
import zmq

from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode
from test_kv_events import Publisher

KEY = "kv-event-fields-test-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 15.0
BLOCK = 16  # the sims' block size

TOPOLOGY = """
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
kv_events:
  enabled: true
policies:
  prefill: cache_aware
  decode: cache_aware
instances: []
"""


def prompt(seed, blocks=4):
    return [200000 + seed * 1000 + i for i in range(blocks * BLOCK)]


def cache_query(router, tokens, lora=None):
    query = "tokens=" + ",".join(str(t) for t in tokens) + (f"&lora={lora}" if lora else "")
    code, _, body = router.request("GET", f"/debug/cache?{query}", headers=AUTH, admin=True)
    assert code == 200, body
    return json.loads(body)


def node_entry(router, tokens, node, lora=None):
    for entry in cache_query(router, tokens, lora)["nodes"]:
        if entry["node"] == node:
            return entry
    return None


def kv_status(router, node):
    inst = router.instance(node)
    return (inst or {}).get("kv_events") or {}


class SimKvGroupsTest(unittest.TestCase):
    def setUp(self):
        self.router = Router(TOPOLOGY, env=ENV)
        self.addCleanup(self.router.dir.cleanup)
        self.addCleanup(self.router.stop)
        # Only its sliding-window group (a window longer than any prompt here: it keeps them).
        self.sliding = self.sim("--kv-events-groups", "sliding_window:4096")
        # Only a recurrent group keeping a state per block (vLLM's mamba_cache_mode "all").
        self.mamba = self.sim("--kv-events-groups", "mamba", "--kv-events-encoding", "array")
        # A hybrid model: full attention, and a one-block sliding window that slides past every
        # block of a run but its last, removing them from its group at once.
        self.hybrid = self.sim("--kv-events-groups", f"full_attention,sliding_window:{BLOCK}")
        # Full attention with a CPU tier that keeps what the GPU (4 blocks) evicts, announced as
        # tokenless placeholders.
        self.offload = self.sim("--kv-events-groups", "full_attention", "--kv-events-cpu-tier", "placeholder",
                                "--prefix-cache-blocks", "4")
        self.prefills = [self.sliding, self.mamba, self.hybrid, self.offload]
        self.decode = SimNode("--role", "decode", "--connector", "nixl", "--register", self.router.discovery,
                              "--register-interval-ms", "200")
        self.addCleanup(self.decode.stop)
        self.probes = 0
        self.batches = {}
        for node in self.prefills:
            self.await_subscribed(node)
        self.router.wait_for(lambda: self.router.instance(self.decode.http_address), WAIT_S)

    def sim(self, *flags):
        node = SimNode("--role", "prefill", "--connector", "nixl", "--register", self.router.discovery,
                       "--register-interval-ms", "200", "--kv-events-endpoint", "tcp://127.0.0.1:0", *flags)
        self.addCleanup(node.stop)
        return node

    def batches_of(self, node):
        """Batches the router received from `node`: applied, or refused as undecodable."""
        status = kv_status(self.router, node.http_address)
        return status.get("batches", 0) + status.get("decode_errors", 0)

    def await_subscribed(self, node):
        """A PUB socket drops what it sends before the router's SUB connects: probe prompts go
        straight to the sim until the router counts one of its batches (blocks of some groups are
        never indexed, so the index cannot tell)."""
        self.router.wait_for(lambda: self.router.instance(node.http_address), WAIT_S)
        deadline = time.monotonic() + WAIT_S * TIME_SCALE
        while time.monotonic() < deadline:
            self.probes += 1
            self.send_direct(node, prompt(900 + self.probes, 1))
            try:
                self.router.wait_for(lambda: self.batches_of(node) > 0, 1.5, interval=0.05)
                self.batches[node.http_address] = self.batches_of(node)
                return
            except AssertionError:
                continue
        self.fail(f"the router never received {node.http_address}'s events")

    def send_direct(self, node, tokens):
        status, body = node.post_json("/v1/completions", {"prompt": tokens, "max_tokens": 1})
        self.assertEqual(status, 200, body)

    def warm(self, node, *prompts):
        """Sends `prompts` to `node` itself and waits until the router applied their batches."""
        for tokens in prompts:
            self.send_direct(node, tokens)
        want = self.batches[node.http_address] + len(prompts)
        self.router.wait_for(lambda: self.batches_of(node) >= want, WAIT_S, interval=0.05)
        self.batches[node.http_address] = self.batches_of(node)

    def route(self, tokens):
        code, _, raw = self.router.request("POST", "/v1/completions", timeout=10 * TIME_SCALE,
                                           body=json.dumps({"model": "sim-model", "prompt": tokens,
                                                            "max_tokens": 2}).encode(),
                                           headers={"Content-Type": "application/json"})
        self.assertEqual(code, 200, raw)

    def served(self, node, tokens):
        return any(r["method"] == "POST" and r["path"] == "/v1/completions"
                   and json.loads(r["body"])["prompt"] == tokens
                   for r in node.sim_requests()["requests"])

    def test_only_full_attention_blocks_attract_cache_aware_routing(self):
        shared = prompt(1)
        # The sliding-window and Mamba nodes hold all 4 blocks of the shared prefix in their
        # groups; the hybrid node 3 in its full-attention group (its sliding window slid past 2).
        self.warm(self.sliding, shared)
        self.warm(self.mamba, shared)
        self.warm(self.hybrid, shared[:3 * BLOCK])
        # warm() counts batches, and a probe's batch that arrived late can stand in for the one
        # awaited: the index itself is waited for. The blocks never show if the sliding window's
        # removals took them.
        try:
            entry, _ = self.router.wait_for(
                lambda: node_entry(self.router, shared, self.hybrid.http_address), WAIT_S, interval=0.05)
        except AssertionError:
            self.fail("the sliding window's removals took the full-attention blocks")
        self.assertEqual(entry["matched_tokens"], 3 * BLOCK)
        self.assertIsNone(node_entry(self.router, shared, self.sliding.http_address))
        self.assertIsNone(node_entry(self.router, shared, self.mamba.http_address))
        for i in range(4):
            tokens = shared + [7, 8, i]  # 48 of 67 tokens held by the hybrid node's full attention
            self.route(tokens)
            self.assertTrue(self.served(self.hybrid, tokens),
                            f"request {i} went to " + str([n.http_address for n in self.prefills
                                                           if self.served(n, tokens)]))
        metrics = self.router.metrics()
        # sliding 4 + mamba 4 + hybrid's sliding group 3, and the probes' blocks of those groups.
        self.assertGreaterEqual(metrics["pdrouter_kv_events_blocks_ignored_total"], 11)
        self.assertEqual(metrics.get("pdrouter_kv_events_decode_errors_total", 0), 0)
        self.assertEqual(metrics.get("pdrouter_kv_events_gaps_total", 0), 0)

    def test_a_block_the_cpu_tier_keeps_still_counts_at_a_discount(self):
        kept, other = prompt(2), prompt(3)
        self.warm(self.offload, kept)
        self.assertEqual(self.blocks_held(kept, (4, 4)), (4, 4))
        # 4 new blocks evict `kept` from the node's 4-block GPU cache; its CPU tier keeps them.
        self.warm(self.offload, other)
        self.assertEqual(self.blocks_held(other, (4, 4)), (4, 4))
        entry = node_entry(self.router, kept, self.offload.http_address)
        self.assertIsNotNone(entry, "the GPU eviction removed the CPU tier's copies")
        self.assertEqual((entry["matched_blocks"], entry["gpu_blocks"]), (4, 0))
        self.assertEqual(entry["cached_tokens"], 4 * BLOCK // 2)

    def blocks_held(self, tokens, want):
        """(matched_blocks, gpu_blocks) of the offload node for `tokens` once the index shows
        `want`, else as last seen: warm() counts batches, and a probe's batch that arrived late can
        stand in for the one awaited, so the index itself is waited for."""
        def held():
            entry = node_entry(self.router, tokens, self.offload.http_address)
            return (entry["matched_blocks"], entry["gpu_blocks"]) if entry else None
        try:
            return self.router.wait_for(lambda: held() == want, WAIT_S, interval=0.05) and want
        except AssertionError:
            return held()
        metrics = self.router.metrics()
        self.assertEqual(metrics.get("pdrouter_kv_events_decode_errors_total", 0), 0)
        self.assertEqual(metrics.get("pdrouter_kv_events_gaps_total", 0), 0)


class KvEventsShapesTest(unittest.TestCase):
    def setUp(self):
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)
        self.pub = Publisher(self.ctx)
        self.addCleanup(self.pub.sock.close, 0)
        self.node = "127.0.0.1:18561"
        self.router = Router(TOPOLOGY.replace(
            "instances: []", "instances:\n"
            f'  - {{role: prefill, http_address: "{self.node}", connector: nixl, '
            f'kv_events_endpoint: "{self.pub.endpoint}"}}'), env=ENV)
        self.addCleanup(self.router.dir.cleanup)
        self.addCleanup(self.router.stop)
        self.pub.await_subscriber()
        self.seq = 0

    def publish(self, payload):
        self.pub.publish(self.seq, msgpack.packb(payload))
        self.seq += 1

    def test_empty_batches_change_nothing_in_any_envelope(self):
        tokens = list(range(500, 500 + 2 * 4))
        stored = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": None,
                  "token_ids": tokens, "block_size": 4, "lora_id": None, "medium": "GPU", "lora_name": None,
                  "extra_keys": [None, None], "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
        self.publish([time.time(), [stored], 0])
        self.router.wait_for(lambda: node_entry(self.router, tokens, self.node), WAIT_S)
        self.publish([time.time(), []])                                   # vLLM before dp ranks
        self.publish([time.time(), [], 0])                                # [ts, events, dp_rank]
        self.publish({"ts": time.time(), "events": [], "data_parallel_rank": 0})  # the struct by name
        self.router.wait_for(lambda: kv_status(self.router, self.node).get("batches") == 4, WAIT_S,
                             interval=0.05)
        status = kv_status(self.router, self.node)
        self.assertEqual((status["gaps"], status["decode_errors"], status["events"]), (0, 0, 1))
        self.assertEqual(node_entry(self.router, tokens, self.node)["matched_blocks"], 2)
        self.assertEqual(self.router.metrics()["pdrouter_kv_events_index_entries"], 2)

    def test_an_adapters_blocks_are_indexed_under_the_adapter(self):
        # vLLM puts the adapter's name first in every block's extra keys.
        tokens = list(range(700, 700 + 3 * 4))
        self.publish([time.time(), [
            {"type": "BlockStored", "block_hashes": [11, 12, 13], "parent_block_hash": None,
             "token_ids": tokens, "block_size": 4, "lora_id": 1, "medium": "GPU", "lora_name": "adapter-a",
             "extra_keys": [["adapter-a"], ["adapter-a"], ["adapter-a"]], "group_idx": 0,
             "kv_cache_spec_kind": "full_attention"}], 0])
        entry, _ = self.router.wait_for(lambda: node_entry(self.router, tokens, self.node, lora="adapter-a"),
                                        WAIT_S)
        self.assertEqual(entry["matched_blocks"], 3)
        self.assertIsNone(node_entry(self.router, tokens, self.node), "the base model does not hold them")
        self.assertTrue(cache_query(self.router, tokens, lora="adapter-a")["lora_known"])


if __name__ == "__main__":
    unittest.main()
