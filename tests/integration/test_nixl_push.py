"""NIXL push (vLLM's NixlPushConnector) end to end through pdrouter and `pdnode sim --connector
nixl-push` nodes that move real KV bytes: the decode registers its blocks with the prefill over the
side channel the router named, the prefill WRITEs its KV there, the decode verifies every byte.

  * streamed and non-streamed requests (completions and chat) on 2 prefills + 2 decodes: every one
    answered, every KV transfer verified, no block held anywhere afterwards;
  * a failing prefill (500) closes its concurrent decode leg, and the retry goes out with a new
    transfer_id (and request id) on both legs;
  * a failing decode (503) closes its prefill leg still computing, and the new pair has a new
    transfer_id;
  * a client gone mid-prefill closes both legs; gone mid-stream, the decode's.

What each node saw comes from its GET /sim/requests log and GET /sim/kv counters.
"""
import json
import socket
import time
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE
from test_kv_transfer import no_blocks_held, request_for, send, wait_kv

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
REQUESTS = 48
WAIT_S = 15.0 * TIME_SCALE


def gen(log):
    return [r for r in log["requests"] if r["path"] in (CHAT, COMPLETIONS)]


def params(entry):
    return json.loads(entry["body"])["kv_transfer_params"]


def completion(max_tokens=4, stream=False):
    return {"model": "sim-model", "prompt": "one two three four five six", "max_tokens": max_tokens,
            "stream": stream}


class PushTest(unittest.TestCase):
    def cluster(self, **kwargs):
        c = PdCluster("nixl-push", **kwargs)
        self.addCleanup(c.close)
        return c

    def wait_aborted(self, node, count=1):
        node.wait_for_requests(lambda log: log["counters"]["aborts"] >= count, 5 * TIME_SCALE)


class TestPushServing(PushTest):
    def test_streamed_and_plain_requests_move_verified_kv(self):
        c = self.cluster(prefills=2, decodes=2)
        failures = [f for f in (send(c, *request_for(i)) for i in range(REQUESTS)) if f]
        self.assertEqual(failures, [])
        streamed = sum(1 for i in range(REQUESTS) if request_for(i)[1].get("stream"))
        self.assertTrue(0 < streamed < REQUESTS)
        nodes = c.prefills + c.decodes
        stats = dict(zip((n.http_address for n in nodes),
                         wait_kv(self, nodes, no_blocks_held, "no KV blocks held on any sim")))
        transfers = 0
        for node in c.decodes:
            s = stats[node.http_address]
            self.assertEqual(s["mode"], "write", s)
            self.assertEqual((s["kv_mismatches"], s["kv_errors"]), (0, 0), s)
            transfers += s["kv_transfers"]
        self.assertEqual(transfers, REQUESTS)
        moved = sum(stats[n.http_address]["kv_bytes_moved"] for n in c.decodes)
        self.assertGreater(moved, 0)
        self.assertEqual(moved, sum(stats[n.http_address]["kv_bytes_moved"] for n in c.prefills))
        # Each request's legs shared one transfer_id; no two requests did.
        ids = [params(r)["transfer_id"] for d in c.decodes for r in gen(d.sim_requests())]
        self.assertEqual(len(ids), REQUESTS)
        self.assertEqual(len(set(ids)), REQUESTS)
        prefill_ids = {params(r)["transfer_id"] for p in c.prefills for r in gen(p.sim_requests())}
        self.assertEqual(prefill_ids, set(ids))


