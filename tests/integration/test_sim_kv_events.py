"""`pdnode sim`'s prefix cache and KV events end to end: sims publish vLLM KV cache events (ZMQ PUB,
map and array encodings, replay ROUTER) and register their publishers with a real pdrouter
(kv_events.enabled, policies cache_aware). The router's index fills (GET /debug/cache), token-id
prompts go to the sims that hold them, the sims' own hit counts go up, a gap is filled by a replay
(replay answers with the topic frame as vLLM >= 0.26 sends them, and without, as older vLLM and
SGLang do; each with both event encodings) and a prefix cache reset (AllBlocksCleared) empties the
node's entries."""
import http.client
import json
import re
import signal
import time
import unittest

from pdr_testlib import ProcessHandle, pdnode_path
from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode

KEY = "sim-kv-events-test-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
WAIT_S = 15.0
BLOCK = 16

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


def prompt(seed, length=4 * BLOCK):
    """A token-id prompt of `length` ids, distinct per seed."""
    return [100000 + seed * 1000 + i for i in range(length)]


def generations(node):
    """(prompt, cached_tokens) of each generation request `node` logged, in order."""
    out = []
    for r in node.sim_requests()["requests"]:
        if r["method"] == "POST" and r["path"] == "/v1/completions":
            out.append((json.loads(r["body"])["prompt"], r["cached_tokens"]))
    return out


def events_endpoints(node):
    line = node.proc.output("stdout")
    endpoint = re.search(r" kv_events=(tcp://\S+)", line)
    replay = re.search(r" kv_events_replay=(tcp://\S+)", line)
    return endpoint and endpoint.group(1), replay and replay.group(1)


