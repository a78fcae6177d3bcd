"""The request state machine's failure cases (docs/design/request-flow.md), one test each, end to end:
pdrouter with simulated nodes whose faults are injected through /sim/faults. What each node saw
(requests, aborts) comes from its /sim/requests log; what the client saw from its own socket."""
import json
import signal
import socket
import time
import unittest

from pd_fixture import CHAT, COMPLETIONS, PdCluster, chat, completion
from pdrouter_fixture import TIME_SCALE


def generation_requests(log):
    return [r for r in log["requests"] if r["path"] in (CHAT, COMPLETIONS)]


def request_id(entry):
    return entry["headers"].get("x-request-id")


def kv_params(entry):
    return json.loads(entry["body"]).get("kv_transfer_params")


def error_of(body):
    payload = json.loads(body)
    assert set(payload) == {"error"}, payload
    return payload["error"]


def dead_address():
    """"127.0.0.1:PORT" where nothing listens: a node that went away."""
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    return "127.0.0.1:%d" % port


class ClusterTest(unittest.TestCase):
    """One cluster per test: failures leave nodes in states later tests must not inherit."""

    def cluster(self, connector="moriio", transfer_mode="WRITE", **kwargs):
        c = PdCluster(connector, transfer_mode=transfer_mode, **kwargs)
        self.addCleanup(c.close)
        return c

    def wait_aborted(self, node, count=1, timeout=1.0):
        """Polls until `node` counted `count` aborts; returns the seconds it took."""
        start = time.monotonic()
        node.wait_for_requests(lambda log: log["counters"]["aborts"] >= count, timeout * TIME_SCALE)
        return time.monotonic() - start


class PrefillFailures(ClusterTest):
    # In WRITE mode the decode waits for the prefill's KV push only up to its KV timeout, and a
    # failed prefill never pushes; tests where the prefill fails also slow the decode down, so its
    # leg is certainly still open when the prefill's failure reaches pdrouter.
    SLOW_DECODE = ("--decode-us-per-token", "300000")

    def test_prefill_500_is_retried_on_another_prefill_with_fresh_ids(self):
        c = self.cluster(prefills=2, decodes=1, decode_flags=self.SLOW_DECODE)
        bad, good = c.prefills
        bad.set_fault(status=500, count=-1)
        for _ in range(4):
            status, _, body = c.post(COMPLETIONS, completion())
            self.assertEqual(status, 200, body)
        bad_log = generation_requests(bad.sim_requests())
        good_log = generation_requests(good.sim_requests())
        self.assertGreaterEqual(len(bad_log), 1)
        self.assertEqual(len(good_log), 4)
        # The retry never reuses the failed attempt's ids: request id and transfer id are new.
        failed_ids = {request_id(r) for r in bad_log}
        failed_transfers = {kv_params(r)["transfer_id"] for r in bad_log}
        for r in good_log:
            self.assertNotIn(request_id(r), failed_ids)
            self.assertNotIn(kv_params(r)["transfer_id"], failed_transfers)
        # WRITE mode sends decode concurrently: each failed attempt's decode leg was closed.
        decode_log = c.decodes[0].sim_requests()
        self.assertEqual(decode_log["counters"]["aborts"], len(bad_log))
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="prefill"}'), len(bad_log))
        self.assertEqual(c.metric('pdrouter_leg_failures_total{leg="prefill",cause="status_5xx"}'),
                         len(bad_log))

    def test_prefill_500_everywhere_gives_502_after_the_retry_budget(self):
        c = self.cluster(prefills=2, decodes=1, decode_flags=self.SLOW_DECODE)
        for p in c.prefills:
            p.set_fault(status=500, count=-1)
        status, headers, body = c.post(COMPLETIONS, completion())
        self.assertEqual(status, 502, body)
        err = error_of(body)
        self.assertEqual(err["code"], "prefill_failed")
        self.assertIn("500", err["message"])
        attempts = sum(len(generation_requests(p.sim_requests())) for p in c.prefills)
        self.assertEqual(attempts, 2)  # retries.prefill_attempts default
        self.wait_aborted(c.decodes[0], count=2)
        self.assertEqual(c.metric('pdrouter_requests_total{outcome="failed"}'), 1)

    def test_prefill_timeout_closes_both_legs_and_answers_504(self):
        c = self.cluster(prefills=1, decodes=1, decode_flags=self.SLOW_DECODE,
                         topology="timeouts:\n  prefill_ms: 300\n")
        c.prefills[0].set_fault(hang=True, count=-1)
        start = time.monotonic()
        status, _, body = c.post(COMPLETIONS, completion())
        elapsed = time.monotonic() - start
        self.assertEqual(status, 504, body)
        self.assertEqual(error_of(body)["code"], "prefill_timeout")
        self.assertGreaterEqual(elapsed, 0.3)
        self.assertLess(elapsed, 3.0 * TIME_SCALE)
        self.wait_aborted(c.prefills[0])
        self.wait_aborted(c.decodes[0])
        self.assertEqual(c.metric('pdrouter_leg_failures_total{leg="prefill",cause="timeout"}'), 1)

    def test_prefill_killed_mid_request_is_retried_elsewhere(self):
        # ~1 s of simulated prefill: long enough to kill the node while it works.
        # READ mode: the decode waits for the prefill, so the kill lands in PREFILL_SENT.
        c = self.cluster(transfer_mode="READ", prefills=2, decodes=1,
                         prefill_flags=("--prefill-us-per-token", "200000"))
        results = {}

        def send():
            results["answer"] = c.post(COMPLETIONS, completion(prompt="a b c d e"), timeout=30)

        import threading
        t = threading.Thread(target=send)
        t.start()
        deadline = time.monotonic() + 5 * TIME_SCALE
        victim = None
        while victim is None and time.monotonic() < deadline:
            for p in c.prefills:
                if generation_requests(p.sim_requests()):
                    victim = p
            time.sleep(0.01)
        self.assertIsNotNone(victim, "no prefill received the request")
        victim.kill()
        c.prefills.remove(victim)
        t.join(30 * TIME_SCALE)
        self.assertFalse(t.is_alive())
        status, _, body = results["answer"]
        self.assertEqual(status, 200, body)
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="prefill"}'), 1)

    def test_prefill_4xx_is_relayed_not_retried(self):
        c = self.cluster(prefills=2, decodes=1, decode_flags=self.SLOW_DECODE)
        for p in c.prefills:
            p.set_fault(status=400, count=-1)
        status, _, body = c.post(COMPLETIONS, completion())
        self.assertEqual(status, 400, body)
        attempts = sum(len(generation_requests(p.sim_requests())) for p in c.prefills)
        self.assertEqual(attempts, 1)
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="prefill"}'), 0)


