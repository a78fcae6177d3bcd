"""Latency histograms in /metrics, end to end through pdrouter with `pdnode sim` nodes (NIXL):

  * pdrouter_request_duration_seconds{outcome}: one observation per P/D request, under the
    outcome pdrouter_requests_total counts it in (a decode failing everywhere: "failed"; a
    client leaving mid-stream: "cancelled");
  * pdrouter_time_to_first_byte_seconds: one per answer that reached the client (JSON and streams);
  * pdrouter_leg_duration_seconds{leg}: one per leg attempt (answered or failed);
  * pdrouter_pd_{prefill,handover,decode}_seconds{dialect}: per connector dialect, one prefill and
    one decode observation per P/D request answered, one handover per streamed one; a serial
    dialect (NIXL) and a concurrent one (NIXL push) each land under their own label only, and a
    prefill held back by a fault shows in the prefill phase (and, concurrent, in the decode's);
  * every series has the 18 finite buckets plus +Inf, cumulative counts never go down, +Inf equals
    _count, and _sum is positive once something was observed.
"""
import re
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

WAIT_S = 15.0 * TIME_SCALE
LE = ["0.0005", "0.001", "0.0025", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5", "1",
      "2.5", "5", "10", "30", "60", "120", "300", "+Inf"]
OUTCOMES = ("done", "failed", "cancelled")


def completion(max_tokens=3, **extra):
    body = {"model": "sim-model", "prompt": "Hello there, how are you?", "max_tokens": max_tokens}
    body.update(extra)
    return body


def series(metrics, family, labels=""):
    """(buckets {le: count} in LE order, sum, count) of one histogram series; `labels` is the
    series' own labels as exported ('outcome="done"'), "" for none."""
    prefix = labels + "," if labels else ""
    buckets = {}
    for le in LE:
        key = '%s_bucket{%sle="%s"}' % (family, prefix, le)
        assert key in metrics, "missing %s" % key
        buckets[le] = metrics[key]
    suffix = "{%s}" % labels if labels else ""
    return buckets, metrics["%s_sum%s" % (family, suffix)], metrics["%s_count%s" % (family, suffix)]


class HistogramCase(unittest.TestCase):
    """A cluster per class and the /metrics readers; no tests of its own."""
    DECODE_FLAGS = ()

    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("nixl", prefills=1, decodes=1, decode_flags=cls.DECODE_FLAGS)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def metrics(self):
        return self.cluster.router.metrics()

    def assert_well_formed(self, metrics, family, labels=""):
        buckets, total, count = series(metrics, family, labels)
        values = [buckets[le] for le in LE]
        self.assertEqual(values, sorted(values), "%s{%s} buckets go down: %s" % (family, labels, values))
        self.assertEqual(buckets["+Inf"], count, "%s{%s}: +Inf != _count" % (family, labels))
        if count > 0:
            self.assertGreater(total, 0, "%s{%s}: _sum" % (family, labels))
        return count

    def counts(self):
        """The observation counts pdrouter exports, after checking every series' shape."""
        m = self.metrics()
        out = {o: self.assert_well_formed(m, "pdrouter_request_duration_seconds", 'outcome="%s"' % o)
               for o in OUTCOMES}
        out["ttfb"] = self.assert_well_formed(m, "pdrouter_time_to_first_byte_seconds")
        for leg in ("prefill", "decode"):
            out[leg] = self.assert_well_formed(m, "pdrouter_leg_duration_seconds", 'leg="%s"' % leg)
        for o in OUTCOMES:  # the histogram counts what pdrouter_requests_total counts
            self.assertEqual(out[o], m['pdrouter_requests_total{outcome="%s"}' % o], o)
        out["decode_failures"] = sum(v for k, v in m.items()
                                     if k.startswith('pdrouter_leg_failures_total{leg="decode"'))
        return out

    def wait_counts(self, predicate):
        """Polls /metrics until predicate(counts) (a request is recorded as it ends, which can be
        just after its client got the answer); returns the counts."""
        found, _ = self.cluster.router.wait_for(lambda: (lambda c: c if predicate(c) else None)(self.counts()),
                                                timeout=WAIT_S)
        return found


