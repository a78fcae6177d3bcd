"""The admission queue (router/proxy/admission_queue.h) end to end: a real pdrouter with
limits.max_concurrent_requests small and simulated NIXL nodes that answer slowly or not at all.

  * an overload burst waits instead of getting 429: every request is answered 200, and the queue
    depth gauge was seen above 0 while they waited;
  * a full queue (in requests or in body bytes) answers 429 with Retry-After and an OpenAI error
    body naming the limit; a request that waits queue_timeout_ms gets 503 with Retry-After;
  * a client that leaves while its request waits takes it out of the queue: no leg of it ever
    reaches a node, and pdrouter_admission_queue_client_gone_total counts it;
  * the drain answers a waiting request 503 shutting_down at once;
  * a slot given back goes to the highest class first, and the tenants of one class take turns.
Every wait is on /metrics or a node's request log, never a sleep.
"""
import json
import signal
import os
import socket
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402
from pdrouter_fixture import TIME_SCALE  # noqa: E402

GEN_PATHS = ("/v1/completions", "/v1/chat/completions")
WAIT_S = 15.0 * TIME_SCALE


def completion(prompt="Hello there, how are you?", max_tokens=2, **extra):
    body = {"model": "sim-model", "prompt": prompt, "max_tokens": max_tokens}
    body.update(extra)
    return body


def gen_entries(node):
    return [r for r in node.sim_requests()["requests"] if r["method"] == "POST" and r["path"] in GEN_PATHS]


def queue_depth(cluster):
    return sum(v for k, v in cluster.router.metrics().items() if k.startswith("pdrouter_admission_queue_depth{"))


def refused(cluster, reason):
    return cluster.metric('pdrouter_requests_refused_total{reason="%s"}' % reason)


def send_held(cluster, body, headers=None):
    """A request whose answer is not read: the socket, to close when done (a client gone)."""
    host, port = cluster._host_port()
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, port), timeout=WAIT_S)
    extra = "".join("%s: %s\r\n" % kv for kv in (headers or {}).items()).encode()
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: pdrouter\r\nContent-Type: application/json\r\n"
                 + extra + b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return sock


class AdmissionQueueCase(unittest.TestCase):
    def cluster(self, limits, **extra):
        topology = "limits:\n" + "".join("  %s: %s\n" % kv for kv in limits.items())
        c = PdCluster("nixl", prefills=1, decodes=1, kv_backends="none", topology=topology + extra.get("more", ""))
        self.addCleanup(c.close)
        return c

    def hold_the_only_slot(self, c):
        """Fills limits.max_concurrent_requests: 1 with a request the decode never answers."""
        c.decodes[0].set_fault(hang=True, count=1)
        sock = send_held(c, completion(max_tokens=50, stream=True))
        self.addCleanup(sock.close)
        c.decodes[0].wait_for_requests(lambda log: len(gen_entries_of(log)) == 1, WAIT_S)
        c.router.wait_for(lambda: c.metric("pdrouter_requests_in_flight") == 1, timeout=WAIT_S)
        return sock

    def assert_error(self, status, headers, raw, expected_status, code, *words):
        self.assertEqual(status, expected_status, raw)
        self.assertRegex(headers.get("retry-after", ""), r"^\d+$")
        error = json.loads(raw)["error"]  # OpenAI's shape
        self.assertEqual(error["code"], code, error)
        for w in words:
            self.assertIn(w, error["message"])


def gen_entries_of(log):
    return [r for r in log["requests"] if r["method"] == "POST" and r["path"] in GEN_PATHS]


