"""vLLM's tokens-in POST /inference/v1/generate through pdrouter's P/D pipeline, end to end with a
real pdrouter and real `pdnode sim` nodes, and the seed's render -> generate flow
(example_mm_serve.py: the render answer is posted to generate unchanged, plus sampling_params).

Checked from the sims' request logs: the prefill leg got sampling_params.max_tokens 1 and stream
off; the decode leg got the client's sampling_params and the prefill's kv_transfer_params both at
the top level and in sampling_params.extra_args (where vLLM's generate handler passes them on);
the answer carries token ids, stream and not. NIXL, MoRIIO READ, Mooncake and P2P-NCCL serve it; SGLang is
refused with a 501 naming the dialect. Bad bodies get OpenAI-style 400s, counted in
pdrouter_requests_refused_total{reason="bad_parameter"}.
"""
import json
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402
from pdrouter_fixture import TIME_SCALE  # noqa: E402
from sim_fixture import SimNode  # noqa: E402

MODEL = "sim-model"
GENERATE = "/inference/v1/generate"
WAIT_S = 15.0 * TIME_SCALE
IMAGE_CHAT = {"model": MODEL, "messages": [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    {"type": "text", "text": "What color is this image? Answer in one word."}]}]}


def generate_entries(node, count):
    """The node's generate requests once `count` of them were answered."""
    def done(log):
        entries = [r for r in log["requests"] if r["path"] == GENERATE]
        return len(entries) >= count and all(r["status"] != 0 or r["aborted"] for r in entries)
    log = node.wait_for_requests(done, WAIT_S)
    return [r for r in log["requests"] if r["path"] == GENERATE]


class SimGenerate(unittest.TestCase):
    """The simulator's side alone: vLLM's GenerateResponse and where it reads the KV params."""

    @classmethod
    def setUpClass(cls):
        cls.sim = SimNode("--role", "decode", "--connector", "nixl", "--kv-backends", "none")

    @classmethod
    def tearDownClass(cls):
        cls.sim.stop()

    def test_answer_shape_and_max_tokens(self):
        status, body = self.sim.post_json(GENERATE, {"model": MODEL, "token_ids": [5, 6, 7],
                                                     "sampling_params": {"max_tokens": 4}},
                                          headers={"X-Request-Id": "abc"})
        self.assertEqual(status, 200, body)
        self.assertEqual(body["request_id"], "generate-tokens-abc")
        self.assertEqual(len(body["choices"][0]["token_ids"]), 4)
        self.assertEqual(body["choices"][0]["finish_reason"], "length")
        self.assertIsNone(body["kv_transfer_params"])
        self.assertEqual(body["usage"]["prompt_tokens"], 3)

    def test_refusals(self):
        for bad in ({"token_ids": [1]}, {"token_ids": [], "sampling_params": {}},
                    {"token_ids": [-1], "sampling_params": {}},
                    {"token_ids": [1], "sampling_params": {"max_tokens": 0}},
                    {"token_ids": [1], "sampling_params": {"extra_args": {"kv_transfer_params": {"a": 1}}},
                     "kv_transfer_params": {"a": 2}}):
            status, body = self.sim.post_json(GENERATE, bad)
            self.assertEqual(status, 400, (bad, body))


class RenderThenGenerate:
    """The seed's flow on one dialect (mixed into a TestCase per dialect below)."""
    CONNECTOR = None
    TRANSFER_MODE = None
    DECODE_MAX_TOKENS_DELTA = 0  # MoRIIO's decode counts the prefill's token
    CONCURRENT = False  # the prefill leg may be closed once the decode answered (Mooncake)

    @classmethod
    def setUpClass(cls):
        cls.c = PdCluster(cls.CONNECTOR, transfer_mode=cls.TRANSFER_MODE, kv_backends="none")

    @classmethod
    def tearDownClass(cls):
        cls.c.close()

    def setUp(self):
        for node in self.c.prefills + self.c.decodes:
            node.reset()

    def render(self):
        status, _, raw = self.c.post("/v1/chat/completions/render", IMAGE_CHAT)
        self.assertEqual(status, 200, raw)
        body = json.loads(raw)
        self.assertTrue(body["token_ids"], body)
        return body

    def check_legs(self, max_tokens, stream):
        pre = generate_entries(self.c.prefills[0], 1)
        dec = generate_entries(self.c.decodes[0], 1)
        self.assertEqual((len(pre), len(dec)), (1, 1))
        self.assertEqual(dec[0]["status"], 200)
        if not (self.CONCURRENT and pre[0]["aborted"]):
            self.assertEqual(pre[0]["status"], 200)
        p, d = json.loads(pre[0]["body"]), json.loads(dec[0]["body"])
        self.assertEqual(p["sampling_params"]["max_tokens"], 1)
        self.assertNotIn("max_tokens", p, "the cap is in sampling_params, not at the top level")
        if self.CONNECTOR != "p2p-nccl":  # P2P-NCCL's prefill keeps the client's stream flag
            self.assertEqual(p["stream"], False)
        self.assertEqual(p["sampling_params"]["temperature"], 0.0)
        self.assertEqual(d["sampling_params"]["max_tokens"], max_tokens - self.DECODE_MAX_TOKENS_DELTA)
        self.assertEqual(d.get("stream", False), stream)
        for leg in (p, d):
            if self.CONNECTOR == "p2p-nccl":  # the connector takes no kv_transfer_params
                self.assertNotIn("kv_transfer_params", leg)
                self.assertNotIn("kv_transfer_params", leg["sampling_params"].get("extra_args") or {})
            else:
                self.assertIsInstance(leg["kv_transfer_params"], dict)
                self.assertEqual(leg["sampling_params"]["extra_args"]["kv_transfer_params"],
                                 leg["kv_transfer_params"])
            # The render output reaches both nodes unchanged.
            self.assertEqual(leg["features"], self.rendered["features"])
            self.assertEqual(leg["token_ids"], self.rendered["token_ids"])
        if self.CONNECTOR == "nixl":
            self.assertTrue(p["kv_transfer_params"]["do_remote_decode"])
            self.assertTrue(d["kv_transfer_params"]["do_remote_prefill"])
            self.assertTrue(d["kv_transfer_params"]["remote_block_ids"])
        return p, d

    def test_render_then_generate(self):
        self.rendered = self.render()
        body = dict(self.rendered)
        body["sampling_params"] = {"max_tokens": 7, "temperature": 0.0}
        status, headers, raw = self.c.post(GENERATE, body)
        self.assertEqual(status, 200, raw)
        answer = json.loads(raw)
        tokens = answer["choices"][0]["token_ids"]
        self.assertEqual(len(tokens), 7 - self.DECODE_MAX_TOKENS_DELTA)
        self.assertTrue(all(isinstance(t, int) and t >= 0 for t in tokens), tokens)
        self.assertEqual(answer["choices"][0]["finish_reason"], "length")
        self.assertIn("request_id", answer)
        self.check_legs(7, stream=False)

    def test_render_then_generate_stream(self):
        self.rendered = self.render()
        body = dict(self.rendered)
        body["sampling_params"] = {"max_tokens": 5, "temperature": 0.0}
        body["stream"] = True
        tokens, done = [], False
        with self.c.stream(GENERATE, body) as events:
            self.assertEqual(events.status, 200)
            for data in events:
                if data == "[DONE]":
                    done = True
                    continue
                for choice in json.loads(data).get("choices", []):
                    tokens += choice["token_ids"]
        self.assertTrue(done)
        self.assertEqual(len(tokens), 5 - self.DECODE_MAX_TOKENS_DELTA)
        self.check_legs(5, stream=True)


