"""Session affinity end to end (topology session_affinity:): a real pdrouter and registered
`pdnode sim` nodes (two NIXL prefills, two NIXL decodes), policies round_robin (which, left alone,
alternates every request between the two nodes of each role). Checked from the sims' request
logs:

  * the turns of one session (x-session-affinity header, or a body field) all go to one prefill
    and one decode, while another session is bound on its own;
  * a client naming another client's session id does not land on that session's nodes by it
    (its binding is its own);
  * a session whose decode is drained (admin API) moves to the other decode, keeps its prefill,
    and stays on the new decode once the old one is back;
  * a session whose decode is loaded (long streams in flight) beyond spill_margin_requests of
    the other decode spills to the other one, and its next turns stay there (the new binding
    sticks), even after the load is gone.
"""
import json
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

GEN_PATHS = ("/v1/completions", "/v1/chat/completions")
ADMIN_KEY = "session-affinity-admin-key"
TOPOLOGY = """\
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
policies: {prefill: round_robin, decode: round_robin}
session_affinity:
  enabled: true
  headers: [x-session-affinity, session-id]
  fields: [user]
  spill_margin_requests: 1
"""


def chat(text, max_tokens=3, stream=False, user=None):
    body = {"model": "sim-model", "max_tokens": max_tokens, "stream": stream,
            "messages": [{"role": "user", "content": text}]}
    if user is not None:
        body["user"] = user
    return body


def gen_texts(node):
    return [json.loads(r["body"])["messages"][0]["content"] for r in node.sim_requests()["requests"]
            if r["method"] == "POST" and r["path"] in GEN_PATHS]


