"""The predicted_latency policy end to end: real pdrouter, real `pdnode sim` nodes (NIXL, two
prefills and two decodes, static instances) and a fake vLLM KV events publisher (ZMQ XPUB, vLLM's
frames) standing for prefill 1's cache. Prefill 1 holds a long prefix; requests that extend it go
there while its queue costs less than the prefix saves, and a request holding little of it goes to
the idle prefill 0 once prefill 1 is loaded. Which node served each request is read from the sims'
request logs; the decisions from GET /debug/route and /metrics."""
import json
import signal
import threading
import time
import unittest

import zmq

from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode
from test_cache_aware import served_prompts
from test_decode_alone import gen_bodies
from test_kv_events import BLOCK, Publisher, batch, stored_map

KEY = "predicted-latency-test-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 15.0 * TIME_SCALE

HELD = list(range(5000, 5000 + 1024))  # prefix prefill 1 holds: 256 blocks of BLOCK tokens
SUFFIX = 300                           # uncached tokens each loading request adds
PREFILL_US_PER_TOKEN = 5000            # 300 tokens: 1.5 s on the prefill sim, 1324: 6.6 s


def start_cluster(test, policy_options="", topology_extra="", prefill_us_per_token=PREFILL_US_PER_TOKEN,
                  decode_flags=()):
    test.ctx = zmq.Context()
    test.addCleanup(test.ctx.destroy, 0)
    test.pub = Publisher(test.ctx)
    test.addCleanup(test.pub.sock.close, 0)
    test.prefills = [SimNode("--role", "prefill", "--connector", "nixl",
                             "--prefill-us-per-token", str(prefill_us_per_token)) for _ in range(2)]
    test.decodes = [SimNode("--role", "decode", "--connector", "nixl", *decode_flags) for _ in range(2)]
    for node in test.prefills + test.decodes:
        test.addCleanup(node.stop)
    instances = []
    for i, node in enumerate(test.prefills):
        extra = f', kv_events_endpoint: "{test.pub.endpoint}"' if i == 1 else ""
        instances.append(f'  - {{role: prefill, http_address: "{node.http_address}", connector: nixl{extra}}}')
    for node in test.decodes:
        instances.append(f'  - {{role: decode, http_address: "{node.http_address}", connector: nixl}}')
    # Both prefills predicted at 1,000 tokens/s until measured (then the fleet's mean: still equal
    # for the two), no transfer term: the choice turns on queued + uncached tokens, each uncached
    # token weighing 1 + fleet_work_weight (8 by default) for the work it adds to the node.
    options = "default_prefill_tokens_per_second: 1000, kv_transfer_ns_per_token: 0"
    if policy_options:
        options += ", " + policy_options
    topology = ("admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\nkv_events:\n  enabled: true\n"
                "policies:\n  prefill: predicted_latency\n  decode: predicted_latency\n"
                f"  predicted_latency: {{{options}}}\n" + topology_extra +
                "instances:\n" + "\n".join(instances) + "\n")
    test.router = Router(topology, env=ENV)
    test.addCleanup(test.router.stop)
    test.pub.await_subscriber()


