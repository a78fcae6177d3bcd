"""Multi-turn KV reuse end to end (topology multi_turn:, NIXL with bidirectional_kv_xfer): a real
pdrouter and registered `pdnode sim` nodes (two NIXL prefills, two NIXL decodes started with
--bidirectional-kv-xfer, real KV bytes between them for the first turn). Checked from the sims'
request logs: conversation_id never reaches a node, the next turn goes to the decode that served
the last one, and its prefill gets that decode's kv_transfer_params rewritten for pulling
(do_remote_decode true, do_remote_prefill false, remote_host the decode's host), and pulls the
blocks the decode kept over the sims' KV side channel (bytes counted on both ends)."""
import json
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode

WAIT_S = 15.0 * TIME_SCALE
GEN_PATHS = ("/v1/completions", "/v1/chat/completions")


def gen_bodies(node):
    return [json.loads(r["body"]) for r in node.sim_requests()["requests"]
            if r["method"] == "POST" and r["path"] in GEN_PATHS]


class MultiTurnTest(unittest.TestCase):
    def setUp(self):
        self.cluster = PdCluster("nixl", prefills=2, decodes=2,
                                 topology="multi_turn:\n  enabled: true\n",
                                 prefill_flags=("--bidirectional-kv-xfer",),
                                 decode_flags=("--bidirectional-kv-xfer",))
        self.addCleanup(self.cluster.close)

    def turn(self, conversation, text, stream):
        body = {"model": "sim-model", "conversation_id": conversation, "max_tokens": 3,
                "messages": [{"role": "user", "content": text}]}
        if stream:
            with self.cluster.stream("/v1/chat/completions", dict(body, stream=True)) as events:
                events.body()
        else:
            code, _, raw = self.cluster.post("/v1/chat/completions", body)
            self.assertEqual(code, 200, raw)

    def served_by(self, nodes, text):
        """(index of the node whose log has the message `text`, that request's body)."""
        found = [(i, b) for i, n in enumerate(nodes) for b in gen_bodies(n)
                 if b["messages"][0]["content"] == text]
        self.assertEqual(len(found), 1, (text, found))
        return found[0]

    def turns(self, result):
        return self.cluster.metric('pdrouter_multi_turn_turns_total{result="%s"}' % result)

    def test_the_next_turn_reuses_the_decodes_kv(self):
        self.turn("conv-a", "first turn", stream=True)
        d1, decode_body = self.served_by(self.cluster.decodes, "first turn")
        _, prefill_body = self.served_by(self.cluster.prefills, "first turn")
        self.assertNotIn("conversation_id", decode_body)
        self.assertNotIn("conversation_id", prefill_body)
        self.assertIsNone(prefill_body["kv_transfer_params"]["remote_block_ids"])  # a normal first turn
        self.assertEqual(self.turns("no_entry"), 1)
        self.assertEqual(self.cluster.metric("pdrouter_multi_turn_stored_total"), 1)
        self.assertEqual(self.cluster.metric("pdrouter_multi_turn_entries"), 1)

        for n, stream in ((2, False), (3, True), (4, False)):
            text = f"turn {n}"
            self.turn("conv-a", text, stream=stream)
            d, decode_body = self.served_by(self.cluster.decodes, text)
            self.assertEqual(d, d1, f"{text} left its decode")
            _, prefill_body = self.served_by(self.cluster.prefills, text)
            params = prefill_body["kv_transfer_params"]
            self.assertIs(params["do_remote_decode"], True)
            self.assertIs(params["do_remote_prefill"], False)
            self.assertEqual(params["remote_host"], "127.0.0.1")
            self.assertTrue(params["remote_block_ids"])
            self.assertTrue(params["remote_engine_id"])
            self.assertNotIn("conversation_id", prefill_body)
            self.assertNotIn("conversation_id", decode_body)
        self.assertEqual(self.turns("reused"), 3)
        self.assertEqual(self.cluster.metric("pdrouter_multi_turn_stored_total"), 4)
        self.assertEqual(self.cluster.metric("pdrouter_multi_turn_entries"), 1)

    def test_the_next_turns_prefill_pulls_the_decodes_blocks(self):
        if self.cluster.kv_backends == "none":
            self.skipTest("PDR_SIM_KV_BACKENDS=none: the sims move no KV bytes")
        text1 = "first turn " + "word " * 40  # 42 tokens: 3 blocks kept by the decode
        self.turn("conv-k", text1, stream=False)
        d, _ = self.served_by(self.cluster.decodes, text1)
        decode = self.cluster.decodes[d]
        decode_before = decode.kv_stats()
        prefill_moved = {i: p.kv_stats()["kv_bytes_moved"] for i, p in enumerate(self.cluster.prefills)}
        text2 = "second turn"
        self.turn("conv-k", text2, stream=False)
        self.assertEqual(self.turns("reused"), 1)
        p, prefill_body = self.served_by(self.cluster.prefills, text2)
        block_ids = prefill_body["kv_transfer_params"]["remote_block_ids"]
        self.assertEqual(len(block_ids), 3)
        prefill = self.cluster.prefills[p]
        entry = [r for r in prefill.sim_requests()["requests"]
                 if r["path"] in GEN_PATHS and json.loads(r["body"])["messages"][0]["content"] == text2][0]
        self.assertEqual(entry["kv_reused_tokens"], 48)  # 3 blocks of 16 tokens, pulled
        # The bytes really moved decode -> prefill: the prefill's mover imported them, the
        # decode's engine served them and its READ notification freed the kept blocks.
        moved = prefill.kv_stats()["kv_bytes_moved"] - prefill_moved[p]
        block_bytes = decode_before["kv_block_bytes"] * decode_before["kv_layers"]
        self.assertGreaterEqual(moved, 3 * block_bytes)
        self.assertEqual(prefill.kv_stats()["kv_mismatches"], 0)

        def served():
            after = decode.kv_stats()
            return (after["engine"]["bytes_served"] - decode_before["engine"]["bytes_served"] >= 3 * block_bytes
                    and after["kv_bytes_moved"] - decode_before["kv_bytes_moved"] >= 3 * block_bytes)
        self.cluster.router.wait_for(served, timeout=WAIT_S)

    def test_conversations_are_kept_apart_and_a_gone_decode_means_a_normal_turn(self):
        self.turn("conv-a", "a1", stream=False)
        self.turn("conv-b", "b1", stream=False)
        da, _ = self.served_by(self.cluster.decodes, "a1")
        db, _ = self.served_by(self.cluster.decodes, "b1")
        self.assertNotEqual(da, db)  # round robin spread the first turns
        self.turn("conv-b", "b2", stream=False)
        self.assertEqual(self.served_by(self.cluster.decodes, "b2")[0], db)
        # The decode holding conv-a leaves (its goodbye removes it): the next turn is a normal one
        # on the other decode, with a prefill that computes everything itself.
        gone = self.cluster.decodes[da]
        self.assertEqual(gone.stop(), 0)
        self.cluster.router.wait_for(
            lambda: gone.http_address not in [i["http_address"] for i in self.cluster.router.status()["instances"]
                                              if i["state"] == "up"], timeout=WAIT_S)
        self.turn("conv-a", "a2", stream=False)
        self.assertEqual(self.served_by([self.cluster.decodes[db]], "a2")[0], 0)
        _, prefill_body = self.served_by(self.cluster.prefills, "a2")
        self.assertIsNone(prefill_body["kv_transfer_params"]["remote_block_ids"])
        self.assertEqual(self.turns("reused"), 1)  # b2 only
        self.assertEqual(self.turns("decode_unavailable"), 1)  # a2

    def test_a_decode_restarted_mid_conversation_means_a_normal_turn(self):
        self.turn("conv-a", "a1", stream=False)
        d, _ = self.served_by(self.cluster.decodes, "a1")
        old = self.cluster.decodes[d]
        epoch = self.cluster.router.instance(old.http_address)["epoch"]
        # A crash (no goodbye) and a restart on the same address: the blocks the entry names are
        # gone, although the router's entry for the address lives on with a new epoch.
        self.assertEqual(old.kill(), -9)
        new = self.cluster.start_node("decode", ("--bidirectional-kv-xfer", "--http", old.http_address))
        self.cluster.decodes[d] = new
        self.cluster.router.wait_for(
            lambda: (self.cluster.router.instance(old.http_address) or {}).get("epoch") not in (None, epoch)
            and self.cluster.router.instance(old.http_address)["state"] == "up", timeout=WAIT_S)
        self.turn("conv-a", "a2", stream=False)
        _, prefill_body = self.served_by(self.cluster.prefills, "a2")
        self.assertIsNone(prefill_body["kv_transfer_params"]["remote_block_ids"])  # recomputed
        self.assertEqual(self.turns("decode_unavailable"), 1)
        self.assertEqual(self.turns("reused"), 0)
        # The restarted decode's own answer left a fresh entry: the turn after reuses it.
        self.turn("conv-a", "a3", stream=False)
        self.assertEqual(self.turns("reused"), 1)

    def test_a_bad_conversation_id_is_refused(self):
        for bad in (42, "", "x" * 513):
            code, _, raw = self.cluster.post("/v1/chat/completions", {
                "model": "sim-model", "conversation_id": bad, "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]})
            self.assertEqual(code, 400, raw)
            error = json.loads(raw)["error"]
            self.assertEqual(error["code"], "invalid_parameter")
            self.assertIn("conversation_id", error["message"])
        for node in self.cluster.prefills + self.cluster.decodes:
            self.assertEqual(gen_bodies(node), [])


class MultiTurnRemoteHostTest(unittest.TestCase):
    """A decode whose answer names another host as its side channel (remote_host): the next turn's
    prefill would connect there to pull the blocks, so the entry is not reused (counted), and the
    turn is an ordinary one. The decode is a sim advertising a name under .invalid (RFC 6761: it
    never resolves) while listed at its real 127.0.0.1 address; nothing connects to the name."""

    def setUp(self):
        self.prefill = SimNode("--role", "prefill", "--connector", "nixl", "--bidirectional-kv-xfer")
        self.addCleanup(self.prefill.stop)
        self.decode = SimNode("--role", "decode", "--connector", "nixl", "--bidirectional-kv-xfer",
                              "--advertise-host", "victim.invalid")
        self.addCleanup(self.decode.stop)
        self.router = Router(f"""
multi_turn:
  enabled: true
instances:
  - {{role: prefill, http_address: "{self.prefill.http_address}", connector: nixl}}
  - {{role: decode, http_address: "127.0.0.1:{self.decode.port}", connector: nixl}}
""")
        self.addCleanup(self.router.dir.cleanup)
        self.addCleanup(self.router.stop)

    def turn(self, text):
        code, _, raw = self.router.request(
            "POST", "/v1/chat/completions", timeout=10 * TIME_SCALE, headers={"Content-Type": "application/json"},
            body=json.dumps({"model": "sim-model", "conversation_id": "conv-h", "max_tokens": 3,
                             "messages": [{"role": "user", "content": text}]}).encode())
        self.assertEqual(code, 200, raw)

    def prefill_params(self, text):
        found = [b for b in gen_bodies(self.prefill) if b["messages"][0]["content"] == text]
        self.assertEqual(len(found), 1, (text, found))
        return found[0]["kv_transfer_params"]

    def turns(self, result):
        return self.router.metrics().get('pdrouter_multi_turn_turns_total{result="%s"}' % result, 0)

    def test_an_entry_naming_another_host_is_not_reused(self):
        self.turn("first")
        self.assertEqual(self.router.metrics()["pdrouter_multi_turn_stored_total"], 1)
        self.turn("second")
        params = self.prefill_params("second")
        self.assertIsNone(params["remote_block_ids"], params)  # an ordinary turn: nothing to pull
        self.assertIsNone(params["remote_host"], params)
        self.assertEqual(self.turns("remote_host_mismatch"), 1)
        self.assertEqual(self.turns("reused"), 0)
        self.assertNotIn("victim.invalid", json.dumps([r["body"] for r in self.prefill.sim_requests()["requests"]]))


if __name__ == "__main__":
    unittest.main()
