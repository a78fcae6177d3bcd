"""POST /v1/responses through pdrouter's P/D pipeline, end to end with real `pdnode sim` nodes.

vLLM accepts kv_transfer_params on the Responses API since vllm-project/vllm#37424 (request field,
answered at the top level of the response object), so pdrouter splits a Responses request like a
chat completion (proto/responses_legs.h): the prefill leg gets max_output_tokens 1 (not max_tokens,
which vLLM's ResponsesRequest ignores), stream false, store false, no background; the decode leg
gets the client's body plus the prefill's kv_transfer_params (NIXL). The legs are read from the
sims' request logs. The sim's own shapes (vLLM's response object and its named SSE events) are
checked directly on one sim.
"""
import http.client
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402
from pdrouter_fixture import TIME_SCALE  # noqa: E402
from sim_fixture import SimNode  # noqa: E402

MODEL = "sim-model"
TIMEOUT_S = 15 * TIME_SCALE


def responses_body(**extra):
    body = {"model": MODEL, "input": [{"role": "user", "content": "Tell me about the sea please"}],
            "max_output_tokens": 4}
    body.update(extra)
    return body


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


def raw_stream(host, port, path, body, timeout):
    """The whole answer of a streaming POST: (status, content type, body bytes)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("POST", path, body=json.dumps(body),
                     headers={"Content-Type": "application/json", "Accept": "text/event-stream"})
        response = conn.getresponse()
        return response.status, response.getheader("Content-Type"), response.read()
    finally:
        conn.close()


def entries(node, path="/v1/responses"):
    return [r for r in node.sim_requests()["requests"] if r["method"] == "POST" and r["path"] == path]


class SimResponsesShapes(unittest.TestCase):
    """The simulator alone answers the Responses API in vLLM's shapes."""

    @classmethod
    def setUpClass(cls):
        cls.sim = SimNode("--role", "decode", "--connector", "nixl", "--decode-us-per-token", "0")

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()

    def test_non_stream_object(self):
        status, body = self.sim.post_json("/v1/responses", responses_body(), headers={"X-Request-Id": "abc"})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["object"], "response")
        self.assertEqual(body["id"], "resp_abc")
        self.assertEqual(body["status"], "incomplete")  # ended by max_output_tokens
        self.assertEqual(body["usage"]["output_tokens"], 4)
        self.assertEqual(body["usage"]["input_tokens"], 6)
        self.assertEqual(body["output"][0]["type"], "message")
        self.assertEqual(body["output"][0]["content"][0]["type"], "output_text")
        self.assertIn("kv_transfer_params", body)
        # A string input and max_tokens (an extra field vLLM ignores: the default cap applies).
        status, body = self.sim.post_json("/v1/responses", {"model": MODEL, "input": "hi", "max_tokens": 1})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["usage"]["output_tokens"], 16)
        status, body = self.sim.post_json("/v1/responses", {"model": MODEL})
        self.assertEqual(status, 400, body)
        status, body = self.sim.post_json("/v1/responses", responses_body(max_output_tokens="3"))
        self.assertEqual(status, 400, body)

    def test_stream_events(self):
        host, port = self.sim.http_address.rsplit(":", 1)
        status, ctype, raw = raw_stream(host, int(port), "/v1/responses", responses_body(stream=True), TIMEOUT_S)
        self.assertEqual(status, 200, raw)
        self.assertTrue(ctype.startswith("text/event-stream"), ctype)
        events = named_events(raw)
        names = [name for name, _ in events]
        self.assertEqual(names[:4], ["response.created", "response.in_progress", "response.output_item.added",
                                     "response.content_part.added"])
        self.assertEqual(names[4:8], ["response.output_text.delta"] * 4)
        self.assertEqual(names[8:], ["response.output_text.done", "response.content_part.done",
                                     "response.output_item.done", "response.completed"])
        for name, data in events:
            self.assertEqual(data["type"], name)
        self.assertEqual([data["sequence_number"] for _, data in events], list(range(len(events))))
        text = "".join(data["delta"] for name, data in events if name == "response.output_text.delta")
        self.assertEqual(events[-1][1]["response"]["output"][0]["content"][0]["text"], text)
        self.assertNotIn(b"[DONE]", raw)