class OverloadBurst(AdmissionQueueCase):
    def test_a_burst_over_the_limit_waits_and_is_served(self):
        c = self.cluster({"max_concurrent_requests": 2})
        # Each decode answer takes a while: 12 requests through 2 slots must wait their turn.
        c.decodes[0].set_fault(delay_ms=int(300 * TIME_SCALE), count=-1)
        results = []
        lock = threading.Lock()

        def one(i):
            r = c.post("/v1/completions", completion(prompt="burst %d" % i, stream=True), timeout=60)
            with lock:
                results.append(r)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(12)]
        for t in threads:
            t.start()
        try:
            # Waiters were seen in the queue (the old code answered them 429 at once).
            c.router.wait_for(lambda: queue_depth(c) >= 1, timeout=WAIT_S)
        finally:
            for t in threads:
                t.join(120 * TIME_SCALE)
        self.assertEqual(sorted(r[0] for r in results), [200] * 12,
                         [(r[0], r[2][:200]) for r in results if r[0] != 200])
        for status, _, raw in results:
            self.assertIn(b"data: [DONE]", raw)
        self.assertEqual(refused(c, "too_busy") + refused(c, "queue_full") + refused(c, "queue_timeout"), 0)
        c.router.wait_for(lambda: c.metric("pdrouter_requests_in_flight") == 0 and queue_depth(c) == 0,
                          timeout=WAIT_S)
        self.assertGreaterEqual(c.metric("pdrouter_admission_queue_wait_seconds_count"), 1)
        self.assertEqual(len(gen_entries(c.decodes[0])), 12)
        status = c.router.status()["admission_queue"]
        self.assertTrue(status["enabled"])
        self.assertEqual(status["max_concurrent_requests"], 2)
        self.assertEqual(status["max_queued_requests"], 1024)


class FullQueue(AdmissionQueueCase):
    def test_beyond_max_queued_requests_gets_429(self):
        c = self.cluster({"max_concurrent_requests": 1, "max_queued_requests": 1})
        self.hold_the_only_slot(c)
        waiting = send_held(c, completion())  # the one place in the queue
        self.addCleanup(waiting.close)
        c.router.wait_for(lambda: queue_depth(c) == 1, timeout=WAIT_S)
        status, headers, raw = c.post("/v1/completions", completion())
        self.assert_error(status, headers, raw, 429, "too_many_requests", "max_queued_requests = 1")
        self.assertEqual(refused(c, "queue_full"), 1)
        self.assertEqual(refused(c, "too_busy"), 0)

    def test_beyond_max_queued_bytes_gets_429(self):
        c = self.cluster({"max_concurrent_requests": 1, "max_queued_bytes": 2000})
        self.hold_the_only_slot(c)
        status, headers, raw = c.post("/v1/completions", completion(prompt="x" * 3000))
        self.assert_error(status, headers, raw, 429, "too_many_requests", "max_queued_bytes = 2000")
        self.assertEqual(refused(c, "queue_full"), 1)
        self.assertEqual(queue_depth(c), 0)
        self.assertEqual(c.metric("pdrouter_admission_queue_bytes"), 0)

    def test_queue_off_answers_429_at_once_as_before(self):
        c = self.cluster({"max_concurrent_requests": 1, "max_queued_requests": 0})
        self.hold_the_only_slot(c)
        status, headers, raw = c.post("/v1/completions", completion())
        self.assert_error(status, headers, raw, 429, "too_many_requests", "max_concurrent_requests")
        self.assertEqual(refused(c, "too_busy"), 1)
        self.assertFalse(c.router.status()["admission_queue"]["enabled"])


class QueueTimeout(AdmissionQueueCase):
    def test_a_request_waiting_past_queue_timeout_gets_503(self):
        c = self.cluster({"max_concurrent_requests": 1, "queue_timeout_ms": int(300 * TIME_SCALE)})
        self.hold_the_only_slot(c)
        status, headers, raw = c.post("/v1/completions", completion(), timeout=30)
        self.assert_error(status, headers, raw, 503, "queue_timeout", "queue_timeout_ms")
        self.assertEqual(refused(c, "queue_timeout"), 1)
        self.assertEqual(queue_depth(c), 0)
        self.assertEqual(len(gen_entries(c.prefills[0])), 1, "only the held request reached a node")


