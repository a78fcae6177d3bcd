"""pdrouter-bench (bench/loadgen/) against real processes: simulated vLLM nodes alone and behind pdrouter.

  * Through pdrouter to 2 prefill + 2 decode sims (MoRIIO WRITE, real KV bytes): every request
    succeeds; the JSON result counts exactly the tokens the decode leg was asked for; each
    request has one inter-token gap fewer than tokens; TTFT/ITL/throughput are positive; progress lines go to stderr.
  * The arrival schedule is real: the sim's own arrival stamps of a rate-20 run span at least the
    time the schedule asks for (sending everything at once would not).
  * --max-concurrency caps what is in flight (the sim never sees more at once: its arrival and
    answer times are checked), chat and token-id prompts work, and the model is found through
    GET /v1/models.
  * Failures are counted with their reasons and exit 1: HTTP errors from the node, a stream cut
    by a dying decode behind pdrouter (an error event, never a silent short success).
  * Cache workloads: multi_turn chat sends a conversation's turns in order, each turn's messages
    the previous turn's plus the answer the sim streamed back plus a new user message;
    prefix_repetition (token ids) shares exactly --prefix-repetition-num-prefixes prefixes; both
    report the oracle prefix hit rate the workload implies.
  * SIGINT cancels what is in flight (the node sees the aborts) and prints the partial table,
    exit 130. Bad flags exit 2 and an unreachable server exits 1, each with a message.
"""
import json
import os
import signal
import tempfile
import unittest

from pd_fixture import PdCluster
from pdr_testlib import ProcessHandle, pdrouter_bench_path
from pdrouter_fixture import TIME_SCALE
from sim_fixture import SimNode

RUN_TIMEOUT_S = 60.0 * TIME_SCALE


def run_bench(port, *flags, expect_code=0):
    """Runs pdrouter-bench to completion; returns (result JSON or None, stdout, stderr)."""
    out_dir = tempfile.mkdtemp(prefix="pdr-bench-")
    result_path = os.path.join(out_dir, "result.json")
    proc = ProcessHandle([pdrouter_bench_path(), "--port", str(port), "--json", result_path,
                          "--progress-interval", "0.2", *flags], name="pdrouter-bench")
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


def generation_requests(node):
    return [r for r in node.sim_requests()["requests"] if r["path"].startswith("/v1/")
            and r["path"] != "/v1/models"]


class ThroughPdrouter(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("moriio", transfer_mode="WRITE", prefills=2, decodes=2)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def port(self):
        return int(self.cluster.router.http.rsplit(":", 1)[1])

    def test_streamed_run_counts_every_token(self):
        prompts, input_len, output_len = 24, 300, 12
        for decode in self.cluster.decodes:
            decode.reset()  # forget the other tests' requests
        result, stdout, stderr = run_bench(
            self.port(), "--num-prompts", str(prompts), "--random-input-len", str(input_len),
            "--random-output-len", str(output_len), "--request-rate", "40", "--seed", "3")
        self.assertEqual(result["completed"], prompts)
        self.assertEqual(result["failed"], 0)
        self.assertEqual(result["error_counts"], {})
        # MoRIIO's proxy rule (docs/design/wire-formats.md 1.3 step 6): the decode leg asks for max_tokens - 1, so a client
        # gets one token less than it asked for through any MoRIIO router; usage says so.
        self.assertEqual(result["total_output_tokens"], prompts * (output_len - 1))
        # The sims count one token per word: usage.prompt_tokens equals the asked length.
        self.assertEqual(result["total_input_tokens"], prompts * input_len)
        self.assertEqual(result["model_id"], "sim-model")
        self.assertEqual(len(result["itls"]), prompts)
        for gaps in result["itls"]:
            self.assertEqual(len(gaps), output_len - 2)
        for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_itl_ms",
                    "p99_itl_ms", "mean_e2el_ms", "request_throughput", "output_throughput"):
            self.assertGreater(result[key], 0, key)
        self.assertLessEqual(result["median_ttft_ms"], result["p99_ttft_ms"])
        self.assertIn("Successful requests:", stdout)
        self.assertIn("Mean TTFT (ms):", stdout)
        self.assertIn("P99 ITL (ms):", stdout)
        self.assertRegex(stderr, r"pdrouter-bench: %d/%d done, 0 failed" % (prompts, prompts))
        self.assertIn("test request OK", stderr)
        # Every request (and the test request) really went through the P/D pair: each decode
        # sim verified the KV bytes its prefill sent.
        decoded = sum(len(generation_requests(d)) for d in self.cluster.decodes)
        self.assertEqual(decoded, prompts + 1)
        for decode in self.cluster.decodes:
            self.assertEqual(decode.kv_stats()["kv_mismatches"], 0)

    def test_decode_dying_mid_stream_is_a_failure_with_a_reason(self):
        for decode in self.cluster.decodes:
            decode.set_fault(close_after_tokens=2, count=1)
        try:
            result, stdout, _ = run_bench(
                self.port(), "--num-prompts", "6", "--random-input-len", "20",
                "--random-output-len", "8", "--no-test-request", "--max-concurrency", "1",
                expect_code=1)
        finally:
            for decode in self.cluster.decodes:
                decode.clear_faults()
        self.assertEqual(result["completed"] + result["failed"], 6)
        self.assertGreaterEqual(result["failed"], 1)
        reasons = list(result["error_counts"])
        # pdrouter ends a stream whose decode died with an OpenAI-style error event.
        self.assertTrue(all(r.startswith("error event:") for r in reasons), reasons)
        self.assertIn("Errors", stdout)


