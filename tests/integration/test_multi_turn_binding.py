"""Multi-turn entries belong to the client that made them, and no client sees a decode's
kv_transfer_params. A real pdrouter and registered `pdnode sim` nodes: one NIXL prefill and one
NIXL decode, both started with --bidirectional-kv-xfer, so every decode answer ends with the
kv_transfer_params naming the blocks it keeps (its host, KV side-channel port, engine id, block
ids), as vLLM's bidirectional NIXL does.

  * Two clients (different Authorization) send the same conversation_id: the second one's
    prefill gets none of the first one's blocks (its leg carries no remote_block_ids, the sim
    pulls nothing), and each client's next turn pulls only the blocks its own last turn left
    (the prefill's kv_transfer_params name the decode request of that client's turn). Checked
    from the sims' request logs.
  * The answers the clients get (JSON and streamed; completions, chat, Responses, generate)
    carry no kv_transfer_params: the field is null where vLLM has it, and none of the decode's
    remote_* values appear anywhere in the bytes.
"""
import json
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

WAIT_S = 15.0 * TIME_SCALE
ALICE = {"Authorization": "Bearer alice-token"}
MALLORY = {"Authorization": "Bearer mallory-token"}


def chat(conversation, text):
    return {"model": "sim-model", "conversation_id": conversation, "max_tokens": 3,
            "messages": [{"role": "user", "content": text}]}


class TwoClientsOneConversationId(unittest.TestCase):
    def setUp(self):
        self.cluster = PdCluster("nixl", prefills=1, decodes=1,
                                 topology="multi_turn:\n  enabled: true\n",
                                 prefill_flags=("--bidirectional-kv-xfer",),
                                 decode_flags=("--bidirectional-kv-xfer",))
        self.addCleanup(self.cluster.close)
        self.prefill, self.decode = self.cluster.prefills[0], self.cluster.decodes[0]

    def turn(self, who, conversation, text):
        code, _, raw = self.cluster.post("/v1/chat/completions", chat(conversation, text), headers=who)
        self.assertEqual(code, 200, raw)

    @staticmethod
    def logged(node, text):
        """The node's log entry of the chat request whose message is `text`."""
        found = [r for r in node.sim_requests()["requests"]
                 if r["path"] == "/v1/chat/completions" and json.loads(r["body"])["messages"][0]["content"] == text]
        assert len(found) == 1, (text, found)
        return found[0]

    def kept_by(self, text):
        """The start of remote_request_id in the params the decode answered for the turn `text`:
        the decode's internal id of that request (the sim's, as vLLM's, starts with the chat id)."""
        return "chatcmpl-" + self.logged(self.decode, text)["headers"]["x-request-id"] + "-"

    def turns(self, result):
        return self.cluster.metric('pdrouter_multi_turn_turns_total{result="%s"}' % result)

    def test_a_client_reusing_another_clients_conversation_id_gets_none_of_its_kv(self):
        alice_1 = "alice first " + "secret " * 40  # 42 tokens: the decode keeps 3 blocks
        self.turn(ALICE, "conv-shared", alice_1)

        # Mallory, same conversation_id, another credential: an ordinary first turn.
        mallory_1 = "mallory first " + "probe " * 40
        self.turn(MALLORY, "conv-shared", mallory_1)
        entry = self.logged(self.prefill, mallory_1)
        params = json.loads(entry["body"])["kv_transfer_params"]
        self.assertIsNone(params["remote_block_ids"], params)  # Alice's blocks were not handed out
        self.assertIsNone(params.get("remote_request_id"), params)
        self.assertIn(entry["kv_reused_tokens"], (None, 0), entry)
        self.assertEqual(self.turns("binding_mismatch"), 1)
        self.assertEqual(self.turns("reused"), 0)
        self.assertEqual(self.cluster.metric("pdrouter_multi_turn_entries"), 2)  # one per client

        # Alice's next turn pulls the blocks of her own last turn, not Mallory's.
        alice_2 = "alice second"
        self.turn(ALICE, "conv-shared", alice_2)
        entry = self.logged(self.prefill, alice_2)
        params = json.loads(entry["body"])["kv_transfer_params"]
        self.assertTrue(params["remote_block_ids"], params)
        self.assertTrue(params["remote_request_id"].startswith(self.kept_by(alice_1)), params)
        if self.cluster.kv_backends != "none":
            self.assertEqual(entry["kv_reused_tokens"], 48)  # her 3 blocks
        # And Mallory's next turn her own.
        mallory_2 = "mallory second"
        self.turn(MALLORY, "conv-shared", mallory_2)
        params = json.loads(self.logged(self.prefill, mallory_2)["body"])["kv_transfer_params"]
        self.assertTrue(params["remote_request_id"].startswith(self.kept_by(mallory_1)), params)
        self.assertEqual(self.turns("reused"), 2)

    def test_requests_without_credentials_share_the_anonymous_binding(self):
        self.turn({}, "conv-anon", "anonymous first")
        self.turn(ALICE, "conv-anon", "alice with the anonymous id")
        params = json.loads(self.logged(self.prefill, "alice with the anonymous id")["body"])["kv_transfer_params"]
        self.assertIsNone(params["remote_block_ids"])
        self.turn({}, "conv-anon", "anonymous second")
        params = json.loads(self.logged(self.prefill, "anonymous second")["body"])["kv_transfer_params"]
        self.assertTrue(params["remote_request_id"].startswith(self.kept_by("anonymous first")), params)


