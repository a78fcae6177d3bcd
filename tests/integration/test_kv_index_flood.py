"""A node's KV events publisher sends engine block hashes crafted against libstdc++'s hash tables
while clients keep using the router: real pdrouter (kv_events on, cache_aware policy), real
`pdnode sim` prefill and decode, a fake vLLM publisher (ZMQ XPUB, vLLM's frames and msgpack,
as in test_kv_events.py).

std::hash<uint64_t> is the identity in libstdc++ and its bucket counts are a fixed list of primes,
so hashes that are multiples of the table's current bucket count all land in one bucket. Sent
stage by stage as the table grows, ~170k such blocks made every insert walk a chain as long as the
stage while the index's lock was held: cache-aware requests (which look the index up) and
everything else on their worker threads stalled for seconds to minutes. The index now hashes keys
with a per-process secret and applies a batch in short lock holds, so the probes stay fast."""
import json
import threading
import time
import unittest

import msgpack
import zmq

from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode
from test_kv_events import Publisher

BLOCK = 4
# libstdc++'s bucket counts for a std::unordered_map grown one insert at a time: each is the first
# prime of its __prime_list at or above twice the one before (read from bucket_count() of a
# growing map; bench/router/block_index_bench.cc reads them the same way).
BUCKET_COUNTS = [13, 29, 59, 127, 257, 541, 1109, 2357, 5087, 10273, 20753, 42043, 85229, 172933]
MAX_BLOCKS_PER_EVENT = 65536  # the subscriber's per-event limit (proto/kv_events.h)
# The longest a probe may take, and after how long an unanswered probe counts as a stall (ends
# the wait early: the code before the fix stalled for minutes here).
PROBE_BOUND_S = 1.0 * TIME_SCALE
STALL_S = 3.0 * PROBE_BOUND_S
DEADLINE_S = 30.0 * TIME_SCALE


def crafted_batches():
    """One batch per bucket count B: the multiples of B, as many as the table grows by while it
    has B buckets, as chained BlockStored events (vLLM's map encoding). Returns (payloads, blocks)."""
    payloads, total, previous, parent = [], 0, 0, None
    for buckets in BUCKET_COUNTS:
        hashes = [i * buckets for i in range(1, buckets - previous + 1)]
        previous = buckets
        events = []
        for start in range(0, len(hashes), MAX_BLOCKS_PER_EVENT):
            part = hashes[start:start + MAX_BLOCKS_PER_EVENT]
            tokens = [(total + start + i + j) % 30000 for i in range(len(part)) for j in range(BLOCK)]
            events.append({"type": "BlockStored", "block_hashes": part, "parent_block_hash": parent,
                           "token_ids": tokens, "block_size": BLOCK, "lora_id": None,
                           "medium": "GPU", "lora_name": None})
            parent = part[-1]
        total += len(hashes)
        payloads.append(msgpack.packb([time.time(), events, 0]))
    return payloads, total


class Probe(threading.Thread):
    """Sends one request after another and keeps each one's latency; `started` is the start time
    of the request in flight (None between requests)."""

    def __init__(self, router, name, send):
        super().__init__(name=name, daemon=True)
        self.router, self.send = router, send
        self.latencies, self.codes = [], []
        self.started = None
        self.stop = threading.Event()

    def run(self):
        while not self.stop.is_set():
            self.started = time.monotonic()
            try:
                code = self.send(self.router)
            except OSError as e:  # a timeout, or the router stopped under a stalled probe
                code = repr(e)
            self.latencies.append(time.monotonic() - self.started)
            self.codes.append(code)
            self.started = None

    def longest(self):
        in_flight = self.started
        now = time.monotonic()
        return max(self.latencies + ([now - in_flight] if in_flight is not None else []), default=0.0)


def completion(router):
    prompt = list(range(1000, 1000 + 4 * BLOCK)) + [7, 8]
    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 1}).encode()
    code, _, _ = router.request("POST", "/v1/completions", body=body, timeout=DEADLINE_S,
                                headers={"Content-Type": "application/json"})
    return code


