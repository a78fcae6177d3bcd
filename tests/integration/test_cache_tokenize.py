"""Exact cache-aware routing of TEXT prompts through tokenisation by a node
(policies.cache_aware.tokenize: node): real pdrouter, real `pdnode sim` nodes (NIXL, two prefills,
two decodes), a fake vLLM KV events publisher for prefill 1 that announces the blocks of a text's
token ids as the sims' /tokenize answers them (a vocabulary word's id is its index). With the KV
events as the only signal, tokenize: node sends the text to the prefill holding it; tokenize: off
cannot see it (the prefix tree knows nothing yet). A failing or slow /tokenize falls back to the
prefix tree, counted; a client that goes away during the call cancels it. The call has a whole-call
deadline (a node trickling its answer a byte at a time is cut at tokenize_timeout_ms), and the
prompt goes only to a node labelled `serves: tokenize` or, without one, to a prefill the request
could be paired with: a render node (`connector: none`) beside the fleet never sees it."""
import json
import socket
import time
import unittest

from fake_node import FakeNode
from pdrouter_fixture import TIME_SCALE
from sim_fixture import SimNode
from test_cache_aware import served_prompts, start_cache_cluster
from test_kv_events import BLOCK, batch, stored_map

KEY = "cache-tokenize-test-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 15.0 * TIME_SCALE
# The sim's vocabulary (node/sim/generation.cc): a word's token id is its index.
VOCABULARY = ["the", "quick", "brown", "fox", "jumps", "over", "lazy", "dog",
              "prefill", "decode", "cache", "block", "token", "model", "router", "node"]
HELD_WORDS = VOCABULARY[:4 * BLOCK]  # 4 blocks held by prefill 1


class CacheTokenizeBase:
    TOKENIZE = "node"
    TIMEOUT_MS = int(5000 * TIME_SCALE)

    def extra_instances(self):
        """Static instances beside the P/D fleet (flow map contents)."""
        return ()

    def setUp(self):
        start_cache_cluster(self, f"tokenize: {self.TOKENIZE}, tokenize_timeout_ms: {self.TIMEOUT_MS}", ENV,
                            self.extra_instances())
        tokens = list(range(len(HELD_WORDS)))
        self.pub.publish(0, batch(stored_map([61, 62, 63, 64], None, tokens)))
        query = ",".join(str(t) for t in tokens)
        deadline = time.monotonic() + WAIT_S
        while True:
            code, _, raw = self.router.request("GET", f"/debug/cache?tokens={query}", headers=AUTH, admin=True)
            self.assertEqual(code, 200, raw)
            if json.loads(raw)["nodes"]:
                break
            self.assertLess(time.monotonic(), deadline, "the events never reached the index")
            time.sleep(0.02)

    def post(self, body, timeout=None):
        code, _, raw = self.router.request("POST", "/v1/completions", body=json.dumps(body).encode(),
                                           headers={"Content-Type": "application/json"},
                                           timeout=timeout or 5 * TIME_SCALE)
        self.assertEqual(code, 200, raw)

    def prompt(self, i):
        return " ".join(HELD_WORDS + ["alpha", "beta", f"request{i}"])

    def holders(self, prompt):
        return [i for i, n in enumerate(self.prefills) if json.dumps(prompt) in served_prompts(n)]

    def metric(self, name, **labels):
        key = name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        return self.router.metrics().get(key, 0)


class TokenizeByNodeTest(CacheTokenizeBase, unittest.TestCase):
    def test_text_prompts_go_to_the_prefill_whose_kv_events_hold_their_tokens(self):
        for i in range(4):
            prompt = self.prompt(i)
            self.post({"model": "sim-model", "prompt": prompt, "max_tokens": 2})
            self.assertEqual(self.holders(prompt), [1], f"request {i}")
        self.assertEqual(self.metric("pdrouter_cache_tokenize_total", result="matched"), 4)
        self.assertEqual(self.metric("pdrouter_cache_routing_requests_total", leg="prefill", source="kv_events",
                                     result="hit"), 4)
        self.assertEqual(self.metric("pdrouter_cache_routing_requests_total", leg="prefill", source="prefix_tree",
                                     result="hit"), 0)
        # One node tokenized each prompt: vLLM's {model, prompt} body.
        calls = [json.loads(r["body"]) for n in self.prefills + self.decodes for r in n.sim_requests()["requests"]
                 if r["path"] == "/tokenize"]
        self.assertEqual(len(calls), 4)
        self.assertEqual(calls[0]["model"], "sim-model")
        self.assertIn("prompt", calls[0])

    def test_a_failing_tokenize_falls_back_to_the_prefix_tree(self):
        for node in self.prefills + self.decodes:
            node.set_fault(path="/tokenize", status=503, count=-1)
        self.post({"model": "sim-model", "prompt": self.prompt(0), "max_tokens": 2})
        self.assertEqual(self.metric("pdrouter_cache_tokenize_total", result="failed"), 1)
        self.assertEqual(self.metric("pdrouter_cache_tokenize_total", result="matched"), 0)
        self.assertEqual(self.metric("pdrouter_cache_routing_requests_total", leg="prefill", source="prefix_tree",
                                     result="miss"), 1)
        for node in self.prefills + self.decodes:
            node.clear_faults()
            node.set_fault(path="/tokenize", close_immediately=True, count=-1)
        self.post({"model": "sim-model", "prompt": self.prompt(1), "max_tokens": 2})
        self.assertEqual(self.metric("pdrouter_cache_tokenize_total", result="failed"), 2)

    def test_a_client_gone_during_the_tokenize_call_cancels_it(self):
        for node in self.prefills + self.decodes:
            node.set_fault(path="/tokenize", delay_ms=int(3000 * TIME_SCALE), count=-1)
        body = json.dumps({"model": "sim-model", "prompt": self.prompt(0), "max_tokens": 2}).encode()
        host, port = self.router.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5 * TIME_SCALE) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            # Wait for the router's /tokenize call to reach a node, then go away.
            deadline = time.monotonic() + WAIT_S
            while not any(r["path"] == "/tokenize" for n in self.prefills + self.decodes
                          for r in n.sim_requests()["requests"]):
                self.assertLess(time.monotonic(), deadline, "no /tokenize call")
                time.sleep(0.02)
        self.router.wait_for(lambda: self.metric("pdrouter_cache_tokenize_total", result="cancelled") == 1,
                             timeout=10)
        self.assertEqual(sum(len([r for r in n.sim_requests()["requests"] if r["path"] == "/v1/completions"])
                             for n in self.prefills + self.decodes), 0)


