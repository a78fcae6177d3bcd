"""Anthropic's Messages API (POST /v1/messages, POST /v1/messages/count_tokens) through pdrouter,
end to end with real `pdnode sim` nodes of every connector dialect.

vLLM takes kv_transfer_params on /v1/messages since vllm-project/vllm#37535 (it serves a Messages
request as a chat completion and answers the engine's params at the top level of a non-streamed
message), so pdrouter splits it like chat (proto/anthropic_messages.h): the prefill gets the
dialect's edits (max_tokens 1, stream false, its kv_transfer_params), the decode the client's body
plus the dialect's params, and a stream is relayed as the named events vLLM writes. SGLang's
/v1/messages drops the bootstrap fields, so pdrouter refuses it there (501). count_tokens goes to
one node. pdrouter's own errors on these paths are Anthropic's shape
({"type":"error","error":{"type","message"}}), a stream that fails mid-way ends with an
`event: error`, and a client's x-api-key reaches the nodes as `Authorization: Bearer` (vLLM's
--api-key check reads only that). Legs are read from the sims' request logs.
"""
import http.client
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402
from pdrouter_fixture import Router, TIME_SCALE  # noqa: E402
from sim_fixture import SimNode  # noqa: E402

MODEL = "sim-model"
TIMEOUT_S = 15 * TIME_SCALE
API_KEY = "sk-ant-test-4b1d"
ANTHROPIC_HEADERS = {"x-api-key": API_KEY, "anthropic-version": "2023-06-01"}
STREAM_EVENTS_OPEN = ["message_start", "content_block_start", "ping"]
STREAM_EVENTS_CLOSE = ["content_block_stop", "message_delta", "message_stop"]
PROMPT_WORDS = 4 + 5  # the system prompt's words and the message's (the sim counts words)


def messages_body(**extra):
    body = {"model": MODEL, "max_tokens": 4, "system": "You answer very briefly",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "Tell me about the sea"}]}],
            "temperature": 0.5, "metadata": {"user_id": "u-1"}}
    body.update(extra)
    return {k: v for k, v in body.items() if v is not None}


def named_events(raw):
    """[(event name, data object)] of a complete SSE body of named events."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-80:]
    out = []
    for block in text.split("\n\n"):
        if not block:
            continue
        fields = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((fields.get("event"), json.loads(fields["data"])))
    return out


def raw_post(host, port, path, body, headers=None, timeout=TIMEOUT_S):
    """The whole answer of a POST: (status, headers with lower-case names, body bytes)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        all_headers = {"Content-Type": "application/json"}
        all_headers.update(headers or {})
        conn.request("POST", path, body=body if isinstance(body, (bytes, str)) else json.dumps(body),
                     headers=all_headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def entries(node, path="/v1/messages"):
    return [r for r in node.sim_requests()["requests"] if r["method"] == "POST" and r["path"] == path]


def anthropic_error(test, raw, error_type, status=None):
    """Checks `raw` is Anthropic's error shape of `error_type`; returns its message."""
    doc = json.loads(raw)
    test.assertEqual(set(doc), {"type", "error"}, doc)
    test.assertEqual(doc["type"], "error", doc)
    test.assertEqual(set(doc["error"]), {"type", "message"}, doc)
    test.assertEqual(doc["error"]["type"], error_type, doc)
    test.assertIsInstance(doc["error"]["message"], str)
    return doc["error"]["message"]


class SimMessagesShapes(unittest.TestCase):
    """The simulator alone answers the Messages API in vLLM's shapes."""

    @classmethod
    def setUpClass(cls):
        cls.sim = SimNode("--role", "decode", "--connector", "nixl", "--decode-us-per-token", "0")
        host, port = cls.sim.http_address.rsplit(":", 1)
        cls.host, cls.port = host, int(port)

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()

    def test_non_stream_message(self):
        status, body = self.sim.post_json("/v1/messages", messages_body(), headers={"X-Request-Id": "abc"})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["id"], "chatcmpl-abc")  # vLLM answers its chat completion's id
        self.assertEqual((body["type"], body["role"], body["model"]), ("message", "assistant", MODEL))
        self.assertEqual(body["stop_reason"], "max_tokens")
        self.assertEqual(body["usage"], {"input_tokens": PROMPT_WORDS, "output_tokens": 4})
        self.assertEqual(len(body["content"]), 1)
        self.assertEqual(body["content"][0]["type"], "text")
        self.assertEqual(len(body["content"][0]["text"].split()), 4)
        self.assertNotIn("kv_transfer_params", body)  # vLLM leaves a null one out

    def test_refusals_are_the_anthropic_shape(self):
        status, raw, _ = self.sim.request("POST", "/v1/messages", messages_body(max_tokens=None))
        self.assertEqual(status, 400, raw)
        anthropic_error(self, raw, "BadRequestError")  # vLLM's type names, Anthropic's shape
        status, raw, _ = self.sim.request("POST", "/v1/messages", messages_body(model="other"))
        self.assertEqual(status, 404, raw)
        anthropic_error(self, raw, "NotFoundError")
        status, raw, _ = self.sim.request("POST", "/v1/chat/completions", {"model": MODEL})
        self.assertEqual(status, 400, raw)
        self.assertEqual(json.loads(raw)["object"], "error")  # other paths keep OpenAI's

    def test_stream_events(self):
        status, head, raw = raw_post(self.host, self.port, "/v1/messages", messages_body(stream=True))
        self.assertEqual(status, 200, raw)
        self.assertTrue(head["content-type"].startswith("text/event-stream"), head)
        events = named_events(raw)
        names = [name for name, _ in events]
        self.assertEqual(names, STREAM_EVENTS_OPEN + ["content_block_delta"] * 4 + STREAM_EVENTS_CLOSE)
        for name, data in events:
            self.assertEqual(data["type"], name)
        self.assertEqual(events[0][1]["message"]["usage"], {"input_tokens": PROMPT_WORDS, "output_tokens": 0})
        self.assertEqual(events[-2][1]["delta"]["stop_reason"], "max_tokens")
        self.assertEqual(events[-2][1]["usage"]["output_tokens"], 4)
        self.assertNotIn(b"[DONE]", raw)
        self.assertNotIn(b"kv_transfer_params", raw)

    def test_count_tokens(self):
        body = {"model": MODEL, "system": "You answer very briefly", "messages": messages_body()["messages"]}
        status, answer = self.sim.post_json("/v1/messages/count_tokens", body)
        self.assertEqual(status, 200, answer)
        self.assertEqual(answer, {"input_tokens": PROMPT_WORDS,
                                  "context_management": {"original_input_tokens": PROMPT_WORDS}})
        status, raw, _ = self.sim.request("POST", "/v1/messages/count_tokens", {"model": MODEL})
        self.assertEqual(status, 400, raw)
        anthropic_error(self, raw, "BadRequestError")