class ResponsesThroughPd(unittest.TestCase):
    """NIXL: serial legs, the decode completed from the prefill's answer."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("nixl", prefills=1, decodes=1)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def setUp(self):
        for node in self.cluster.prefills + self.cluster.decodes:
            node.reset()

    def legs(self):
        (prefill,) = entries(self.cluster.prefills[0])
        (decode,) = entries(self.cluster.decodes[0])
        return prefill, decode

    def check_legs(self, client_body):
        prefill, decode = self.legs()
        self.assertEqual(prefill["headers"]["x-request-id"], decode["headers"]["x-request-id"])
        p = json.loads(prefill["body"])
        self.assertEqual(p["max_output_tokens"], 1)
        self.assertNotIn("max_tokens", p)
        self.assertIs(p["stream"], False)
        self.assertIs(p["store"], False)
        self.assertNotIn("background", p)
        self.assertIs(p["kv_transfer_params"]["do_remote_decode"], True)
        self.assertEqual(p["input"], client_body["input"])
        d = json.loads(decode["body"])
        self.assertEqual(d["max_output_tokens"], client_body["max_output_tokens"])
        self.assertEqual(d.get("stream", False), client_body.get("stream", False))
        # The decode carries what the prefill answered (vLLM#37424's top-level kv_transfer_params).
        self.assertIs(d["kv_transfer_params"]["do_remote_prefill"], True)
        self.assertTrue(d["kv_transfer_params"]["remote_block_ids"])
        self.assertEqual(prefill["status"], 200)
        self.assertEqual(decode["status"], 200)

    def test_non_stream(self):
        body = responses_body(background=True, store=True)
        status, headers, raw = self.cluster.post("/v1/responses", body, timeout=TIMEOUT_S)
        self.assertEqual(status, 200, raw)
        answer = json.loads(raw)
        self.assertEqual(answer["object"], "response")
        self.assertEqual(answer["usage"]["output_tokens"], 4)
        self.check_legs(body)
        self.assertGreater(self.cluster.metric('pdrouter_requests_total{outcome="done"}'), 0)

    def test_stream(self):
        body = responses_body(stream=True)
        host, port = self.cluster._host_port()
        status, ctype, raw = raw_stream(host, port, "/v1/responses", body, TIMEOUT_S)
        self.assertEqual(status, 200, raw)
        self.assertTrue(ctype.startswith("text/event-stream"), ctype)
        names = [name for name, _ in named_events(raw)]
        self.assertEqual(names[0], "response.created")
        self.assertEqual(names[-1], "response.completed")
        self.assertEqual(names.count("response.output_text.delta"), 4)
        self.check_legs(body)

    def test_bad_max_output_tokens_is_the_routers_400(self):
        status, _, raw = self.cluster.post("/v1/responses", responses_body(max_output_tokens=2.5))
        self.assertEqual(status, 400, raw)
        self.assertIn("max_output_tokens", json.loads(raw)["error"]["message"])
        self.assertEqual(entries(self.cluster.prefills[0]), [])

    def test_get_is_405(self):
        status, headers, _ = self.cluster.get("/v1/responses")
        self.assertEqual(status, 405)
        self.assertEqual(headers["allow"], "POST")


class ResponsesMidStreamFailure(unittest.TestCase):
    """A Responses stream whose decode dies after the client's stream began."""

    def setUp(self):
        # Tokens 100 ms apart: the events before the cut reach pdrouter before the sim closes
        # (a cut in the same loop turn as the first events would drop them with the connection).
        self.cluster = PdCluster("nixl", prefills=1, decodes=1,
                                 decode_flags=("--decode-us-per-token", "100000"))
        self.addCleanup(self.cluster.close)

    def test_decode_dying_mid_stream_ends_the_responses_way(self):
        # The decode is cut after two tokens: the client's stream had begun, so pdrouter ends it
        # with the Responses API's error and response.failed events (proto/responses_stream.h),
        # numbered after the relayed ones, and no [DONE] (vLLM's Responses stream has none).
        errors_before = self.cluster.metric("pdrouter_stream_errors_total")
        self.cluster.decodes[0].set_fault(path="/v1/responses", close_after_tokens=2)
        host, port = self.cluster._host_port()
        status, ctype, raw = raw_stream(host, port, "/v1/responses", responses_body(stream=True, max_output_tokens=8),
                                        TIMEOUT_S)
        self.assertEqual(status, 200, raw)
        self.assertTrue(ctype.startswith("text/event-stream"), ctype)
        self.assertNotIn(b"[DONE]", raw)
        events = named_events(raw)
        names = [name for name, _ in events]
        self.assertEqual(names[0], "response.created")
        self.assertEqual(names.count("response.output_text.delta"), 2)
        self.assertEqual(names[-2:], ["error", "response.failed"], names)
        self.assertNotIn("response.completed", names)
        for name, data in events:
            self.assertEqual(data["type"], name)
        self.assertEqual([data["sequence_number"] for _, data in events], list(range(len(events))))
        error = events[-2][1]
        self.assertEqual(error["code"], "decode_failed")
        self.assertIn("decode", error["message"])
        self.assertIn("param", error)
        failed = events[-1][1]["response"]
        self.assertEqual(failed["id"], events[0][1]["response"]["id"])
        self.assertEqual(failed["object"], "response")
        self.assertEqual(failed["status"], "failed")
        self.assertEqual(failed["error"]["code"], "server_error")
        self.assertEqual(failed["error"]["message"], error["message"])
        self.cluster.router.wait_for(
            lambda: self.cluster.metric("pdrouter_stream_errors_total") == errors_before + 1, timeout=5 * TIME_SCALE)


if __name__ == "__main__":
    unittest.main()
