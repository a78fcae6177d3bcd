"""Cache-aware routing end to end (policies: cache_aware): real pdrouter, real `pdnode sim` nodes
(NIXL, two prefills and two decodes, static instances), a fake vLLM KV events publisher (ZMQ XPUB,
vLLM's frames) for one prefill. Which node served each request is read from the sims' request
logs; the hit counts from /metrics."""
import json
import time
import unittest

import zmq

from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode
from test_kv_events import BLOCK, Publisher, batch, stored_map

KEY = "cache-aware-test-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 15.0 * TIME_SCALE


def served_prompts(node):
    """The prompts (or messages, or generate's token_ids) of the generation requests `node`
    received, in order."""
    out = []
    for r in node.sim_requests()["requests"]:
        if r["method"] == "POST" and r["path"] in ("/v1/completions", "/v1/chat/completions",
                                                   "/inference/v1/generate"):
            body = json.loads(r["body"])
            out.append(json.dumps(body.get("prompt", body.get("messages", body.get("token_ids")))))
    return out


def start_cache_cluster(test, cache_aware_options="", env=None, extra_instances=()):
    """On `test`: a KV events publisher (test.pub) standing for prefill 1, 2 prefill and 2 decode
    NIXL sims (test.prefills, test.decodes) and a cache_aware router (test.router) subscribed to
    it; `cache_aware_options` is a flow map's content for policies.cache_aware; `env` holds
    PDR_TEST_ADMIN_KEY (default this module's ENV); `extra_instances`: more static instances,
    each a flow map's content (`role: decode, http_address: "...", ...`)."""
    test.ctx = zmq.Context()
    test.addCleanup(test.ctx.destroy, 0)
    test.pub = Publisher(test.ctx)
    test.addCleanup(test.pub.sock.close, 0)
    test.prefills = [SimNode("--role", "prefill", "--connector", "nixl") for _ in range(2)]
    test.decodes = [SimNode("--role", "decode", "--connector", "nixl") for _ in range(2)]
    for node in test.prefills + test.decodes:
        test.addCleanup(node.stop)
    instances = []
    for i, node in enumerate(test.prefills):
        extra = f', kv_events_endpoint: "{test.pub.endpoint}"' if i == 1 else ""
        instances.append(f'  - {{role: prefill, http_address: "{node.http_address}", connector: nixl{extra}}}')
    for node in test.decodes:
        instances.append(f'  - {{role: decode, http_address: "{node.http_address}", connector: nixl}}')
    instances += [f"  - {{{extra}}}" for extra in extra_instances]
    topology = ("admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\nkv_events:\n  enabled: true\n"
                "policies:\n  prefill: cache_aware\n  decode: cache_aware\n"
                + (f"  cache_aware: {{{cache_aware_options}}}\n" if cache_aware_options else "")
                + "instances:\n" + "\n".join(instances) + "\n")
    test.router = Router(topology, env=env or ENV)
    test.addCleanup(test.router.stop)
    test.pub.await_subscriber()