class MessagesDialectCase:
    """Mixin: one cluster of CONNECTOR/MODE; a Messages request streamed and not."""
    CONNECTOR = None
    MODE = None
    CONCURRENT = False
    DECODE_DECREMENT = 0  # MoRIIO's decode asks for one token less (REQUEST_LEGS.md)
    PREFILL_STREAMS = False  # P2P-NCCL leaves the prefill's stream as the client sent it
    KV_PARAMS = True  # the legs carry the dialect's kv_transfer_params

    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster(cls.CONNECTOR, transfer_mode=cls.MODE)
        cls.p, cls.d = cls.cluster.prefills[0], cls.cluster.decodes[0]
        cls.host, cls.port = cls.cluster._host_port()

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def setUp(self):
        for node in (self.p, self.d):
            node.reset()

    def legs(self):
        """The prefill's and the decode's log entries once both were answered (or, concurrent,
        the prefill closed by pdrouter once the decode's answer was complete)."""
        def done(log):
            gen = [r for r in log["requests"] if r["path"] == "/v1/messages"]
            return len(gen) == 1 and (gen[0]["status"] != 0 or gen[0]["aborted"])
        p = [r for r in self.p.wait_for_requests(done, TIMEOUT_S)["requests"] if r["path"] == "/v1/messages"][0]
        d = [r for r in self.d.wait_for_requests(done, TIMEOUT_S)["requests"] if r["path"] == "/v1/messages"][0]
        return p, d

    def check_legs(self, body, request_id):
        p, d = self.legs()
        self.assertEqual(d["status"], 200, d)
        if not (self.CONCURRENT and p["aborted"]):
            self.assertEqual(p["status"], 200, p)
        pb, db = json.loads(p["body"]), json.loads(d["body"])
        for leg, doc in ((p, pb), (d, db)):
            self.assertEqual(leg["headers"]["x-request-id"], request_id)
            # The client's x-api-key as the Bearer token vLLM's --api-key reads.
            self.assertEqual(leg["headers"]["authorization"], "Bearer " + API_KEY)
            self.assertNotIn("x-api-key", leg["headers"])
            for key in ("model", "system", "messages", "temperature", "metadata"):
                self.assertEqual(doc[key], body[key], key)
        self.assertEqual(pb["max_tokens"], 1)
        self.assertEqual(pb.get("stream", False), body.get("stream", False) if self.PREFILL_STREAMS else False)
        self.assertEqual(db["max_tokens"], body["max_tokens"] - self.DECODE_DECREMENT)
        self.assertEqual(db.get("stream", False), body.get("stream", False))
        if self.KV_PARAMS:
            self.assertIsInstance(pb["kv_transfer_params"], dict)
            self.assertIs(pb["kv_transfer_params"]["do_remote_decode"], True)
            self.assertIsInstance(db["kv_transfer_params"], dict)
            self.assertIs(db["kv_transfer_params"]["do_remote_prefill"], True)
        else:
            self.assertNotIn("kv_transfer_params", pb)
            self.assertNotIn("kv_transfer_params", db)
        return db

    def test_non_stream(self):
        body = messages_body()
        status, head, raw = raw_post(self.host, self.port, "/v1/messages", body, ANTHROPIC_HEADERS)
        self.assertEqual(status, 200, raw)
        self.assertTrue(head["content-type"].startswith("application/json"), head)
        answer = json.loads(raw)
        self.assertEqual((answer["type"], answer["role"]), ("message", "assistant"))
        self.assertEqual(answer["content"][0]["type"], "text")
        want_tokens = body["max_tokens"] - self.DECODE_DECREMENT
        self.assertEqual(len(answer["content"][0]["text"].split()), want_tokens)
        self.assertEqual(answer["usage"]["output_tokens"], want_tokens)
        self.assertEqual(answer["stop_reason"], "max_tokens")
        self.assertIsNone(answer.get("kv_transfer_params"))  # node-internal: never the client's
        self.check_legs(body, head["x-request-id"])

    def test_stream(self):
        body = messages_body(stream=True, max_tokens=5)
        status, head, raw = raw_post(self.host, self.port, "/v1/messages", body, ANTHROPIC_HEADERS)
        self.assertEqual(status, 200, raw)
        self.assertTrue(head["content-type"].startswith("text/event-stream"), head)
        self.assertNotIn(b"[DONE]", raw)
        events = named_events(raw)
        names = [name for name, _ in events]
        want_tokens = body["max_tokens"] - self.DECODE_DECREMENT
        self.assertEqual(names, STREAM_EVENTS_OPEN + ["content_block_delta"] * want_tokens + STREAM_EVENTS_CLOSE)
        for name, data in events:
            self.assertEqual(data["type"], name)
        text = "".join(data["delta"]["text"] for name, data in events if name == "content_block_delta")
        self.assertEqual(len(text.split()), want_tokens)
        self.assertEqual(events[-2][1]["usage"]["output_tokens"], want_tokens)
        self.check_legs(body, head["x-request-id"])


