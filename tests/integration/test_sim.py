"""`pdnode sim`: the simulated vLLM node, driven over loopback HTTP like a real vLLM peer
(docs/design/wire-formats.md 1.4, 3, 4, 5, 6)."""
import http.client
import json
import socket
import time
import unittest
import uuid

from pdr_testlib import FakeRouter
from sim_fixture import SimNode, sse_events, stream_post


def moriio_request_id(prefill_zmq, decode_zmq):
    return "___prefill_addr_%s___decode_addr_%s_%s" % (prefill_zmq, decode_zmq, uuid.uuid4().hex)


class SimTestBase(unittest.TestCase):
    def start(self, *flags):
        node = SimNode(*flags)
        # A clean SIGTERM exit is 0; sanitizer reports would make it non-zero.
        self.addCleanup(lambda: self.assertEqual(node.stop(), 0, node.proc.output()))
        return node


class FormatTest(SimTestBase):
    def setUp(self):
        self.node = self.start("--role", "decode", "--connector", "nixl",
                               "--decode-us-per-token", "100")

    def test_health_and_models(self):
        status, body, _ = self.node.request("GET", "/health")
        self.assertEqual((status, body), (200, b""))
        status, body, _ = self.node.request("GET", "/v1/models")
        models = json.loads(body)
        self.assertEqual(models["object"], "list")
        self.assertEqual(models["data"][0]["id"], "sim-model")
        self.assertEqual(models["data"][0]["object"], "model")
        self.assertEqual(models["data"][0]["owned_by"], "vllm")
        self.assertIn("max_model_len", models["data"][0])

    def test_completion_non_stream(self):
        status, body = self.node.post_json(
            "/v1/completions", {"model": "sim-model", "prompt": "one two three four", "max_tokens": 5},
            {"X-Request-Id": "req-1"})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["id"], "cmpl-req-1")
        self.assertEqual(body["object"], "text_completion")
        self.assertEqual(body["model"], "sim-model")
        self.assertIsInstance(body["created"], int)
        choice = body["choices"][0]
        self.assertEqual(choice["index"], 0)
        self.assertEqual(choice["finish_reason"], "length")
        self.assertIsNone(choice["logprobs"])
        self.assertEqual(len(choice["text"].split()), 5)
        self.assertEqual(body["usage"], {"prompt_tokens": 4, "completion_tokens": 5,
                                         "total_tokens": 9})
        self.assertIn("kv_transfer_params", body)
        self.assertIsNone(body["kv_transfer_params"])
        # Deterministic from (request id, prompt).
        _, again = self.node.post_json(
            "/v1/completions", {"prompt": "one two three four", "max_tokens": 5},
            {"X-Request-Id": "req-1"})
        self.assertEqual(again["choices"][0]["text"], choice["text"])

    def test_chat_non_stream_default_max_tokens(self):
        status, body = self.node.post_json(
            "/v1/chat/completions", {"messages": [{"role": "user", "content": "hello sim"}]},
            {"X-Request-Id": "c1"})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["id"], "chatcmpl-c1")
        self.assertEqual(body["object"], "chat.completion")
        message = body["choices"][0]["message"]
        self.assertEqual(message["role"], "assistant")
        self.assertEqual(len(message["content"].split()), 16)
        self.assertEqual(body["usage"]["completion_tokens"], 16)
        self.assertEqual(body["usage"]["prompt_tokens"], 2)

    def test_completion_stream_matches_non_stream(self):
        request = {"prompt": "alpha beta", "max_tokens": 4}
        _, full = self.node.post_json("/v1/completions", request, {"X-Request-Id": "s1"})
        status, raw, content_type = self.node.request(
            "POST", "/v1/completions", dict(request, stream=True,
                                            stream_options={"include_usage": True}),
            {"X-Request-Id": "s1"})
        self.assertEqual(status, 200)
        self.assertTrue(content_type.startswith("text/event-stream"))
        events = sse_events(raw)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        tokens = [c for c in chunks if c["choices"]]
        self.assertEqual(len(tokens), 4)
        for chunk in chunks:
            self.assertEqual(chunk["id"], "cmpl-s1")
            self.assertEqual(chunk["object"], "text_completion")
        self.assertEqual([c["choices"][0]["finish_reason"] for c in tokens],
                         [None, None, None, "length"])
        self.assertEqual("".join(c["choices"][0]["text"] for c in tokens),
                         full["choices"][0]["text"])
        self.assertEqual(chunks[-1]["choices"], [])
        self.assertEqual(chunks[-1]["usage"]["completion_tokens"], 4)

    def test_chat_stream(self):
        status, raw, _ = self.node.request(
            "POST", "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "stream": True},
            {"X-Request-Id": "cs"})
        self.assertEqual(status, 200)
        events = sse_events(raw)
        self.assertEqual(events[-1], "[DONE]")
        chunks = [json.loads(e) for e in events[:-1]]
        self.assertEqual(chunks[0]["choices"][0]["delta"]["role"], "assistant")
        self.assertEqual(len(chunks), 4)  # role + 3 tokens, no usage chunk
        for chunk in chunks:
            self.assertEqual(chunk["object"], "chat.completion.chunk")
            self.assertEqual(chunk["id"], "chatcmpl-cs")
            self.assertNotIn("usage", chunk)
        self.assertEqual(chunks[-1]["choices"][0]["finish_reason"], "length")

    def test_bad_input(self):
        status, body = self.node.post_json("/v1/completions", {"max_tokens": 2})
        self.assertEqual(status, 400)
        self.assertEqual(body["object"], "error")
        self.assertEqual(body["type"], "BadRequestError")
        self.assertEqual(body["code"], 400)
        status, raw, _ = self.node.request("POST", "/v1/completions", b"{not json")
        self.assertEqual(status, 400)
        status, body = self.node.post_json("/v1/completions", {"prompt": "a", "model": "other"})
        self.assertEqual(status, 404)

    def test_bad_dp_rank_rejected(self):
        for rank in ("1", "-1", "x"):
            status, body = self.node.post_json("/v1/completions", {"prompt": "a", "max_tokens": 1},
                                               {"X-data-parallel-rank": rank})
            self.assertEqual(status, 400, rank)
            self.assertEqual(body["object"], "error")
        status, _ = self.node.post_json("/v1/completions", {"prompt": "a", "max_tokens": 1},
                                        {"X-data-parallel-rank": "0"})
        self.assertEqual(status, 200)
        self.assertEqual(self.node.sim_requests()["counters"]["errors_by_reason"]["bad_dp_rank"], 3)

    def test_sim_requests_shows_what_was_received(self):
        self.node.request("POST", "/sim/reset")
        body = json.dumps({"prompt": "exact bytes", "max_tokens": 1})
        self.node.request("POST", "/v1/completions", body, {"X-Request-Id": "seen-1"})
        log = self.node.sim_requests()
        self.assertEqual(len(log["requests"]), 1)
        entry = log["requests"][0]
        self.assertEqual(entry["method"], "POST")
        self.assertEqual(entry["path"], "/v1/completions")
        self.assertEqual(entry["body"], body)
        self.assertEqual(entry["headers"]["x-request-id"], "seen-1")
        self.assertEqual(entry["status"], 200)
        self.assertFalse(entry["aborted"])
        self.assertGreater(entry["arrival_unix_ms"], 0)
        self.assertEqual(log["counters"]["requests"], 1)
        self.assertEqual(log["counters"]["aborts"], 0)
        self.node.request("POST", "/sim/reset")
        self.assertEqual(self.node.sim_requests()["requests"], [])


