"""The access log (topology access_log:), end to end: a real pdrouter in front of real `pdnode sim`
nodes (NIXL) writes one JSON line per client request, with the fields docs/endpoints.md lists ("Client keys, tenants and the access log"),
for P/D requests streamed and not and for refused ones; SIGUSR1 (logrotate) reopens the file;
and an output that takes nothing (a FIFO nobody reads) makes pdrouter drop lines, counted, while
every request is still answered at once.
"""
import fcntl
import json
import os
import signal
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402
from pdrouter_fixture import TIME_SCALE  # noqa: E402

MODEL = "sim-model"
F_SETPIPE_SZ = 1031  # fcntl.h (Linux)
KEY = "sk-logged-3e9d1a7c5b2f8e40"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
FIELDS = ["time", "request_id", "trace_id", "client", "tenant", "method", "path", "status", "outcome", "stream",
          "prefill", "decode", "prefill_rank", "decode_rank", "retries", "prompt_tokens", "output_tokens",
          "cache_source", "cache_matched", "cache_prompt", "queue_ms", "ttft_ms", "total_ms", "bytes_in",
          "bytes_out"]


def read_lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class AccessLogLines(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="pdr-alog-")
        cls.log_path = os.path.join(cls.tmp.name, "access.log")
        keys = os.path.join(cls.tmp.name, "clients.keys")
        with open(keys, "w") as f:
            f.write(KEY + " team-log\n")
        cls.cluster = PdCluster("nixl", topology="client_auth: {keys_file: %s}\naccess_log: {path: %s}\n" % (
            keys, cls.log_path))
        cls.p, cls.d = cls.cluster.prefills[0], cls.cluster.decodes[0]
        cls.headers = {"Authorization": "Bearer " + KEY}

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()
        cls.tmp.cleanup()

    def line_where(self, predicate, path=None):
        """The first line of the log matching `predicate`, waiting for the writer."""
        found = self.cluster.router.wait_for(
            lambda: next((line for line in read_lines(path or self.log_path) if predicate(line)), None))[0]
        self.assertEqual(list(found), FIELDS)  # every field, in order
        return found

    def check_pd_line(self, line, status, stream, body_bytes, answer_bytes):
        self.assertEqual(line["tenant"], "team-log")
        self.assertEqual(line["client"], "127.0.0.1")
        self.assertEqual((line["method"], line["path"]), ("POST", "/v1/completions"))
        self.assertEqual((line["status"], line["outcome"], line["stream"]), (status, "done", stream))
        self.assertEqual(line["prefill"], self.p.http_address)
        self.assertEqual(line["decode"], self.d.http_address)
        self.assertIsNone(line["prefill_rank"])  # dp_size 1: no rank header
        self.assertIsNone(line["decode_rank"])
        self.assertEqual(line["retries"], 0)
        self.assertEqual(line["prompt_tokens"], 5)  # the sim counts the prompt's words
        self.assertEqual(line["output_tokens"], 3)
        self.assertIsNone(line["cache_source"])  # round_robin: no cache lookup
        self.assertEqual(line["queue_ms"], 0)
        self.assertGreater(line["ttft_ms"], 0)
        self.assertGreaterEqual(line["total_ms"], line["ttft_ms"])
        self.assertEqual(line["bytes_in"], body_bytes)
        self.assertEqual(line["bytes_out"], answer_bytes)
        self.assertRegex(line["time"], r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

    def test_a_pd_request_not_streamed(self):
        body = json.dumps({"model": MODEL, "prompt": "Tell me about the sea", "max_tokens": 3})
        status, head, raw = self.cluster.request("POST", "/v1/completions", body,
                                                 headers=dict(self.headers, traceparent=TRACEPARENT))
        self.assertEqual(status, 200, raw)
        line = self.line_where(lambda l: l["request_id"] == head["x-request-id"])
        self.check_pd_line(line, 200, False, len(body), len(raw))
        self.assertEqual(line["trace_id"], "4bf92f3577b34da6a3ce929d0e0e4736")
        with open(self.log_path) as f:
            self.assertNotIn(KEY, f.read())

    def test_a_pd_request_streamed(self):
        body = json.dumps({"model": MODEL, "prompt": "Tell me about the sea", "max_tokens": 3, "stream": True,
                           "stream_options": {"include_usage": True}})
        status, head, raw = self.cluster.request("POST", "/v1/completions", body, headers=self.headers)
        self.assertEqual(status, 200, raw)
        self.assertTrue(raw.endswith(b"data: [DONE]\n\n"))
        line = self.line_where(lambda l: l["request_id"] == head["x-request-id"])
        self.check_pd_line(line, 200, True, len(body), len(raw))
        self.assertIsNone(line["trace_id"])  # no traceparent sent

    def test_refused_requests(self):
        # A wrong key: refused before any tenant is known.
        status, _, raw = self.cluster.request("POST", "/v1/chat/completions", {"model": MODEL, "messages": []},
                                              headers={"Authorization": "Bearer sk-wrong-000000000000"})
        self.assertEqual(status, 401, raw)
        line = self.line_where(lambda l: l["path"] == "/v1/chat/completions" and l["status"] == 401)
        self.assertEqual((line["outcome"], line["method"], line["tenant"]), ("refused", "POST", None))
        self.assertEqual((line["request_id"], line["prefill"], line["decode"], line["ttft_ms"]), (None, None, None, None))
        self.assertEqual(line["bytes_out"], len(raw))
        # A body pdrouter refuses itself (400): no node was asked.
        status, _, raw = self.cluster.request("POST", "/v1/completions", "{not json", headers=self.headers)
        self.assertEqual(status, 400, raw)
        line = self.line_where(lambda l: l["path"] == "/v1/completions" and l["status"] == 400)
        self.assertEqual((line["outcome"], line["tenant"], line["bytes_in"]), ("refused", "team-log", 9))
        self.assertIsNone(line["decode"])
        # A one-node request has its line too, its node as the decode.
        status, _, raw = self.cluster.request("POST", "/tokenize", {"model": MODEL, "prompt": "hi"}, headers=self.headers)
        self.assertEqual(status, 200, raw)
        line = self.line_where(lambda l: l["path"] == "/tokenize")
        self.assertEqual((line["status"], line["outcome"]), (200, "done"))
        self.assertIn(line["decode"], (self.p.http_address, self.d.http_address))
        self.assertEqual(line["bytes_out"], len(raw))

    def test_sigusr1_reopens_the_file(self):
        status, _, _ = self.cluster.request("POST", "/tokenize", {"model": MODEL, "prompt": "before"},
                                            headers=self.headers)
        self.assertEqual(status, 200)
        self.line_where(lambda l: l["path"] == "/tokenize")
        rotated = self.log_path + ".1"
        os.rename(self.log_path, rotated)  # what logrotate does, then its postrotate sends USR1
        self.cluster.router.process.send_signal(signal.SIGUSR1)
        self.cluster.router.wait_for(lambda: "reopening the access log" in self.cluster.router.log())
        body = {"model": MODEL, "prompt": "after the rotation", "max_tokens": 2}
        status, head, _ = self.cluster.request("POST", "/v1/completions", body, headers=self.headers)
        self.assertEqual(status, 200)
        line = self.line_where(lambda l: l["request_id"] == head["x-request-id"])
        self.assertEqual(line["status"], 200)
        self.assertFalse(any(l["request_id"] == head["x-request-id"] for l in read_lines(rotated)))
        self.assertTrue(os.path.exists(self.log_path))


class BlockedOutput(unittest.TestCase):
    """The log's output is a FIFO whose reader never reads: the pipe fills, the writer waits on it,
    its queue fills, and lines are dropped; requests are answered as fast as ever."""

    def test_lines_are_dropped_never_waited_for(self):
        with tempfile.TemporaryDirectory(prefix="pdr-alog-") as tmp:
            fifo = os.path.join(tmp, "access.fifo")
            os.mkfifo(fifo)
            reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # held open, never read
            fcntl.fcntl(reader, F_SETPIPE_SZ, 4096)  # one page: a dozen lines fill it
            try:
                cluster = PdCluster("nixl", topology="access_log: {path: %s, max_queued_lines: 16}\n" % fifo)
                try:
                    body = {"model": MODEL, "prompt": "hi"}
                    slowest = 0.0
                    start = time.monotonic()
                    for _ in range(300):
                        t0 = time.monotonic()
                        status, _, raw = cluster.request("POST", "/tokenize", body)
                        slowest = max(slowest, time.monotonic() - t0)
                        self.assertEqual(status, 200, raw)
                    elapsed = time.monotonic() - start
                    metrics = cluster.router.metrics()
                    dropped = metrics["pdrouter_access_log_dropped_total"]
                    written = metrics["pdrouter_access_log_lines_total"]
                    # The pipe holds about a dozen lines and the queue 16: nearly all of the 300
                    # are dropped.
                    self.assertGreater(dropped, 250)
                    self.assertLess(written, 50)
                    self.assertLessEqual(dropped + written, 300)  # the rest wait in the queue
                    # No request waited for the log (a blocked writer would hold each one forever).
                    self.assertLess(slowest, 1.0 * TIME_SCALE)
                    self.assertLess(elapsed, 30 * TIME_SCALE)
                finally:
                    cluster.close()  # the writer gives up on the blocked pipe within a second
            finally:
                os.close(reader)


if __name__ == "__main__":
    unittest.main()
