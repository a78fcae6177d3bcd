"""A node flooding its KV events publisher, against a real pdrouter (kv_events.enabled, default
bounds): one node sends large batches (a Python publisher sending vLLM's frames and msgpack, as
tests/integration/test_kv_events.py does) for a few seconds, while an honest `pdnode sim` node's
events keep being applied, pdrouter's peak memory stays bounded, and SIGTERM ends pdrouter
promptly while the flood goes on. (The other bounds: test_kv_events_bounds.py.)

Not run under TSan (tests/integration/CMakeLists.txt): there every byte libzmq hands over costs a
suppressed race report, so bytes and seconds of a gigabyte flood measure TSan, not pdrouter.
"""
import json
import re
import signal
import threading
import time
import unittest

import msgpack
import zmq

from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode

KEY = "kv-events-flood-test-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
BLOCK = 16  # the sim's --kv-block-tokens default
WAIT_S = 15.0

TOPOLOGY = """
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
kv_events:
  enabled: true
instances: []
"""

# The flood: batches of about 4 MiB (half the default max_node_bytes_per_sec of 8 MiB), at most
# FLOOD_RATE a second (about 1 GB/s) for at most FLOOD_S seconds: a bounded attack, which unbounded
# code would queue at the rate it arrives.
FLOOD_EVENTS, FLOOD_BLOCKS = 2, 20_000  # per batch, per event (within KvEventLimits)
FLOOD_RATE = 250
FLOOD_S = 5.0
# Peak resident memory pdrouter may reach (VmHWM). With the default bounds the flooding node's
# socket queues at most 32 such batches (about 110 MiB) and its allowance admits two a second
# (about 150 MB measured); before the bounds existed the queue took what loopback delivered
# faster than it was applied (1.8 GB after two seconds). ASan holds freed memory in quarantine
# (PDR_TIME_SCALE > 1): twice the room.
MAX_PEAK_RSS_MB = 400 * (2 if TIME_SCALE > 1 else 1)
SIGTERM_EXIT_S = 5.0


def flood_batch():
    """One large batch that decodes and costs real work to index (array encoding): FLOOD_EVENTS
    BlockStored events of FLOOD_BLOCKS blocks of BLOCK tokens each, a payload of about 3.6 MiB."""
    events = []
    for e in range(FLOOD_EVENTS):
        hashes = [(1 << 63) + e * FLOOD_BLOCKS + i for i in range(FLOOD_BLOCKS)]
        tokens = [100000 + (i % 50000) for i in range(FLOOD_BLOCKS * BLOCK)]
        events.append(["BlockStored", hashes, None, tokens, BLOCK, None, "GPU", None])
    return msgpack.packb([time.time(), events, 0])


def proc_status_kb(pid, field):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


def prompt(seed, length=4 * BLOCK):
    return [200000 + seed * 1000 + i for i in range(length)]


class FloodingPublisher:
    """vLLM's per-rank publisher, played by the attacker: binds an XPUB (so the test can wait for
    pdrouter's subscription), sends [topic, seq, payload]. A small SNDHWM keeps this process's own
    queue small: what pdrouter cannot take is dropped here, as a PUB socket does."""

    def __init__(self, ctx, sndhwm=4):
        self.sock = ctx.socket(zmq.XPUB)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, sndhwm)  # before bind: connections take the bind's options
        self.sock.bind("tcp://127.0.0.1:0")
        self.endpoint = self.sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self.sent = 0
        self.stop = threading.Event()

    def await_subscriber(self):
        assert self.sock.poll(int(WAIT_S * TIME_SCALE * 1000), zmq.POLLIN), "pdrouter never subscribed"
        assert self.sock.recv() == b"\x01"

    def flood(self, payload, seconds):
        started = time.monotonic()
        seq = 0
        frame = zmq.Frame(payload)  # zero-copy: the same bytes each time
        while not self.stop.is_set() and time.monotonic() - started < seconds:
            try:
                self.sock.send_multipart([b"", seq.to_bytes(8, "big"), frame], flags=zmq.NOBLOCK,
                                         copy=False)
                self.sent += 1
            except zmq.Again:
                pass
            seq += 1
            ahead = started + seq / FLOOD_RATE - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)  # pacing: FLOOD_RATE batches a second at most


