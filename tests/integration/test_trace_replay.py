"""pdrouter-bench --trace (bench/loadgen/trace_workload.h) against real processes: a tiny Mooncake-format
trace replayed through a real pdrouter (cache_aware, KV events from the sims) to `pdnode sim`
prefill and decode nodes, and straight to sims.

  * Through pdrouter: every request completes with exactly the trace's input and output lengths
    (usage), the prefill sims receive token-id prompts in which the trace's shared hash ids are
    identical blocks and the rest (partial last blocks) differs between requests, arrivals at the
    sims span the trace's timestamps over the speed-up, the oracle hit rate is the trace's
    shared blocks, and the router's prefix-cache hit rate is read from its /metrics; the same
    through /inference/v1/generate (--backend generate).
  * SLO accounting against a paced decode sim: TBT objectives below the sim's token gap miss
    every request, generous ones meet every one; 503 and 429 answers are counted by status.
  * Several --base-url targets take requests in turn.
  * A bad trace line is refused with its line number (exit 2) before anything is sent.
"""
import json
import os
import tempfile
import unittest

from pd_fixture import PdCluster
from pdr_testlib import ProcessHandle, pdrouter_bench_path
from pdrouter_fixture import TIME_SCALE
from sim_fixture import SimNode

RUN_TIMEOUT_S = 60.0 * TIME_SCALE
BLOCK = 32  # --trace-block-size: small blocks keep the prompts small

# (timestamp ms, input_length, output_length, hash_ids). Shared: ids 1, 2 (three requests), 3
# (r0 and r4, whose prompts differ only in their partial last block), 7 (r3 and r5).
TRACE = [
    (0, 100, 3, [1, 2, 3]),
    (100, 80, 4, [1, 2, 5]),
    (200, 64, 2, [1, 2]),
    (300, 96, 5, [7, 8, 9]),
    (400, 100, 3, [1, 2, 3]),
    (600, 40, 1, [7]),
]
SPEEDUP = 2.0
# In 16-token blocks (the oracle's), the tokens of each prompt sent before: r1 and r2 64 (ids 1,
# 2), r4 96 (1, 2, 3), r5 32 (7).
ORACLE_HIT_RATE = (64 + 64 + 96 + 32) / sum(t[1] for t in TRACE)


def write_trace(rows=TRACE, extra_lines=()):
    path = os.path.join(tempfile.mkdtemp(prefix="pdr-trace-"), "trace.jsonl")
    with open(path, "w", encoding="utf-8") as f:
        for ts, n_in, n_out, ids in rows:
            f.write(json.dumps({"timestamp": ts, "input_length": n_in, "output_length": n_out,
                                "hash_ids": ids}) + "\n")
        for line in extra_lines:
            f.write(line + "\n")
    return path


def run_bench(flags, expect_code=0):
    out_dir = tempfile.mkdtemp(prefix="pdr-trace-bench-")
    result_path = os.path.join(out_dir, "result.json")
    proc = ProcessHandle([pdrouter_bench_path(), "--json", result_path, "--no-progress", *flags],
                         name="pdrouter-bench")
    code = proc.wait(RUN_TIMEOUT_S)
    if code is None:
        proc.stop()
        raise AssertionError("pdrouter-bench did not finish:\n" + proc.output())
    stdout, stderr = proc.output("stdout"), proc.output("stderr")
    if code != expect_code:
        raise AssertionError("pdrouter-bench exited %s, expected %s\nstdout:\n%s\nstderr:\n%s"
                             % (code, expect_code, stdout, stderr))
    result = None
    if os.path.exists(result_path):
        with open(result_path, encoding="utf-8") as f:
            result = json.load(f)
    return result, stdout, stderr


def generation_requests(node, path=None):
    return [r for r in node.sim_requests()["requests"] if r["method"] == "POST"
            and (r["path"] == path if path else r["path"] in ("/v1/completions",
                                                                "/inference/v1/generate"))]