class TestPushFailures(PushTest):
    # The decode generates slowly, so its leg is certainly open when its prefill fails.
    SLOW_DECODE = ("--decode-us-per-token", "300000")

    def first_failed_request(self, c, bad, good, legs_of):
        """Sends requests one at a time until one of them met `bad` (tried first and failed, then
        retried on `good`); returns (failed attempt, its retry) as seen by legs_of(node)."""
        for _ in range(6):
            before = len(gen(good.sim_requests()))
            status, _, body = c.post(COMPLETIONS, completion(), timeout=WAIT_S)
            self.assertEqual(status, 200, body)
            failed = gen(bad.sim_requests())
            if failed:
                retry = sorted(gen(good.sim_requests()), key=lambda r: r["arrival_unix_ms"])
                self.assertEqual(len(retry), before + 1)
                return failed[0], retry[-1]
        self.fail("the bad node was never tried")

    def test_failed_prefill_closes_the_decode_and_the_retry_has_a_new_transfer_id(self):
        c = self.cluster(prefills=2, decodes=1, decode_flags=self.SLOW_DECODE)
        bad, good = c.prefills
        bad.set_fault(status=500, count=-1)
        failed, retry = self.first_failed_request(c, bad, good, gen)
        self.assertEqual((failed["status"], retry["status"]), (500, 200))
        by_transfer = {params(r)["transfer_id"]: r for r in gen(c.decodes[0].sim_requests())}
        # Each attempt's legs pair by their own transfer_id and request id.
        failed_decode = by_transfer[params(failed)["transfer_id"]]
        retry_decode = by_transfer[params(retry)["transfer_id"]]
        self.assertTrue(failed_decode["aborted"], "the failed attempt's decode leg was left open")
        self.assertEqual(retry_decode["status"], 200)
        self.assertEqual(failed_decode["headers"]["x-request-id"], failed["headers"]["x-request-id"])
        self.assertNotEqual(params(failed)["transfer_id"], params(retry)["transfer_id"])
        self.assertNotEqual(failed["headers"]["x-request-id"], retry["headers"]["x-request-id"])
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="prefill"}'), 1)

    def test_failed_decode_closes_the_prefill_and_the_new_pair_has_a_new_transfer_id(self):
        c = self.cluster(prefills=1, decodes=2)
        p = c.prefills[0]
        p.set_fault(delay_ms=int(800 * TIME_SCALE), count=-1)  # still computing when D fails
        bad, good = c.decodes
        bad.set_fault(status=503, count=-1)
        failed, retry = self.first_failed_request(c, bad, good, gen)
        self.assertEqual((failed["status"], retry["status"]), (503, 200))
        log = p.wait_for_requests(lambda log: any(r["aborted"] for r in gen(log)), WAIT_S)
        by_transfer = {params(r)["transfer_id"]: r for r in gen(log)}
        self.assertTrue(by_transfer[params(failed)["transfer_id"]]["aborted"],
                        "the failed decode's prefill leg was left open")
        self.assertNotEqual(params(failed)["transfer_id"], params(retry)["transfer_id"])
        self.assertIn(params(retry)["transfer_id"], by_transfer)
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="decode"}'), 1)

    def open_request(self, c, body):
        host, port = c.router.http.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5)
        data = json.dumps(body).encode()
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (COMPLETIONS.encode(), len(data), data))
        return sock

    def test_client_gone_mid_prefill_closes_both_legs(self):
        c = self.cluster(prefills=1, decodes=1)
        c.prefills[0].set_fault(hang=True)
        sock = self.open_request(c, completion())
        for node in (c.prefills[0], c.decodes[0]):
            node.wait_for_requests(lambda log: gen(log), WAIT_S)
        sock.close()
        self.wait_aborted(c.prefills[0])
        self.wait_aborted(c.decodes[0])
        # The decode gave its registered blocks back (none held, none left quarantined forever).
        wait_kv(self, c.decodes, lambda s: s["kv_blocks_held"] == s["kv_blocks_quarantined"],
                "the cancelled decode's blocks freed or quarantined")
        c.router.wait_for(lambda: c.metric('pdrouter_requests_total{outcome="cancelled"}') == 1)

    def test_client_gone_mid_stream_closes_the_decode(self):
        c = self.cluster(prefills=1, decodes=1, decode_flags=("--decode-us-per-token", "100000"))
        stream = c.stream(CHAT, {"model": "sim-model", "max_tokens": 50, "stream": True,
                                 "messages": [{"role": "user", "content": "hi there"}]})
        self.assertIn("choices", json.loads(next(iter(stream))))
        stream.close()
        self.wait_aborted(c.decodes[0])
        c.router.wait_for(lambda: c.metric('pdrouter_requests_total{outcome="cancelled"}') == 1)


if __name__ == "__main__":
    unittest.main()
