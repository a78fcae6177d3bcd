"""The endpoints that are not P/D (docs/endpoints.md "How each vLLM endpoint goes through pdrouter"), end to
end with a real pdrouter and real `pdnode sim` nodes: render, /tokenize and /detokenize to one up
node (one labelled serves=render first); the pooling and audio endpoints to a node labelled
serves=pooling / serves=audio, else 501; unknown paths
404 unless routing.pass_through_unknown; a 1 MB+ render answer relayed without pdrouter holding
it (its RSS high-water mark does not grow by the answer's size); node failures as 502 / relayed
statuses. Which node served a request is read from the sims' request logs.
"""
import base64
import json
import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402
from pdrouter_fixture import Router, TIME_SCALE  # noqa: E402
from sim_fixture import SimNode  # noqa: E402

MODEL = "sim-model"
IMAGE_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    {"type": "text", "text": "What color is this image?"}]}]}


def served(nodes, path):
    """How many requests for `path` each node's log holds."""
    return [sum(1 for r in n.sim_requests()["requests"] if r["path"] == path) for n in nodes]


def proc_status_kb(pid, field):
    with open("/proc/%d/status" % pid) as f:
        return int(next(l for l in f if l.startswith(field + ":")).split()[1])


class SimAuxEndpoints(unittest.TestCase):
    """The simulator's side alone: vLLM's answer shapes."""

    @classmethod
    def setUpClass(cls):
        cls.sim = SimNode("--role", "decode", "--connector", "nixl", "--render-feature-bytes", "3000")

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()

    def test_tokenize_detokenize_round_trip(self):
        status, body = self.sim.post_json("/tokenize", {"model": MODEL, "prompt": "the quick brown fox",
                                                        "return_token_strs": True})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["count"], 4)
        self.assertEqual(body["tokens"], [0, 1, 2, 3])
        self.assertEqual(body["token_strs"], ["the", "quick", "brown", "fox"])
        self.assertIn("max_model_len", body)
        status, body = self.sim.post_json("/detokenize", {"tokens": [0, 1, 2, 3]})
        self.assertEqual((status, body), (200, {"prompt": "the quick brown fox"}))
        status, body = self.sim.post_json("/detokenize", {"tokens": ["x"]})
        self.assertEqual(status, 400, body)
        status, body = self.sim.post_json("/tokenize", {"model": "other", "prompt": "a"})
        self.assertEqual(status, 404, body)

    def test_embeddings(self):
        status, body = self.sim.post_json("/v1/embeddings", {"input": ["a b", "c"]})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "list")
        self.assertEqual([d["index"] for d in body["data"]], [0, 1])
        self.assertEqual(body["data"][0]["object"], "embedding")
        self.assertEqual(len(body["data"][0]["embedding"]), 8)
        self.assertEqual(body["usage"]["prompt_tokens"], 3)
        status, again = self.sim.post_json("/v1/embeddings", {"input": ["a b", "c"]})
        self.assertEqual(again["data"], body["data"])  # deterministic
        status, body = self.sim.post_json("/v1/embeddings", {"input": {"x": 1}})
        self.assertEqual(status, 400, body)

    def test_render_shapes(self):
        status, body = self.sim.post_json("/v1/chat/completions/render", IMAGE_CHAT)
        self.assertEqual(status, 200, body)
        for key in ("request_id", "token_ids", "features", "sampling_params", "kv_transfer_params"):
            self.assertIn(key, body)
        self.assertIsNone(body["kv_transfer_params"])
        features = body["features"]
        self.assertEqual(len(features["mm_hashes"]["image"]), 1)
        placeholder = features["mm_placeholders"]["image"][0]
        self.assertEqual(len(body["token_ids"]), placeholder["offset"] + placeholder["length"])
        self.assertEqual(len(base64.b64decode(features["kwargs_data"]["image"][0])), 3000)
        status, body = self.sim.post_json("/v1/completions/render", {"prompt": "the dog"})
        self.assertEqual(status, 200, body)
        self.assertIsInstance(body, list)
        self.assertEqual(len(body), 1)
        self.assertIsNone(body[0]["features"])
        self.assertEqual(body[0]["token_ids"], [0, 7])


