"""The periodic load scrape (topology load_signals, router/proxy/engine_load_scrape.h) end to end.

pdrouter reads each routable node's /metrics every interval and keeps vllm:num_requests_running,
_waiting and kv_cache_usage_perc per node and DP rank (/status `engine_load`, /metrics
pdrouter_node_engine_*). Nodes: a P/D pair of `pdnode sim` (the decode with its vLLM engine model
and two DP ranks), and a fake node (a small HTTP server, `connector: none`, so never paired) whose
/metrics page the test switches between a good page, garbage, a page over max_body_bytes, a 500,
a page without the request families and an answer slower than timeout_ms, plus an address that
refuses connections: each failure is counted by reason, the fake's figures age out after
stale_after_ms, and P/D requests keep being served.
Turned off by a reload, the scrape stops reading.
"""
import http.server
import os
import socket
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster, completion  # noqa: E402
from pdrouter_fixture import TIME_SCALE  # noqa: E402

INTERVAL_MS = int(150 * TIME_SCALE)
STALE_AFTER_MS = 3 * INTERVAL_MS
MAX_BODY = 256 * 1024  # a sim with two engines writes about 19 KB

GOOD_PAGE = (
    "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    'vllm:num_requests_running{engine="0",model_name="sim-model"} 2.0\n'
    'vllm:num_requests_running{engine="1",model_name="sim-model"} 3.0\n'
    "# TYPE vllm:num_requests_waiting gauge\n"
    'vllm:num_requests_waiting{engine="0",model_name="sim-model"} 0.0\n'
    'vllm:num_requests_waiting{engine="1",model_name="sim-model"} 7.0\n'
    "# TYPE vllm:kv_cache_usage_perc gauge\n"
    'vllm:kv_cache_usage_perc{engine="0",model_name="sim-model"} 0.25\n'
    'vllm:kv_cache_usage_perc{engine="1",model_name="sim-model"} 0.75\n'
)


class FakeNode:
    """An HTTP server whose GET /metrics answers per `mode`; counts the reads and records their
    Authorization headers."""

    def __init__(self):
        self.mode = "good"
        self.reads = 0
        self.authorizations = []
        self.lock = threading.Lock()
        self.release = threading.Event()  # ends the "slow" answers (at shutdown)
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):  # noqa: N802 (http.server's naming)
                with fake.lock:
                    fake.reads += 1
                    fake.authorizations.append(self.headers.get("Authorization"))
                    mode = fake.mode
                status, body = 200, GOOD_PAGE.encode()
                if mode == "garbage":
                    body = b"<html><body>upstream went away</body></html>\n"
                elif mode == "huge":
                    body = (GOOD_PAGE + "# padding " + "x" * (4 * MAX_BODY) + "\n").encode()
                elif mode == "status":
                    status, body = 500, b"Internal Server Error"
                elif mode == "missing":
                    body = b'vllm:request_success_total{model_name="sim-model"} 3\n'
                elif mode == "slow":
                    fake.release.wait(10 * INTERVAL_MS / 1000.0)
                self.send_response(status)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass  # pdrouter gave up on the read (too large, timeout)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.address = "127.0.0.1:%d" % self.server.server_address[1]

    def set_mode(self, mode):
        with self.lock:
            self.mode = mode

    def read_count(self):
        with self.lock:
            return self.reads

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def topology(fake_address, dead_address, scrape=True):
    return (
        "connectors:\n  upstream_api_key_env: PDR_TEST_UPSTREAM_KEY\n"
        "load_signals:\n  scrape_engine_metrics: %s\n  interval_ms: %d\n  timeout_ms: %d\n"
        "  stale_after_ms: %d\n  max_body_bytes: %d\n"
        "instances:\n  - {role: decode, http_address: \"%s\", connector: none}\n"
        "  - {role: decode, http_address: \"%s\", connector: none}\n"
        % ("true" if scrape else "false", INTERVAL_MS, INTERVAL_MS, STALE_AFTER_MS, MAX_BODY, fake_address,
           dead_address))