class SimKvEventsTest(unittest.TestCase):
    def setUp(self):
        self.router = Router(TOPOLOGY, env=ENV)
        self.addCleanup(self.router.dir.cleanup)
        self.addCleanup(self.router.stop)
        # Every (event encoding, replay layout) pair once.
        self.prefills = [self.sim("prefill", "map", "topic"), self.sim("prefill", "array", "topic")]
        self.decodes = [self.sim("decode", "array", "no-topic"), self.sim("decode", "map", "no-topic")]
        self.nodes = self.prefills + self.decodes
        self.probes = 0
        for node in self.nodes:
            self.await_subscribed(node)

    def sim(self, role, encoding, replay_layout):
        node = SimNode("--role", role, "--connector", "nixl", "--register", self.router.discovery,
                       "--register-interval-ms", "200",
                       "--kv-events-endpoint", "tcp://127.0.0.1:0",
                       "--kv-events-replay-endpoint", "tcp://127.0.0.1:0",
                       "--kv-events-encoding", encoding,
                       "--kv-events-replay-layout", replay_layout)
        self.addCleanup(node.stop)
        return node

    def matched(self, tokens):
        """{node http address: matched_tokens} from GET /debug/cache."""
        query = ",".join(str(t) for t in tokens)
        code, _, body = self.router.request("GET", f"/debug/cache?tokens={query}", headers=AUTH,
                                            admin=True)
        self.assertEqual(code, 200, body)
        return {n["node"]: n["matched_tokens"] for n in json.loads(body)["nodes"]}

    def await_subscribed(self, node):
        """Waits until the router holds events from `node`: a PUB socket drops what it sends before
        the subscriber connects, so each attempt sends a fresh prompt straight to the sim until one
        shows up in the index."""
        inst, _ = self.router.wait_for(lambda: self.router.instance(node.http_address), WAIT_S)
        endpoint, replay = events_endpoints(node)
        self.assertEqual(inst["kv_events_endpoint"], endpoint)
        self.assertEqual(inst["kv_events_replay_endpoint"], replay)
        deadline = time.monotonic() + WAIT_S * TIME_SCALE
        while time.monotonic() < deadline:
            self.probes += 1
            tokens = prompt(900 + self.probes, BLOCK + 1)
            self.send_direct(node, tokens)
            try:
                self.router.wait_for(lambda: self.matched(tokens).get(node.http_address), 0.5)
                return
            except AssertionError:
                continue
        self.fail(f"the router never indexed {node.http_address}'s events")

    def send_direct(self, node, tokens):
        """A plain request (no kv_transfer_params): the node prefills it itself."""
        status, body = node.post_json("/v1/completions", {"prompt": tokens, "max_tokens": 1})
        self.assertEqual(status, 200, body)

    def post(self, tokens):
        code, _, raw = self.router.request("POST", "/v1/completions", timeout=10 * TIME_SCALE,
                                           body=json.dumps({"model": "sim-model", "prompt": tokens,
                                                            "max_tokens": 2}).encode(),
                                           headers={"Content-Type": "application/json"})
        self.assertEqual(code, 200, raw)

    def holders(self, nodes, tokens):
        return [i for i, n in enumerate(nodes) if any(p == tokens for p, _ in generations(n))]

    def test_token_prompts_follow_the_sims_that_cached_them(self):
        base = [prompt(c) for c in range(4)]
        where = {}
        for c, tokens in enumerate(base):
            self.post(tokens)
            (p,), (d,) = self.holders(self.prefills, tokens), self.holders(self.decodes, tokens)
            where[c] = (p, d)
            # Both legs' caches hold the prompt's 4 blocks; the router's index learns it.
            self.router.wait_for(lambda: self.matched(tokens) == {
                self.prefills[p].http_address: 4 * BLOCK,
                self.decodes[d].http_address: 4 * BLOCK}, WAIT_S)
        hits_before = [n.sim_requests()["counters"]["prefix_cache_hit_tokens"] for n in self.prefills]
        for turn in range(3):
            for c, tokens in enumerate(base):
                longer = tokens + prompt(50 + 10 * c + turn, BLOCK)
                self.post(longer)
                p, d = where[c]
                self.assertEqual(self.holders(self.prefills, longer), [p], (c, turn))
                self.assertEqual(self.holders(self.decodes, longer), [d], (c, turn))
                # The sim itself found the shared blocks in its cache.
                cached = [k for q, k in generations(self.prefills[p]) if q == longer]
                self.assertEqual(cached, [4 * BLOCK])
        hits_after = [n.sim_requests()["counters"]["prefix_cache_hit_tokens"] for n in self.prefills]
        self.assertEqual(sum(hits_after) - sum(hits_before), 12 * 4 * BLOCK)
        metrics = self.router.metrics()
        hits = sum(v for k, v in metrics.items()
                   if k.startswith("pdrouter_cache_routing_requests_total") and 'result="hit"' in k)
        self.assertGreaterEqual(hits, 12, {k: v for k, v in metrics.items() if "cache_routing" in k})

    def test_a_gap_is_filled_by_a_replay(self):
        """On each sim (each encoding x replay layout): one batch withheld, the next one sent; the
        router sees the gap and fills it from the sim's replay socket. Before pdrouter read the
        layout with the topic frame, such a replay failed and the node's entries were dropped."""
        for i, node in enumerate(self.nodes):
            with self.subTest(node=i):
                status, raw, _ = node.request("POST", "/sim/prefix_cache", {"withhold_batches": 1})
                self.assertEqual(status, 200, raw)
                hidden, next_one = prompt(70 + 2 * i), prompt(71 + 2 * i)
                self.send_direct(node, hidden)   # numbered and buffered, never sent
                self.send_direct(node, next_one)  # sent: the router sees the gap and replays it
                self.router.wait_for(
                    lambda: self.matched(next_one).get(node.http_address) == 4 * BLOCK, WAIT_S)
                self.assertEqual(self.matched(hidden).get(node.http_address), 4 * BLOCK)
                status, raw, _ = node.request("GET", "/sim/prefix_cache")
                stats = json.loads(raw)["kv_events"]
                self.assertEqual(stats["withheld"], 1)
                self.assertGreaterEqual(stats["replay_requests"], 1)
                self.assertGreaterEqual(stats["replayed_batches"], 1)
        metrics = self.router.metrics()
        self.assertGreaterEqual(metrics["pdrouter_kv_events_replays_total"], len(self.nodes))
        self.assertEqual(metrics.get("pdrouter_kv_events_replay_failures_total", 0), 0)
        self.assertEqual(metrics.get("pdrouter_kv_events_gaps_total", 0), 0)
        self.assertEqual(metrics.get("pdrouter_kv_events_bad_messages_total", 0), 0)

    def test_a_prefix_cache_reset_clears_the_nodes_entries(self):
        node = self.prefills[0]
        tokens = prompt(80)
        self.send_direct(node, tokens)
        self.router.wait_for(lambda: self.matched(tokens).get(node.http_address) == 4 * BLOCK,
                             WAIT_S)
        status, raw, _ = node.request("POST", "/reset_prefix_cache")
        self.assertEqual(status, 200, raw)
        self.router.wait_for(lambda: node.http_address not in self.matched(tokens), WAIT_S)
        self.send_direct(node, tokens)
        self.assertEqual(generations(node)[-1], (tokens, 0))