class PrefillWithoutKv(ClusterTest):
    """A prefill whose one token is EOS exports no KV and answers kv_transfer_params null
    (docs/design/wire-formats.md rule 7). A decode told to fetch blocks would wait for ones that never
    come: pdrouter sends it as a plain request, which recomputes the prompt."""

    def check_fallback(self, connector, transfer_mode):
        c = self.cluster(connector=connector, transfer_mode=transfer_mode)
        p, d = c.prefills[0], c.decodes[0]
        p.set_fault(stop_after_first_token=True)
        status, _, body = c.post(COMPLETIONS, completion(max_tokens=4), timeout=30)
        self.assertEqual(status, 200, body)
        answer = json.loads(body)
        self.assertTrue(answer["choices"][0]["text"], answer)
        [prefill_leg] = generation_requests(p.sim_requests())
        self.assertEqual(prefill_leg["fault"], {"stop_after_first_token": True})
        [decode_leg] = generation_requests(d.sim_requests())
        self.assertNotIn("kv_transfer_params", json.loads(decode_leg["body"]))
        self.assertEqual(request_id(decode_leg), request_id(prefill_leg))
        self.assertEqual(c.metric("pdrouter_local_prefill_fallbacks_total"), 1)
        self.assertEqual(c.metric('pdrouter_requests_total{outcome="done"}'), 1)

    def test_nixl_decode_is_sent_as_a_plain_request(self):
        self.check_fallback("nixl", None)

    def test_moriio_read_decode_is_sent_as_a_plain_request(self):
        self.check_fallback("moriio", "READ")