class SessionAffinityTest(unittest.TestCase):
    def setUp(self):
        # Slow decodes (3 ms a token): a long stream stays in flight for the whole test.
        self.cluster = PdCluster("nixl", prefills=2, decodes=2, topology=TOPOLOGY,
                                 decode_flags=("--decode-us-per-token", "3000"),
                                 router_env={"PDR_TEST_ADMIN_KEY": ADMIN_KEY})
        self.addCleanup(self.cluster.close)

    def turn(self, text, headers=None, user=None):
        code, _, raw = self.cluster.post("/v1/chat/completions", chat(text, user=user), headers=headers)
        self.assertEqual(code, 200, raw)

    def served_by(self, nodes, text):
        found = [i for i, n in enumerate(nodes) if text in gen_texts(n)]
        self.assertEqual(len(found), 1, (text, found))
        return found[0]

    def pair_of(self, text):
        return self.served_by(self.cluster.prefills, text), self.served_by(self.cluster.decodes, text)

    def metric(self, name):
        return self.cluster.metric("pdrouter_session_affinity_" + name)

    def test_the_turns_of_a_session_stay_on_one_pair(self):
        a = {"x-session-affinity": "agent-run-7f3a"}
        b = {"session-id": "chat-b"}  # the second header of the list
        self.turn("a0", a)
        self.turn("b0", b)
        first_a, first_b = self.pair_of("a0"), self.pair_of("b0")
        for n in range(1, 6):
            self.turn(f"a{n}", a)
            self.turn(f"b{n}", b)
            self.turn(f"u{n}", user="user-u")  # a body field
            self.assertEqual(self.pair_of(f"a{n}"), first_a, f"turn {n} of a moved")
            self.assertEqual(self.pair_of(f"b{n}"), first_b, f"turn {n} of b moved")
            self.assertEqual(self.pair_of(f"u{n}"), self.pair_of("u1"), f"turn {n} of u moved")
        self.assertEqual(self.metric("misses_total"), 3)
        self.assertEqual(self.metric("hits_total"), 5 + 5 + 4)
        self.assertEqual(self.metric("sessions"), 3)
        # /status may be rendered up to a second ago: wait for it to show the same figures.
        figures = ("enabled", "sessions", "hits", "misses", "spills", "bad_ids")
        self.cluster.router.wait_for(
            lambda: tuple(self.cluster.router.status()["session_affinity"][k] for k in figures)
            == (True, 3, 14, 3, 0, 0), timeout=5)
        # Ids are exact: a prefix of a's id is another session (no binding yet).
        self.turn("prefix", {"x-session-affinity": "agent-run-7f3"})
        self.assertEqual(self.metric("misses_total"), 4)
        # A bad id is ignored (the request is served) and counted.
        self.turn("bad", {"x-session-affinity": "x" * 300})
        self.assertEqual(self.metric("bad_ids_total"), 1)
        self.assertEqual(self.metric("misses_total"), 4)

    def test_another_clients_session_id_is_not_its_binding(self):
        alice = {"x-session-affinity": "shared-id", "Authorization": "Bearer alice"}
        mallory = {"x-session-affinity": "shared-id", "Authorization": "Bearer mallory"}
        self.turn("alice0", alice)
        self.turn("alice1", alice)
        self.turn("mallory0", mallory)
        self.assertEqual(self.metric("hits_total"), 1)
        self.assertEqual(self.metric("misses_total"), 2)  # mallory's first turn finds nothing
        self.assertEqual(self.metric("sessions"), 2)

    def admin(self, verb, node):
        code, _, raw = self.cluster.router.request(
            "POST", f"/admin/instances/{node.http_address}/{verb}",
            headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        self.assertEqual(code, 200, raw)

    def test_a_drained_node_breaks_the_binding_and_the_new_one_sticks(self):
        s = {"x-session-affinity": "drain-session"}
        self.turn("d0", s)
        p0, d0 = self.pair_of("d0")
        self.admin("drain", self.cluster.decodes[d0])
        self.cluster.router.wait_for(
            lambda: self.cluster.router.instance(self.cluster.decodes[d0].http_address)["state"] == "draining")
        self.turn("d1", s)
        p1, d1 = self.pair_of("d1")
        self.assertNotEqual(d1, d0)
        self.assertEqual(p1, p0)  # the prefill was fine: it stays
        self.assertEqual(self.metric("broken_total"), 1)
        self.assertEqual(self.metric("rebinds_total"), 1)
        self.admin("undrain", self.cluster.decodes[d0])
        self.cluster.router.wait_for(
            lambda: self.cluster.router.instance(self.cluster.decodes[d0].http_address)["state"] == "up")
        for n in range(2, 6):
            self.turn(f"d{n}", s)
            self.assertEqual(self.pair_of(f"d{n}"), (p0, d1), f"d{n} left the new binding")

    def decode_sequences(self):
        m = self.cluster.router.metrics()
        return {d: m.get('pdrouter_node_decode_sequences{node="%s"}' % d.http_address, 0.0)
                for d in self.cluster.decodes}

    def test_a_loaded_decode_spills_the_session_and_the_new_binding_sticks(self):
        s = {"x-session-affinity": "busy-session"}
        self.turn("t0", s)
        _, d0 = self.pair_of("t0")
        streams = []
        try:
            # Long streams of the same session pile onto its decode: each is held until the
            # router counts it on a decode, so the next one sees that load.
            for n in range(3):
                streams.append(self.cluster.stream("/v1/chat/completions",
                                                   chat(f"long{n}", max_tokens=8000, stream=True),
                                                   headers=s, timeout=30))
                self.cluster.router.wait_for(lambda: sum(self.decode_sequences().values()) >= n + 1,
                                             timeout=10)
            self.assertEqual(self.served_by(self.cluster.decodes, "long0"), d0)
            self.assertEqual(self.served_by(self.cluster.decodes, "long1"), d0)
            # 2 in flight on d0 against 0: beyond the margin of 1, so the third went elsewhere.
            d1 = self.served_by(self.cluster.decodes, "long2")
            self.assertNotEqual(d1, d0)
            self.assertEqual(self.metric("spills_total"), 1)
            self.assertEqual(self.metric("rebinds_total"), 1)
            self.turn("t1", s)
            self.assertEqual(self.served_by(self.cluster.decodes, "t1"), d1)
        finally:
            for st in streams:
                st.close()
        self.cluster.router.wait_for(lambda: sum(self.decode_sequences().values()) == 0, timeout=10)
        for n in range(2, 5):
            self.turn(f"t{n}", s)
            self.assertEqual(self.served_by(self.cluster.decodes, f"t{n}"), d1, f"t{n} left the new binding")
        self.assertEqual(self.metric("spills_total"), 1)


if __name__ == "__main__":
    unittest.main()