class ThroughPdrouter(unittest.TestCase):
    def cluster(self, topology=None, prefill_flags=(), decode_flags=()):
        c = PdCluster("nixl", prefills=1, decodes=1, topology=topology, kv_backends="none",
                      prefill_flags=prefill_flags, decode_flags=decode_flags)
        self.addCleanup(c.close)
        return c

    def test_render_and_tokenize_go_to_one_node(self):
        c = self.cluster()
        nodes = c.prefills + c.decodes
        for path, body in (("/tokenize", {"prompt": "the quick brown fox"}),
                           ("/detokenize", {"tokens": [0, 1]}),
                           ("/v1/completions/render", {"prompt": "the dog"}),
                           ("/v1/chat/completions/render", IMAGE_CHAT)):
            with self.subTest(path=path):
                status, headers, raw = c.post(path, body, headers={"X-Request-Id": "rid-1"})
                self.assertEqual(status, 200, raw)
                self.assertTrue(headers["content-type"].startswith("application/json"), headers)
                json.loads(raw)
                self.assertEqual(sum(served(nodes, path)), 1)
        self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="any_node",'
                                  'outcome="relayed"}'), 2)
        self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="render",'
                                  'outcome="relayed"}'), 2)
        # The node's own answer to a bad request is relayed as it is.
        status, _, raw = c.post("/tokenize", {"model": "other", "prompt": "x"})
        self.assertEqual(status, 404, raw)
        self.assertIn("does not exist", json.loads(raw)["message"])

    def test_render_prefers_a_node_labelled_serves_render(self):
        c = self.cluster(prefill_flags=("--label", "serves=render"))
        for _ in range(4):
            status, _, raw = c.post("/v1/chat/completions/render", IMAGE_CHAT)
            self.assertEqual(status, 200, raw)
        self.assertEqual(served(c.prefills, "/v1/chat/completions/render"), [4])
        self.assertEqual(served(c.decodes, "/v1/chat/completions/render"), [0])

    def test_a_node_without_connector_serves_render_and_is_never_paired(self):
        # A GPU-less render node (`vllm launch render`) has no KV connector: `connector: none`.
        render = SimNode("--role", "decode", "--connector", "nixl")
        self.addCleanup(render.stop)
        address = "127.0.0.1:%d" % render.port
        c = self.cluster(topology="instances:\n  - role: decode\n    http_address: \"%s\"\n"
                                  "    connector: none\n    labels:\n      serves: render\n" % address)
        self.assertNotIn("connector", c.router.instance(address))  # /status: no KV connector
        self.assertEqual(c.router.instance(address)["dialect"], "none")
        for _ in range(3):
            status, _, raw = c.post("/v1/chat/completions/render", IMAGE_CHAT)
            self.assertEqual(status, 200, raw)
            status, _, raw = c.post("/v1/completions", {"model": MODEL, "prompt": "hi", "max_tokens": 2})
            self.assertEqual(status, 200, raw)
        self.assertEqual(served([render], "/v1/chat/completions/render"), [3])
        self.assertEqual(served([render], "/v1/completions"), [0])
        self.assertEqual(served(c.decodes, "/v1/completions"), [3])

    def test_pooling_is_501_unless_a_node_declares_it(self):
        c = self.cluster()
        for path in ("/v1/embeddings", "/pooling", "/classify", "/score", "/rerank",
                     "/v1/audio/transcriptions"):
            with self.subTest(path=path):
                status, _, raw = c.post(path, {"input": "a"})
                self.assertEqual(status, 501, raw)
                error = json.loads(raw)["error"]
                self.assertEqual(error["code"], "not_supported")
                self.assertIn("serves=", error["message"])
        self.assertEqual(served(c.prefills + c.decodes, "/v1/embeddings"), [0, 0])
        self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="pooling",'
                                  'outcome="not_supported"}'), 5)

        c = self.cluster(decode_flags=("--label", "serves=render, pooling"))
        status, _, raw = c.post("/v1/embeddings", {"input": ["a b", "c"]})
        self.assertEqual(status, 200, raw)
        self.assertEqual(len(json.loads(raw)["data"]), 2)
        self.assertEqual(served(c.prefills, "/v1/embeddings"), [0])
        self.assertEqual(served(c.decodes, "/v1/embeddings"), [1])
        status, _, raw = c.post("/v1/audio/transcriptions", {"file": "x"})
        self.assertEqual(status, 501, raw)  # pooling does not imply audio

    def test_unknown_paths_404_unless_pass_through(self):
        c = self.cluster()
        # (/inference/v1/generate, once this path, is P/D now: test_generate.py.)
        status, _, raw = c.post("/v1/not_a_vllm_endpoint", {"token_ids": [1]})
        self.assertEqual(status, 404, raw)
        self.assertEqual(served(c.prefills + c.decodes, "/v1/not_a_vllm_endpoint"), [0, 0])

        c = self.cluster(topology="routing:\n  pass_through_unknown: true\n")
        status, _, raw = c.request("GET", "/some/unknown?x=1")
        self.assertEqual(status, 404, raw)  # the decode's own 404, relayed
        self.assertEqual(served(c.prefills, "/some/unknown"), [0])
        log = c.decodes[0].sim_requests()["requests"]
        self.assertTrue(any(r["path"] == "/some/unknown" for r in log), log)
        # Paths pdrouter routes itself are never passed through.
        status, _, _ = c.get("/v1/models")
        self.assertEqual(status, 200)
        self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="pass_through",'
                                  'outcome="relayed"}'), 1)

    def test_node_failures(self):
        c = self.cluster()
        for node in c.prefills + c.decodes:
            node.set_fault(path="/tokenize", status=503, count=-1)
        status, _, raw = c.post("/tokenize", {"prompt": "a"})
        self.assertEqual(status, 503, raw)  # the node's error, relayed
        for node in c.prefills + c.decodes:
            node.clear_faults()
            node.set_fault(path="/tokenize", close_immediately=True, count=-1)
        status, _, raw = c.post("/tokenize", {"prompt": "a"})
        self.assertEqual(status, 502, raw)
        self.assertEqual(json.loads(raw)["error"]["code"], "upstream_failed")
        self.assertGreaterEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="any_node",'
                                         'outcome="failed"}'), 1)

    def test_large_render_answer_is_streamed_not_held(self):
        feature_bytes = 12 << 20  # base64: 16 MiB of answer
        # ASan's quarantine keeps freed chunks resident, so the router's peak RSS would count every
        # chunk relayed: this router runs without it (still ASan-checked). Under TSan (shadow
        # memory) RSS says nothing about pdrouter's own memory: the bound is not asserted there.
        asan = os.environ.get("ASAN_OPTIONS")
        router_env = {"ASAN_OPTIONS": asan + ":quarantine_size_mb=0:thread_local_quarantine_size_kb=0"} if asan else None
        c = PdCluster("nixl", prefills=1, decodes=1, kv_backends="none", router_env=router_env,
                      prefill_flags=("--render-feature-bytes", str(feature_bytes)),
                      decode_flags=("--render-feature-bytes", str(feature_bytes)))
        self.addCleanup(c.close)
        pid = c.router.process.proc.pid
        before = proc_status_kb(pid, "VmRSS")
        status, headers, raw = c.post("/v1/chat/completions/render", IMAGE_CHAT, timeout=60)
        self.assertEqual(status, 200)
        self.assertEqual(headers.get("transfer-encoding"), "chunked")
        answer = json.loads(raw)
        blob = answer["features"]["kwargs_data"]["image"][0]
        self.assertEqual(len(base64.b64decode(blob)), feature_bytes)
        grown_kb = proc_status_kb(pid, "VmHWM") - before
        if os.environ.get("TSAN_OPTIONS"):
            print("pdrouter's peak RSS grew by %d kB for a %d byte answer (not asserted under TSan)"
                  % (grown_kb, len(raw)))
            return
        self.assertLess(grown_kb * 1024, len(raw) // 4,
                        "pdrouter's peak RSS grew by %d kB for a %d byte answer" % (grown_kb, len(raw)))

    def test_a_client_that_does_not_read_is_cut_after_client_write_ms(self):
        feature_bytes = 12 << 20
        c = PdCluster("nixl", prefills=1, decodes=1, kv_backends="none",
                      topology="timeouts:\n  client_write_ms: 300\n",
                      prefill_flags=("--render-feature-bytes", str(feature_bytes)),
                      decode_flags=("--render-feature-bytes", str(feature_bytes)))
        self.addCleanup(c.close)
        host, port = c.router.http.rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(sock.close)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect((host, int(port)))
        body = json.dumps(IMAGE_CHAT).encode()
        sock.sendall(b"POST /v1/chat/completions/render HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        # Nothing is read: reading from the node pauses, then the stall deadline cuts the client.
        c.router.wait_for(lambda: c.metric("pdrouter_client_write_stalls_total") >= 1, timeout=20)
        c.router.wait_for(lambda: c.metric('pdrouter_one_node_requests_total{endpoint_class="render",'
                                           'outcome="failed"}') == 1, timeout=5)


class OneNodeAdmission(unittest.TestCase):
    """The one-node endpoints take a P/D request's admission (router/proxy/admission.h): they count
    against limits.max_concurrent_requests (429 with Retry-After beyond it, with the admission
    queue off; test_admission_queue.py tests the queue) and give their slot back however they end."""

    LIMIT = 2
    RENDER = "/v1/chat/completions/render"

    def cluster(self, **flags):
        c = PdCluster("nixl", prefills=1, decodes=1, kv_backends="none",
                      topology="limits:\n  max_concurrent_requests: %d\n  max_queued_requests: 0\n" % self.LIMIT,
                      **flags)
        self.addCleanup(c.close)
        return c

    def test_render_calls_beyond_the_limit_get_429_and_the_slots_come_back(self):
        c = self.cluster()
        nodes = c.prefills + c.decodes
        # Slow renders: held by the nodes long enough for the checks below on a loaded machine
        # (each step waits on a condition; the delay only has to outlast them).
        delay_ms = int(4000 * TIME_SCALE)
        for node in nodes:
            node.set_fault(path=self.RENDER, delay_ms=delay_ms, count=-1)
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            c.post(self.RENDER, IMAGE_CHAT, timeout=30))) for _ in range(self.LIMIT)]
        for t in threads:
            t.start()
        try:
            c.router.wait_for(lambda: c.metric("pdrouter_requests_in_flight") == self.LIMIT,
                              timeout=10 * TIME_SCALE)
            refused_before = c.metric('pdrouter_requests_refused_total{reason="too_busy"}')
            for path, body in ((self.RENDER, IMAGE_CHAT), ("/tokenize", {"prompt": "a b"}),
                               ("/v1/chat/completions", {"model": MODEL, "max_tokens": 2,
                                                         "messages": [{"role": "user", "content": "hi"}]})):
                with self.subTest(path=path):
                    status, headers, raw = c.post(path, body)
                    self.assertEqual(status, 429, raw)
                    self.assertEqual(headers.get("retry-after"), "1")
                    error = json.loads(raw)["error"]
                    self.assertEqual(error["code"], "too_many_requests")
                    self.assertEqual(error["type"], "rate_limit_error")
                    self.assertIn("max_concurrent_requests", error["message"])
            self.assertEqual(c.metric('pdrouter_requests_refused_total{reason="too_busy"}'), refused_before + 3)
            self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="render",'
                                      'outcome="refused"}'), 1)
            self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="any_node",'
                                      'outcome="refused"}'), 1)
        finally:
            for t in threads:
                t.join(60 * TIME_SCALE)
        self.assertEqual([r[0] for r in results], [200] * self.LIMIT, results)
        c.router.wait_for(lambda: c.metric("pdrouter_requests_in_flight") == 0, timeout=5 * TIME_SCALE)
        self.assertEqual(c.metric("pdrouter_buffered_bytes"), 0)
        for node in nodes:
            node.clear_faults()
        for _ in range(self.LIMIT + 1):  # more than the limit, one after the other: all served
            status, _, raw = c.post(self.RENDER, IMAGE_CHAT)
            self.assertEqual(status, 200, raw)
        self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="render",'
                                  'outcome="relayed"}'), self.LIMIT + self.LIMIT + 1)
        c.router.wait_for(lambda: c.metric("pdrouter_requests_in_flight") == 0, timeout=5 * TIME_SCALE)

    def test_a_client_closing_mid_answer_gives_its_slot_back(self):
        feature_bytes = 12 << 20  # far more than pdrouter relays before it pauses for the client
        c = self.cluster(prefill_flags=("--render-feature-bytes", str(feature_bytes)),
                         decode_flags=("--render-feature-bytes", str(feature_bytes)))
        host, port = c.router.http.rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(sock.close)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.settimeout(10 * TIME_SCALE)
        sock.connect((host, int(port)))
        body = json.dumps(IMAGE_CHAT).encode()
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % (self.RENDER.encode(), len(body)) + body)
        head = sock.recv(4096)  # the answer has begun
        self.assertTrue(head.startswith(b"HTTP/1.1 200"), head)
        self.assertEqual(c.metric("pdrouter_requests_in_flight"), 1)
        sock.close()
        c.router.wait_for(lambda: c.metric('pdrouter_one_node_requests_total{endpoint_class="render",'
                                           'outcome="failed"}') == 1, timeout=5 * TIME_SCALE)
        c.router.wait_for(lambda: c.metric("pdrouter_requests_in_flight") == 0, timeout=5 * TIME_SCALE)
        self.assertEqual(c.metric("pdrouter_buffered_bytes"), 0)
        # The limit is whole again: as many renders at once as it allows are served.
        results = []
        threads = [threading.Thread(target=lambda: results.append(
            c.post("/v1/completions/render", {"prompt": "the dog"}, timeout=30))) for _ in range(self.LIMIT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60 * TIME_SCALE)
        self.assertEqual([r[0] for r in results], [200] * self.LIMIT, results)


class ResetPrefixCache(unittest.TestCase):
    """POST /reset_prefix_cache: fanned out to every up node, admin key only (like /start_profile)."""

    def test_fan_out_with_the_admin_key(self):
        nodes = [SimNode(), SimNode()]
        for node in nodes:
            self.addCleanup(node.stop)
        router = Router("admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\nconnectors:\n  default: nixl\n"
                        "instances:\n  - {role: prefill, http_address: \"%s\"}\n"
                        "  - {role: decode, http_address: \"%s\"}\n"
                        % (nodes[0].http_address, nodes[1].http_address),
                        env={"PDR_TEST_ADMIN_KEY": "k-123"})
        self.addCleanup(router.stop)
        code, _, raw = router.request("POST", "/reset_prefix_cache")
        self.assertEqual(code, 401, raw)
        self.assertEqual(served(nodes, "/reset_prefix_cache"), [0, 0])
        code, _, raw = router.request("POST", "/reset_prefix_cache", headers={"Authorization": "Bearer k-123"})
        self.assertEqual(code, 200, raw)
        self.assertEqual(len(json.loads(raw)["results"]), 2)
        self.assertEqual(served(nodes, "/reset_prefix_cache"), [1, 1])


if __name__ == "__main__":
    unittest.main()