class PredictedLatencyTest(unittest.TestCase):
    def setUp(self):
        start_cluster(self)
        hashes = list(range(1, len(HELD) // BLOCK + 1))
        self.pub.publish(0, batch(stored_map(hashes, None, HELD)))
        self.await_index(HELD)

    def await_index(self, tokens):
        deadline = time.monotonic() + WAIT_S
        query = ",".join(str(t) for t in tokens)
        while True:
            code, _, raw = self.router.request("GET", f"/debug/cache?tokens={query}", headers=AUTH, admin=True)
            self.assertEqual(code, 200, raw)
            nodes = json.loads(raw)["nodes"]
            if nodes and nodes[0]["cached_tokens"] >= len(tokens) - BLOCK:
                return
            self.assertLess(time.monotonic(), deadline, "the events never reached the index")
            time.sleep(0.02)

    def post(self, prompt, results=None):
        code, _, raw = self.router.request(
            "POST", "/v1/completions",
            body=json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).encode(),
            headers={"Content-Type": "application/json"}, timeout=120 * TIME_SCALE)
        if results is not None:
            results.append((code, raw))
        return code, raw

    def queued_on(self, node):
        """The node's queued prefill tokens as the router's ledger holds them now (/metrics is
        rendered per request; /status may be up to a second old)."""
        return self.router.metrics().get(f'pdrouter_node_prefill_tokens_queued{{node="{node.http_address}"}}', 0)

    def decisions(self):
        code, _, raw = self.router.request("GET", "/debug/route", headers=AUTH, admin=True)
        self.assertEqual(code, 200, raw)
        return json.loads(raw)

    def holder(self, prompt):
        having = [i for i, n in enumerate(self.prefills) if json.dumps(prompt) in served_prompts(n)]
        self.assertEqual(len(having), 1, having)
        return having[0]

    def test_a_loaded_cache_hot_prefill_is_skipped_only_when_its_queue_costs_more(self):
        # Three requests extending the held prefix: on prefill 1 each costs its queue + 9 x 300
        # tokens, on prefill 0 9 x the whole 1,324; the hot node is cheaper each time, so it
        # takes every one although it is the loaded one (cache_aware's thresholds aside).
        loading = [HELD + list(range(90000 + i * SUFFIX, 90000 + (i + 1) * SUFFIX)) for i in range(3)]
        results, threads = [], []
        for i, prompt in enumerate(loading):
            t = threading.Thread(target=self.post, args=(prompt, results), daemon=True)
            t.start()
            threads.append(t)
            deadline = time.monotonic() + WAIT_S
            while self.queued_on(self.prefills[1]) < (i + 1) * SUFFIX:
                self.assertLess(time.monotonic(), deadline,
                                f"the loading request never reached prefill 1: {self.decisions()}")
                time.sleep(0.01)
        self.assertEqual(self.queued_on(self.prefills[0]), 0)
        # A request holding one block of the prefix: prefill 1 would cost 900 + 9 x 8 tokens, the
        # idle cold prefill 0 only 9 x 12.
        small = HELD[:BLOCK] + [1, 2, 3, 4, 5, 6, 7, 8]
        code, raw = self.post(small)
        self.assertEqual(code, 200, raw)
        self.assertEqual(self.holder(small), 0)
        for t in threads:
            t.join(timeout=120 * TIME_SCALE)
        self.assertEqual([c for c, _ in results], [200, 200, 200], results)
        for prompt in loading:
            self.assertEqual(self.holder(prompt), 1)

        metrics = self.router.metrics()
        self.assertEqual(metrics['pdrouter_routing_cache_best_total{outcome="chosen"}'], 3)
        self.assertEqual(metrics['pdrouter_routing_cache_best_total{outcome="skipped_for_load"}'], 1)
        self.assertGreaterEqual(metrics["pdrouter_routing_ttft_prediction_error_seconds_count"], 4)

        # /debug/route explains it: newest first, the small request's decision.
        doc = self.decisions()
        self.assertEqual(doc["capacity"], 256)
        self.assertEqual(doc["recorded"], 4)
        newest = doc["decisions"][0]["prefill"]
        self.assertTrue(doc["decisions"][0]["request_id"])
        self.assertEqual(newest["chosen"], self.prefills[0].http_address)
        self.assertEqual(newest["cache_best"], self.prefills[1].http_address)
        self.assertIn("skipped for load", newest["reason"])
        by_node = {c["node"]: c for c in newest["candidates"]}
        hot, cold = by_node[self.prefills[1].http_address], by_node[self.prefills[0].http_address]
        self.assertEqual(hot["queued_prefill_tokens"], 3 * SUFFIX)
        self.assertEqual(hot["uncached_tokens"], 8)
        self.assertEqual(cold["uncached_tokens"], len(small))
        self.assertGreater(hot["predicted_seconds"], cold["predicted_seconds"])
        self.assertIsNotNone(doc["decisions"][0]["decode"])
        # The third loading request: the hot node chosen with 600 tokens already queued on it.
        third = doc["decisions"][1]["prefill"]
        self.assertEqual(third["chosen"], self.prefills[1].http_address)
        self.assertEqual(third["cache_best"], self.prefills[1].http_address)
        self.assertIn("holds the most of the prompt", third["reason"])

    def test_debug_route_needs_the_admin_key_and_a_valid_limit(self):
        code, _, _ = self.router.request("GET", "/debug/route", admin=True)
        self.assertEqual(code, 401)
        for bad in ("limit=0", "limit=257", "limit=x", "other=1"):
            code, _, raw = self.router.request("GET", f"/debug/route?{bad}", headers=AUTH, admin=True)
            self.assertEqual(code, 400, bad)
            self.assertEqual(json.loads(raw)["error"]["code"], "bad_limit")
        code, _, raw = self.router.request("GET", "/debug/route?limit=1", headers=AUTH, admin=True)
        self.assertEqual(code, 200, raw)
        self.assertEqual(json.loads(raw)["decisions"], [])


class SessionSpillTest(unittest.TestCase):
    """Session affinity under predicted_latency: a session's bound prefill is left when its
    predicted TTFT exceeds the fastest candidate's by more than spill_margin_queue_ms."""

    TURN = 600  # uncached tokens of each turn: 0.6 s predicted, 6 to 24 s on the sim

    def setUp(self):
        # The turns' prefills outlast the sending of all five, so no rate is measured meanwhile
        # (the predictions stay at the configured 1,000 tokens/s); slower machines get longer
        # prefills, but well within timeouts.prefill_ms (60 s).
        start_cluster(self, topology_extra="session_affinity: {enabled: true, spill_margin_queue_ms: 2000}\n",
                      prefill_us_per_token=int(10000 * min(TIME_SCALE, 4)))

    def test_a_session_leaves_its_prefill_once_the_predicted_ttft_there_is_past_the_margin(self):
        decisions = PredictedLatencyTest.decisions
        queued = PredictedLatencyTest.queued_on
        results, threads, bound = [], [], None
        # Turn k, sent while turns 0..k-1 are still in their prefills there, is predicted
        # (0.6 k + 0.6) s on the bound prefill against 0.6 s on the idle one: within the 2 s
        # margin for k <= 3, past it for k = 4 (3.0 s against 0.6 s).
        for k in range(5):
            prompt = list(range(40000 + k * self.TURN, 40000 + (k + 1) * self.TURN))
            body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).encode()
            t = threading.Thread(target=lambda b=body: results.append(self.router.request(
                "POST", "/v1/completions", body=b, timeout=120 * TIME_SCALE,
                headers={"Content-Type": "application/json", "x-session-affinity": "agent-1"})), daemon=True)
            t.start()
            threads.append(t)
            deadline = time.monotonic() + WAIT_S
            while sum(queued(self, n) for n in self.prefills) < (k + 1) * self.TURN:
                self.assertLess(time.monotonic(), deadline, f"turn {k} never reached a prefill: {decisions(self)}")
                time.sleep(0.01)
            if k == 0:
                bound = next(n for n in self.prefills if queued(self, n) == self.TURN)
        for t in threads:
            t.join(timeout=120 * TIME_SCALE)
        self.assertEqual([r[0] for r in results], [200] * 5, results)
        other = next(n for n in self.prefills if n is not bound)
        doc = decisions(self)["decisions"]  # newest first
        chosen = [d["prefill"]["chosen"] for d in reversed(doc)]
        self.assertEqual(chosen, [bound.http_address] * 4 + [other.http_address], doc)
        for d in reversed(doc[1:4]):  # turns 1 to 3: kept on the bound prefill by the session
            self.assertTrue(d["prefill"]["preferred"], d)
        self.assertFalse(doc[0]["prefill"]["preferred"], doc[0])
        by_node = {c["node"]: c for c in doc[0]["prefill"]["candidates"]}
        self.assertGreater(by_node[bound.http_address]["predicted_seconds"],
                           by_node[other.http_address]["predicted_seconds"] + 2.0)
        metrics = self.router.metrics()
        self.assertEqual(metrics["pdrouter_session_affinity_misses_total"], 1)
        self.assertEqual(metrics["pdrouter_session_affinity_hits_total"], 3)
        self.assertEqual(metrics["pdrouter_session_affinity_spills_total"], 1)
        self.assertEqual(metrics["pdrouter_session_affinity_rebinds_total"], 1)