class NixlGenerate(RenderThenGenerate, unittest.TestCase):
    CONNECTOR = "nixl"

    def test_bad_bodies_are_400_json_and_counted(self):
        metric = 'pdrouter_requests_refused_total{reason="bad_parameter"}'
        before = self.c.metric(metric)
        cases = [
            ({"sampling_params": {}}, "token_ids"),
            ({"token_ids": [1, -2], "sampling_params": {}}, "token_ids[1]"),
            ({"token_ids": "1 2", "sampling_params": {}}, "token_ids"),
            ({"token_ids": [1]}, "sampling_params"),
            ({"token_ids": [1], "sampling_params": [1]}, "sampling_params"),
            ({"token_ids": [1], "sampling_params": {"max_tokens": 0}}, "sampling_params.max_tokens"),
        ]
        for body, named in cases:
            status, _, raw = self.c.post(GENERATE, body)
            self.assertEqual(status, 400, raw)
            error = json.loads(raw)["error"]
            self.assertEqual(error["code"], "invalid_parameter")
            self.assertEqual(error["type"], "invalid_request_error")
            self.assertIn(named, error["message"])
        self.assertEqual(self.c.metric(metric) - before, len(cases))
        # model is read for pairing before anything else, as for completions: invalid_json.
        status, _, raw = self.c.post(GENERATE, {"token_ids": [1], "sampling_params": {}, "model": 3})
        self.assertEqual(status, 400, raw)
        self.assertIn("model", json.loads(raw)["error"]["message"])
        for node in self.c.prefills + self.c.decodes:
            self.assertFalse([r for r in node.sim_requests()["requests"] if r["path"] == GENERATE])

    def test_n_above_1_goes_to_the_decode_alone(self):
        # n > 1 goes to the decode alone (NIXL can): no prefill leg, no KV params on the decode.
        status, _, raw = self.c.post(GENERATE, {"token_ids": [3, 4], "sampling_params": {"n": 2, "max_tokens": 3}})
        self.assertEqual(status, 200, raw)
        dec = generate_entries(self.c.decodes[0], 1)
        d = json.loads(dec[0]["body"])
        self.assertNotIn("kv_transfer_params", d)
        self.assertNotIn("extra_args", d["sampling_params"])
        self.assertEqual(generate_entries(self.c.prefills[0], 0), [])


class MoriioReadGenerate(RenderThenGenerate, unittest.TestCase):
    CONNECTOR = "moriio"
    TRANSFER_MODE = "READ"
    DECODE_MAX_TOKENS_DELTA = 1


class MooncakeGenerate(RenderThenGenerate, unittest.TestCase):
    CONNECTOR = "mooncake"
    CONCURRENT = True


class P2pNcclGenerate(RenderThenGenerate, unittest.TestCase):
    CONNECTOR = "p2p-nccl"


class SglangGenerate(unittest.TestCase):
    def test_refused_with_501_naming_the_dialect(self):
        c = PdCluster("sglang", kv_backends="none")
        try:
            status, _, raw = c.post(GENERATE, {"token_ids": [1, 2], "sampling_params": {"max_tokens": 2}})
            self.assertEqual(status, 501, raw)
            error = json.loads(raw)["error"]
            self.assertEqual(error["code"], "not_supported")
            self.assertIn("sglang", error["message"])
            for node in c.prefills + c.decodes:
                self.assertFalse([r for r in node.sim_requests()["requests"] if r["path"] == GENERATE])
        finally:
            c.close()


if __name__ == "__main__":
    unittest.main()