class PacingTest(SimTestBase):
    def test_stream_is_paced_by_decode_latency(self):
        node = self.start("--decode-us-per-token", "20000", "--prefill-us-per-token", "10000")
        started = time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", node.port, timeout=10)
        self.addCleanup(conn.close)
        conn.request("POST", "/v1/completions",
                     json.dumps({"prompt": "w " * 5, "max_tokens": 5, "stream": True}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        first = response.read1(65536)
        first_at = time.monotonic() - started
        raw = first + response.read()
        total = time.monotonic() - started
        self.assertIn(b"data: [DONE]", raw)
        # 5 prompt tokens x 10 ms prefill before the first token; 4 gaps of 20 ms after it.
        self.assertGreaterEqual(first_at, 0.045)
        self.assertGreaterEqual(total, 0.045 + 0.080)

    def test_non_stream_takes_whole_generation(self):
        node = self.start("--decode-us-per-token", "20000")
        started = time.monotonic()
        status, _ = node.post_json("/v1/completions", {"prompt": "a", "max_tokens": 5})
        self.assertEqual(status, 200)
        self.assertGreaterEqual(time.monotonic() - started, 0.080)


class KvTransferTest(SimTestBase):
    def test_nixl_prefill_returns_full_params(self):
        node = self.start("--role", "prefill", "--connector", "nixl", "--tp-size", "2")
        status, body = node.post_json("/v1/completions", {
            "prompt": "p " * 40, "max_tokens": 1, "stream": False,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                   "remote_engine_id": None, "remote_block_ids": None,
                                   "remote_host": None, "remote_port": None}},
            {"X-Request-Id": "nixl-1"})
        self.assertEqual(status, 200, body)
        params = body["kv_transfer_params"]
        self.assertIs(params["do_remote_prefill"], True)
        self.assertIs(params["do_remote_decode"], False)
        self.assertEqual(len(params["remote_block_ids"]), 3)  # 40 tokens / 16 per block
        self.assertTrue(params["remote_engine_id"])
        self.assertTrue(params["remote_request_id"].startswith("cmpl-nixl-1-0-"))
        self.assertEqual(params["remote_host"], "127.0.0.1")
        self.assertEqual(params["remote_port"], 5600)
        self.assertEqual(params["tp_size"], 2)
        # A NIXL decode accepts those params verbatim...
        decode = self.start("--role", "decode", "--connector", "nixl")
        status, body = decode.post_json("/v1/completions", {
            "prompt": "p " * 40, "max_tokens": 3, "kv_transfer_params": params},
            {"X-Request-Id": "nixl-1"})
        self.assertEqual(status, 200, body)
        # ...and rejects them with a key missing.
        for key in ("remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host",
                    "remote_port"):
            trimmed = dict(params)
            del trimmed[key]
            status, body = decode.post_json("/v1/completions", {
                "prompt": "p", "max_tokens": 3, "kv_transfer_params": trimmed})
            self.assertEqual(status, 400, key)
            self.assertIn(key, body["message"])

    def test_moriio_prefill_and_decode(self):
        prefill_zmq = "host:127.0.10.1,handshake:6301,notify:61005"
        decode_zmq = "host:127.0.10.2,handshake:6302,notify:61006"
        node = self.start("--role", "prefill", "--connector", "moriio", "--transfer-mode", "READ",
                          "--dp-size", "2", "--handshake-port", "7001", "--notify-port", "7002")
        rid = moriio_request_id(prefill_zmq, decode_zmq)
        prefill_params = {"remote_dp_size": 1, "remote_tp_size": 1, "transfer_id": "tx-1",
                          "do_remote_decode": True, "do_remote_prefill": False,
                          "remote_engine_id": None, "remote_block_ids": None}
        status, body = node.post_json("/v1/completions", {
            "prompt": "a b c", "max_tokens": 1, "kv_transfer_params": prefill_params},
            {"X-Request-Id": rid, "X-data-parallel-rank": "1"})
        self.assertEqual(status, 200, body)
        params = body["kv_transfer_params"]
        self.assertEqual(params["remote_engine_id"], "127.0.0.1:7001")
        self.assertEqual(params["remote_handshake_port"], 7001)
        self.assertEqual(params["remote_notify_port"], 7002)
        self.assertEqual(params["remote_dp_size"], 2)
        self.assertEqual(params["transfer_id"], "tx-1")
        for key in ("do_remote_prefill", "do_remote_decode", "remote_block_ids", "remote_host",
                    "tp_size"):
            self.assertIn(key, params)
        # transfer_id is required; an id without addresses is refused unless remote_* are given.
        no_tx = {k: v for k, v in prefill_params.items() if k != "transfer_id"}
        status, body = node.post_json("/v1/completions", {
            "prompt": "a", "max_tokens": 1, "kv_transfer_params": no_tx}, {"X-Request-Id": rid})
        self.assertEqual(status, 400)
        status, _ = node.post_json("/v1/completions", {
            "prompt": "a", "max_tokens": 1, "kv_transfer_params": prefill_params},
            {"X-Request-Id": "plain-id"})
        self.assertEqual(status, 400)
        explicit = dict(prefill_params, remote_host="127.0.10.2", remote_handshake_port=6302,
                        remote_notify_port=61006)
        status, _ = node.post_json("/v1/completions", {
            "prompt": "a", "max_tokens": 1, "kv_transfer_params": explicit},
            {"X-Request-Id": "plain-id"})
        self.assertEqual(status, 200)

        decode = self.start("--role", "decode", "--connector", "moriio", "--transfer-mode", "READ")
        decode_params = {"do_remote_decode": False, "do_remote_prefill": True,
                         "remote_engine_id": params["remote_engine_id"],
                         "remote_block_ids": params["remote_block_ids"], "transfer_id": "tx-1",
                         "remote_dp_size": 2, "remote_tp_size": 1, "remote_dp_rank": 1}
        status, body = decode.post_json("/v1/completions", {
            "prompt": "a b c", "max_tokens": 4, "kv_transfer_params": decode_params},
            {"X-Request-Id": rid})
        self.assertEqual(status, 200, body)
        missing = dict(decode_params, remote_block_ids=None)
        status, body = decode.post_json("/v1/completions", {
            "prompt": "a b c", "max_tokens": 4, "kv_transfer_params": missing},
            {"X-Request-Id": rid})
        self.assertEqual(status, 400)

    def test_mooncake_prefill_returns_no_params_and_serves_bootstrap(self):
        node = self.start("--role", "prefill", "--connector", "mooncake", "--dp-size", "2",
                          "--bootstrap-port", "0")
        status, body = node.post_json("/v1/completions", {
            "prompt": "a b", "max_tokens": 1,
            "kv_transfer_params": {"do_remote_decode": True, "do_remote_prefill": False,
                                   "transfer_id": "xfer-1"}}, {"X-data-parallel-rank": "1"})
        self.assertEqual(status, 200, body)
        self.assertIsNone(body["kv_transfer_params"])
        for port in (node.port, node.bootstrap_port):
            status, raw, _ = node.request("GET", "/query", port=port)
            self.assertEqual(status, 200)
            table = json.loads(raw)
            self.assertEqual(sorted(table), ["0", "1"])
            self.assertTrue(table["1"]["engine_id"])
            self.assertTrue(table["0"]["worker_addr"]["0"]["0"].startswith("tcp://127.0.0.1:"))

        decode = self.start("--role", "decode", "--connector", "mooncake")
        good = {"do_remote_decode": False, "do_remote_prefill": True,
                "remote_bootstrap_addr": "http://127.0.0.1:%d" % node.bootstrap_port,
                "remote_engine_id": table["0"]["engine_id"], "transfer_id": "xfer-1"}
        status, body = decode.post_json("/v1/completions", {
            "prompt": "a b", "max_tokens": 2, "kv_transfer_params": good})
        self.assertEqual(status, 200, body)
        for key in ("remote_engine_id", "remote_bootstrap_addr", "transfer_id"):
            bad = {k: v for k, v in good.items() if k != key}
            status, body = decode.post_json("/v1/completions", {
                "prompt": "a b", "max_tokens": 2, "kv_transfer_params": bad})
            self.assertEqual(status, 400, key)

    def test_p2p_nccl_needs_addresses_in_request_id(self):
        node = self.start("--role", "decode", "--connector", "p2p-nccl")
        status, _ = node.post_json("/v1/completions", {"prompt": "a", "max_tokens": 2},
                                   {"X-Request-Id": "no-addresses"})
        self.assertEqual(status, 400)
        rid = "___prefill_addr_10.0.0.1:21001___decode_addr_10.0.0.2:21002_" + uuid.uuid4().hex
        status, _ = node.post_json("/v1/completions", {"prompt": "a", "max_tokens": 2},
                                   {"X-Request-Id": rid})
        self.assertEqual(status, 200)


class AbortTest(SimTestBase):
    def test_client_close_mid_stream_aborts(self):
        node = self.start("--decode-us-per-token", "50000")
        sock = socket.create_connection(("127.0.0.1", node.port), timeout=5)
        body = json.dumps({"prompt": "a b", "max_tokens": 200, "stream": True}).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"X-Request-Id: abort-me\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        received = b""
        while b"data: " not in received:
            chunk = sock.recv(4096)
            self.assertTrue(chunk, "stream ended early")
            received += chunk
        sock.close()
        deadline = time.monotonic() + 5
        while True:
            log = node.sim_requests()
            entry = [r for r in log["requests"] if r["headers"].get("x-request-id") == "abort-me"]
            if entry and entry[0]["aborted"] and log["counters"]["aborts"] == 1:
                break
            self.assertLess(time.monotonic(), deadline, "abort not recorded: %s" % log)
            time.sleep(0.02)
        # The node stays healthy and serves the next request.
        status, _ = node.post_json("/v1/completions", {"prompt": "a", "max_tokens": 1})
        self.assertEqual(status, 200)
        self.assertEqual(node.sim_requests()["counters"]["aborts"], 1)


class FaultTest(SimTestBase):
    """POST /sim/faults (node/sim/server.h): each fault kind, as a router under test meets it."""

    def setUp(self):
        self.node = self.start("--role", "decode", "--connector", "nixl",
                               "--decode-us-per-token", "2000")

    def completion(self, **fields):
        body = {"prompt": "a b", "max_tokens": 4}
        body.update(fields)
        return body

    def entry(self, log, request_id):
        found = [r for r in log["requests"] if r["headers"].get("x-request-id") == request_id]
        return found[0] if found else None

    def test_status(self):
        self.assertEqual(self.node.set_fault(status=503), [{"status": 503, "count": 1}])
        status, body = self.node.post_json("/v1/completions", self.completion(),
                                           {"X-Request-Id": "f-503"})
        self.assertEqual(status, 503)
        # The same vLLM error body the sim uses for its own refusals.
        self.assertEqual(body["object"], "error")
        self.assertEqual(body["type"], "InternalServerError")
        self.assertEqual(body["code"], 503)
        self.assertIn("injected", body["message"])
        status, _ = self.node.post_json("/v1/completions", self.completion(),
                                        {"X-Request-Id": "f-ok"})
        self.assertEqual(status, 200)
        log = self.node.sim_requests()
        self.assertEqual(self.entry(log, "f-503")["fault"], {"status": 503})
        self.assertEqual(self.entry(log, "f-503")["status"], 503)
        self.assertIsNone(self.entry(log, "f-ok")["fault"])
        self.assertEqual(log["counters"]["faults_applied"], 1)
        status, raw, _ = self.node.request("GET", "/sim/faults")
        self.assertEqual((status, json.loads(raw)), (200, {"faults": []}))

    def test_status_on_a_stream_request(self):
        self.node.set_fault(status=500)
        with stream_post("127.0.0.1", self.node.port, "/v1/chat/completions",
                         {"messages": [{"role": "user", "content": "x"}], "stream": True},
                         timeout=5) as stream:
            self.assertEqual(stream.status, 500)
            self.assertEqual(json.loads(stream.body())["code"], 500)

    def test_hang_until_the_client_closes_is_an_abort(self):
        self.node.set_fault(hang=True)
        sock = socket.create_connection(("127.0.0.1", self.node.port), timeout=5)
        self.addCleanup(sock.close)
        body = json.dumps(self.completion(max_tokens=1)).encode()
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nX-Request-Id: f-hang\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
        self.node.wait_for_requests(lambda log: self.entry(log, "f-hang") is not None)
        sock.settimeout(0.3)  # far longer than the 2 ms the request would take unfaulted
        with self.assertRaises(socket.timeout):
            sock.recv(1)
        sock.close()
        log = self.node.wait_for_requests(
            lambda log: self.entry(log, "f-hang")["aborted"] and log["counters"]["aborts"] == 1)
        self.assertEqual(self.entry(log, "f-hang")["fault"], {"hang": True})
        self.assertEqual(self.entry(log, "f-hang")["status"], 0)
        status, _ = self.node.post_json("/v1/completions", self.completion())
        self.assertEqual(status, 200)

    def test_close_after_tokens_truncates_the_stream(self):
        self.node.set_fault(close_after_tokens=3)
        events = []
        with stream_post("127.0.0.1", self.node.port, "/v1/completions",
                         self.completion(max_tokens=10, stream=True),
                         {"X-Request-Id": "f-cut"}, timeout=5) as stream:
            self.assertEqual(stream.status, 200)
            with self.assertRaises(http.client.IncompleteRead):
                for event in stream:
                    events.append(event)
        self.assertEqual(len(events), 3, events)
        self.assertNotIn("[DONE]", events)
        self.assertTrue(all(json.loads(e)["choices"][0]["finish_reason"] is None for e in events))
        log = self.node.sim_requests()
        self.assertEqual(self.entry(log, "f-cut")["fault"], {"close_after_tokens": 3})
        self.assertFalse(self.entry(log, "f-cut")["aborted"])

    def test_close_after_tokens_on_a_non_stream_request_closes_unanswered(self):
        self.node.set_fault(close_after_tokens=2)
        started = time.monotonic()
        with self.assertRaises(http.client.RemoteDisconnected):
            self.node.post_json("/v1/completions", self.completion(max_tokens=10),
                                {"X-Request-Id": "f-cut-ns"})
        # Closed when the answer was due: 10 tokens x 2 ms after the first.
        self.assertGreaterEqual(time.monotonic() - started, 0.015)
        log = self.node.sim_requests()
        self.assertEqual(self.entry(log, "f-cut-ns")["status"], 0)
        self.assertEqual(log["counters"]["aborts"], 0)

    def test_close_immediately(self):
        self.node.set_fault(close_immediately=True, count=2)
        with self.assertRaises(http.client.RemoteDisconnected):
            self.node.post_json("/v1/completions", self.completion(), {"X-Request-Id": "f-close"})
        with self.assertRaises((http.client.RemoteDisconnected, http.client.IncompleteRead)):
            with stream_post("127.0.0.1", self.node.port, "/v1/completions",
                             self.completion(stream=True), timeout=5) as stream:
                list(stream)
        log = self.node.sim_requests()
        entry = self.entry(log, "f-close")
        self.assertEqual(entry["fault"], {"close_immediately": True})
        self.assertEqual(entry["status"], 0)
        self.assertFalse(entry["aborted"])
        self.assertEqual(log["counters"]["faults_applied"], 2)
        status, _ = self.node.post_json("/v1/completions", self.completion())
        self.assertEqual(status, 200)

    def test_delay_before_the_first_byte(self):
        self.node.set_fault(delay_ms=300)
        started = time.monotonic()
        with stream_post("127.0.0.1", self.node.port, "/v1/completions",
                         self.completion(stream=True), timeout=5) as stream:
            head_at = time.monotonic() - started
            events = list(stream)
        self.assertGreaterEqual(head_at, 0.29)
        self.assertEqual(events[-1], "[DONE]")
        # Combined with a status; the wait happens first.
        self.node.set_fault(delay_ms=200, status=502)
        started = time.monotonic()
        status, _ = self.node.post_json("/v1/completions", self.completion(),
                                        {"X-Request-Id": "f-delay"})
        self.assertEqual(status, 502)
        self.assertGreaterEqual(time.monotonic() - started, 0.19)
        entry = self.entry(self.node.sim_requests(), "f-delay")
        self.assertEqual(entry["fault"], {"delay_ms": 200, "status": 502})

    def test_client_close_during_a_delay_is_an_abort(self):
        self.node.set_fault(delay_ms=5000)
        conn = http.client.HTTPConnection("127.0.0.1", self.node.port, timeout=5)
        conn.request("POST", "/v1/completions", json.dumps(self.completion()),
                     {"Content-Type": "application/json", "X-Request-Id": "f-delay-abort"})
        self.node.wait_for_requests(lambda log: self.entry(log, "f-delay-abort") is not None)
        conn.close()
        self.node.wait_for_requests(lambda log: self.entry(log, "f-delay-abort")["aborted"])

    def test_count(self):
        self.node.set_fault(status=500, count=2)
        statuses = [self.node.post_json("/v1/completions", self.completion())[0] for _ in range(3)]
        self.assertEqual(statuses, [500, 500, 200])
        self.node.set_fault(status=429, count=-1)
        statuses = [self.node.post_json("/v1/completions", self.completion())[0] for _ in range(4)]
        self.assertEqual(statuses, [429] * 4)
        self.node.clear_faults()
        self.assertEqual(self.node.post_json("/v1/completions", self.completion())[0], 200)
        self.assertEqual(self.node.sim_requests()["counters"]["faults_applied"], 6)

    def test_faults_queue_in_order(self):
        self.node.set_fault(status=501)
        queue = self.node.set_fault(status=502)
        self.assertEqual([f["status"] for f in queue], [501, 502])
        statuses = [self.node.post_json("/v1/completions", self.completion())[0] for _ in range(3)]
        self.assertEqual(statuses, [501, 502, 200])

    def test_path_filter(self):
        self.node.set_fault(status=500, path="/v1/chat/completions")
        self.assertEqual(self.node.post_json("/v1/completions", self.completion())[0], 200)
        status, _ = self.node.post_json("/v1/chat/completions",
                                        {"messages": [{"role": "user", "content": "x"}]})
        self.assertEqual(status, 500)
        # Health checks are not faulted by default, but can be.
        self.assertEqual(self.node.request("GET", "/health")[0], 200)
        self.node.set_fault(status=503, path="/health")
        self.assertEqual(self.node.request("GET", "/health")[0], 503)
        self.assertEqual(self.node.request("GET", "/health")[0], 200)

    def test_bad_fault_bodies_are_refused(self):
        for body, needle in ((b"{oops", "not valid JSON"),
                             ([], "JSON object"),
                             ({"status": 500, "colour": "red"}, "unknown key 'colour'"),
                             ({"status": "500"}, "status must be an integer"),
                             ({"status": 200}, "400..599"),
                             ({"hang": "yes"}, "hang must be a boolean"),
                             ({"close_after_tokens": -1}, "close_after_tokens must be in"),
                             ({"status": 500, "count": 0}, "count must be"),
                             ({"status": 500, "path": "/sim/requests"}, "path must not"),
                             ({"status": 500, "hang": True}, "mutually exclusive"),
                             ({"count": 3}, "needs one of")):
            status, raw, _ = self.node.request("POST", "/sim/faults", body)
            self.assertEqual(status, 400, body)
            error = json.loads(raw)
            self.assertEqual(error["object"], "error")
            self.assertEqual(error["code"], 400)
            self.assertIn(needle, error["message"], body)
        status, raw, _ = self.node.request("GET", "/sim/faults")
        self.assertEqual(json.loads(raw), {"faults": []})
        self.assertEqual(self.node.post_json("/v1/completions", self.completion())[0], 200)

    def test_stream_post_yields_events_as_they_arrive(self):
        node = self.start("--decode-us-per-token", "50000")
        started = time.monotonic()
        with stream_post("127.0.0.1", node.port, "/v1/completions",
                         {"prompt": "a", "max_tokens": 10, "stream": True}, timeout=5) as stream:
            events = iter(stream)
            first = json.loads(next(events))
            first_at = time.monotonic() - started
            rest = list(events)
        total = time.monotonic() - started
        self.assertEqual(first["choices"][0]["finish_reason"], None)
        self.assertEqual(rest[-1], "[DONE]")
        self.assertLess(first_at, total - 0.3)  # 9 more tokens at 50 ms each came after it


class RegistrationTest(SimTestBase):
    def test_moriio_self_registration(self):
        router = FakeRouter()
        self.addCleanup(router.close)
        node = self.start("--role", "prefill", "--connector", "moriio", "--transfer-mode", "WRITE",
                          "--dp-size", "2", "--tp-size", "4", "--handshake-port", "6401",
                          "--notify-port", "61105", "--register", router.endpoint)
        message = router.receive_until(lambda m: m.get("type") == "P", timeout=5)
        self.assertIsNotNone(message, "no registration arrived")
        self.assertEqual(message, {
            "type": "P", "http_address": "127.0.0.1:%d" % node.port,
            "zmq_address": "host:127.0.0.1,handshake:6401,notify:61105",
            "dp_size": 2, "tp_size": 4, "transfer_mode": "WRITE"})

    def test_nixl_registers_in_pdrouter_format(self):
        router = FakeRouter()
        self.addCleanup(router.close)
        node = self.start("--role", "decode", "--connector", "nixl", "--register", router.endpoint)
        message = router.receive_until(lambda m: m.get("type") == "D", timeout=5)
        self.assertIsNotNone(message, "no registration arrived")
        self.assertEqual(message["http_address"], "127.0.0.1:%d" % node.port)
        self.assertEqual(message["connector"], "nixl")
        self.assertEqual(message["model"], "sim-model")
        self.assertIn("pdr_v", message)

    def test_p2p_nccl_registers_in_its_format(self):
        router = FakeRouter()
        self.addCleanup(router.close)
        node = self.start("--role", "prefill", "--connector", "p2p-nccl", "--kv-port", "21005",
                          "--register", router.endpoint)
        message = router.receive_until(lambda m: m.get("type") == "P", timeout=5)
        self.assertEqual(message, {"type": "P", "http_address": "127.0.0.1:%d" % node.port,
                                   "zmq_address": "127.0.0.1:21005"})


if __name__ == "__main__":
    unittest.main()
