"""OpenTelemetry traces of P/D requests (tracing:), exported over OTLP/HTTP JSON to a stand-in
collector (otlp_collector.py) that decodes what it receives, with simulated NIXL nodes that
record the headers they get (GET /sim/requests):

  * one request gives a server span, a route span, the prefill and decode client spans and the
    handover span, all in one trace, the legs' and the others' parent being the server span; each
    sim received a traceparent naming its own leg's span; attributes follow OpenTelemetry's HTTP
    and GenAI conventions;
  * a client's sampled traceparent (and tracestate) is honoured: its trace id, its span as the
    parent; an unsampled one is passed on to the nodes as it came and nothing is recorded; a
    malformed one is counted and a new trace starts; sampling_ratio 0 records nothing and adds
    no header;
  * a collector that is down or never answers does not slow requests: failed exports and
    dropped spans are counted, and a full queue drops spans (counted) instead of growing.
"""
import json
import time
import unittest

from otlp_collector import Collector, dead_endpoint
from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

COMPLETION = {"model": "sim-model", "prompt": "trace me", "max_tokens": 4}
CHAT_STREAM = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
               "stream": True}
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"


def topology(endpoint, ratio=1, extra=""):
    return f"""
connectors:
  default: nixl
tracing:
  endpoint: "{endpoint}"
  sampling_ratio: {ratio}
  service_name: pdrouter-it
  batch_ms: 50
{extra}"""


def by_trace(spans, trace_id):
    return [s for s in spans if s["traceId"] == trace_id]


def leg_requests(node, path):
    return [r for r in node.sim_requests()["requests"] if r["path"] == path]