class BusyPrefillBase(unittest.TestCase):
    """Conditional disaggregation by prediction (prefill_busy_ms): two prefills and two decodes,
    prompts queued on both prefills past the threshold."""

    LOAD = 400  # tokens of each loading prompt: 0.4 s predicted (1,000 tokens/s), 2 to 8 s on the sims
    SHORT = 100  # tokens of the requests that follow: 0.1 s predicted, 2 to 8 s on a decode alone
    POLICY_OPTIONS = ""

    def setUp(self):
        scale = min(TIME_SCALE, 4)
        # The prompts outlast the sending of every request, so no rate is measured meanwhile: the
        # predictions stay at the configured 1,000 tokens/s.
        start_cluster(self, policy_options=self.POLICY_OPTIONS,
                      topology_extra="conditional_disaggregation: {enabled: true, prefill_busy_ms: 300}\n",
                      prefill_us_per_token=int(5000 * scale),
                      decode_flags=("--prefill-us-per-token", str(int(20000 * scale))))
        self.results, self.threads = [], []

    def send(self, prompt):
        body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).encode()
        t = threading.Thread(target=lambda: self.results.append(self.router.request(
            "POST", "/v1/completions", body=body, timeout=120 * TIME_SCALE,
            headers={"Content-Type": "application/json"})), daemon=True)
        t.start()
        self.threads.append(t)

    def await_queued(self, nodes, tokens, what):
        deadline = time.monotonic() + WAIT_S
        while sum(PredictedLatencyTest.queued_on(self, n) for n in nodes) < tokens:
            self.assertLess(time.monotonic(), deadline, f"{what}: {PredictedLatencyTest.decisions(self)}")
            time.sleep(0.01)

    def load_prefills_then_send_alone(self):
        """Two loading prompts, one per prefill (an idle fleet: P/D as usual); then both prefills
        have 0.4 s queued (>= 300 ms), and the next prompt goes to a decode alone, predicted 0.1 s
        there against 0.5 s on a prefill. Returns that prompt and the decode computing it."""
        for k in range(2):
            self.send(list(range(50000 + k * self.LOAD, 50000 + (k + 1) * self.LOAD)))
            self.await_queued(self.prefills, (k + 1) * self.LOAD, f"loading prompt {k} never reached a prefill")
        alone = list(range(60000, 60000 + self.SHORT))
        self.send(alone)
        self.await_queued(self.decodes, self.SHORT, "the prompt never reached a decode alone")
        return alone, next(d for d in self.decodes if PredictedLatencyTest.queued_on(self, d) == self.SHORT)

    def join_all(self):
        for t in self.threads:
            t.join(timeout=120 * TIME_SCALE)
        self.assertEqual([r[0] for r in self.results], [200] * len(self.threads), self.results)

    def assert_served_alone(self, prompt, decode):
        self.assertNotIn(json.dumps(prompt), [p for n in self.prefills for p in served_prompts(n)])
        plain = [b for b in gen_bodies(decode) if b["prompt"] == prompt]
        self.assertEqual(len(plain), 1)
        self.assertNotIn("kv_transfer_params", plain[0])  # the dialect's plain request


