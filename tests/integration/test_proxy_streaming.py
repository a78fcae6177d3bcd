"""Streaming through pdrouter: each SSE event reaches the client while the decode node is still
generating (no buffering in the router), and the end of the stream (finish_reason, usage,
data: [DONE]) arrives intact."""
import json
import time
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

TOKEN_US = 200000  # 200 ms per decoded token: a 10-token stream lasts ~2 s
TOKENS = 10


class StreamingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("moriio", transfer_mode="READ",
                                decode_flags=("--decode-us-per-token", str(TOKEN_US)))

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def stream_and_check(self, path, body):
        decode = self.cluster.decodes[0]
        decode.reset()
        start = time.monotonic()
        with self.cluster.stream(path, body, timeout=30) as events:
            self.assertEqual(events.status, 200)
            self.assertTrue(dict(events.headers)["Content-Type"].startswith("text/event-stream"))
            payloads = []
            first_token_at = None
            for payload in events:
                payloads.append(payload)
                if first_token_at is None and payload != "[DONE]":
                    chunk = json.loads(payload)
                    if any((c.get("delta") or {}).get("content") or c.get("text")
                           for c in chunk.get("choices", [])):
                        first_token_at = time.monotonic() - start
                        # The decode has not finished: its request is still unanswered.
                        log = decode.sim_requests()
                        [leg] = [r for r in log["requests"] if r["path"] == path]
                        self.assertEqual(leg["status"], 0, "decode already finished")
        total = time.monotonic() - start
        self.assertIsNotNone(first_token_at)
        # MoRIIO decodes max_tokens - 1 tokens: the stream lasts ~(TOKENS - 1) x 200 ms; the
        # first token must come long before its end.
        self.assertGreaterEqual(total, (TOKENS - 2) * TOKEN_US / 1e6)
        self.assertLess(first_token_at, total / 2)
        self.assertEqual(payloads[-1], "[DONE]")
        chunks = [json.loads(p) for p in payloads[:-1]]
        self.assertFalse(any("error" in c for c in chunks), chunks)
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
        self.assertEqual(finishes[-1], "length")
        usage = [c["usage"] for c in chunks if c.get("usage")]
        self.assertEqual(len(usage), 1, chunks)
        self.assertEqual(usage[0]["total_tokens"],
                         usage[0]["prompt_tokens"] + usage[0]["completion_tokens"])

    def test_chat_stream_is_relayed_as_generated(self):
        self.stream_and_check("/v1/chat/completions", {
            "model": "sim-model", "messages": [{"role": "user", "content": "tell me a story"}],
            "max_tokens": TOKENS, "stream": True, "stream_options": {"include_usage": True}})

    def test_completion_stream_is_relayed_as_generated(self):
        self.stream_and_check("/v1/completions", {
            "model": "sim-model", "prompt": "once upon a time", "max_tokens": TOKENS,
            "stream": True, "stream_options": {"include_usage": True}})


if __name__ == "__main__":
    unittest.main()
