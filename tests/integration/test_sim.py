"""`pdnode sim`: the simulated vLLM node, driven over loopback HTTP like a real vLLM peer
(shared/PROTOCOLS.md §1.4, §3, §4, §5, §6)."""
import http.client
import json
import re
import socket
import time
import unittest
import uuid

from pdr_testlib import FakeRouter, ProcessHandle, pdnode_path

START_TIMEOUT_S = 10.0


class SimNode:
    """A running `pdnode sim` and an HTTP client for it."""

    def __init__(self, *flags):
        self.proc = ProcessHandle([pdnode_path(), "sim", "--http", "127.0.0.1:0", *flags],
                                  name="pdnode-sim")
        line = self.proc.wait_for_line(r"pdnode sim listening http=", START_TIMEOUT_S,
                                       streams=("stdout",))
        if line is None:
            self.proc.stop()
            raise AssertionError("pdnode sim did not start:\n" + self.proc.output())
        self.port = int(re.search(r"http=127\.0\.0\.1:(\d+)", line).group(1))
        match = re.search(r"bootstrap=127\.0\.0\.1:(\d+)", line)
        self.bootstrap_port = int(match.group(1)) if match else None

    def request(self, method, path, body=None, headers=None, port=None):
        conn = http.client.HTTPConnection("127.0.0.1", port or self.port, timeout=10)
        try:
            data = None if body is None else (body if isinstance(body, (bytes, str))
                                              else json.dumps(body))
            all_headers = {"Content-Type": "application/json"}
            all_headers.update(headers or {})
            conn.request(method, path, body=data, headers=all_headers)
            response = conn.getresponse()
            return response.status, response.read(), response.getheader("Content-Type")
        finally:
            conn.close()

    def post_json(self, path, body, headers=None):
        status, raw, _ = self.request("POST", path, body, headers)
        return status, json.loads(raw)

    def sim_requests(self):
        status, raw, _ = self.request("GET", "/sim/requests")
        assert status == 200
        return json.loads(raw)

    def stop(self):
        return self.proc.stop()


def sse_events(raw):
    """The `data:` payloads of an SSE body, in order."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-40:]
    events = []
    for block in text.split("\n\n"):
        if not block:
            continue
        assert block.startswith("data: "), block
        events.append(block[len("data: "):])
    return events


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
        prefill_zmq = "host:10.0.0.1,handshake:6301,notify:61005"
        decode_zmq = "host:10.0.0.2,handshake:6302,notify:61006"
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
        explicit = dict(prefill_params, remote_host="10.0.0.2", remote_handshake_port=6302,
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