class LatencyHistograms(HistogramCase):
    def test_requests_ttfb_and_legs_are_counted_and_a_failed_decode_lands_in_failed(self):
        c = self.cluster
        before = self.counts()
        json_requests, streams = 3, 2
        for _ in range(json_requests):
            status, _, body = c.post("/v1/completions", completion(), timeout=WAIT_S)
            self.assertEqual(status, 200, body)
        for _ in range(streams):
            with c.stream("/v1/completions", completion(stream=True), timeout=WAIT_S) as events:
                self.assertEqual(events.status, 200)
                self.assertEqual(list(events)[-1], "[DONE]")
        n = json_requests + streams
        after = self.wait_counts(lambda k: k["done"] == before["done"] + n and k["decode"] == before["decode"] + n)
        self.assertEqual(after["ttfb"], before["ttfb"] + n)
        self.assertEqual(after["prefill"], before["prefill"] + n)
        self.assertEqual(after["failed"], before["failed"])

        # A decode answering 500 to every attempt: the request fails (502), each failed decode
        # attempt is a leg observation, and no answer byte reached the client.
        c.decodes[0].set_fault(status=500, count=-1)
        try:
            status, _, body = c.post("/v1/completions", completion(), timeout=WAIT_S)
        finally:
            c.decodes[0].clear_faults()
        self.assertEqual(status, 502, body)
        final = self.wait_counts(lambda k: k["failed"] == after["failed"] + 1)
        self.assertEqual(final["done"], after["done"])
        self.assertEqual(final["ttfb"], after["ttfb"])
        self.assertGreaterEqual(final["decode_failures"], after["decode_failures"] + 1)
        self.assertEqual(final["decode"] - after["decode"], final["decode_failures"] - after["decode_failures"])
        self.assertGreaterEqual(final["prefill"], after["prefill"] + 1)

    def test_metric_text_declares_three_histogram_families(self):
        _, _, body = self.cluster.router.request("GET", "/metrics", admin=True)
        text = body.decode()
        for family in ("pdrouter_request_duration_seconds", "pdrouter_time_to_first_byte_seconds",
                       "pdrouter_leg_duration_seconds", "pdrouter_pd_prefill_seconds",
                       "pdrouter_pd_handover_seconds", "pdrouter_pd_decode_seconds"):
            self.assertEqual(len(re.findall(r"^# TYPE %s histogram$" % family, text, re.M)), 1, family)
            self.assertEqual(len(re.findall(r"^# HELP %s " % family, text, re.M)), 1, family)
        # le is the last label of every bucket.
        for line in text.splitlines():
            if "_bucket{" in line and line.startswith("pdrouter_"):
                self.assertRegex(line, r',?le="[^"]+"\} \d+$')


DIALECTS = ("nixl", "moriio-read", "moriio-write", "mooncake", "p2p-nccl", "sglang", "nixl-push")
PHASES = ("prefill", "handover", "decode")


class PdPhaseCase:
    """Mixin: JSON and streamed requests through CONNECTOR's pair, the prefill held back by
    DELAY_MS; each phase is counted under that dialect alone."""
    CONNECTOR = None
    DELAY_MS = int(300 * TIME_SCALE)

    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster(cls.CONNECTOR, prefills=1, decodes=1)

    def phase_counts(self):
        m = self.metrics()
        return {(d, ph): series(m, "pdrouter_pd_%s_seconds" % ph, 'dialect="%s"' % d)
                for d in DIALECTS for ph in PHASES}

    def test_each_phase_is_observed_under_its_dialect(self):
        c = self.cluster
        json_requests, streams = 2, 2
        c.prefills[0].set_fault(delay_ms=self.DELAY_MS, count=-1)
        try:
            for _ in range(json_requests):
                status, _, body = c.post("/v1/completions", completion(), timeout=WAIT_S)
                self.assertEqual(status, 200, body)
            for _ in range(streams):
                with c.stream("/v1/completions", completion(stream=True), timeout=WAIT_S) as events:
                    self.assertEqual(list(events)[-1], "[DONE]")
        finally:
            c.prefills[0].clear_faults()
        n = json_requests + streams
        want = {"prefill": n, "handover": streams, "decode": n}
        found, _ = c.router.wait_for(
            lambda: (lambda k: k if all(k[(self.CONNECTOR, ph)][2] == want[ph] for ph in PHASES) else None)(
                self.phase_counts()), timeout=WAIT_S)
        m = self.metrics()
        for d in DIALECTS:
            for ph in PHASES:
                count = self.assert_well_formed(m, "pdrouter_pd_%s_seconds" % ph, 'dialect="%s"' % d)
                self.assertEqual(count, want[ph] if d == self.CONNECTOR else 0, (d, ph))
        prefill_sum = found[(self.CONNECTOR, "prefill")][1]
        self.assertGreaterEqual(prefill_sum, n * self.DELAY_MS / 1000.0)
        if self.CONNECTOR == "nixl-push":
            # Sent with the prefill, the decode waited for its KV: longer than the prefill's delay.
            self.assertGreaterEqual(found[(self.CONNECTOR, "decode")][1], n * self.DELAY_MS / 1000.0)
        self.assertGreater(found[(self.CONNECTOR, "handover")][1], 0)
        self.assertLess(found[(self.CONNECTOR, "handover")][1], found[(self.CONNECTOR, "decode")][1])


class SerialPhases(PdPhaseCase, HistogramCase):
    CONNECTOR = "nixl"


class ConcurrentPhases(PdPhaseCase, HistogramCase):
    CONNECTOR = "nixl-push"


class CancelledStream(HistogramCase):
    """A client that leaves after the first event of a slow stream: its request is observed once
    under "cancelled", its first byte once, and its decode leg (closed by pdrouter) not at all."""
    DECODE_FLAGS = ("--decode-us-per-token", "100000")

    def test_client_leaving_mid_stream_is_cancelled(self):
        c = self.cluster
        before = self.counts()
        stream = c.stream("/v1/completions", completion(max_tokens=50, stream=True), timeout=WAIT_S)
        try:
            self.assertEqual(stream.status, 200)
            next(iter(stream))
        finally:
            stream.close()
        after = self.wait_counts(lambda k: k["cancelled"] == before["cancelled"] + 1)
        self.assertEqual(after["ttfb"], before["ttfb"] + 1)
        self.assertEqual(after["done"], before["done"])
        self.assertEqual(after["prefill"], before["prefill"] + 1)
        self.assertEqual(after["decode"], before["decode"], "a leg pdrouter closed is not observed")
        _, total, _ = series(self.metrics(), "pdrouter_request_duration_seconds", 'outcome="cancelled"')
        self.assertGreater(total, 0)


if __name__ == "__main__":
    unittest.main()