class SimKvEventsDpTest(unittest.TestCase):
    def test_each_dp_rank_has_its_cache_and_publisher(self):
        """With port 0 each DP rank binds an ephemeral port of its own (an ephemeral base plus the
        rank may be another process's port: the sim then failed to start with "Address already
        in use"); the registration lists them and the router subscribes to each rank there, its
        replay socket included."""
        router = Router(TOPOLOGY, env=ENV)
        self.addCleanup(router.dir.cleanup)
        self.addCleanup(router.stop)
        node = SimNode("--role", "prefill", "--connector", "nixl", "--dp-size", "2",
                       "--register", router.discovery, "--register-interval-ms", "200",
                       "--kv-events-endpoint", "tcp://127.0.0.1:0",
                       "--kv-events-replay-endpoint", "tcp://127.0.0.1:0")
        self.addCleanup(node.stop)
        status, raw, _ = node.request("GET", "/sim/prefix_cache")
        published = json.loads(raw)["kv_events"]
        ports, replay_ports = published["ports"], published["replay_ports"]
        self.assertEqual((len(ports), len(replay_ports)), (2, 2), published)
        endpoint, replay = events_endpoints(node)
        self.assertEqual((endpoint, replay), ("tcp://127.0.0.1:%d" % ports[0],
                                              "tcp://127.0.0.1:%d" % replay_ports[0]))

        def subscribed():
            inst = router.instance(node.http_address)
            return inst if ((inst or {}).get("kv_events") or {}).get("subscribed_ranks") == 2 else None

        inst, _ = router.wait_for(subscribed, WAIT_S)
        self.assertEqual((inst["kv_events_ports"], inst["kv_events_replay_ports"]),
                         (ports, replay_ports))

        def send(rank, tokens):
            status, body = node.post_json("/v1/completions", {"prompt": tokens, "max_tokens": 1},
                                          {"X-data-parallel-rank": str(rank)})
            self.assertEqual(status, 200, body)
            return generations(node)[-1][1]

        def indexed(tokens):
            query = ",".join(str(t) for t in tokens)
            code, _, body = router.request("GET", f"/debug/cache?tokens={query}", headers=AUTH,
                                           admin=True)
            return code == 200 and any(n["node"] == node.http_address
                                       for n in json.loads(body)["nodes"])

        # A PUB socket drops what it sends before the SUB connects: probe until rank 1's
        # events arrive at the router, which found them on rank 1's listed port.
        deadline = time.monotonic() + WAIT_S * TIME_SCALE
        seed = 0
        while True:
            seed += 1
            tokens = prompt(500 + seed, BLOCK + 1)
            send(1, tokens)
            try:
                router.wait_for(lambda: indexed(tokens), 0.5)
                break
            except AssertionError:
                self.assertLess(time.monotonic(), deadline, "rank 1's events never arrived")
        # Rank 0's cache does not hold what rank 1 computed; rank 1's does.
        self.assertEqual(send(0, tokens), 0)
        self.assertEqual(send(1, tokens), BLOCK)
        status, raw, _ = node.request("GET", "/sim/prefix_cache")
        ranks = json.loads(raw)["ranks"]
        self.assertEqual(len(ranks), 2)
        self.assertGreaterEqual(ranks[1]["hit_tokens"], BLOCK)
        # A gap on rank 1 is filled from rank 1's own replay socket.
        status, raw, _ = node.request("POST", "/sim/prefix_cache", {"withhold_batches": 1})
        self.assertEqual(status, 200, raw)
        hidden, next_one = prompt(560, BLOCK + 1), prompt(561, BLOCK + 1)
        send(1, hidden)
        send(1, next_one)
        router.wait_for(lambda: indexed(next_one) and indexed(hidden), WAIT_S)
        self.assertGreaterEqual(router.metrics()["pdrouter_kv_events_replays_total"], 1)
        self.assertEqual(router.metrics().get("pdrouter_kv_events_gaps_total", 0), 0)