class KvEventsFloodTest(unittest.TestCase):
    def setUp(self):
        self.router = Router(TOPOLOGY, env=ENV)
        self.addCleanup(self.router.dir.cleanup)
        self.addCleanup(self.router.stop)
        self.ctx = zmq.Context()
        self.addCleanup(self.ctx.destroy, 0)

    def matched(self, tokens):
        query = ",".join(str(t) for t in tokens)
        code, _, body = self.router.request("GET", f"/debug/cache?tokens={query}", headers=AUTH,
                                            admin=True)
        self.assertEqual(code, 200, body)
        return {n["node"]: n["matched_tokens"] for n in json.loads(body)["nodes"]}

    def send_direct(self, node, tokens):
        status, body = node.post_json("/v1/completions", {"prompt": tokens, "max_tokens": 1})
        self.assertEqual(status, 200, body)

    def await_indexed(self, node, seed):
        """Sends fresh prompts straight to the sim until the router indexes one (a PUB socket drops
        what it sends before the subscriber connects); returns the seed used."""
        deadline = time.monotonic() + WAIT_S * TIME_SCALE
        while time.monotonic() < deadline:
            seed += 1
            tokens = prompt(seed, BLOCK + 1)
            self.send_direct(node, tokens)
            try:
                self.router.wait_for(lambda: self.matched(tokens).get(node.http_address), 0.5)
                return seed
            except AssertionError:
                continue
        self.fail(f"the router never indexed {node.http_address}'s events")

    def test_a_flooding_node_costs_neither_memory_nor_the_others_events_nor_shutdown(self):
        sim = SimNode("--role", "prefill", "--connector", "nixl",
                      "--register", self.router.discovery, "--register-interval-ms", "200",
                      "--kv-events-endpoint", "tcp://127.0.0.1:0")
        self.addCleanup(sim.stop)
        self.router.wait_for(lambda: self.router.instance(sim.http_address), WAIT_S)
        seed = self.await_indexed(sim, 0)

        attacker = FloodingPublisher(self.ctx)
        self.addCleanup(attacker.sock.close, 0)
        attacker_node = "127.0.0.1:18671"
        registration = {"type": "D", "http_address": attacker_node, "pdr_v": 1,
                        "connector": "nixl", "dp_size": 1, "kv_events_endpoint": attacker.endpoint,
                        "ttl_ms": 120000}  # registered once: alive for the whole test
        self.router.send(registration)
        attacker.await_subscriber()

        pid = self.router.process.proc.pid
        rss_before_mb = proc_status_kb(pid, "VmRSS") / 1024
        payload = flood_batch()
        self.assertGreater(len(payload), 3 << 20)
        self.assertLess(len(payload), 8 << 20)  # under the default max_node_bytes_per_sec
        flood = threading.Thread(target=attacker.flood, args=(payload, FLOOD_S * TIME_SCALE),
                                 daemon=True)
        flood_started = time.monotonic()
        flood.start()
        self.addCleanup(flood.join, 10)
        self.addCleanup(attacker.stop.set)
        # The flood reaches pdrouter: it has taken the attacker's first message.
        self.router.wait_for(
            lambda: ((self.router.instance(attacker_node) or {}).get("kv_events") or {})
            .get("ranks_seen") == 1, WAIT_S)

        # The honest node's events are applied during the flood. Failures are collected, not
        # raised, so every figure of a failing run is reported.
        problems = []
        tokens = prompt(seed + 1)
        sent_at = time.monotonic()
        self.send_direct(sim, tokens)
        honest_s = None
        deadline = sent_at + 3.0 * TIME_SCALE
        while time.monotonic() < deadline:
            if self.matched(tokens).get(sim.http_address) == 4 * BLOCK:
                honest_s = time.monotonic() - sent_at
                break
            time.sleep(0.02)
        if honest_s is None:
            problems.append("the honest sim's batch was not applied within %.0f s of the flood"
                            % (3.0 * TIME_SCALE))

        # Let the flood run two seconds at least (a bounded attack), then read the peak.
        left = 2.0 - (time.monotonic() - flood_started)
        if left > 0:
            time.sleep(left)
        self.assertTrue(flood.is_alive(), "the flood ended before the measurements")
        peak_mb = proc_status_kb(pid, "VmHWM") / 1024
        if peak_mb > MAX_PEAK_RSS_MB:
            problems.append("pdrouter peaked at %.0f MB (VmHWM; %.0f MB before the flood), over %d MB"
                            % (peak_mb, rss_before_mb, MAX_PEAK_RSS_MB))

        metrics = self.router.metrics()
        self.router_kv_totals = {k.replace("pdrouter_kv_events_", ""): v for k, v in metrics.items()
                                 if re.match(r"pdrouter_kv_events_(batches|decode_errors|rate_limited)", k)}
        # SIGTERM while the flood goes on.
        flood_was_on = flood.is_alive()
        signalled = time.monotonic()
        self.router.process.send_signal(signal.SIGTERM)
        code = self.router.process.wait(SIGTERM_EXIT_S * TIME_SCALE)
        exit_s = time.monotonic() - signalled
        if code is None:
            problems.append("pdrouter still running %.0f s after SIGTERM" % exit_s)
        attacker.stop.set()
        flood.join(10)
        sent = attacker.sent
        kv = self.router_kv_totals
        print(f"\nflood: {sent} batches of {len(payload) / (1 << 20):.1f} MiB sent ({kv}); honest batch applied "
              f"after {honest_s if honest_s is None else round(honest_s, 2)} s; VmHWM {peak_mb:.0f} MB "
              f"(VmRSS before {rss_before_mb:.0f} MB); exit {exit_s:.2f} s after SIGTERM (code {code})")
        self.assertEqual(problems, [])
        self.assertTrue(flood_was_on, "the flood had ended before SIGTERM")
        self.assertEqual(code, 0, self.router.log()[-3000:])


if __name__ == "__main__":
    unittest.main()
