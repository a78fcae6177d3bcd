"""GET /engine_metrics end to end: pdrouter fetches every up node's /metrics at once and answers one
Prometheus page where each sample carries pdrouter_node / pdrouter_role, each family's HELP and
TYPE appear once, and pdrouter_engine_metrics_scrape_ok{node,role} says which nodes were read.
Nodes: two `pdnode sim` (their vLLM-like /metrics), a hostile fake node whose page mixes valid and
malformed lines (the malformed are dropped and counted), and an address nobody listens on (a failed
fetch, scrape_ok 0). Served on the admin listener without the admin key, like /metrics.
"""
import http.server
import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pdrouter_fixture import Router  # noqa: E402
from sim_fixture import SimNode  # noqa: E402

HOSTILE_PAGE = (
    "# HELP vllm:num_requests_running Some other help text.\n"
    "# TYPE vllm:num_requests_running gauge\n"
    "vllm:num_requests_running{engine=\"0\",model_name=\"sim-model\"} 7\n"
    "vllm:forged{pdrouter_node=\"127.9.9.9:1\"} 1\n"          # pdrouter's own label: refused
    "vllm:broken{model_name=\"unterminated} 1\n"            # refused
    "vllm:notanumber 12abc\n"                               # refused
    "vllm:too_long{x=\"" + "y" * 5000 + "\"} 1\n"           # label value over the limit
    "# TYPE fake_conflicted gauge\n"
    "# TYPE fake_conflicted counter\n"                      # typed twice: its samples dropped
    "fake_conflicted 5\n"
    "fake_up 1\n"
)


class HostileHandler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        body = HOSTILE_PAGE.encode()
        self.send_response(200 if self.path == "/metrics" else 404)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def refusing_port():
    """A socket bound to a loopback port and never listening: a connect to the port is refused,
    and while the socket stays open no other process (another module's sim under ctest -j) can
    take the port and answer /metrics there. Keep it open for as long as the port is used."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    return sock


class EngineMetrics(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.prefill = SimNode("--role", "prefill", "--connector", "nixl")
        cls.decode = SimNode("--role", "decode", "--connector", "nixl")
        cls.hostile = http.server.ThreadingHTTPServer(("127.0.0.1", 0), HostileHandler)
        threading.Thread(target=cls.hostile.serve_forever, daemon=True).start()
        cls.hostile_address = "127.0.0.1:%d" % cls.hostile.server_address[1]
        cls.dead_socket = refusing_port()
        cls.dead_address = "127.0.0.1:%d" % cls.dead_socket.getsockname()[1]
        cls.router = Router(
            "connectors:\n  default: nixl\ninstances:\n"
            "  - {role: prefill, http_address: \"%s\"}\n  - {role: decode, http_address: \"%s\"}\n"
            "  - {role: decode, http_address: \"%s\"}\n  - {role: decode, http_address: \"%s\"}\n"
            % (cls.prefill.http_address, cls.decode.http_address, cls.hostile_address, cls.dead_address))

    @classmethod
    def tearDownClass(cls):
        cls.router.stop()
        cls.hostile.shutdown()
        cls.hostile.server_close()
        cls.dead_socket.close()
        cls.prefill.stop()
        cls.decode.stop()

    def scrape(self):
        code, headers, raw = self.router.request("GET", "/engine_metrics", admin=True, timeout=30)
        self.assertEqual(code, 200, raw)
        self.assertTrue(headers["content-type"].startswith("text/plain"), headers)
        return raw.decode()

    def test_one_page_for_the_fleet(self):
        before = self.router.metrics()
        page = self.scrape()
        lines = page.splitlines()
        for node, role in ((self.prefill.http_address, "prefill"), (self.decode.http_address, "decode")):
            self.assertIn('vllm:num_requests_running{pdrouter_node="%s",pdrouter_role="%s",engine="0",'
                          'model_name="sim-model"} 0' % (node, role), lines)
            self.assertIn('pdrouter_engine_metrics_scrape_ok{node="%s",role="%s"} 1' % (node, role), lines)
            # Every sample of a sim is labelled with it.
            self.assertTrue(any(l.startswith('vllm:generation_tokens_total{pdrouter_node="%s"' % node)
                                for l in lines), page)
        # HELP and TYPE once per family, the first node's.
        self.assertEqual(lines.count("# TYPE vllm:num_requests_running gauge"), 1, page)
        self.assertEqual(sum(1 for l in lines if l.startswith("# HELP vllm:num_requests_running ")), 1, page)
        self.assertEqual(lines.count("# TYPE vllm:request_success_total counter"), 1, page)
        # The hostile node: its valid lines kept and labelled, the rest dropped.
        self.assertIn('vllm:num_requests_running{pdrouter_node="%s",pdrouter_role="decode",engine="0",'
                      'model_name="sim-model"} 7' % self.hostile_address, lines)
        self.assertIn('fake_up{pdrouter_node="%s",pdrouter_role="decode"} 1' % self.hostile_address, lines)
        for dropped in ("forged", "broken", "notanumber", "too_long", "127.9.9.9"):
            self.assertNotIn(dropped, page)
        self.assertNotIn("fake_conflicted 5", page)
        self.assertIn('pdrouter_engine_metrics_scrape_ok{node="%s",role="decode"} 1' % self.hostile_address, lines)
        # The address nobody listens on.
        self.assertIn('pdrouter_engine_metrics_scrape_ok{node="%s",role="decode"} 0' % self.dead_address, lines)
        self.assertEqual(sum(1 for l in lines if l.startswith("# TYPE pdrouter_engine_metrics_scrape_ok")), 1)
        after = self.router.metrics()

        def delta(name):
            return after.get(name, 0) - before.get(name, 0)
        self.assertEqual(delta("pdrouter_engine_metrics_scrapes_total"), 1)
        self.assertEqual(delta('pdrouter_engine_metrics_node_fetches_total{result="ok"}'), 3)
        self.assertEqual(delta('pdrouter_engine_metrics_node_fetches_total{result="failed"}'), 1)
        self.assertEqual(delta('pdrouter_engine_metrics_dropped_lines_total{reason="malformed"}'), 4)
        self.assertEqual(delta('pdrouter_engine_metrics_dropped_lines_total{reason="type_conflict"}'), 1)

    def test_the_sims_count_what_they_served(self):
        status, _ = self.decode.post_json("/v1/completions", {"prompt": "a b c", "max_tokens": 3})
        self.assertEqual(status, 200)
        lines = self.scrape().splitlines()
        counts = [l for l in lines if l.startswith('vllm:generation_tokens_total{pdrouter_node="%s"'
                                                    % self.decode.http_address)]
        self.assertEqual(len(counts), 1, lines)
        self.assertGreaterEqual(float(counts[0].rsplit(" ", 1)[1]), 3)

    def test_not_on_the_client_listener_when_an_admin_listener_is_set(self):
        router = Router("listeners:\n  admin: \"127.0.0.1:0\"\nconnectors:\n  default: nixl\n"
                        "instances:\n  - {role: decode, http_address: \"%s\"}\n" % self.decode.http_address)
        self.addCleanup(router.stop)
        code, _, _ = router.request("GET", "/engine_metrics")
        self.assertEqual(code, 404)
        code, _, raw = router.request("GET", "/engine_metrics", admin=True, timeout=30)
        self.assertEqual(code, 200, raw)
        self.assertIn('pdrouter_node="%s"' % self.decode.http_address, raw.decode())


if __name__ == "__main__":
    unittest.main()
