"""`pdnode sim --engine vllm`: the simulated vLLM V1 engine end to end (node/sim/engine/). Requests
contend like on a GPU: concurrent prompts queue behind each other one engine step at a time, so the
k-th time to first token is k prefill steps of the documented step-time formula (computed here from
the formula); the same holds through a real pdrouter with a P/D pair, where the decode adds the
modelled KV pull and one decode step. A small KV pool preempts and recomputes yet completes every
request, its KV events follow the real evictions, vLLM's own metrics are on /metrics, and an idle
engine costs no CPU."""
import json
import os
import re
import threading
import time
import unittest

import msgpack
import zmq

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE
from sim_fixture import SimNode, stream_post

# The default profile (node/sim/engine/profile.h), in modelled milliseconds.
OVERHEAD_MS, WEIGHT_READ_MS, MS_PER_TOKEN = 1.5, 6.0, 0.018
MS_PER_ATTENTION_PAIR, MS_PER_CONTEXT_TOKEN = 1.0e-6, 4.5e-5
KV_BYTES_PER_TOKEN, KV_LATENCY_MS, KV_GBPS = 131072, 1.0, 25.0


def prefill_step_ms(tokens, computed=0):
    """One step computing a `tokens`-token chunk after `computed` tokens, alone in its batch."""
    return (OVERHEAD_MS + max(WEIGHT_READ_MS, MS_PER_TOKEN * tokens)
            + MS_PER_ATTENTION_PAIR * tokens * (computed + tokens / 2.0))


def decode_step_ms(contexts):
    """One step of decodes with these contexts (computed tokens + the new one)."""
    return (OVERHEAD_MS + max(WEIGHT_READ_MS, MS_PER_TOKEN * len(contexts))
            + MS_PER_CONTEXT_TOKEN * sum(contexts))


def kv_pull_ms(tokens):
    """A lone KV pull of `tokens` tokens."""
    return KV_LATENCY_MS + tokens * KV_BYTES_PER_TOKEN / (KV_GBPS * 1e6)


def words(seed, count):
    """A text prompt of `count` tokens (one per word) sharing no block with another seed's."""
    return " ".join("s%dw%d" % (seed, i) for i in range(count))


def metrics(node):
    """{sample name with labels: value} of the node's GET /metrics."""
    status, body, _ = node.request("GET", "/metrics")
    assert status == 200, status
    out = {}
    for line in body.decode().splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def sample(values, name, engine="0"):
    return values['%s{model_name="sim-model",engine="%s"}' % (name, engine)]


def concurrent_ttfts(post_stream, count):
    """Starts `count` streams at once (post_stream(i) returns an SseStream); returns, after every
    stream ended, each one's seconds from its own start to its first event (its TTFT) and the
    moments (time.monotonic()) of those first events, both sorted. Threads released together may
    still send a few tens of ms apart on a loaded machine; the moments of the first events do
    not depend on that (a prompt queued behind others is served when their steps end)."""
    barrier = threading.Barrier(count)
    ttfts, firsts, errors = [None] * count, [None] * count, []

    def run(i):
        try:
            barrier.wait()
            start = time.monotonic()
            with post_stream(i) as stream:
                assert stream.status == 200, (stream.status, stream.body())
                for _ in stream:
                    if ttfts[i] is None:
                        firsts[i] = time.monotonic()
                        ttfts[i] = firsts[i] - start
        except BaseException as e:  # reported below, not lost in the thread
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60 * TIME_SCALE)
    if errors:
        raise errors[0]
    assert None not in ttfts, ttfts
    return sorted(ttfts), sorted(firsts)