class TestNixlMessages(MessagesDialectCase, unittest.TestCase):
    CONNECTOR = "nixl"

    def test_decode_takes_the_prefills_top_level_kv_transfer_params(self):
        self.test_non_stream()
        p, d = self.legs()
        self.assertTrue(json.loads(d["body"])["kv_transfer_params"]["remote_block_ids"])


class TestMoriioReadMessages(MessagesDialectCase, unittest.TestCase):
    CONNECTOR = "moriio"
    MODE = "READ"
    DECODE_DECREMENT = 1


class TestMoriioWriteMessages(MessagesDialectCase, unittest.TestCase):
    CONNECTOR = "moriio"
    MODE = "WRITE"
    CONCURRENT = True
    DECODE_DECREMENT = 1


class TestMooncakeMessages(MessagesDialectCase, unittest.TestCase):
    CONNECTOR = "mooncake"
    CONCURRENT = True


class TestP2pNcclMessages(MessagesDialectCase, unittest.TestCase):
    CONNECTOR = "p2p-nccl"
    PREFILL_STREAMS = True
    KV_PARAMS = False


class TestSglangMessages(unittest.TestCase):
    """SGLang's /v1/messages rebuilds the request from Anthropic's fields and drops the bootstrap
    fields that pair its prefill and decode: pdrouter answers 501 and sends nothing."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("sglang")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_501_in_anthropic_shape(self):
        before = self.cluster.metric('pdrouter_requests_refused_total{reason="no_pair"}')
        status, _, raw = self.cluster.post("/v1/messages", messages_body(), headers=ANTHROPIC_HEADERS)
        self.assertEqual(status, 501, raw)
        message = anthropic_error(self, raw, "api_error")
        self.assertIn("sglang", message)
        self.assertEqual(entries(self.cluster.prefills[0]), [])
        self.assertEqual(entries(self.cluster.decodes[0]), [])
        self.assertEqual(self.cluster.metric('pdrouter_requests_refused_total{reason="no_pair"}'), before + 1)
        # count_tokens needs no pair: one node answers it.
        status, _, raw = self.cluster.post("/v1/messages/count_tokens",
                                           {"model": MODEL, "messages": messages_body()["messages"]})
        self.assertEqual(status, 200, raw)
        self.assertEqual(json.loads(raw)["input_tokens"], 5)


class MessagesEdges(unittest.TestCase):
    """Refusals, count_tokens and failures before the stream, on a NIXL pair."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("nixl")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def setUp(self):
        for node in self.cluster.prefills + self.cluster.decodes:
            node.reset()

    def nodes(self):
        return self.cluster.prefills + self.cluster.decodes

    def test_bad_input_is_the_routers_400(self):
        cases = [
            (messages_body(max_tokens=None), "max_tokens is required"),
            (messages_body(max_tokens="8"), "max_tokens must be an integer"),
            (messages_body(max_tokens=2.5), "max_tokens must be an integer"),
            (messages_body(max_tokens=0), "max_tokens must be at least 1"),
            (messages_body(max_tokens=-3), "max_tokens must be at least 1"),
            (messages_body(stream="yes"), "stream must be a boolean"),
            (messages_body(stream=1), "stream must be a boolean"),
            (messages_body(messages={"role": "user"}), "messages must be an array"),
            (messages_body(messages=[]), "messages must hold at least one message"),
            (messages_body(messages=None), "messages is required"),
            (messages_body(model=None), "model is required"),
            (messages_body(model=""), "model must not be empty"),
        ]
        before = self.cluster.metric('pdrouter_requests_refused_total{reason="bad_parameter"}')
        for body, want in cases:
            status, _, raw = self.cluster.post("/v1/messages", body, headers=ANTHROPIC_HEADERS)
            self.assertEqual(status, 400, (body, raw))
            self.assertIn(want, anthropic_error(self, raw, "invalid_request_error"), body)
        status, _, raw = self.cluster.post("/v1/messages", b"{not json", headers=ANTHROPIC_HEADERS)
        self.assertEqual(status, 400, raw)
        anthropic_error(self, raw, "invalid_request_error")
        after = self.cluster.metric('pdrouter_requests_refused_total{reason="bad_parameter"}')
        self.assertEqual(after, before + len(cases))
        for node in self.nodes():  # nothing reached a node
            self.assertEqual(entries(node), [])

    def test_wrong_content_type_and_method(self):
        status, _, raw = self.cluster.post("/v1/messages", "x", headers={"Content-Type": "text/plain"})
        self.assertEqual(status, 415, raw)
        anthropic_error(self, raw, "invalid_request_error")
        status, headers, raw = self.cluster.get("/v1/messages")
        self.assertEqual(status, 405, raw)
        self.assertEqual(headers["allow"], "POST")
        anthropic_error(self, raw, "invalid_request_error")

    def test_count_tokens_goes_to_one_node(self):
        body = {"model": MODEL, "system": "You answer very briefly", "messages": messages_body()["messages"]}
        before = self.cluster.metric('pdrouter_one_node_requests_total{endpoint_class="any_node",outcome="relayed"}')
        status, _, raw = self.cluster.post("/v1/messages/count_tokens", body, headers=ANTHROPIC_HEADERS)
        self.assertEqual(status, 200, raw)
        self.assertEqual(json.loads(raw)["input_tokens"], PROMPT_WORDS)
        served = [e for node in self.nodes() for e in entries(node, "/v1/messages/count_tokens")]
        self.assertEqual(len(served), 1)
        self.assertEqual(served[0]["headers"]["authorization"], "Bearer " + API_KEY)
        self.assertEqual(json.loads(served[0]["body"]), body)
        after = self.cluster.metric('pdrouter_one_node_requests_total{endpoint_class="any_node",outcome="relayed"}')
        self.assertEqual(after, before + 1)
        # The node's own refusal is relayed as it is (vLLM answers Anthropic's shape there).
        status, _, raw = self.cluster.post("/v1/messages/count_tokens", {"model": MODEL})
        self.assertEqual(status, 400, raw)
        anthropic_error(self, raw, "BadRequestError")

    def test_count_tokens_node_failing_is_a_502_in_anthropic_shape(self):
        for node in self.nodes():  # whichever node is picked closes without answering
            node.set_fault(path="/v1/messages/count_tokens", close_immediately=True, count=-1)
        status, _, raw = self.cluster.post("/v1/messages/count_tokens",
                                           {"model": MODEL, "messages": messages_body()["messages"]})
        self.assertEqual(status, 502, raw)
        self.assertIn("instance", anthropic_error(self, raw, "api_error"))

    def test_client_authorization_wins_over_x_api_key(self):
        headers = dict(ANTHROPIC_HEADERS, Authorization="Bearer own-token")
        status, _, raw = self.cluster.post("/v1/messages", messages_body(), headers=headers)
        self.assertEqual(status, 200, raw)
        (p,) = entries(self.cluster.prefills[0])
        self.assertEqual(p["headers"]["authorization"], "Bearer own-token")
        # Neither header: no Authorization on the legs, and the request still works.
        for node in self.nodes():
            node.reset()
        status, _, raw = self.cluster.post("/v1/messages", messages_body())
        self.assertEqual(status, 200, raw)
        (p,) = entries(self.cluster.prefills[0])
        self.assertNotIn("authorization", p["headers"])

    def test_prefill_failing_is_a_502_in_anthropic_shape(self):
        self.cluster.prefills[0].set_fault(path="/v1/messages", status=500, count=10)
        status, _, raw = self.cluster.post("/v1/messages", messages_body(stream=True), headers=ANTHROPIC_HEADERS)
        self.assertEqual(status, 502, raw)
        self.assertIn("prefill", anthropic_error(self, raw, "api_error"))
        self.assertEqual(entries(self.cluster.decodes[0]), [])