class EngineLoadScrape(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fake = FakeNode()
        # Bound and never listening: a connect to it is refused, and no other process can take
        # the port while the socket stays open.
        cls.dead_socket = socket.socket()
        cls.dead_socket.bind(("127.0.0.1", 0))
        cls.dead_address = "127.0.0.1:%d" % cls.dead_socket.getsockname()[1]
        cls.cluster = PdCluster("nixl", topology=topology(cls.fake.address, cls.dead_address),
                                router_env={"PDR_TEST_UPSTREAM_KEY": "scrape-secret"},
                                decode_flags=("--engine", "vllm", "--dp-size", "2", "--time-scale", "20"))
        cls.router = cls.cluster.router

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()
        cls.fake.close()
        cls.dead_socket.close()

    def setUp(self):
        self.fake.set_mode("good")

    def engine_load(self, address):
        inst = self.router.instance(address)
        return inst["engine_load"] if inst else None

    def wait_figures(self, address, predicate=lambda f: True, timeout=10):
        def ready():
            load = self.engine_load(address)
            return load if load and load["figures"] is not None and predicate(load) else None
        return self.router.wait_for(ready, timeout=timeout, interval=0.02)[0]

    def failures(self, reason):
        return self.router.metrics().get('pdrouter_engine_scrape_failures_total{reason="%s"}' % reason, 0)

    def test_sim_figures_appear_in_status_and_metrics(self):
        decode, prefill = self.cluster.decodes[0], self.cluster.prefills[0]
        # Idle (an earlier test's last request may still be finishing on the slowed engine).
        load = self.wait_figures(decode.http_address,
                                 lambda l: l["figures"]["running"] == 0 and l["figures"]["kv_cache_usage"] == 0)
        self.assertEqual(load["figures"]["running"], 0, load)
        self.assertEqual(load["figures"]["waiting"], 0, load)
        self.assertEqual(load["figures"]["kv_cache_usage"], 0, load)  # the engine model's KV pool
        self.assertEqual(len(load["ranks"]), 2, load)  # one per DP engine
        self.assertLessEqual(load["age_ms"], STALE_AFTER_MS, load)
        self.assertIsNone(load["last_error"], load)
        # The per-token prefill has no KV pool: running and waiting only.
        load = self.wait_figures(prefill.http_address)
        self.assertIsNone(load["figures"]["kv_cache_usage"], load)
        self.assertEqual(load["ranks"], [{"running": 0, "waiting": 0, "kv_cache_usage": None}], load)
        m = self.router.metrics()
        self.assertEqual(m['pdrouter_node_engine_requests_running{node="%s"}' % decode.http_address], 0)
        self.assertEqual(m['pdrouter_node_rank_engine_kv_cache_usage{node="%s",rank="1"}' % decode.http_address], 0)
        self.assertGreater(m["pdrouter_engine_scrape_reads_total"], 0)

    def test_a_streaming_request_shows_running_on_the_decode(self):
        decode = self.cluster.decodes[0]
        self.wait_figures(decode.http_address)
        # A long generation on the slowed engine (--time-scale 20): running while it streams.
        with self.cluster.stream("/v1/completions", {"model": "sim-model", "prompt": "one two three",
                                                     "max_tokens": 400, "stream": True}, timeout=30) as events:
            next(iter(events))
            load = self.wait_figures(decode.http_address, lambda l: l["figures"]["running"] == 1)
            self.assertEqual(sum(r["running"] for r in load["ranks"]), 1, load)
            self.assertGreater(load["figures"]["kv_cache_usage"], 0, load)
        # The client gone, the decode ends the request: 0 again at a later read.
        self.wait_figures(decode.http_address, lambda l: l["figures"]["running"] == 0)

    def test_fake_node_figures_per_engine_with_the_upstream_key(self):
        load = self.wait_figures(self.fake.address)
        self.assertEqual(load["figures"], {"running": 5, "waiting": 7, "kv_cache_usage": 0.5}, load)
        self.assertEqual(load["ranks"], [{"running": 2, "waiting": 0, "kv_cache_usage": 0.25},
                                         {"running": 3, "waiting": 7, "kv_cache_usage": 0.75}], load)
        with self.fake.lock:
            self.assertEqual(set(self.fake.authorizations), {"Bearer scrape-secret"})

    def test_each_failure_is_counted_by_reason_and_figures_age_out(self):
        self.wait_figures(self.fake.address)
        for mode, reason in (("garbage", "malformed"), ("huge", "too_large"), ("status", "status"),
                             ("missing", "missing_families"), ("slow", "timeout")):
            with self.subTest(mode=mode):
                before = self.failures(reason)
                self.fake.set_mode(mode)
                self.router.wait_for(lambda: self.failures(reason) > before, timeout=10)
                load = self.router.wait_for(lambda: (lambda l: l if l["last_error"] == reason else None)(
                    self.engine_load(self.fake.address)), timeout=10)[0]
                self.assertGreater(load["failures"], 0)
                # The last good figures are dropped once older than stale_after_ms.
                load = self.router.wait_for(lambda: (lambda l: l if l["figures"] is None else None)(
                    self.engine_load(self.fake.address)), timeout=10)[0]
                self.assertGreater(load["age_ms"], STALE_AFTER_MS, load)
                self.assertNotIn('pdrouter_node_engine_requests_running{node="%s"}' % self.fake.address,
                                 self.router.metrics())
                # Routing goes on (the P/D pair is read fine; the fake is never paired).
                status, _, body = self.cluster.post("/v1/completions", completion())
                self.assertEqual(status, 200, body)
                self.fake.set_mode("good")
                self.wait_figures(self.fake.address)
        self.fake.release.set()  # the slow answers still held end now

    def test_a_node_that_refuses_connections_is_counted(self):
        self.router.wait_for(lambda: self.failures("connect") > 0, timeout=10)
        load = self.router.wait_for(lambda: self.engine_load(self.dead_address), timeout=10)[0]
        self.assertEqual(load["last_error"], "connect", load)
        self.assertIsNone(load["figures"], load)
        self.assertIsNone(load["age_ms"], load)  # never read
        self.assertEqual(load["reads"], 0, load)
        self.assertNotIn('pdrouter_node_engine_scrape_age_seconds{node="%s"}' % self.dead_address,
                         self.router.metrics())

    def test_turning_the_scrape_off_stops_the_reads(self):
        self.wait_figures(self.fake.address)
        reloads = self.router.metrics().get('pdrouter_topology_reloads_total{result="ok"}', 0)
        self.router.write_topology(topology(self.fake.address, self.dead_address, scrape=False))
        self.router.wait_for(
            lambda: self.router.metrics().get('pdrouter_topology_reloads_total{result="ok"}', 0) > reloads, timeout=10)
        # One read may have started before the reload was seen; after it, none. Waited for on
        # pdrouter's own state: the figures age out, then three more intervals pass.
        self.router.wait_for(lambda: self.engine_load(self.fake.address)["figures"] is None, timeout=10)
        count = self.fake.read_count()
        self.router.wait_for(lambda: self.engine_load(self.fake.address)["age_ms"] > STALE_AFTER_MS + 3 * INTERVAL_MS,
                             timeout=10)
        off = self.fake.read_count()
        self.assertLessEqual(off, count + 1)
        status, _, body = self.cluster.post("/v1/completions", completion())
        self.assertEqual(status, 200, body)
        # And on again.
        self.router.write_topology(topology(self.fake.address, self.dead_address))
        self.wait_figures(self.fake.address, timeout=10)
        self.assertGreater(self.fake.read_count(), off)


if __name__ == "__main__":
    unittest.main()
