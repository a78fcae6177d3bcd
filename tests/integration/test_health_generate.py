"""GET /health_generate end to end: pdrouter sends itself one 1-token completion that takes a real
P/D pair (NIXL sims here), answers 200 when it worked and 503 naming the failing leg when it did
not, 503 no_pair at once (nothing sent) without a pair, and never runs more than one probe per
HTTP worker at a time (callers meanwhile share the answer). Read from the sims' request logs and
pdrouter_health_generate_total.
"""
import json
import os
import sys
import threading
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402
from pdrouter_fixture import Router, TIME_SCALE  # noqa: E402

TIMEOUT_S = 60 * TIME_SCALE


def completions(node):
    return [r for r in node.sim_requests()["requests"] if r["path"] == "/v1/completions"]


def counted(cluster, result):
    return cluster.metric('pdrouter_health_generate_total{result="%s"}' % result)


def fresh_probe(cluster):
    """GET /health_generate until an answer comes from a new probe (one reaching the prefill), not
    from one reused for 1 s; returns (status, body). Polled, bounded."""
    sent = len(completions(cluster.prefills[0]))

    def fresh():
        code, _, raw = cluster.get("/health_generate", timeout=TIMEOUT_S)
        return (code, raw) if len(completions(cluster.prefills[0])) > sent else None
    return cluster.router.wait_for(fresh, timeout=10, interval=0.2)[0]


class HealthGenerateOk(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("nixl", prefills=1, decodes=1)  # the fixture runs pdrouter with 2 workers

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_one_token_through_one_pair(self):
        for node in self.cluster.prefills + self.cluster.decodes:
            node.reset()
        code, raw = fresh_probe(self.cluster)
        self.assertEqual(code, 200, raw)
        body = json.loads(raw)
        self.assertEqual(body["status"], "ok")
        self.assertGreaterEqual(body["latency_ms"], 0)
        (prefill,) = completions(self.cluster.prefills[0])
        (decode,) = completions(self.cluster.decodes[0])
        self.assertEqual(json.loads(prefill["body"])["max_tokens"], 1)
        self.assertEqual(json.loads(decode["body"])["prompt"], "ping")
        self.assertEqual(prefill["headers"]["x-request-id"], decode["headers"]["x-request-id"])
        self.assertGreaterEqual(counted(self.cluster, "ok"), 1)

    def test_concurrent_probes_share_one_request_per_worker(self):
        for node in self.cluster.prefills + self.cluster.decodes:
            node.reset()
        # The decode holds its answer, so every caller arrives while a probe is in flight.
        self.cluster.decodes[0].set_fault(delay_ms=int(2000 * TIME_SCALE), count=-1)
        self.addCleanup(self.cluster.decodes[0].clear_faults)
        before = counted(self.cluster, "shared") + counted(self.cluster, "reused")
        answers = []

        def probe():
            answers.append(self.cluster.get("/health_generate", timeout=TIMEOUT_S)[0])
        threads = [threading.Thread(target=probe) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT_S)
        self.assertEqual(answers, [200] * 6)
        # Two router workers: at most two probes went out.
        self.assertLessEqual(len(completions(self.cluster.decodes[0])), 2)
        self.assertGreaterEqual(counted(self.cluster, "shared") + counted(self.cluster, "reused") - before, 4)


class HealthGenerateFailures(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("nixl", prefills=1, decodes=1)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def wait_past_reuse(self):
        return fresh_probe(self.cluster)

    def test_a_failing_leg_is_named(self):
        self.cluster.decodes[0].set_fault(status=500, count=-1)
        self.addCleanup(self.cluster.decodes[0].clear_faults)
        code, raw = self.wait_past_reuse()
        self.assertEqual(code, 503, raw)
        error = json.loads(raw)["error"]
        self.assertEqual(error["code"], "decode_failed", error)
        self.assertIn("decode leg", error["message"])
        self.cluster.decodes[0].clear_faults()
        self.cluster.prefills[0].set_fault(status=500, count=-1)
        self.addCleanup(self.cluster.prefills[0].clear_faults)
        code, raw = self.wait_past_reuse()
        self.assertEqual(code, 503, raw)
        error = json.loads(raw)["error"]
        self.assertEqual(error["code"], "prefill_failed", error)
        self.assertIn("prefill leg", error["message"])
        self.assertGreaterEqual(counted(self.cluster, "failed"), 2)


class HealthGenerateWithoutAPair(unittest.TestCase):
    def test_503_at_once(self):
        router = Router()
        self.addCleanup(router.stop)
        code, _, raw = router.request("GET", "/health_generate")
        self.assertEqual(code, 503, raw)
        self.assertEqual(json.loads(raw)["error"]["code"], "no_pair")
        self.assertEqual(router.metrics().get('pdrouter_health_generate_total{result="no_pair"}'), 1)
        self.assertEqual(router.metrics().get('pdrouter_requests_total{outcome="done"}', 0), 0)


if __name__ == "__main__":
    unittest.main()