class UnreachableNodes(ClusterTest):
    def test_node_that_refuses_connections_is_ejected_after_three_legs(self):
        # A static prefill nobody listens on (a node that went away without a heartbeat to
        # expire it) beside a live registered one: each leg sent to it fails to connect and is
        # retried on the live one; after three in a row (the default) it is skipped for
        # retries.eject_ms (here 10 minutes, so slow sanitizer runs see it still ejected).
        dead = dead_address()
        topology = ("connectors:\n  default: nixl\npolicies:\n  prefill: round_robin\n"
                    "retries:\n  eject_ms: 600000\n"
                    "instances:\n  - {role: prefill, http_address: \"%s\"}\n" % dead)
        c = self.cluster(connector="nixl", transfer_mode=None, topology=topology)
        for i in range(10):
            status, _, body = c.post(COMPLETIONS, completion(), timeout=30)
            self.assertEqual(status, 200, (i, body))
        failures = 'pdrouter_leg_failures_total{leg="prefill",cause="connect"}'
        self.assertEqual(c.metric(failures), 3)
        self.assertEqual(c.metric('pdrouter_node_ejections_total{role="prefill"}'), 1)
        self.assertEqual(c.metric('pdrouter_node_ejections_total{role="decode"}'), 0)
        # /status is rendered at most once a second per snapshot (liveness fields may lag by that).
        node, _ = c.router.wait_for(lambda: (lambda n: n if n["connect_failures"] == 3 else None)(
            c.router.instance(dead)), timeout=5)
        self.assertGreater(node["ejected_for_ms"], 0)
        self.assertLessEqual(node["ejected_for_ms"], 600000)
        live = c.router.instance(c.prefills[0].http_address)
        self.assertEqual((live["connect_failures"], live["ejected_for_ms"]), (0, 0))
        self.assertEqual(len(generation_requests(c.prefills[0].sim_requests())), 10)
        self.assertIn("ejected for 600000 ms", c.router.log())


class DecodeFailures(ClusterTest):
    def test_decode_refusal_retries_the_whole_pair_when_ids_name_the_decode(self):
        c = self.cluster(prefills=1, decodes=2)
        bad, good = c.decodes
        bad.set_fault(status=503, count=-1)
        for _ in range(3):
            status, _, body = c.post(COMPLETIONS, completion())
            self.assertEqual(status, 200, body)
        bad_log = generation_requests(bad.sim_requests())
        self.assertGreaterEqual(len(bad_log), 1)
        # MoRIIO ids embed the decode's address: a new decode means a new prefill and new ids.
        prefill_ids = [request_id(r) for r in generation_requests(c.prefills[0].sim_requests())]
        self.assertEqual(len(prefill_ids), 3 + len(bad_log))
        self.assertEqual(len(set(prefill_ids)), len(prefill_ids))
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="decode"}'), len(bad_log))

    def test_nixl_decode_refusal_retries_the_whole_pair(self):
        # The refusing decode got the request: it may have pulled the prefill's blocks, and
        # closing it tells the prefill to free them, so their params are not handed to another
        # decode; a new prefill computes the prompt again.
        c = self.cluster(connector="nixl", transfer_mode=None, prefills=1, decodes=2)
        bad, good = c.decodes
        bad.set_fault(status=503, count=-1)
        for _ in range(3):
            status, _, body = c.post(COMPLETIONS, completion())
            self.assertEqual(status, 200, body)
        bad_log = generation_requests(bad.sim_requests())
        self.assertGreaterEqual(len(bad_log), 1)
        prefill_log = generation_requests(c.prefills[0].sim_requests())
        self.assertEqual(len(prefill_log), 3 + len(bad_log))
        good_log = generation_requests(good.sim_requests())
        self.assertEqual(len(good_log), 3)
        resent = {request_id(r) for r in good_log} & {request_id(r) for r in bad_log}
        self.assertEqual(resent, set(), "fresh ids for the new pair")
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="decode"}'), len(bad_log))

    def test_nixl_unreachable_decode_retries_only_the_decode(self):
        # A decode that could not even be connected to never saw the request: the prefill's KV
        # params go to another decode as they are, and the prompt is not computed again.
        dead = dead_address()
        topology = ("connectors:\n  default: nixl\n"
                    "instances:\n  - {role: decode, http_address: \"%s\"}\n" % dead)
        c = self.cluster(connector="nixl", transfer_mode=None, prefills=1, decodes=1,
                         topology=topology)
        for _ in range(4):
            status, _, body = c.post(COMPLETIONS, completion())
            self.assertEqual(status, 200, body)
        self.assertEqual(len(generation_requests(c.prefills[0].sim_requests())), 4)
        self.assertEqual(len(generation_requests(c.decodes[0].sim_requests())), 4)
        retries = c.metric('pdrouter_leg_retries_total{leg="decode"}')
        self.assertGreaterEqual(retries, 1)
        self.assertEqual(c.metric('pdrouter_leg_failures_total{leg="decode",cause="connect"}'),
                         retries)

    def test_decode_4xx_is_relayed_as_is(self):
        c = self.cluster(prefills=1, decodes=2)
        for d in c.decodes:
            d.set_fault(status=400, count=-1)
        status, headers, body = c.post(COMPLETIONS, completion())
        self.assertEqual(status, 400, body)
        # vLLM's own error shape, relayed byte for byte.
        self.assertEqual(json.loads(body)["message"], "injected fault: HTTP 400")
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="decode"}'), 0)

    def test_decode_dying_mid_stream_ends_with_an_error_event(self):
        c = self.cluster(prefills=1, decodes=1)
        c.decodes[0].set_fault(close_after_tokens=2)
        with c.stream(CHAT, chat(max_tokens=10, stream=True)) as events:
            self.assertEqual(events.status, 200)
            payloads = list(events)
        self.assertEqual(payloads[-1], "[DONE]")
        error = json.loads(payloads[-2])
        self.assertIn("error", error)
        self.assertEqual(error["error"]["code"], "decode_failed")
        tokens = [json.loads(p) for p in payloads[:-2]]
        self.assertTrue(all("choices" in t for t in tokens), tokens)
        self.assertGreaterEqual(len(tokens), 2)
        # pdrouter counts the error before writing the event; /metrics may still be served by
        # another worker, so the counter is polled (it flaked under ASan read at once).
        c.router.wait_for(lambda: c.metric("pdrouter_stream_errors_total") == 1)