class BusyPrefillTest(BusyPrefillBase):
    """Without a TPOT SLO: a request goes to an idle decode alone, which computes its prompt;
    while that decode computes it, the next request stays P/D."""

    def test_an_idle_decode_computes_a_prompt_while_the_prefills_are_busy(self):
        alone, computing = self.load_prefills_then_send_alone()
        # While that decode computes it, the next prompt is P/D: a decode computing a prompt takes
        # no other, and the other decode stays free of prompts for the P/D decodes.
        paired = list(range(70000, 70000 + self.SHORT))
        self.send(paired)
        self.await_queued(self.prefills, 2 * self.LOAD + self.SHORT, "the next prompt never reached a prefill")
        self.join_all()

        self.assert_served_alone(alone, computing)
        self.assertIn(json.dumps(paired), [p for n in self.prefills for p in served_prompts(n)])
        metrics = self.router.metrics()
        self.assertEqual(metrics['pdrouter_decode_alone_total{reason="prefill_busy"}'], 1)
        doc = PredictedLatencyTest.decisions(self)["decisions"]  # newest first
        self.assertEqual([d["decode_alone"] is not None for d in doc], [False, True, False, False], doc)
        self.assertEqual(doc[1]["decode_alone"]["reason"], "prefill_busy")
        self.assertAlmostEqual(doc[1]["decode_alone"]["predicted_seconds"], 0.1, places=6)
        self.assertEqual(doc[1]["decode"]["chosen"], computing.http_address)