class CacheAwareTest(unittest.TestCase):
    def setUp(self):
        start_cache_cluster(self)

    def post(self, path, body):
        code, _, raw = self.router.request("POST", path, body=json.dumps(body).encode(),
                                           headers={"Content-Type": "application/json"})
        self.assertEqual(code, 200, raw)

    def holder(self, nodes, prompt):
        """Index of the node in `nodes` whose log has `prompt` (exactly one must)."""
        having = [i for i, n in enumerate(nodes) if json.dumps(prompt) in served_prompts(n)]
        self.assertEqual(len(having), 1, (prompt, having))
        return having[0]

    def metric(self, leg, source, result):
        return self.router.metrics().get(
            f'pdrouter_cache_routing_requests_total{{leg="{leg}",source="{source}",result="{result}"}}', 0)

    def test_a_conversation_follows_the_nodes_that_served_its_last_turn(self):
        conversations = [[{"role": "system", "content": f"You are assistant number {c}. " + "Be brief. " * 40}]
                         for c in range(4)]
        first = {}
        for turn in range(3):
            for c, messages in enumerate(conversations):
                messages.append({"role": "user", "content": f"turn {turn} of conversation {c}"})
                self.post("/v1/chat/completions", {"model": "sim-model", "messages": messages, "max_tokens": 2})
                where = (self.holder(self.prefills, messages), self.holder(self.decodes, messages))
                if turn == 0:
                    first[c] = where
                else:
                    self.assertEqual(where, first[c], f"conversation {c} moved on turn {turn}")
                messages.append({"role": "assistant", "content": "ok"})
        # With nothing cached, load spread the conversations over both prefills and both decodes.
        self.assertEqual({p for p, _ in first.values()}, {0, 1})
        self.assertEqual({d for _, d in first.values()}, {0, 1})
        # Turns 1 and 2 are hits; a first turn may count one too when load picked a node that holds
        # the JSON text every conversation opens with ('[{"role": "system", "content": "You are').
        for leg in ("prefill", "decode"):
            hits, misses = self.metric(leg, "prefix_tree", "hit"), self.metric(leg, "prefix_tree", "miss")
            self.assertEqual(hits + misses, 12)
            self.assertGreaterEqual(hits, 8)
        metrics = self.router.metrics()
        matched = metrics['pdrouter_cache_routing_matched_units_total{leg="prefill",source="prefix_tree"}']
        prompt = metrics['pdrouter_cache_routing_prompt_units_total{leg="prefill",source="prefix_tree"}']
        self.assertGreater(matched / prompt, 0.5)
        self.assertGreater(metrics["pdrouter_prefix_tree_bytes"], 0)

    def test_token_id_prompts_go_to_the_node_whose_kv_events_hold_them(self):
        tokens = list(range(1000, 1000 + 4 * BLOCK))  # 4 blocks on prefill 1
        self.pub.publish(0, batch(stored_map([51, 52, 53, 54], None, tokens)))
        deadline = time.monotonic() + WAIT_S
        query = ",".join(str(t) for t in tokens)
        while True:
            code, _, raw = self.router.request("GET", f"/debug/cache?tokens={query}", headers=AUTH, admin=True)
            self.assertEqual(code, 200, raw)
            if json.loads(raw)["nodes"]:
                break
            self.assertLess(time.monotonic(), deadline, "the events never reached the index")
            time.sleep(0.02)
        for i in range(4):
            prompt = tokens + [7, 8, i]  # 16 of 19 tokens held by prefill 1
            self.post("/v1/completions", {"model": "sim-model", "prompt": prompt, "max_tokens": 2})
            self.assertEqual(self.holder(self.prefills, prompt), 1, f"request {i}")
        self.assertEqual(self.metric("prefill", "kv_events", "hit"), 4)
        self.assertEqual(self.metric("prefill", "kv_events", "miss"), 0)
        # The decodes publish no events here: for the first request none holds the prompt as far
        # as pdrouter knows, so load picked one; the next three go to the decode it was sent to
        # (the prefix tree of where prompts went, counted in token ids, stands in for events
        # that have not come).
        self.assertEqual(self.metric("decode", "kv_events", "miss"), 1)
        self.assertEqual(self.metric("decode", "kv_events", "hit"), 3)
        # /inference/v1/generate's token_ids are matched against the events the same way.
        for i in range(2):
            ids = tokens + [9, i]
            self.post("/inference/v1/generate", {"model": "sim-model", "token_ids": ids,
                                                 "sampling_params": {"max_tokens": 2}})
            self.assertEqual(self.holder(self.prefills, ids), 1, f"generate request {i}")
        self.assertEqual(self.metric("prefill", "kv_events", "hit"), 6)


if __name__ == "__main__":
    unittest.main()