class ThroughPdrouter(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        topology = ("kv_events:\n  enabled: true\n"
                    "policies:\n  prefill: cache_aware\n  decode: round_robin\n")
        cls.cluster = PdCluster("nixl", prefills=2, decodes=1, topology=topology, kv_backends="none",
                                prefill_flags=("--kv-events-endpoint", "tcp://127.0.0.1:0"))
        try:
            cls.await_kv_events()
        except BaseException:
            cls.cluster.close()
            raise

    @classmethod
    def await_kv_events(cls):
        """Until the router applies events from both prefills: a ZMQ subscriber misses what a
        publisher sends before the subscription is through, so a replay started at once could
        find no node holding anything."""
        router = cls.cluster.router
        router.wait_for(lambda: router.metrics().get("pdrouter_kv_events_subscribed_ranks") == 2,
                        timeout=10)
        batches = lambda: router.metrics().get("pdrouter_kv_events_batches_total", 0)
        for i, node in enumerate(cls.cluster.prefills):
            for attempt in range(50):
                before = batches()
                # 32 ids no trace prompt uses (they are below 1000): two full blocks of 16.
                code, body = node.post_json("/v1/completions", {
                    "model": "sim-model", "prompt": [i * 100 + attempt + 1] * 32, "max_tokens": 1})
                assert code == 200, body
                try:
                    router.wait_for(lambda: batches() > before, timeout=0.2)
                    break
                except AssertionError:
                    continue
            else:
                raise AssertionError("the router applied no KV events from %s" % node.http_address)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def setUp(self):
        for node in self.cluster.prefills + self.cluster.decodes:
            node.reset()

    def replay(self, *flags):
        router = "http://" + self.cluster.router.http
        metrics = [f for node in self.cluster.prefills
                   for f in ("--engine-metrics-url", "http://%s/metrics" % node.http_address)]
        return run_bench(["--base-url", router, "--trace", write_trace(), "--trace-speedup",
                          str(SPEEDUP), "--trace-block-size", str(BLOCK), "--router-metrics-url",
                          router + "/metrics", "--no-test-request", *metrics, *flags])

    def prefill_prompts(self, path, key):
        """Every prompt the prefill sims received, as id lists, with each one's arrival time."""
        out = []
        for node in self.cluster.prefills:
            for r in generation_requests(node, path):
                out.append((r["arrival_unix_ms"], json.loads(r["body"])[key]))
        return sorted(out)

    def check_prompts(self, prompts):
        self.assertEqual(sorted(len(p) for _, p in prompts), sorted(t[1] for t in TRACE))
        self.assertTrue(all(isinstance(t, int) and t >= 1000 for _, p in prompts for t in p))
        by_len = {}
        for _, p in prompts:
            by_len.setdefault(len(p), []).append(p)
        first, again = by_len[100]
        # ids [1, 2, 3] twice: the three full blocks equal, the partial 4-token block not.
        self.assertEqual(first[:96], again[:96])
        self.assertNotEqual(first[96:], again[96:])
        # ids 1, 2 open the 80- and 64-token prompts too; the 80's third block (id 5, partial)
        # differs from the 100s' third (id 3).
        for p in (by_len[80][0], by_len[64][0]):
            self.assertEqual(p[:64], first[:64])
        self.assertNotEqual(by_len[80][0][64:80], first[64:80])
        # ids 7...: its own first block, shared with the 40-token prompt only.
        self.assertEqual(by_len[96][0][:32], by_len[40][0][:32])
        self.assertNotEqual(by_len[96][0][:32], first[:32])
        self.assertNotEqual(by_len[40][0][32:], by_len[96][0][32:40])
        # Arrivals follow the trace: 600 ms of trace at speed-up 2 is at least ~300 ms.
        self.assertGreater(prompts[-1][0] - prompts[0][0], 600 / SPEEDUP * 0.8)

    def test_completions_replay_sends_the_trace_and_reports_slo_and_cache(self):
        result, stdout, _ = self.replay("--slo-ttft-ms", str(10000 * TIME_SCALE))
        self.assertEqual((result["completed"], result["failed"]), (len(TRACE), 0))
        self.assertEqual(result["dataset_name"], "mooncake_trace")
        self.assertEqual(result["total_input_tokens"], sum(t[1] for t in TRACE))
        self.assertEqual(result["total_output_tokens"], sum(t[2] for t in TRACE))
        self.assertEqual(result["input_lens"], [t[1] for t in TRACE])
        self.assertEqual(result["output_lens"], [t[2] for t in TRACE])
        self.assertAlmostEqual(result["trace_span_s"], 0.3, places=6)
        self.assertAlmostEqual(result["oracle_prefix_hit_rate"], ORACLE_HIT_RATE, places=6)
        # Sims decode 1 ms a token: every request meets 10 s / 100 ms.
        self.assertEqual((result["slo_met"], result["slo_requests"]), (len(TRACE), len(TRACE)))
        self.assertEqual(result["slo_attainment"], 1.0)
        self.assertGreater(result["goodput"], 0)
        self.assertEqual(len(result["tbts"]), len(TRACE))
        self.assertEqual((result["http_429"], result["http_503"]), (0, 0))
        self.check_prompts(self.prefill_prompts("/v1/completions", "prompt"))
        # The router looked every prefill up in the sims' KV events: a hit rate, within what the
        # trace allows (events may reach it after a later request was routed).
        self.assertEqual(result["scrape_errors"], [])
        # KV events found the trace's shared blocks on the node it chose (at most what the trace
        # shares; events still in flight when a request was routed count as misses).
        self.assertEqual(result["router_prefix_hit_source"], "prefill/kv_events")
        rate = result["router_prefix_hit_rate"]
        self.assertGreater(rate, 0.0)
        self.assertLessEqual(rate, ORACLE_HIT_RATE + 1e-9)
        # The sims' pages have no vLLM prefix-cache counters unless they model vLLM's: the rate
        # is then unknown, never a made-up 0.
        page = self.cluster.prefills[0].request("GET", "/metrics")[1].decode()
        if "vllm:prefix_cache_queries_total" not in page:
            self.assertIsNone(result["engine_prefix_hit_rate"])
        else:
            self.assertIsNotNone(result["engine_prefix_hit_rate"])
        self.assertIn("SLO attainment (%):                     100.00", stdout)
        self.assertIn("Router, prefill/kv_events (%):", stdout)

    def test_generate_replay_sends_token_ids(self):
        result, _, _ = self.replay("--backend", "generate")
        self.assertEqual((result["completed"], result["failed"]), (len(TRACE), 0))
        self.assertEqual(result["endpoint"], "/inference/v1/generate")
        self.assertEqual(result["total_output_tokens"], sum(t[2] for t in TRACE))
        self.check_prompts(self.prefill_prompts("/inference/v1/generate", "token_ids"))
        decoded = generation_requests(self.cluster.decodes[0], "/inference/v1/generate")
        self.assertEqual(sorted(json.loads(r["body"])["sampling_params"]["max_tokens"]
                                for r in decoded), sorted(t[2] for t in TRACE))


class AgainstSims(unittest.TestCase):
    def setUp(self):
        # 20 ms between tokens.
        self.node = SimNode("--role", "decode", "--decode-us-per-token", "20000")
        self.addCleanup(self.node.stop)

    def test_tbt_objective_decides_attainment(self):
        trace = write_trace([(0, 40, 6, [1]), (10, 40, 6, [1]), (20, 50, 6, [2])])
        flags = ["--port", str(self.node.port), "--trace", trace, "--trace-block-size", str(BLOCK),
                 "--no-test-request", "--slo-tbt-ms", "100"]
        # 100 ms x 0.1: a 10 ms objective, below every 20 ms gap.
        result, _, _ = run_bench(flags + ["--slo-scale", "0.1"])
        self.assertEqual(result["completed"], 3)
        self.assertEqual((result["slo_met"], result["slo_met_tbt"], result["slo_attainment"]),
                         (0, 0, 0.0))
        self.assertEqual(result["slo_met_ttft"], 3)
        self.assertEqual(result["goodput"], 0.0)
        self.assertGreaterEqual(min(result["tbts"]), 0.015)
        self.assertAlmostEqual(result["slo_tbt_ms"], 10.0)
        # Generous objectives: all met.
        result, _, _ = run_bench(flags + ["--slo-scale", str(20 * TIME_SCALE)])
        self.assertEqual((result["slo_met"], result["slo_attainment"]), (3, 1.0))

    def test_429_and_503_are_counted_by_status(self):
        self.node.set_fault(status=503, count=2)
        trace = write_trace([(i, 20, 2, []) for i in range(5)])
        result, stdout, _ = run_bench(["--port", str(self.node.port), "--trace", trace,
                                       "--no-test-request", "--max-concurrency", "1"],
                                      expect_code=1)
        self.assertEqual((result["completed"], result["failed"]), (3, 2))
        self.assertEqual((result["http_503"], result["http_429"]), (2, 0))
        self.assertEqual(result["failed_http_status"], {"503": 2})
        self.assertAlmostEqual(result["slo_attainment"], 0.6)
        self.assertIn("HTTP 503:                               2", stdout)
        self.node.set_fault(status=429, count=1)
        result, _, _ = run_bench(["--port", str(self.node.port), "--trace", trace,
                                  "--no-test-request", "--max-concurrency", "1"], expect_code=1)
        self.assertEqual((result["http_429"], result["http_503"]), (1, 0))

    def test_requests_take_the_base_urls_in_turn(self):
        other = SimNode("--role", "decode")
        self.addCleanup(other.stop)
        trace = write_trace([(i, 20, 2, []) for i in range(6)])
        result, _, _ = run_bench(["--base-url", "http://127.0.0.1:%d" % self.node.port,
                                  "--base-url", "http://127.0.0.1:%d" % other.port,
                                  "--trace", trace, "--model", "sim-model"])
        self.assertEqual(result["completed"], 6)
        # The test request went to the first URL.
        self.assertEqual((len(generation_requests(self.node)), len(generation_requests(other))),
                         (4, 3))

    def test_bad_trace_lines_are_refused_with_their_line_number(self):
        block = ["--trace-block-size", str(BLOCK)]
        trace = write_trace(TRACE[:2], extra_lines=['{"timestamp": 900, "input_length": "x"}'])
        _, _, stderr = run_bench(["--port", str(self.node.port), "--trace", trace, *block],
                                 expect_code=2)
        self.assertIn("trace.jsonl line 3: input_length must be an integer >= 1, not a string",
                      stderr)
        trace = write_trace(TRACE[:2], extra_lines=['{"timestamp": 50, "input_length": 5, '
                                                    '"output_length": 1, "hash_ids": []}'])
        _, _, stderr = run_bench(["--port", str(self.node.port), "--trace", trace, *block],
                                 expect_code=2)
        self.assertIn("line 3: timestamp 50 is before the previous line's 100", stderr)
        _, _, stderr = run_bench(["--port", str(self.node.port), "--trace", trace,
                                  "--request-rate", "5"], expect_code=2)
        self.assertIn("--request-rate excludes --trace", stderr)
        _, _, stderr = run_bench(["--port", str(self.node.port), "--trace", "/nonexistent/t.jsonl"],
                                 expect_code=2)
        self.assertIn("cannot open /nonexistent/t.jsonl", stderr)
        self.assertEqual(generation_requests(self.node), [])
        # --num-prompts replays the start only: the bad third line is never read.
        result, _, _ = run_bench(["--port", str(self.node.port), "--trace", trace, *block,
                                  "--num-prompts", "2", "--no-test-request"])
        self.assertEqual(result["completed"], 2)


if __name__ == "__main__":
    unittest.main()