class MessagesWithoutNodes(unittest.TestCase):
    def test_no_pair_is_503_overloaded(self):
        router = Router()

        def stop():
            code = router.stop()
            router.dir.cleanup()
            self.assertEqual(code, 0, router.log()[-3000:])
        self.addCleanup(stop)
        host, port = router.http.rsplit(":", 1)
        status, _, raw = raw_post(host, int(port), "/v1/messages", messages_body(), ANTHROPIC_HEADERS)
        self.assertEqual(status, 503, raw)
        self.assertIn("no prefill/decode pair", anthropic_error(self, raw, "overloaded_error"))
        status, _, raw = raw_post(host, int(port), "/v1/messages/count_tokens",
                                  {"model": MODEL, "messages": messages_body()["messages"]})
        self.assertEqual(status, 503, raw)
        anthropic_error(self, raw, "overloaded_error")
        # The OpenAI paths keep OpenAI's shape.
        status, _, raw = raw_post(host, int(port), "/v1/chat/completions",
                                  {"model": MODEL, "messages": messages_body()["messages"]})
        self.assertEqual(status, 503, raw)
        self.assertEqual(json.loads(raw)["error"]["code"], "no_pair")


class MessagesMidStreamFailure(unittest.TestCase):
    """A Messages stream whose decode dies after the client's stream began."""

    def setUp(self):
        # Tokens 100 ms apart: the events before the cut reach pdrouter before the sim closes.
        self.cluster = PdCluster("nixl", prefills=1, decodes=1,
                                 decode_flags=("--decode-us-per-token", "100000"))
        self.addCleanup(self.cluster.close)

    def test_decode_dying_mid_stream_ends_with_an_anthropic_error_event(self):
        errors_before = self.cluster.metric("pdrouter_stream_errors_total")
        self.cluster.decodes[0].set_fault(path="/v1/messages", close_after_tokens=2)
        host, port = self.cluster._host_port()
        status, head, raw = raw_post(host, port, "/v1/messages", messages_body(stream=True, max_tokens=8),
                                     ANTHROPIC_HEADERS)
        self.assertEqual(status, 200, raw)
        self.assertTrue(head["content-type"].startswith("text/event-stream"), head)
        self.assertNotIn(b"[DONE]", raw)
        self.assertNotIn(b'"code"', raw)  # no OpenAI-style error object
        events = named_events(raw)
        names = [name for name, _ in events]
        self.assertEqual(names, STREAM_EVENTS_OPEN + ["content_block_delta"] * 2 + ["error"])
        error = events[-1][1]
        self.assertEqual(set(error), {"type", "error"})
        self.assertEqual(error["type"], "error")
        self.assertEqual(error["error"]["type"], "api_error")  # pdrouter's 502 decode_failed
        self.assertIn("decode", error["error"]["message"])
        self.cluster.router.wait_for(
            lambda: self.cluster.metric("pdrouter_stream_errors_total") == errors_before + 1, timeout=5 * TIME_SCALE)


if __name__ == "__main__":
    unittest.main()