class SimKvEventsRestartTest(unittest.TestCase):
    """A sim killed and started again on the same HTTP and KV events ports: its sequence numbers
    start from 0 again, and the router drops what the old process had cached."""

    def start(self, http, events):
        proc = ProcessHandle([pdnode_path(), "sim", "--http", http, "--role", "prefill",
                              "--connector", "nixl", "--kv-backends", "none",
                              "--register", self.router.discovery, "--register-interval-ms", "200",
                              "--kv-events-endpoint", events], name="pdnode-sim")
        self.addCleanup(proc.stop)
        line = proc.wait_for_line(r"pdnode sim listening http=", 10 * TIME_SCALE, streams=("stdout",))
        self.assertIsNotNone(line, proc.output())
        return (proc, re.search(r"http=(\S+)", line).group(1),
                re.search(r" kv_events=(\S+)", line).group(1))

    def send_until_indexed(self, address, seed):
        """Sends fresh prompts straight to the sim until the router indexes one; returns it."""
        deadline = time.monotonic() + WAIT_S * TIME_SCALE
        while True:
            seed += 1
            tokens = prompt(seed, BLOCK + 1)
            host, port = address.rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=10)
            conn.request("POST", "/v1/completions", json.dumps({"prompt": tokens, "max_tokens": 1}),
                         {"Content-Type": "application/json"})
            self.assertEqual(conn.getresponse().status, 200)
            conn.close()
            try:
                self.router.wait_for(lambda: address in self.indexed(tokens), 0.5)
                return tokens
            except AssertionError:
                self.assertLess(time.monotonic(), deadline, "the sim's events never arrived")

    def indexed(self, tokens):
        query = ",".join(str(t) for t in tokens)
        code, _, body = self.router.request("GET", f"/debug/cache?tokens={query}", headers=AUTH,
                                            admin=True)
        self.assertEqual(code, 200, body)
        return {n["node"] for n in json.loads(body)["nodes"]}

    def test_a_restarted_publisher_drops_the_old_entries(self):
        self.router = Router(TOPOLOGY, env=ENV)
        self.addCleanup(self.router.dir.cleanup)
        self.addCleanup(self.router.stop)
        old, address, events = self.start("127.0.0.1:0", "tcp://127.0.0.1:0")
        before = self.send_until_indexed(address, 600)
        old.send_signal(signal.SIGKILL)  # SIGKILL: no goodbye, the registration lives on
        self.assertIsNotNone(old.wait(5 * TIME_SCALE))
        self.start(address, events)
        after = self.send_until_indexed(address, 700)
        self.assertNotIn(address, self.indexed(before))
        self.assertIn(address, self.indexed(after))
        metrics = self.router.metrics()
        restarts = (metrics.get("pdrouter_kv_events_publisher_restarts_total", 0) +
                    metrics.get("pdrouter_kv_events_node_restarts_total", 0))
        self.assertGreaterEqual(restarts, 1, metrics)