class TokenizeTimeoutTest(CacheTokenizeBase, unittest.TestCase):
    TIMEOUT_MS = 100

    def test_a_slow_tokenize_times_out_and_falls_back(self):
        for node in self.prefills + self.decodes:
            node.set_fault(path="/tokenize", delay_ms=int(3000 * TIME_SCALE), count=-1)
        started = time.monotonic()
        self.post({"model": "sim-model", "prompt": self.prompt(0), "max_tokens": 2}, timeout=10 * TIME_SCALE)
        self.assertLess(time.monotonic() - started, 3.0 * TIME_SCALE)
        self.assertEqual(self.metric("pdrouter_cache_tokenize_total", result="timeout"), 1)


class TokenizeTrickleTest(CacheTokenizeBase, unittest.TestCase):
    """The node labelled for tokenisation answers /tokenize one byte every 100 ms (8 s in all):
    no per-read timeout ever fires, the whole-call deadline does."""
    TIMEOUT_MS = 1000

    def extra_instances(self):
        self.trickler = FakeNode("tokenize_trickle", interval=0.1, trickle_bytes=80)
        self.addCleanup(self.trickler.close)
        return [f'role: decode, http_address: "{self.trickler.http_address}", connector: none, '
                'labels: {serves: tokenize}']

    def test_a_trickling_tokenize_is_cut_at_the_whole_call_deadline(self):
        sent = 0
        while len(self.trickler.received) < 3 and sent < 40:
            calls = len(self.trickler.received)
            started = time.monotonic()
            self.post({"model": "sim-model", "prompt": self.prompt(sent), "max_tokens": 2}, timeout=30 * TIME_SCALE)
            took = time.monotonic() - started
            sent += 1
            if len(self.trickler.received) == calls:
                continue
            # The request waited for the trickling node up to the deadline, not beyond.
            self.assertLess(took, self.TIMEOUT_MS / 1000 + 1.5 * TIME_SCALE, f"request {sent}")
            self.assertGreaterEqual(took, 0.9 * self.TIMEOUT_MS / 1000, f"request {sent}")
        # Every call went to the node labelled for it, and each fell back to the prefix tree.
        self.assertEqual(sent, 3)
        self.assertEqual([path for path, _ in self.trickler.received], ["/tokenize"] * 3)
        self.assertEqual(self.metric("pdrouter_cache_tokenize_total", result="timeout"), 3)
        self.assertEqual(self.metric("pdrouter_cache_routing_requests_total", leg="prefill", source="kv_events",
                                     result="hit"), 0)


class TokenizeEligibilityTest(CacheTokenizeBase, unittest.TestCase):
    """A render node (`connector: none`, `serves: render`, never paired) beside the fleet, and no
    node labelled for tokenisation: the prompts go to the prefills only."""

    def extra_instances(self):
        self.render = SimNode("--role", "decode", "--connector", "nixl")
        self.addCleanup(self.render.stop)
        return [f'role: decode, http_address: "{self.render.http_address}", connector: none, '
                'labels: {serves: render}']

    def test_only_a_prefill_the_request_may_pair_with_sees_the_prompt(self):
        for i in range(20):
            self.post({"model": "sim-model", "prompt": self.prompt(i), "max_tokens": 2})
        self.assertEqual([r["path"] for r in self.render.sim_requests()["requests"]], [])
        tokenized = {name: [json.loads(r["body"])["prompt"] for n in nodes for r in n.sim_requests()["requests"]
                            if r["path"] == "/tokenize"]
                     for name, nodes in (("prefills", self.prefills), ("decodes", self.decodes))}
        self.assertEqual(len(tokenized["prefills"]), 20)
        self.assertEqual(tokenized["decodes"], [])
        self.assertEqual(self.metric("pdrouter_cache_tokenize_total", result="matched"), 20)


class TokenizeOffTest(CacheTokenizeBase, unittest.TestCase):
    TOKENIZE = "off"

    def test_without_tokenization_text_prompts_cannot_use_the_kv_events(self):
        for i in range(4):
            self.post({"model": "sim-model", "prompt": self.prompt(i), "max_tokens": 2})
        # Text is keyed on the prefix tree only: the index holding the tokens is never consulted.
        self.assertEqual(self.metric("pdrouter_cache_routing_requests_total", leg="prefill", source="kv_events",
                                     result="hit"), 0)
        self.assertEqual(sum(self.metric("pdrouter_cache_tokenize_total", result=r)
                             for r in ("matched", "no_match", "failed", "timeout")), 0)
        self.assertEqual(sum(len(self.holders(self.prompt(i))) for i in range(4)), 4)


if __name__ == "__main__":
    unittest.main()