class EngineQueueingTest(unittest.TestCase):
    # One prompt per step: the budget is exactly one prompt.
    PROMPT = 4096
    COUNT = 6
    # Wall-clock seconds per modelled second: the engine slows down with the build, so its
    # steps stay long next to the sanitizers' HTTP and JSON overheads and a loaded machine's
    # scheduling noise.
    SCALE = 4 * TIME_SCALE

    def assert_queueing(self, timings, first_ms, step_ms):
        """timings: concurrent_ttfts' answer. The first TTFT is first_ms (modelled ms x SCALE), no
        sooner than the model allows; the first events then come one step_ms apart, the k-th k
        steps after the first, within a quarter of a step plus a slack for a loaded machine's
        HTTP round trips (the client's fixed overheads cancel out in the differences)."""
        ttfts, firsts = timings
        step = step_ms / 1000.0 * self.SCALE
        first = first_ms / 1000.0 * self.SCALE
        shown = "TTFTs %s, first events at +%s, step %.3fs" % (
            ["%.3f" % t for t in ttfts], ["%.3f" % (t - firsts[0]) for t in firsts], step)
        self.assertGreater(ttfts[0], 0.9 * first, shown)
        self.assertLess(ttfts[0], first + 0.5 * TIME_SCALE, shown)
        tolerance = 0.25 * step + 0.03 * self.SCALE
        for k in range(1, len(firsts)):
            self.assertLess(abs(firsts[k] - firsts[0] - k * step), tolerance,
                            "request %d: %s, tolerance %.3fs" % (k + 1, shown, tolerance))

    def test_each_concurrent_prompt_waits_one_prefill_step_per_prompt_ahead(self):
        node = SimNode("--role", "prefill", "--engine", "vllm", "--time-scale", str(self.SCALE),
                       "--max-num-batched-tokens", str(self.PROMPT))
        self.addCleanup(lambda: self.assertEqual(node.stop(), 0, node.proc.output()))
        prompts = [words(i, self.PROMPT) for i in range(self.COUNT)]
        timings = concurrent_ttfts(
            lambda i: stream_post("127.0.0.1", node.port, "/v1/completions",
                                  {"prompt": prompts[i], "max_tokens": 1, "stream": True},
                                  timeout=30 * TIME_SCALE),
            self.COUNT)
        step = prefill_step_ms(self.PROMPT)
        self.assert_queueing(timings, step, step)

        m = metrics(node)
        self.assertEqual(sample(m, "vllm:prompt_tokens_total"), self.COUNT * self.PROMPT)
        self.assertEqual(sample(m, "vllm:generation_tokens_total"), self.COUNT)
        self.assertEqual(sample(m, "vllm:request_success_total"), self.COUNT)
        self.assertEqual(sample(m, "vllm:num_requests_running"), 0)
        self.assertEqual(sample(m, "vllm:num_requests_waiting"), 0)
        self.assertEqual(sample(m, "vllm:time_to_first_token_seconds_count"), self.COUNT)
        self.assertEqual(sample(m, "vllm:request_queue_time_seconds_count"), self.COUNT)
        # The engine's own TTFTs add up to 1 + 2 + ... + COUNT steps (arrivals were near-simultaneous).
        engine_sum = sample(m, "vllm:time_to_first_token_seconds_sum")
        want = step / 1000.0 * self.SCALE * self.COUNT * (self.COUNT + 1) / 2
        self.assertLess(abs(engine_sum - want), (0.1 * want + 0.05 * self.COUNT) * self.SCALE,
                        (engine_sum, want))
        # Queue time: everything but the own step.
        queued = sample(m, "vllm:request_queue_time_seconds_sum")
        self.assertLess(abs(queued - (want - self.COUNT * step / 1000.0 * self.SCALE)),
                        (0.1 * want + 0.05 * self.COUNT) * self.SCALE, queued)

    def test_pd_through_pdrouter_queues_at_the_prefill_then_pulls_kv_and_decodes_one_step(self):
        engine = ("--engine", "vllm", "--time-scale", str(self.SCALE))
        cluster = PdCluster("nixl", prefill_flags=engine + ("--max-num-batched-tokens", str(self.PROMPT)),
                            decode_flags=engine)
        self.addCleanup(cluster.close)
        count = 4
        prompts = [words(100 + i, self.PROMPT) for i in range(count)]
        timings = concurrent_ttfts(
            lambda i: cluster.stream("/v1/completions",
                                     {"prompt": prompts[i], "max_tokens": 2, "stream": True},
                                     timeout=30),
            count)
        # Queued at the prefill one step apart; then the decode pulls the prompt's KV (alone: the
        # pulls are a prefill step apart) and computes the last prompt token, sampling the first.
        step = prefill_step_ms(self.PROMPT)
        after = kv_pull_ms(self.PROMPT) + decode_step_ms([self.PROMPT])
        self.assert_queueing(timings, step + after, step)

        prefill, decode = cluster.prefills[0], cluster.decodes[0]
        p, d = metrics(prefill), metrics(decode)
        self.assertEqual(sample(p, "vllm:prompt_tokens_total"), count * self.PROMPT)
        self.assertEqual(sample(p, "vllm:generation_tokens_total"), count)  # max_tokens 1 there
        self.assertEqual(sample(d, "vllm:prompt_tokens_total"), count * self.PROMPT)
        self.assertEqual(sample(d, "vllm:generation_tokens_total"), 2 * count)
        # The decode looked its prompts up once each, found nothing, and pulled them.
        self.assertEqual(sample(d, "vllm:prefix_cache_queries_total"), count * self.PROMPT)
        self.assertEqual(sample(d, "vllm:prefix_cache_hits_total"), 0)
        self.assertEqual(decode.kv_stats()["kv_transfers"], count)
        # The prefill kept each prompt's blocks until the decode had read them, then let go.
        deadline = time.monotonic() + 10 * TIME_SCALE
        while sample(metrics(prefill), "vllm:kv_cache_usage_perc") != 0:
            self.assertLess(time.monotonic(), deadline, "the prefill still holds KV blocks")
            time.sleep(0.02)