class SimPrefixCacheTest(unittest.TestCase):
    def test_lru_bound_and_counters(self):
        node = SimNode("--kv-block-tokens", "4", "--prefix-cache-blocks", "2")
        self.addCleanup(node.stop)
        a, b = prompt(1, 9), prompt(2, 9)
        for tokens in (a, a, b, a):
            status, body = node.post_json("/v1/completions", {"prompt": tokens, "max_tokens": 1})
            self.assertEqual(status, 200, body)
        # a: stored; a: 2 blocks hit; b: evicts a's blocks; a: nothing left.
        self.assertEqual([k for _, k in generations(node)], [0, 8, 0, 0])
        counters = node.sim_requests()["counters"]
        self.assertEqual(counters["prefix_cache_queries"], 4)
        self.assertEqual(counters["prefix_cache_queried_tokens"], 36)
        self.assertEqual(counters["prefix_cache_hit_tokens"], 8)
        self.assertEqual(counters["prefix_cache_hits"], 1)
        status, raw, _ = node.request("GET", "/sim/prefix_cache")
        stats = json.loads(raw)
        self.assertEqual(stats["capacity_blocks"], 2)
        self.assertEqual(stats["ranks"][0]["evicted_blocks"], 4)
        self.assertIsNone(stats["kv_events"])
        # Text prompts: one token per word, so a repeated text hits too.
        text = " ".join(f"w{i}" for i in range(9))
        node.post_json("/v1/completions", {"prompt": text, "max_tokens": 1})
        node.post_json("/v1/completions", {"prompt": text, "max_tokens": 1})
        self.assertEqual(generations(node)[-1], (text, 8))

    def test_prefill_time_is_paid_on_uncached_tokens_only(self):
        node = SimNode("--prefill-us-per-token", "5000", "--decode-us-per-token", "100")
        self.addCleanup(node.stop)
        tokens = prompt(3, 10 * BLOCK)

        def timed():
            started = time.monotonic()
            status, body = node.post_json("/v1/completions", {"prompt": tokens, "max_tokens": 1})
            self.assertEqual(status, 200, body)
            return time.monotonic() - started

        first = timed()   # 160 tokens x 5 ms
        second = timed()  # 9 blocks cached: 16 tokens x 5 ms
        self.assertEqual([k for _, k in generations(node)], [0, 9 * BLOCK])
        self.assertGreaterEqual(first, 0.8)
        # 0.72 s less simulated work; a loaded machine adds about as much to both.
        self.assertLess(second + 0.3, first, (first, second))

    def test_bad_flags_and_controls_are_refused(self):
        node = SimNode()
        self.addCleanup(node.stop)
        status, raw, _ = node.request("POST", "/sim/prefix_cache", {"withhold_batches": 1})
        self.assertEqual(status, 400, raw)  # no publisher
        self.assertIn(b"withhold_batches", raw)
        for flags in (["--kv-events-encoding", "json"],
                      ["--kv-events-endpoint", "tcp://127.0.0.1:0", "--kv-events-replay-layout", "v2"],
                      ["--kv-events-replay-endpoint", "tcp://127.0.0.1:0"],
                      ["--kv-events-endpoint", "udp://127.0.0.1:0"],
                      ["--kv-events-endpoint", "tcp://127.0.0.1:0",
                       "--kv-events-replay-endpoint", "tcp://127.0.0.2:0"]):
            proc = ProcessHandle([pdnode_path(), "sim", "--kv-backends", "none", *flags],
                                 name="pdnode-sim")
            self.assertEqual(proc.wait(10 * TIME_SCALE), 2, (flags, proc.output()))
            self.assertIn("--kv-events", proc.output())


if __name__ == "__main__":
    unittest.main()