class AgainstOneSim(unittest.TestCase):
    def setUp(self):
        self.node = SimNode("--role", "decode", "--decode-us-per-token", "2000")

    def tearDown(self):
        self.node.stop()

    def test_arrivals_follow_the_request_rate(self):
        # 20 requests at 20/s with burstiness 100 (nearly regular gaps): ~0.95 s from first to
        # last arrival. Sent all at once they would arrive within a few milliseconds.
        result, _, _ = run_bench(self.node.port, "--num-prompts", "20", "--random-input-len", "5",
                                 "--random-output-len", "2", "--request-rate", "20",
                                 "--burstiness", "100", "--no-test-request")
        self.assertEqual(result["completed"], 20)
        arrivals = sorted(r["arrival_unix_ms"] for r in generation_requests(self.node))
        self.assertEqual(len(arrivals), 20)
        self.assertGreater(arrivals[-1] - arrivals[0], 800.0)

    def test_max_concurrency_caps_requests_in_flight(self):
        # 12 requests of 40 tokens at 2 ms a token: ~80 ms each, all arriving at once.
        result, stdout, _ = run_bench(self.node.port, "--num-prompts", "12", "--random-input-len",
                                      "10", "--random-output-len", "40", "--max-concurrency", "3",
                                      "--no-test-request")
        self.assertEqual(result["completed"], 12)
        self.assertEqual(result["max_concurrency"], 3)
        self.assertEqual(result["max_concurrency_observed"], 3)
        self.assertIn("Maximum request concurrency:            3", stdout)
        # From the node's side: at most 3 requests were ever open at once. Each request's
        # interval is [arrival, arrival + its E2E latency] (client-measured, so an upper bound).
        arrivals = sorted(r["arrival_unix_ms"] for r in generation_requests(self.node))
        self.assertEqual(len(arrivals), 12)
        # With 3 at a time, the 4th request cannot arrive before one of the first 3 ended.
        self.assertGreater(arrivals[3] - arrivals[0], 40 * 2 * 0.5)

    def test_chat_and_token_ids_and_model_lookup(self):
        result, _, _ = run_bench(self.node.port, "--backend", "openai-chat", "--num-prompts", "4",
                                 "--random-input-len", "30", "--random-output-len", "3",
                                 "--header", "X-Bench-Run: chat-1")
        self.assertEqual((result["completed"], result["endpoint"]), (4, "/v1/chat/completions"))
        self.assertEqual(result["model_id"], "sim-model")
        bodies = [json.loads(r["body"]) for r in generation_requests(self.node)]
        self.assertTrue(all(b["messages"][0]["role"] == "user" for b in bodies))
        self.assertTrue(all(r["headers"].get("x-bench-run") == "chat-1"
                            for r in generation_requests(self.node)))
        self.node.reset()
        result, _, _ = run_bench(self.node.port, "--prompt-format", "token-ids", "--num-prompts",
                                 "3", "--random-input-len", "64", "--random-output-len", "2",
                                 "--model", "sim-model")
        self.assertEqual(result["total_input_tokens"], 3 * 64)
        prompt = json.loads(generation_requests(self.node)[-1]["body"])["prompt"]
        self.assertEqual(len(prompt), 64)
        self.assertTrue(all(isinstance(t, int) for t in prompt))

    def test_multi_turn_chat_extends_each_conversation_with_its_answers(self):
        result, stdout, _ = run_bench(self.node.port, "--dataset-name", "multi_turn", "--backend",
                                      "openai-chat", "--multi-turn-num-conversations", "3",
                                      "--multi-turn-num-turns", "3", "--multi-turn-input-len", "20",
                                      "--multi-turn-output-len", "4", "--no-test-request")
        self.assertEqual(result["completed"], 9)
        self.assertEqual(result["dataset_name"], "multi_turn")
        self.assertIn("Oracle prefix hit rate (%):", stdout)
        requests = sorted(generation_requests(self.node), key=lambda r: r["arrival_unix_ms"])
        bodies = [json.loads(r["body"])["messages"] for r in requests]
        self.assertEqual(sorted(len(m) for m in bodies), [1, 1, 1, 3, 3, 3, 5, 5, 5])
        for i, messages in enumerate(bodies):
            self.assertEqual([m["role"] for m in messages],
                             ["user", "assistant"] * (len(messages) // 2) + ["user"])
            if len(messages) == 1:
                continue
            # The previous turn was sent earlier, and its answer (4 tokens of the sim's text) is
            # the assistant message.
            earlier = [m for m in bodies[:i] if m == messages[:-2]]
            self.assertEqual(len(earlier), 1, "turn %d has no earlier turn" % i)
            self.assertEqual(len(messages[-2]["content"].split()), 4)
        # Prompt words: 20, then 20 + 4 + 20, then 44 + 4 + 20; turn 1 reuses the one full
        # 16-token block of the 20 sent before, turn 2 the two full blocks of the 44.
        self.assertAlmostEqual(result["oracle_prefix_hit_rate"],
                               3 * (16 + 32) / (3 * (20 + 44 + 68)), places=6)

    def test_prefix_repetition_token_ids_share_the_prefixes(self):
        result, _, _ = run_bench(self.node.port, "--dataset-name", "prefix_repetition",
                                 "--prompt-format", "token-ids", "--prefix-repetition-prefix-len",
                                 "32", "--prefix-repetition-suffix-len", "8",
                                 "--prefix-repetition-num-prefixes", "2",
                                 "--prefix-repetition-output-len", "2", "--num-prompts", "6",
                                 "--no-test-request")
        self.assertEqual(result["completed"], 6)
        self.assertEqual(result["total_input_tokens"], 6 * 40)
        prompts = [json.loads(r["body"])["prompt"] for r in generation_requests(self.node)]
        self.assertEqual(len({tuple(p[:32]) for p in prompts}), 2)
        self.assertEqual(len({tuple(p[32:]) for p in prompts}), 6)
        # 4 of the 6 requests find their prefix's 2 blocks already sent.
        self.assertAlmostEqual(result["oracle_prefix_hit_rate"], 4 * 32 / (6 * 40), places=6)

    def test_http_errors_are_counted_with_their_reason(self):
        self.node.set_fault(status=503, count=2)
        result, stdout, _ = run_bench(self.node.port, "--num-prompts", "5", "--random-input-len",
                                      "5", "--random-output-len", "2", "--no-test-request",
                                      "--max-concurrency", "1", expect_code=1)
        self.assertEqual((result["completed"], result["failed"]), (3, 2))
        (reason, count), = result["error_counts"].items()
        self.assertEqual(count, 2)
        self.assertTrue(reason.startswith("HTTP 503: "), reason)
        self.assertIn("     2 x HTTP 503: ", stdout)

    def test_failed_test_request_stops_before_the_run(self):
        self.node.set_fault(status=404, count=1)
        _, _, stderr = run_bench(self.node.port, "--num-prompts", "5", expect_code=1)
        self.assertIn("initial test request failed", stderr)
        self.assertIn("HTTP 404", stderr)
        self.assertEqual(len(generation_requests(self.node)), 1)

    def test_sigint_cancels_in_flight_requests_and_reports_what_finished(self):
        # 4 requests of 5,000 tokens at 2 ms: 10 s each unless interrupted.
        proc = ProcessHandle([pdrouter_bench_path(), "--port", str(self.node.port),
                              "--num-prompts", "4", "--random-input-len", "5",
                              "--random-output-len", "5000", "--no-test-request",
                              "--progress-interval", "0.1"], name="pdrouter-bench")
        try:
            self.assertIsNotNone(proc.wait_for_line(r"0/4 done, 0 failed, 4 in flight",
                                                    10 * TIME_SCALE, streams=("stderr",)),
                                 proc.output())
            proc.send_signal(signal.SIGINT)
            self.assertEqual(proc.wait(10 * TIME_SCALE), 130, proc.output())
        finally:
            proc.stop()
        stdout = proc.output("stdout")
        self.assertIn("Serving Benchmark Result (INTERRUPTED)", stdout)
        self.assertIn("     4 x interrupted", stdout)
        self.node.wait_for_requests(
            lambda log: log["counters"]["aborts"] == 4,
            timeout=10 * TIME_SCALE)

    def test_bad_flags_and_unreachable_server(self):
        _, _, stderr = run_bench(self.node.port, "--request-rate", "-1", "--model", "m",
                                 expect_code=2)
        self.assertIn("--request-rate: '-1' is not a positive number or inf", stderr)
        _, _, stderr = run_bench(self.node.port, "--metric-percentiles", "99,abc", "--model", "m",
                                 expect_code=2)
        self.assertIn("--metric-percentiles: 'abc'", stderr)
        _, _, stderr = run_bench(self.node.port, "--backend", "openai-chat", "--prompt-format",
                                 "token-ids", expect_code=2)
        self.assertIn("token-ids needs a completions backend", stderr)
        _, _, stderr = run_bench(self.node.port, "--header", "X-A: b\r\nX-Injected: c",
                                 expect_code=2)
        self.assertIn("--header: a header may not contain CR, LF or NUL", stderr)
        self.assertEqual(generation_requests(self.node), [])
        node_port = self.node.port
        self.node.stop()
        _, _, stderr = run_bench(node_port, "--num-prompts", "2", expect_code=1)
        self.assertIn("connection refused", stderr)


if __name__ == "__main__":
    unittest.main()