class EngineBehaviourTest(unittest.TestCase):
    def start(self, *flags):
        node = SimNode("--role", "prefill", "--engine", "vllm", *flags)
        self.addCleanup(lambda: self.assertEqual(node.stop(), 0, node.proc.output()))
        return node

    def complete(self, node, prompt, max_tokens):
        status, body = node.post_json("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens},
                                      timeout=30 * TIME_SCALE)
        self.assertEqual(status, 200, body)
        return body

    def test_a_full_kv_cache_preempts_and_recomputes_yet_every_request_completes(self):
        # 9 usable blocks of 16 tokens; three requests growing to 80 tokens (5 blocks) each.
        node = self.start("--num-gpu-blocks-override", "10", "--max-model-len", "144",
                          "--time-scale", "0.05")
        results = [None] * 3

        def run(i):
            results[i] = self.complete(node, words(i, 40), 40)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60 * TIME_SCALE)
        for body in results:
            self.assertIsNotNone(body)
            self.assertEqual(body["usage"]["completion_tokens"], 40)
            self.assertEqual(len(body["choices"][0]["text"].split()), 40)
        m = metrics(node)
        self.assertGreater(sample(m, "vllm:num_preemptions_total"), 0)
        self.assertEqual(sample(m, "vllm:generation_tokens_total"), 120)
        self.assertEqual(sample(m, "vllm:num_requests_running"), 0)
        self.assertEqual(sample(m, "vllm:kv_cache_usage_perc"), 0)

    def test_kv_events_follow_the_engines_evictions(self):
        node = self.start("--num-gpu-blocks-override", "9", "--max-model-len", "128",
                          "--kv-events-endpoint", "tcp://127.0.0.1:0", "--time-scale", "0.05")
        endpoint = re.search(r" kv_events=(tcp://\S+)", node.proc.output("stdout")).group(1)
        ctx = zmq.Context.instance()
        sub = ctx.socket(zmq.SUB)
        self.addCleanup(sub.close, 0)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(endpoint)
        events = []

        def receive_until(predicate):
            deadline = time.monotonic() + 10 * TIME_SCALE
            while not predicate():
                self.assertLess(time.monotonic(), deadline, events)
                if sub.poll(100):
                    _, _, payload = sub.recv_multipart()
                    events.extend(msgpack.unpackb(payload, raw=False)[1])

        # A probe until the subscription is live (a PUB drops what it sends before that).
        probe = 0
        while True:
            probe += 1
            self.complete(node, words(1000 + probe, 16), 1)
            if sub.poll(int(200 * TIME_SCALE)):
                break
        sub.recv_multipart()
        # A: 64 tokens, 4 full blocks, cached and freed (its last block first in the free queue).
        self.complete(node, words(1, 64), 1)
        receive_until(lambda: any(e["type"] == "BlockStored" and len(e["block_hashes"]) == 4
                                  for e in events))
        stored = [e for e in events if e["type"] == "BlockStored" and len(e["block_hashes"]) == 4][0]
        a_hashes = stored["block_hashes"]
        self.assertEqual(len(stored["token_ids"]), 64)
        # B: 112 tokens take 7 of the 8 usable blocks from the free queue's head: the probes'
        # blocks (freed before A's), then A's last three blocks, its last one first; A's first
        # block, freed last, stays cached.
        del events[:]
        self.complete(node, words(2, 112), 1)
        receive_until(lambda: sum(len(e["block_hashes"]) for e in events if e["type"] == "BlockRemoved"
                                  and set(e["block_hashes"]) & set(a_hashes)) >= 3)
        removed = [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
        self.assertEqual([h for h in removed if h in a_hashes], [a_hashes[3], a_hashes[2], a_hashes[1]])
        # B's own blocks are announced after the evictions that made room for them.
        last_removed = max(i for i, e in enumerate(events) if e["type"] == "BlockRemoved")
        b_stored = [i for i, e in enumerate(events) if e["type"] == "BlockStored" and len(e["block_hashes"]) == 7]
        self.assertEqual(len(b_stored), 1, events)
        self.assertGreater(b_stored[0], last_removed)
        status, body, _ = node.request("GET", "/sim/prefix_cache")
        cache = json.loads(body)
        self.assertEqual(cache["engine"], "vllm")
        self.assertGreaterEqual(cache["ranks"][0]["evicted_blocks"], len(removed))

    def test_a_prefill_keeps_its_kv_blocks_until_the_decode_reads_them_or_they_expire(self):
        # 64 blocks of 16 tokens; nobody pulls, so the mover reaps the export after 300 ms.
        node = self.start("--connector", "nixl", "--kv-backends", "tcp", "--kv-port", "0",
                          "--kv-hold-ms", str(int(300 * TIME_SCALE)), "--num-gpu-blocks-override", "65",
                          "--max-model-len", "1024", "--time-scale", "0.05")
        status, body = node.post_json("/v1/completions", {
            "prompt": words(1, 160), "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                   "remote_engine_id": None, "remote_block_ids": None,
                                   "remote_host": None, "remote_port": None}})
        self.assertEqual(status, 200, body)
        self.assertEqual(len(body["kv_transfer_params"]["remote_block_ids"]), 10)
        # Answered, yet its 10 blocks are still in use (vLLM's connectors delay freeing them).
        m = metrics(node)
        self.assertEqual(sample(m, "vllm:kv_cache_usage_perc"), 10 / 64)
        self.assertEqual(sample(m, "vllm:num_requests_running"), 0)
        deadline = time.monotonic() + 10 * TIME_SCALE
        while sample(metrics(node), "vllm:kv_cache_usage_perc") != 0:
            self.assertLess(time.monotonic(), deadline, "the expired export still holds blocks")
            time.sleep(0.05)
        self.assertEqual(node.kv_stats()["kv_blocks_reaped"], 10)

    def test_prompts_longer_than_max_model_len_get_vllms_400(self):
        node = self.start("--max-model-len", "64")
        status, body = node.post_json("/v1/completions", {"prompt": words(1, 64), "max_tokens": 1})
        self.assertEqual(status, 400)
        self.assertEqual(body["type"], "BadRequestError")
        self.assertEqual(body["message"], "This model's maximum context length is 64 tokens. However, "
                         "your request has 64 input tokens. Please reduce the length of the input messages.")
        status, body = node.post_json("/v1/completions", {"prompt": words(1, 60), "max_tokens": 5})
        self.assertEqual(status, 400)
        self.assertIn("'max_tokens' or 'max_completion_tokens' is too large: 5.", body["message"])
        status, raw, _ = node.request("GET", "/v1/models")
        self.assertEqual(json.loads(raw)["data"][0]["max_model_len"], 64)

    def test_bad_engine_flags_exit_2_with_a_message(self):
        from pdr_testlib import ProcessHandle, pdnode_path
        for flags, message in ((("--max-num-seqs", "4"), "--max-num-seqs needs --engine vllm"),
                               (("--engine", "vllm", "--max-num-seqs", "0"), "max-num-seqs '0'"),
                               (("--engine", "vllm", "--num-gpu-blocks-override", "4"),
                                "max-model-len 131072 is more than the 48 tokens"),
                               (("--engine", "gpu"), "--engine 'gpu': expected per-token or vllm")):
            proc = ProcessHandle([pdnode_path(), "sim", "--kv-backends", "none", *flags], name="pdnode-sim")
            self.assertEqual(proc.wait(10), 2, flags)
            self.assertIn(message, proc.output(), flags)

    def test_several_workers_share_one_engine(self):
        node = self.start("--workers", "3", "--time-scale", "0.05")
        results = [None] * 6

        def run(i):
            results[i] = self.complete(node, words(i, 300), 20)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60 * TIME_SCALE)
        self.assertTrue(all(r and r["usage"]["completion_tokens"] == 20 for r in results), results)
        self.assertEqual(sample(metrics(node), "vllm:generation_tokens_total"), 120)

    def test_time_scale_also_shrinks_per_token_pacing(self):
        # Without the engine: the answer comes 9 token times of 40 ms after the first token, 360 ms;
        # at a quarter of that scale, 90 ms.
        node = SimNode("--role", "prefill", "--decode-us-per-token", "40000", "--time-scale", "0.25")
        self.addCleanup(lambda: self.assertEqual(node.stop(), 0, node.proc.output()))
        start = time.monotonic()
        self.complete(node, "a b c", 10)
        elapsed = time.monotonic() - start
        self.assertGreaterEqual(elapsed, 0.09)
        self.assertLess(elapsed, 0.3 * TIME_SCALE)

    def test_an_idle_engine_uses_no_cpu(self):
        node = self.start("--time-scale", "0.01")
        self.complete(node, words(1, 100), 4)  # the engine thread has run

        def cpu_seconds():
            with open("/proc/%d/stat" % node.proc.proc.pid) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

        before = cpu_seconds()
        time.sleep(1.0)
        used = cpu_seconds() - before
        # Nothing polls: an idle node's threads sleep (a tick or two of noise at most).
        self.assertLessEqual(used, 0.03 * TIME_SCALE, used)


if __name__ == "__main__":
    unittest.main()