class Tracing(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.collector = Collector()
        cls.cluster = PdCluster("nixl", topology=topology(cls.collector.endpoint))

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()
        cls.collector.close()

    def setUp(self):
        for node in self.cluster.prefills + self.cluster.decodes:
            node.reset()

    def spans_of(self, trace_id, count):
        return by_trace(self.collector.wait_for(lambda spans: len(by_trace(spans, trace_id)) >= count),
                        trace_id)

    def test_a_pd_request_is_one_trace_with_both_legs_and_the_handover(self):
        status, headers, body = self.cluster.post("/v1/completions", COMPLETION)
        self.assertEqual(status, 200, body)
        request_id = headers["x-request-id"]
        prefill_seen = leg_requests(self.cluster.prefills[0], "/v1/completions")[-1]["headers"]
        decode_seen = leg_requests(self.cluster.decodes[0], "/v1/completions")[-1]["headers"]
        trace_id = prefill_seen["traceparent"].split("-")[1]
        self.assertEqual(decode_seen["traceparent"].split("-")[1], trace_id)  # the same trace on both legs
        spans = {s["name"]: s for s in self.spans_of(trace_id, 5)}
        self.assertEqual(sorted(spans), ["POST /v1/completions", "decode", "handover", "prefill", "route"])
        server = spans["POST /v1/completions"]
        self.assertNotIn("parentSpanId", server)  # the root: the client sent no traceparent
        self.assertEqual(server["kind"], 2)
        for name in ("route", "prefill", "decode", "handover"):
            self.assertEqual(spans[name]["parentSpanId"], server["spanId"], name)
        self.assertEqual((spans["prefill"]["kind"], spans["decode"]["kind"]), (3, 3))
        # Each node got a traceparent naming its own leg's span: its spans join the trace there.
        self.assertEqual(prefill_seen["traceparent"], "00-%s-%s-01" % (trace_id, spans["prefill"]["spanId"]))
        self.assertEqual(decode_seen["traceparent"], "00-%s-%s-01" % (trace_id, spans["decode"]["spanId"]))
        # The handover lies between the prefill's end and the decode's first byte.
        self.assertGreaterEqual(int(spans["handover"]["startTimeUnixNano"]), int(spans["prefill"]["endTimeUnixNano"]))
        self.assertGreaterEqual(int(spans["handover"]["endTimeUnixNano"]), int(spans["decode"]["startTimeUnixNano"]))
        a = server["_attributes"]
        self.assertEqual(a["http.request.method"], "POST")
        self.assertEqual(a["url.path"], "/v1/completions")
        self.assertEqual(a["http.response.status_code"], 200)
        self.assertEqual(a["gen_ai.request.model"], "sim-model")
        self.assertEqual(a["gen_ai.operation.name"], "text_completion")
        self.assertGreater(a["gen_ai.usage.input_tokens"], 0)
        self.assertGreater(a["gen_ai.usage.output_tokens"], 0)
        self.assertEqual(a["pdrouter.request_id"], request_id)
        self.assertEqual(a["client.address"], "127.0.0.1")
        self.assertEqual(server["_resource"]["service.name"], "pdrouter-it")
        for leg, node in (("prefill", self.cluster.prefills[0]), ("decode", self.cluster.decodes[0])):
            la = spans[leg]["_attributes"]
            self.assertEqual("%s:%d" % (la["server.address"], la["server.port"]), node.http_address)
            self.assertEqual(la["http.response.status_code"], 200)
            self.assertEqual(la["url.full"], "http://%s/v1/completions" % node.http_address)
        route = spans["route"]["_attributes"]
        self.assertEqual(route["pdrouter.prefill.node"], self.cluster.prefills[0].http_address)
        self.assertEqual(route["pdrouter.decode.node"], self.cluster.decodes[0].http_address)

    def test_a_sampled_client_traceparent_is_honoured_on_a_stream(self):
        parent = "00-%s-%s-01" % (CLIENT_TRACE, CLIENT_SPAN)
        headers = {"traceparent": parent, "tracestate": "vendor=opaque"}
        with self.cluster.stream("/v1/chat/completions", CHAT_STREAM, headers=headers) as stream:
            self.assertEqual(stream.status, 200)
            self.assertEqual(list(stream)[-1], "[DONE]")
        spans = {s["name"]: s for s in self.spans_of(CLIENT_TRACE, 5)}
        server = spans["POST /v1/chat/completions"]
        self.assertEqual(server["parentSpanId"], CLIENT_SPAN)
        self.assertEqual(server["traceState"], "vendor=opaque")
        self.assertEqual(server["_attributes"]["gen_ai.operation.name"], "chat")
        for node, leg in ((self.cluster.prefills[0], "prefill"), (self.cluster.decodes[0], "decode")):
            seen = leg_requests(node, "/v1/chat/completions")[-1]["headers"]
            self.assertEqual(seen["traceparent"], "00-%s-%s-01" % (CLIENT_TRACE, spans[leg]["spanId"]))
            self.assertEqual(seen["tracestate"], "vendor=opaque")

    def test_an_unsampled_client_traceparent_is_passed_on_and_nothing_recorded(self):
        unsampled_trace = "0af7651916cd43dd8448eb211c80319c"
        parent = "00-%s-b7ad6b7169203331-00" % unsampled_trace
        status, _, body = self.cluster.post("/v1/completions", COMPLETION, headers={"traceparent": parent})
        self.assertEqual(status, 200, body)
        for node in (self.cluster.prefills[0], self.cluster.decodes[0]):
            self.assertEqual(leg_requests(node, "/v1/completions")[-1]["headers"]["traceparent"], parent)
        # A sampled request after it: once its spans are in, the earlier ones would be too.
        marker = "11111111111111111111111111111111"
        self.cluster.post("/v1/completions", COMPLETION,
                          headers={"traceparent": "00-%s-%s-01" % (marker, CLIENT_SPAN)})
        spans = self.collector.wait_for(lambda s: len(by_trace(s, marker)) >= 5)
        self.assertEqual(by_trace(spans, unsampled_trace), [])

    def test_a_malformed_traceparent_is_counted_and_a_new_trace_starts(self):
        before = self.cluster.metric("pdrouter_trace_invalid_traceparent_total")
        status, _, body = self.cluster.post("/v1/completions", COMPLETION,
                                            headers={"traceparent": "00-XYZ-not-a-trace-context"})
        self.assertEqual(status, 200, body)
        self.assertEqual(self.cluster.metric("pdrouter_trace_invalid_traceparent_total"), before + 1)
        seen = leg_requests(self.cluster.prefills[0], "/v1/completions")[-1]["headers"]["traceparent"]
        self.assertRegex(seen, r"^00-[0-9a-f]{32}-[0-9a-f]{16}-01$")
        self.spans_of(seen.split("-")[1], 5)


class TracingSampledOut(unittest.TestCase):
    def test_ratio_zero_records_nothing_and_adds_no_header(self):
        collector = Collector()
        self.addCleanup(collector.close)
        cluster = PdCluster("nixl", topology=topology(collector.endpoint, ratio=0))
        self.addCleanup(cluster.close)
        status, _, body = cluster.post("/v1/completions", COMPLETION)
        self.assertEqual(status, 200, body)
        self.assertNotIn("traceparent", leg_requests(cluster.prefills[0], "/v1/completions")[-1]["headers"])
        # A sampled client parent is still honoured at ratio 0 (parent-based).
        cluster.post("/v1/completions", COMPLETION,
                     headers={"traceparent": "00-%s-%s-01" % (CLIENT_TRACE, CLIENT_SPAN)})
        spans = collector.wait_for(lambda s: len(by_trace(s, CLIENT_TRACE)) >= 5)
        self.assertEqual({s["traceId"] for s in spans}, {CLIENT_TRACE})


class TracingCollectorTrouble(unittest.TestCase):
    def run_requests(self, cluster, n):
        slowest = 0.0
        for _ in range(n):
            start = time.monotonic()
            status, _, body = cluster.post("/v1/completions", COMPLETION)
            slowest = max(slowest, time.monotonic() - start)
            self.assertEqual(status, 200, body)
        return slowest

    def check(self, endpoint, queue=8192):
        # An export may take 3 s before it is given up: a request that waited for one would take
        # at least that long.
        extra = f"""  export_timeout_ms: {int(3000 * TIME_SCALE)}
  max_queue_spans: {queue}
  max_batch_spans: 16"""
        cluster = PdCluster("nixl", topology=topology(endpoint, extra=extra))
        self.addCleanup(cluster.close)
        slowest = self.run_requests(cluster, 30)
        self.assertLess(slowest, 1.0 * TIME_SCALE)
        cluster.router.wait_for(lambda: cluster.metric('pdrouter_trace_exports_total{result="failed"}') >= 1, timeout=15)
        metrics = cluster.router.metrics()
        self.assertEqual(metrics['pdrouter_trace_exports_total{result="ok"}'], 0)
        self.assertEqual(metrics['pdrouter_trace_spans_total{result="exported"}'], 0)
        dropped = (metrics['pdrouter_trace_spans_total{result="dropped_export_failed"}'] +
                   metrics['pdrouter_trace_spans_total{result="dropped_queue_full"}'])
        self.assertGreater(dropped, 0)
        return metrics

    def test_a_collector_that_is_down_never_delays_requests(self):
        self.check(dead_endpoint())

    def test_a_collector_that_never_answers_never_delays_requests_and_the_queue_stays_bounded(self):
        collector = Collector(mode="silent")
        self.addCleanup(collector.close)
        metrics = self.check(collector.endpoint, queue=16)
        self.assertGreater(metrics['pdrouter_trace_spans_total{result="dropped_queue_full"}'], 0)
        self.assertLessEqual(metrics["pdrouter_trace_queue_spans"], 16)


if __name__ == "__main__":
    unittest.main()