class AnonymousRefused(unittest.TestCase):
    def test_allow_anonymous_false_gives_requests_without_credentials_no_reuse(self):
        cluster = PdCluster("nixl", prefills=1, decodes=1,
                            topology="multi_turn:\n  enabled: true\n  allow_anonymous: false\n",
                            prefill_flags=("--bidirectional-kv-xfer",), decode_flags=("--bidirectional-kv-xfer",))
        self.addCleanup(cluster.close)
        for text in ("anonymous first", "anonymous second"):
            code, _, raw = cluster.post("/v1/chat/completions", chat("conv-anon", text))
            self.assertEqual(code, 200, raw)
        bodies = [json.loads(r["body"]) for r in cluster.prefills[0].sim_requests()["requests"]
                  if r["path"] == "/v1/chat/completions"]
        self.assertEqual(len(bodies), 2)
        for body in bodies:
            self.assertNotIn("conversation_id", body)
            self.assertIsNone(body["kv_transfer_params"]["remote_block_ids"])
        m = cluster.router.metrics()
        self.assertEqual(m['pdrouter_multi_turn_turns_total{result="anonymous"}'], 2)
        self.assertEqual(m["pdrouter_multi_turn_stored_total"], 0)


class AnswersCarryNoKvTransferParams(unittest.TestCase):
    """Every decode answer of these sims carries kv_transfer_params (with or without multi-turn):
    none reaches the client, in any endpoint's JSON or stream."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("nixl", prefills=1, decodes=1,
                                prefill_flags=("--bidirectional-kv-xfer",), decode_flags=("--bidirectional-kv-xfer",))
        cls.decode = cls.cluster.decodes[0]

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    REQUESTS = (
        ("/v1/completions", {"model": "sim-model", "prompt": "tell me " * 20, "max_tokens": 3}),
        ("/v1/chat/completions", {"model": "sim-model", "max_tokens": 3,
                                  "messages": [{"role": "user", "content": "tell me " * 20}]}),
        ("/v1/responses", {"model": "sim-model", "input": "tell me " * 20, "max_output_tokens": 3}),
        ("/inference/v1/generate", {"model": "sim-model", "token_ids": list(range(1, 41)),
                                    "sampling_params": {"max_tokens": 3}}),
    )

    def assert_clean(self, raw):
        """No trace of the decode's kv_transfer_params in an answer's bytes."""
        for leak in (b"remote_block_ids", b"remote_engine_id", b"remote_host", b"remote_port", b"remote_request_id"):
            self.assertNotIn(leak, raw)

    def test_json_answers(self):
        for path, body in self.REQUESTS:
            with self.subTest(path=path):
                code, _, raw = self.cluster.post(path, body)
                self.assertEqual(code, 200, raw)
                answer = json.loads(raw)
                self.assertIsNone(answer.get("kv_transfer_params"), answer)  # null, as vLLM without P/D
                self.assert_clean(raw)

    def test_the_decodes_own_answers_carry_them(self):
        # What the relay has to remove: the decode sim asked directly answers its params.
        status, answer = self.decode.post_json("/v1/completions", self.REQUESTS[0][1])
        self.assertEqual(status, 200, answer)
        self.assertTrue(answer["kv_transfer_params"]["remote_block_ids"], answer)
        self.assertTrue(answer["kv_transfer_params"]["remote_engine_id"], answer)

    def test_streamed_answers(self):
        for path, body in self.REQUESTS:
            with self.subTest(path=path):
                with self.cluster.stream(path, dict(body, stream=True), timeout=WAIT_S) as s:
                    self.assertEqual(s.status, 200)
                    raw = s.body()
                self.assert_clean(raw)
                self.assertTrue(raw.endswith(b"\n\n"), raw[-80:])
                events = 0
                for block in raw.decode().split("\n\n"):
                    data = "\n".join(line[len("data: "):] for line in block.split("\n") if line.startswith("data: "))
                    if not data or data == "[DONE]":
                        continue
                    chunk = json.loads(data)
                    events += 1
                    self.assertIsNone(chunk.get("kv_transfer_params"), chunk)
                    self.assertIsNone((chunk.get("response") or {}).get("kv_transfer_params"), chunk)
                self.assertGreaterEqual(events, 3)


if __name__ == "__main__":
    unittest.main()