def health(router):
    return router.request("GET", "/health", timeout=DEADLINE_S)[0]


class KvIndexFloodTest(unittest.TestCase):
    def setUp(self):
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)
        self.pub = Publisher(self.ctx)
        self.addCleanup(self.pub.sock.close, 0)
        self.prefill = SimNode("--role", "prefill", "--connector", "nixl")
        self.addCleanup(self.prefill.stop)
        self.decode = SimNode("--role", "decode", "--connector", "nixl")
        self.addCleanup(self.decode.stop)
        topology = f"""
kv_events:
  enabled: true
policies:
  prefill: cache_aware
  decode: cache_aware
instances:
  - {{role: prefill, http_address: "{self.prefill.http_address}", connector: nixl, kv_events_endpoint: "{self.pub.endpoint}"}}
  - {{role: decode, http_address: "{self.decode.http_address}", connector: nixl}}
"""
        self.router = Router(topology)
        self.addCleanup(self.router.stop)
        self.pub.await_subscriber()

    def index_entries(self):
        try:
            return self.router.metrics().get("pdrouter_kv_events_index_entries", 0)
        except OSError:  # /metrics itself timed out (it reads the index's counts)
            return 0

    def test_crafted_block_hashes_do_not_stall_routing(self):
        payloads, total = crafted_batches()
        probes = [Probe(self.router, "completion-1", completion), Probe(self.router, "completion-2", completion),
                  Probe(self.router, "health", health)]
        for p in probes:
            p.start()

        def stop_probes():  # a probe stuck in a stalled router ends when the router stops
            for p in probes:
                p.stop.set()
            for p in probes:
                p.join(timeout=2 * PROBE_BOUND_S)
        self.addCleanup(stop_probes)
        # Every probe answers before the flood starts.
        self.router.wait_for(lambda: all(len(p.latencies) >= 3 for p in probes), timeout=10)

        start = time.monotonic()
        for seq, payload in enumerate(payloads):
            self.pub.publish(seq, payload)
        # Until the index holds every block, or a probe has waited long enough to call it a stall.
        indexed = stalled = False
        while time.monotonic() - start < DEADLINE_S:
            if self.index_entries() == total:
                indexed = True
                break
            if max(p.longest() for p in probes) > STALL_S:
                stalled = True
                break
            time.sleep(0.05)
        applied_s = time.monotonic() - start
        # A few more probes after the last batch, then the figures.
        if indexed:
            counts = [len(p.latencies) for p in probes]
            self.router.wait_for(lambda: all(len(p.latencies) >= c + 2 for p, c in zip(probes, counts)),
                                 timeout=10)
        longest = {p.name: round(p.longest(), 3) for p in probes}
        stop_probes()
        try:
            metrics = self.router.metrics()
            kv = {k.removeprefix("pdrouter_kv_events_"): v for k, v in metrics.items()
                  if k.startswith("pdrouter_kv_events_") and v}
        except OSError as e:
            kv = repr(e)
        figures = (f"{total} crafted blocks in {len(payloads)} batches; kv_events metrics {kv}; indexed={indexed} after "
                   f"{applied_s:.2f} s; longest probe per kind (s): {longest}; probes done: "
                   f"{ {p.name: len(p.latencies) for p in probes} }")
        print(figures)
        self.assertFalse(stalled, "a probe stalled: " + figures)
        self.assertTrue(indexed, "the index never held every block: " + figures)
        for p in probes:
            self.assertEqual(set(p.codes), {200}, f"{p.name}: {figures}")
            self.assertLess(p.longest(), PROBE_BOUND_S, f"{p.name}: {figures}")
        self.assertEqual(self.router.metrics().get("pdrouter_kv_events_decode_errors_total", 0), 0)


if __name__ == "__main__":
    unittest.main()
