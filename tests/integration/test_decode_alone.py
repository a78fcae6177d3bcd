"""Conditional disaggregation end to end (topology conditional_disaggregation:): real pdrouter and
registered `pdnode sim` nodes. A short prompt, or one the chosen decode already holds (cache_aware's
prefix tree), goes to the decode alone, as a plain request it computes itself; a dialect whose
decode cannot compute alone (Mooncake) never does. Checked from the sims' request logs."""
import json
import unittest

from pd_fixture import PdCluster

GEN_PATHS = ("/v1/completions", "/v1/chat/completions")


def gen_bodies(node):
    return [json.loads(r["body"]) for r in node.sim_requests()["requests"]
            if r["method"] == "POST" and r["path"] in GEN_PATHS]


def prompts(nodes):
    return [b["prompt"] for n in nodes for b in gen_bodies(n)]


class DecodeAloneTest(unittest.TestCase):
    def cluster(self, connector, topology, **kw):
        c = PdCluster(connector, topology=topology, **kw)
        self.addCleanup(c.close)
        return c

    def complete(self, cluster, prompt):
        code, _, raw = cluster.post("/v1/completions", {"model": "sim-model", "prompt": prompt, "max_tokens": 2})
        self.assertEqual(code, 200, raw)

    def alone(self, cluster, reason):
        return cluster.metric('pdrouter_decode_alone_total{reason="%s"}' % reason)

    def test_short_prompts_skip_the_prefill(self):
        c = self.cluster("nixl", "conditional_disaggregation: {enabled: true, max_prompt_tokens: 8}\n")
        short, long = [1, 2, 3, 4, 5, 6, 7, 8], list(range(1, 40))
        self.complete(c, short)
        self.complete(c, long)
        self.assertEqual(prompts(c.prefills), [long])
        decoded = {json.dumps(b["prompt"]): b for b in gen_bodies(c.decodes[0])}
        self.assertNotIn("kv_transfer_params", decoded[json.dumps(short)])  # a plain request
        self.assertIn("kv_transfer_params", decoded[json.dumps(long)])
        self.assertEqual(self.alone(c, "short_prompt"), 1)
        self.assertEqual(c.metric('pdrouter_request_transitions_total{from="paired",to="decode_sent"}'), 1)

    def test_a_decode_holding_the_prompt_serves_it_alone(self):
        c = self.cluster("nixl", "policies: {prefill: cache_aware, decode: cache_aware}\n"
                                 "conditional_disaggregation: {enabled: true, min_cached_percent: 90}\n",
                         decodes=2)
        text = "You are a helpful assistant. " * 20
        self.complete(c, text)  # nothing cached yet: P/D
        self.complete(c, text)  # the decode of the first one holds all of it (as pdrouter knows)
        self.assertEqual(prompts(c.prefills), [text])
        self.assertEqual(sorted(len(gen_bodies(d)) for d in c.decodes), [0, 2])
        self.assertEqual(self.alone(c, "cached"), 1)

    def test_a_decode_failing_alone_is_retried_on_another(self):
        c = self.cluster("nixl", "conditional_disaggregation: {enabled: true, max_prompt_tokens: 100}\n",
                         decodes=2)
        c.decodes[0].set_fault(status=500, count=1)
        # Round robin sends one of the two requests to decodes[0] first: it fails there (500) and
        # is paired anew (a decode alone has no prefill to keep), served by decodes[1].
        self.complete(c, "hello there")
        self.complete(c, "hello again")
        self.assertEqual(sum(len(gen_bodies(d)) for d in c.decodes), 3)
        self.assertEqual(len(gen_bodies(c.decodes[1])) >= 1, True)
        self.assertEqual(prompts(c.prefills), [])
        self.assertEqual(c.metric('pdrouter_leg_retries_total{leg="decode"}'), 1)

    def test_never_for_a_dialect_whose_decode_waits_for_kv(self):
        c = self.cluster("mooncake", "conditional_disaggregation: {enabled: true, max_prompt_tokens: 100}\n")
        self.complete(c, "hi")
        self.assertEqual(prompts(c.prefills), ["hi"])
        self.assertEqual(self.alone(c, "short_prompt"), 0)


if __name__ == "__main__":
    unittest.main()