class BusyPrefillTpotSloTest(BusyPrefillBase):
    """With a TPOT SLO and a 64-token step budget: one chunk of a 100-token prompt is 64 ms at
    1,000 tokens/s, within 1,000 ms, so the other decode takes the next prompt too, although the
    first decode computes one (without the SLO that request stays P/D: BusyPrefillTest)."""

    POLICY_OPTIONS = "slo_tpot_ms: 1000, step_token_budget: 64"

    def test_a_decode_takes_a_prompt_whose_chunk_keeps_its_steps_within_the_slo(self):
        first, computing = self.load_prefills_then_send_alone()
        second = list(range(70000, 70000 + self.SHORT))
        self.send(second)
        self.await_queued(self.decodes, 2 * self.SHORT, "the next prompt never reached a decode alone")
        other = next(d for d in self.decodes if d is not computing)
        self.assertEqual(PredictedLatencyTest.queued_on(self, other), self.SHORT)
        self.join_all()

        self.assert_served_alone(first, computing)
        self.assert_served_alone(second, other)
        self.assertEqual(self.router.metrics()['pdrouter_decode_alone_total{reason="prefill_busy"}'], 2)
        doc = PredictedLatencyTest.decisions(self)["decisions"]  # newest first
        self.assertEqual([d["decode_alone"] is not None for d in doc], [True, True, False, False], doc)
        self.assertEqual(doc[0]["decode"]["chosen"], other.http_address)


