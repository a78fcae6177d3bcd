"""The cache-aware prefix tree's memory budget against real memory: real pdrouter (cache_aware
policies, policies.cache_aware.prefix_tree_max_bytes at its 64 KiB minimum), real `pdnode sim`
nodes (NIXL, static instances), a few thousand text prompts shaped to cost the most tree nodes per
byte of text ("x" + 5 base-62 digits: prompts that share short prefixes, so each adds a node or
two holding a byte or two of text). The tree must charge what its nodes really cost: /metrics'
pdrouter_prefix_tree_bytes stays within the budget with a per-node charge of real size, the
budget evicts, and pdrouter's resident memory grows by about the budget, not by the hundreds of
bytes per request that uncharged nodes would cost."""
import http.client
import json
import os
import random
import threading
import time
import unittest

from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode

BUDGET = 65536  # the smallest prefix_tree_max_bytes
SANITIZED_TSAN = bool(os.environ.get("TSAN_OPTIONS"))
# Under TSan (ten times slower, where RSS is not asserted) fewer still overflow the budget tenfold.
REQUESTS = 3000 if SANITIZED_TSAN else 8000
CLIENTS = 8
DIGITS = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
ASAN = os.environ.get("ASAN_OPTIONS")


def trie_prompt(rng):
    return "x" + "".join(rng.choice(DIGITS) for _ in range(5))


def rss_kb(pid):
    with open("/proc/%d/status" % pid) as f:
        return int(next(line for line in f if line.startswith("VmRSS:")).split()[1])


class PrefixTreeMemoryTest(unittest.TestCase):
    def setUp(self):
        self.prefill = SimNode("--role", "prefill", "--connector", "nixl")
        self.addCleanup(self.prefill.stop)
        self.decode = SimNode("--role", "decode", "--connector", "nixl")
        self.addCleanup(self.decode.stop)
        topology = ("policies:\n  prefill: cache_aware\n  decode: cache_aware\n"
                    "  cache_aware: {prefix_tree_max_bytes: %d}\n"
                    "instances:\n"
                    '  - {role: prefill, http_address: "%s", connector: nixl}\n'
                    '  - {role: decode, http_address: "%s", connector: nixl}\n'
                    % (BUDGET, self.prefill.http_address, self.decode.http_address))
        # ASan's quarantine keeps freed chunks resident, so evicted nodes would still count:
        # this router runs without it (still ASan-checked).
        env = {"ASAN_OPTIONS": ASAN + ":quarantine_size_mb=0:thread_local_quarantine_size_kb=0"} if ASAN else None
        self.router = Router(topology, env=env)
        self.addCleanup(self.router.stop)
        self.pid = self.router.process.proc.pid

    def send(self, prompts):
        """POSTs every prompt (a completion of 1 token) from CLIENTS keep-alive connections; returns
        the statuses that were not 200."""
        host, port = self.router.http.rsplit(":", 1)
        lock = threading.Lock()
        failures = []
        queue = list(prompts)

        def client():
            conn = http.client.HTTPConnection(host, int(port), timeout=10 * TIME_SCALE)
            try:
                while True:
                    with lock:
                        if not queue:
                            return
                        prompt = queue.pop()
                    body = json.dumps({"model": "sim-model", "prompt": prompt, "max_tokens": 1})
                    conn.request("POST", "/v1/completions", body=body,
                                 headers={"Content-Type": "application/json"})
                    resp = conn.getresponse()
                    resp.read()
                    if resp.status != 200:
                        with lock:
                            failures.append(resp.status)
            finally:
                conn.close()

        threads = [threading.Thread(target=client) for _ in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120 * TIME_SCALE)
        self.assertFalse(any(t.is_alive() for t in threads), "clients still running")
        return failures

    def test_trie_shaped_prompts_stay_within_the_budget_in_real_memory(self):
        # Warm-up: the same traffic with one prompt (the tree holds one entry), so that connection
        # pools, buffers and the allocator's arenas have grown before memory is measured.
        self.assertEqual(self.send(["warm-up prompt"] * 1500), [])
        before_kb = rss_kb(self.pid)
        rng = random.Random(1234)
        started = time.monotonic()
        self.assertEqual(self.send([trie_prompt(rng) for _ in range(REQUESTS)]), [])
        took = time.monotonic() - started
        grown = (rss_kb(self.pid) - before_kb) * 1024
        m = self.router.metrics()
        charged, nodes = m["pdrouter_prefix_tree_bytes"], m["pdrouter_prefix_tree_nodes"]
        evictions = m["pdrouter_prefix_tree_evictions_total"]
        print("%d requests in %.1f s: RSS +%d kB, tree %d bytes charged, %d nodes (%.0f B/node), "
              "%d marks evicted" % (REQUESTS, took, grown // 1024, charged, nodes, charged / nodes, evictions))
        # The requests' prompts cost more than the budget: it is full and evicts.
        self.assertLessEqual(charged, BUDGET)
        self.assertGreater(evictions, REQUESTS)
        # A node (with its two tenants' marks) is charged what it costs: well over 100 bytes,
        # never a byte or two of text.
        self.assertGreater(charged / nodes, 100)
        self.assertLess(nodes, BUDGET / 100)
        if SANITIZED_TSAN:  # shadow memory: RSS says nothing about pdrouter's own memory
            return
        # Without a real charge the tree would hold every request's node or two: about
        # REQUESTS * 1.3 * 245 bytes (2.5 MB) here, growing without bound with more requests.
        self.assertLess(grown, BUDGET + 512 * 1024,
                        "pdrouter's RSS grew by %d kB over %d prompts" % (grown // 1024, REQUESTS))


if __name__ == "__main__":
    unittest.main()