class ClientDisconnect(ClusterTest):
    def open_request(self, c, body, path=COMPLETIONS):
        host, port = c.router.http.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5)
        data = json.dumps(body).encode()
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
        return sock

    def test_disconnect_during_prefill_closes_both_legs_promptly(self):
        # A slow decode stands for one waiting for KV (the sim's WRITE decode does not wait).
        c = self.cluster(prefills=1, decodes=1, decode_flags=("--decode-us-per-token", "300000"))
        c.prefills[0].set_fault(hang=True)
        sock = self.open_request(c, completion())
        c.prefills[0].wait_for_requests(lambda log: generation_requests(log), 5 * TIME_SCALE)
        c.decodes[0].wait_for_requests(lambda log: generation_requests(log), 5 * TIME_SCALE)
        sock.close()
        took_prefill = self.wait_aborted(c.prefills[0])
        took_decode = self.wait_aborted(c.decodes[0])
        # Polling adds up to one poll interval plus an HTTP round trip to each measure.
        self.assertLess(max(took_prefill, took_decode), 0.05 * TIME_SCALE + 0.1)
        c.router.wait_for(lambda: c.metric("pdrouter_client_disconnects_total") == 1)
        c.router.wait_for(lambda: c.metric('pdrouter_requests_total{outcome="cancelled"}') == 1)

    def test_disconnect_during_decode_stream_closes_the_decode(self):
        c = self.cluster(prefills=1, decodes=1, decode_flags=("--decode-us-per-token", "100000"))
        stream = c.stream(CHAT, chat(max_tokens=50, stream=True))
        first = next(iter(stream))
        self.assertIn("choices", json.loads(first))
        stream.close()
        took = self.wait_aborted(c.decodes[0])
        self.assertLess(took, 0.05 * TIME_SCALE + 0.1)
        c.router.wait_for(lambda: c.metric('pdrouter_requests_total{outcome="cancelled"}') == 1)


class Shutdown(ClusterTest):
    def test_drain_finishes_in_flight_streams_and_refuses_new_requests(self):
        c = self.cluster(prefills=1, decodes=1, decode_flags=("--decode-us-per-token", "50000"))
        stream = c.stream(CHAT, chat(max_tokens=20, stream=True))
        events = iter(stream)
        first = next(events)
        self.assertIn("choices", json.loads(first))
        c.router.process.send_signal(signal.SIGTERM)
        # New work is refused while the stream drains: the listener is closed (connection
        # refused) or, on a connection that raced in, 503.
        def refused():
            try:
                status, _, _ = c.post(COMPLETIONS, completion(), timeout=2)
                return status == 503
            except OSError:
                return True
        c.router.wait_for(refused)
        rest = list(events)
        stream.close()
        self.assertEqual(rest[-1], "[DONE]")
        self.assertFalse(any('"error"' in e for e in rest))
        self.assertEqual(c.router.process.wait(10 * TIME_SCALE), 0)


if __name__ == "__main__":
    unittest.main()