class SloTest(unittest.TestCase):
    """One prefill and one decode sim, predicted_latency on both legs, a prefill predicted at
    1,000 tokens/s until measured (no transfer term)."""

    def start(self, policy_options="", limits=""):
        self.prefill = SimNode("--role", "prefill", "--connector", "nixl",
                               "--prefill-us-per-token", str(PREFILL_US_PER_TOKEN))
        self.decode = SimNode("--role", "decode", "--connector", "nixl")
        for node in (self.prefill, self.decode):
            self.addCleanup(node.stop)
        options = "default_prefill_tokens_per_second: 1000, kv_transfer_ns_per_token: 0"
        if policy_options:
            options += ", " + policy_options
        topology = ("admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\n"
                    + (f"limits: {{{limits}}}\n" if limits else "")
                    + "policies:\n  prefill: predicted_latency\n  decode: predicted_latency\n"
                    f"  predicted_latency: {{{options}}}\n"
                    "instances:\n"
                    f'  - {{role: prefill, http_address: "{self.prefill.http_address}", connector: nixl}}\n'
                    f'  - {{role: decode, http_address: "{self.decode.http_address}", connector: nixl}}\n')
        self.router = Router(topology, env=ENV)
        self.addCleanup(self.router.stop)

    def post(self, prompt, headers=None, timeout=None):
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        return self.router.request(
            "POST", "/v1/completions",
            body=json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 2}).encode(),
            headers=h, timeout=timeout or 120 * TIME_SCALE)

    def legs_sent(self):
        return len(served_prompts(self.prefill)) + len(served_prompts(self.decode))

    def refused(self, reason):
        return self.router.metrics().get(f'pdrouter_requests_refused_total{{reason="{reason}"}}', 0)

    def test_an_slo_no_node_can_meet_waits_then_503s_at_the_deadline_without_any_leg(self):
        timeout_ms = int(500 * TIME_SCALE)
        self.start(limits=f"queue_timeout_ms: {timeout_ms}")
        started = time.monotonic()
        # 100 tokens at 1,000 tokens/s: 100 ms predicted, against 1 ms asked.
        code, headers, raw = self.post(list(range(100)), {"x-slo-ttft-ms": "1"})
        elapsed = time.monotonic() - started
        self.assertEqual(code, 503, raw)
        self.assertEqual(json.loads(raw)["error"]["code"], "queue_timeout")
        self.assertEqual(headers.get("retry-after"), "1")
        self.assertGreaterEqual(elapsed, timeout_ms / 1000 * 0.9)
        self.assertEqual(self.legs_sent(), 0)
        self.assertEqual(self.refused("queue_timeout"), 1)
        # Within its SLO the same request is served.
        code, _, raw = self.post(list(range(100)), {"x-slo-ttft-ms": "5000"})
        self.assertEqual(code, 200, raw)

    def test_shed_refuses_at_once_with_retry_after(self):
        self.start(policy_options="shed: true", limits="queue_timeout_ms: 60000")
        started = time.monotonic()
        code, headers, raw = self.post(list(range(100)), {"x-slo-ttft-ms": "1"})
        self.assertEqual(code, 503, raw)
        self.assertEqual(json.loads(raw)["error"]["code"], "slo_unmet")
        self.assertEqual(headers.get("retry-after"), "1")
        self.assertLess(time.monotonic() - started, 30)
        self.assertEqual(self.legs_sent(), 0)
        self.assertEqual(self.refused("slo_unmet"), 1)

    def test_a_bad_slo_header_is_a_400_and_counted(self):
        self.start()
        for name, value in (("x-slo-ttft-ms", "abc"), ("x-slo-ttft-ms", "0"), ("x-slo-tpot-ms", "60001"),
                            ("x-slo-tpot-ms", "-1")):
            code, _, raw = self.post([1, 2, 3], {name: value})
            self.assertEqual(code, 400, (name, value, raw))
            error = json.loads(raw)["error"]
            self.assertEqual(error["code"], "bad_slo")
            self.assertIn(name, error["message"])
        self.assertEqual(self.refused("bad_slo"), 4)
        self.assertEqual(self.legs_sent(), 0)

    def test_a_waiting_request_is_sent_when_a_leg_ends(self):
        self.start(limits="queue_timeout_ms: 60000")
        # The loader: 1,324 uncached tokens, 6.6 s on the prefill sim, 1.3 s predicted.
        loader = list(range(20000, 21324))
        results = []
        t = threading.Thread(target=lambda: results.append(self.post(loader)), daemon=True)
        t.start()
        deadline = time.monotonic() + WAIT_S
        key = f'pdrouter_node_prefill_tokens_queued{{node="{self.prefill.http_address}"}}'
        while self.router.metrics().get(key, 0) < len(loader):
            self.assertLess(time.monotonic(), deadline, "the loader never reached the prefill")
            time.sleep(0.01)
        # 12 tokens behind 1,324 queued: 1.34 s predicted, 500 ms asked: it waits for the loader's
        # prefill to answer, then (queue empty, the rate now measured) is well within its SLO.
        started = time.monotonic()
        code, _, raw = self.post(list(range(12)), {"x-slo-ttft-ms": "500"})
        elapsed = time.monotonic() - started
        self.assertEqual(code, 200, raw)
        t.join(timeout=120 * TIME_SCALE)
        self.assertEqual(results[0][0], 200, results)
        # It waited for the loader's prefill (seconds), and was woken by it, not by the 60 s deadline.
        self.assertGreater(elapsed, 2.0)
        self.assertLess(elapsed, 30.0)
        self.assertEqual(self.refused("queue_timeout"), 0)

    def test_the_drain_answers_a_request_waiting_for_its_slo_at_once(self):
        # Deadline and drain both far away: only the drain's own wake answers the waiter soon.
        self.start(limits="queue_timeout_ms: 60000")
        results = []
        t = threading.Thread(target=lambda: results.append(self.post(list(range(100)), {"x-slo-ttft-ms": "1"})),
                             daemon=True)
        t.start()
        self.router.wait_for(lambda: self.router.metrics().get("pdrouter_requests_in_flight", 0) == 1,
                             timeout=WAIT_S)
        started = time.monotonic()
        self.router.process.proc.send_signal(signal.SIGTERM)
        t.join(timeout=60 * TIME_SCALE)
        self.assertEqual(len(results), 1)
        code, _, raw = results[0]
        self.assertEqual(code, 503, raw)
        self.assertEqual(json.loads(raw)["error"]["code"], "shutting_down")
        self.assertLess(time.monotonic() - started, 30)  # not its 60 s deadline
        self.assertEqual(self.legs_sent(), 0)
        self.assertEqual(self.router.process.wait(20 * TIME_SCALE), 0)


if __name__ == "__main__":
    unittest.main()
