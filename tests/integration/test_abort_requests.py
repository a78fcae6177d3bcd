"""A cancelled /inference/v1/generate request reaches vLLM's POST /abort_requests on the nodes
started with --tokens-only (labelled serves=tokens-only), for each of its legs still in flight, with
vLLM's engine id for it ("generate-tokens-" + the leg's X-Request-Id), as well as having its
connection closed: router/proxy/abort_requests.h.

  * serial NIXL, client gone mid-prefill: the prefill gets the abort, the decode (never sent) none;
  * serial NIXL, client gone mid-stream: the decode gets the abort; the prefill, whose leg had
    ended, none;
  * NIXL push (both legs at once), client gone mid-prefill: both get it;
  * nodes not labelled tokens-only get no /abort_requests (vLLM serves it only in that mode).

`pdnode sim --tokens-only` serves /abort_requests and ends the generate request the id names; its
GET /sim/requests log keeps each call with its body.
"""
import json
import socket
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

GENERATE = "/inference/v1/generate"
TOKENS_ONLY = ("--tokens-only", "--label", "serves=tokens-only")
WAIT_S = 10 * TIME_SCALE


def generate_body(stream=False, max_tokens=40):
    return {"model": "sim-model", "token_ids": list(range(1, 33)), "stream": stream,
            "sampling_params": {"max_tokens": max_tokens}}


def legs(log):
    return [r for r in log["requests"] if r["path"] == GENERATE]


def abort_calls(log):
    return [json.loads(r["body"]) for r in log["requests"] if r["path"] == "/abort_requests"]


class AbortTest(unittest.TestCase):
    def cluster(self, connector="nixl", prefill_flags=TOKENS_ONLY, decode_flags=TOKENS_ONLY, **kwargs):
        c = PdCluster(connector, prefill_flags=prefill_flags, decode_flags=decode_flags, **kwargs)
        self.addCleanup(c.close)
        return c

    def open_generate(self, c, body):
        host, port = c.router.http.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5)
        data = json.dumps(body).encode()
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (GENERATE.encode(), len(data), data))
        return sock

    def wait_abort_call(self, node):
        """The node's one /abort_requests call body once it came (and the leg it aborts)."""
        log = node.wait_for_requests(lambda log: abort_calls(log), WAIT_S)
        [call] = abort_calls(log)
        [leg] = legs(log)
        return call, leg

    def assert_aborts(self, call, leg):
        self.assertEqual(call, {"request_ids": ["generate-tokens-" + leg["headers"]["x-request-id"]]})

    def wait_cancelled(self, c):
        c.router.wait_for(lambda: c.metric('pdrouter_requests_total{outcome="cancelled"}') == 1)


class TestAbortRequests(AbortTest):
    def test_gone_mid_prefill_aborts_the_prefill_by_id(self):
        c = self.cluster()
        p, d = c.prefills[0], c.decodes[0]
        p.set_fault(hang=True, path=GENERATE)
        sock = self.open_generate(c, generate_body())
        p.wait_for_requests(lambda log: legs(log), WAIT_S)
        sock.close()
        call, leg = self.wait_abort_call(p)
        self.assert_aborts(call, leg)
        self.wait_cancelled(c)
        c.router.wait_for(lambda: c.metric('pdrouter_abort_requests_total{result="ok"}') == 1)
        log = d.sim_requests()
        self.assertEqual((legs(log), abort_calls(log)), ([], []))

    def test_gone_mid_stream_aborts_the_decode_by_id(self):
        c = self.cluster(decode_flags=TOKENS_ONLY + ("--decode-us-per-token", "100000"))
        p, d = c.prefills[0], c.decodes[0]
        stream = c.stream(GENERATE, generate_body(stream=True), timeout=WAIT_S)
        self.assertEqual(stream.status, 200)
        self.assertIn("choices", json.loads(next(iter(stream))))
        stream.close()
        call, leg = self.wait_abort_call(d)
        self.assert_aborts(call, leg)
        self.assertTrue(d.wait_for_requests(lambda log: legs(log)[0]["aborted"], WAIT_S))
        self.wait_cancelled(c)
        self.assertEqual(abort_calls(p.sim_requests()), [])  # its leg had ended

    def test_concurrent_legs_are_both_aborted_by_id(self):
        c = self.cluster(connector="nixl-push")
        p, d = c.prefills[0], c.decodes[0]
        p.set_fault(hang=True, path=GENERATE)
        sock = self.open_generate(c, generate_body())
        for node in (p, d):
            node.wait_for_requests(lambda log: legs(log), WAIT_S)
        sock.close()
        (pc, pl), (dc, dl) = self.wait_abort_call(p), self.wait_abort_call(d)
        self.assert_aborts(pc, pl)
        self.assert_aborts(dc, dl)
        self.assertEqual(pl["headers"]["x-request-id"], dl["headers"]["x-request-id"])
        self.wait_cancelled(c)

    def test_nodes_not_in_tokens_only_mode_get_none(self):
        c = self.cluster(prefill_flags=(), decode_flags=())
        p = c.prefills[0]
        p.set_fault(hang=True, path=GENERATE)
        sock = self.open_generate(c, generate_body())
        p.wait_for_requests(lambda log: legs(log), WAIT_S)
        sock.close()
        p.wait_for_requests(lambda log: log["counters"]["aborts"] >= 1, WAIT_S)
        self.wait_cancelled(c)
        for node in (p, c.decodes[0]):
            self.assertEqual(abort_calls(node.sim_requests()), [])
        self.assertEqual(c.metric('pdrouter_abort_requests_total{result="ok"}'), 0)


class TestSimAbortRequests(unittest.TestCase):
    """The sim's /abort_requests ends the generate request it names."""

    def test_abort_ends_the_named_request(self):
        c = PdCluster("nixl", prefills=1, decodes=1, decode_flags=TOKENS_ONLY + ("--decode-us-per-token", "200000"))
        self.addCleanup(c.close)
        d = c.decodes[0]
        host, port = d.http_address.rsplit(":", 1)
        from sim_fixture import stream_post
        stream = stream_post(host, int(port), GENERATE, generate_body(stream=True),
                             {"X-Request-Id": "rid-1"}, WAIT_S)
        self.assertEqual(stream.status, 200)
        status, raw, _ = d.request("POST", "/abort_requests", {"request_ids": ["generate-tokens-rid-1"]})
        self.assertEqual(status, 200, raw)
        log = d.wait_for_requests(lambda log: legs(log) and legs(log)[0]["aborted"], WAIT_S)
        self.assertEqual(abort_calls(log), [{"request_ids": ["generate-tokens-rid-1"]}])
        stream.close()
        status, raw, _ = d.request("POST", "/abort_requests", {"ids": []})
        self.assertEqual(status, 400, raw)
        status, _, _ = c.prefills[0].request("POST", "/abort_requests", {"request_ids": []})
        self.assertEqual(status, 404)  # not --tokens-only


if __name__ == "__main__":
    unittest.main()