class ClientGoneWhileWaiting(AdmissionQueueCase):
    def test_a_client_that_leaves_the_queue_sends_nothing_to_the_nodes(self):
        c = self.cluster({"max_concurrent_requests": 1})
        held = self.hold_the_only_slot(c)
        waiting = send_held(c, completion(prompt="I will not wait"))
        c.router.wait_for(lambda: queue_depth(c) == 1, timeout=WAIT_S)
        waiting.close()
        c.router.wait_for(lambda: c.metric("pdrouter_admission_queue_client_gone_total") == 1, timeout=WAIT_S)
        self.assertEqual(queue_depth(c), 0)
        self.assertEqual(c.metric("pdrouter_admission_queue_bytes"), 0)
        # The slot comes back: nobody waits, so no leg goes anywhere.
        held.close()
        c.router.wait_for(lambda: c.metric("pdrouter_requests_in_flight") == 0, timeout=WAIT_S)
        for node in c.prefills + c.decodes:
            prompts = [json.loads(r["body"]).get("prompt") if isinstance(r.get("body"), str) else None
                       for r in gen_entries(node)]
            self.assertEqual(len(gen_entries(node)), 1, (node.http_address, prompts))
        # And the router still serves.
        status, _, raw = c.post("/v1/completions", completion())
        self.assertEqual(status, 200, raw)


class ServingOrder(AdmissionQueueCase):
    """Who gets a slot given back: the queue's order seen from the nodes. With one slot the
    requests run one at a time, so the prefill's request log is the order they were served in."""

    def queue_then_release(self, c, held, requests):
        """Queues `requests` ((prompt, headers) in arrival order, each seen waiting before the next
        is sent), gives the held slot back, and returns the prompts in the order the prefill
        got them after the held one."""
        results = []
        lock = threading.Lock()

        def one(prompt, headers):
            r = c.post("/v1/completions", completion(prompt=prompt), headers=headers, timeout=60)
            with lock:
                results.append(r)

        threads = []
        for i, (prompt, headers) in enumerate(requests):
            threads.append(threading.Thread(target=one, args=(prompt, headers)))
            threads[-1].start()
            c.router.wait_for(lambda: queue_depth(c) == i + 1, timeout=WAIT_S)
        held.close()
        for t in threads:
            t.join(60 * TIME_SCALE)
        self.assertEqual([r[0] for r in results], [200] * len(requests), [r[2][:200] for r in results])
        prompts = [json.loads(r["body"])["prompt"] for r in gen_entries(c.prefills[0])]
        return prompts[1:]

    def test_a_higher_class_is_served_before_earlier_lower_ones(self):
        c = self.cluster({"max_concurrent_requests": 1})
        held = self.hold_the_only_slot(c)
        order = self.queue_then_release(c, held, [("low first", {"x-pdr-priority": "1"}),
                                                  ("low second", {"x-pdr-priority": "1"}),
                                                  ("high last", {"x-pdr-priority": "6"})])
        self.assertEqual(order, ["high last", "low first", "low second"])

    def test_tenants_of_one_class_take_turns(self):
        c = self.cluster({"max_concurrent_requests": 1}, more="tenants:\n  header: x-tenant\n")
        held = self.hold_the_only_slot(c)
        a, b = {"x-tenant": "a"}, {"x-tenant": "b"}
        order = self.queue_then_release(c, held, [("a1", a), ("a2", a), ("a3", a), ("b1", b)])
        # b's one request is not held back behind a's burst.
        self.assertEqual(order, ["a1", "b1", "a2", "a3"])


class DrainWhileWaiting(AdmissionQueueCase):
    def test_the_drain_answers_waiting_requests_at_once(self):
        c = self.cluster({"max_concurrent_requests": 1}, more="timeouts:\n  drain_ms: %d\n" % int(3000 * TIME_SCALE))
        self.hold_the_only_slot(c)
        result = []
        t = threading.Thread(target=lambda: result.append(c.post("/v1/completions", completion(), timeout=30)))
        t.start()
        c.router.wait_for(lambda: queue_depth(c) == 1, timeout=WAIT_S)
        c.router.process.proc.send_signal(signal.SIGTERM)  # the drain begins
        t.join(20 * TIME_SCALE)
        self.assertEqual(len(result), 1)
        status, headers, raw = result[0]
        self.assertEqual(status, 503, raw)
        self.assertEqual(json.loads(raw)["error"]["code"], "shutting_down")


if __name__ == "__main__":
    unittest.main()
