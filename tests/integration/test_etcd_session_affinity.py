"""Session affinity bindings shared through etcd (registry.backend: etcd with session_affinity
on), end to end: a real etcd on loopback ports, two pdrouter replicas (policies round_robin), two
NIXL prefills and two NIXL decodes (`pdnode sim`) registered with replica A and known to B
through etcd.

  * a session's turns, alternating between the replicas, all go to one prefill and one decode.
    B serves one unrelated request first, so that its round robin is one step ahead of A's: left
    to itself, B would bind the session to the other pair;
  * a session spilled off its loaded decode on A (long streams of the session in flight there;
    B does not see that load) is rebound on B too: its next turn through B goes to the new decode;
  * a binding written to etcd by someone else that does not decode, names another binding than
    its key's, or has expired is refused and counted, and no session is bound by it.
"""

import base64
import json
import os
import time
import unittest
import urllib.request

from pdr_testlib import requires
from pdrouter_fixture import Router
from sim_fixture import SimNode, stream_post
from test_etcd_replicas import ETCD, Etcd

GEN_PATHS = ("/v1/completions", "/v1/chat/completions")


def topology(etcd, replica, prefix):
    return f"""
connectors:
  default: nixl
discovery:
  ttl_ms: 3000
policies: {{prefill: round_robin, decode: round_robin}}
session_affinity:
  enabled: true
  spill_margin_requests: 1
registry:
  backend: etcd
  etcd_endpoints: ["127.0.0.1:{etcd.client_port}"]
  etcd_prefix: "{prefix}"
  replica_id: "{replica}"
  lease_ttl_s: 2
"""


def gen_texts(node):
    return [json.loads(r["body"])["messages"][0]["content"] for r in node.sim_requests()["requests"]
            if r["method"] == "POST" and r["path"] in GEN_PATHS]


@requires(os.access(ETCD, os.X_OK), "etcd-server")
class EtcdSessionAffinity(unittest.TestCase):
    def setUp(self):
        self.etcd = Etcd()
        self.addCleanup(self.etcd.close)
        self.prefix = f"/pdr-sa-{os.getpid()}-{time.monotonic_ns()}/"
        self.a = Router(topology_yaml=topology(self.etcd, "a", self.prefix))
        self.addCleanup(self.a.stop)
        self.b = Router(topology_yaml=topology(self.etcd, "b", self.prefix))
        self.addCleanup(self.b.stop)
        kv = os.environ.get("PDR_SIM_KV_BACKENDS", "tcp")
        self.prefills, self.decodes = [], []
        for role, nodes in (("prefill", self.prefills), ("decode", self.decodes)):
            # Slow decodes (3 ms a token): a long stream stays in flight for the whole test.
            slow = ("--decode-us-per-token", "3000") if role == "decode" else ()
            for _ in range(2):
                node = SimNode(*slow, "--role", role, "--connector", "nixl", "--handshake-port", "0", "--notify-port", "0",
                               "--kv-port", "0", "--kv-backends", kv,
                               "--register", self.a.discovery, "--register-interval-ms", "200")
                self.addCleanup(node.kill)
                nodes.append(node)
        everyone = self.prefills + self.decodes
        for r, source in ((self.a, "registered"), (self.b, "replica")):
            r.wait_for(lambda r=r, source=source: all(
                (r.instance(n.http_address) or {}).get("state") == "up"
                and r.instance(n.http_address)["source"] == source for n in everyone)
                and r.request("GET", "/ready")[0] == 200, timeout=15)

    def turn(self, router, session, text):
        body = json.dumps({"model": "sim-model", "max_tokens": 3,
                           "messages": [{"role": "user", "content": text}]}).encode()
        headers = {"Content-Type": "application/json"}
        if session is not None:
            headers["x-session-affinity"] = session
        code, _, raw = router.request("POST", "/v1/chat/completions", body=body, timeout=10, headers=headers)
        self.assertEqual(code, 200, raw)

    def pair_of(self, text):
        pair = []
        for nodes in (self.prefills, self.decodes):
            found = [i for i, n in enumerate(nodes) if text in gen_texts(n)]
            self.assertEqual(len(found), 1, (text, found))
            pair.append(found[0])
        return tuple(pair)

    def mirrored(self, router):
        return router.metrics().get('pdrouter_session_affinity_etcd_ops_total{op="mirrored"}', 0)

    def test_a_sessions_turns_stay_on_one_pair_whichever_replica_serves_them(self):
        self.turn(self.b, None, "warm-up")  # B's round robin one step ahead of A's
        self.turn(self.a, "shared-session", "turn 0")
        first = self.pair_of("turn 0")
        self.b.wait_for(lambda: self.mirrored(self.b) >= 1, timeout=10)
        for n in range(1, 7):
            router = self.b if n % 2 else self.a
            self.turn(router, "shared-session", f"turn {n}")
            self.assertEqual(self.pair_of(f"turn {n}"), first, f"turn {n} (through {'b' if n % 2 else 'a'}) moved")
        self.assertEqual(self.a.metrics()["pdrouter_session_affinity_misses_total"], 1)
        self.assertEqual(self.b.metrics()["pdrouter_session_affinity_misses_total"], 0)
        self.assertEqual(self.b.metrics()["pdrouter_session_affinity_hits_total"], 3)
        self.assertGreaterEqual(self.a.metrics()['pdrouter_session_affinity_etcd_ops_total{op="put"}'], 1)

    def test_a_spill_on_one_replica_rebinds_the_session_on_the_other(self):
        self.turn(self.a, "hot-session", "hot 0")
        _, d0 = self.pair_of("hot 0")
        self.b.wait_for(lambda: self.mirrored(self.b) >= 1, timeout=10)
        host, port = self.a.http.rsplit(":", 1)
        body = {"model": "sim-model", "max_tokens": 8000, "stream": True,
                "messages": [{"role": "user", "content": ""}]}
        streams = []
        try:
            for n in range(3):  # the third finds d0 two streams ahead: beyond the margin of 1
                streams.append(stream_post(host, int(port), "/v1/chat/completions",
                                           dict(body, messages=[{"role": "user", "content": f"long {n}"}]),
                                           {"x-session-affinity": "hot-session"}, timeout=30))
                self.a.wait_for(lambda n=n: sum(
                    v for k, v in self.a.metrics().items()
                    if k.startswith("pdrouter_node_decode_sequences{")) >= n + 1, timeout=10)
            self.assertEqual(self.a.metrics()["pdrouter_session_affinity_spills_total"], 1)
            _, d1 = self.pair_of("long 2")
            self.assertNotEqual(d1, d0)
            # B learns the new binding from etcd (its own ledger shows no load on d0).
            self.b.wait_for(lambda: self.mirrored(self.b) >= 2, timeout=10)
            self.turn(self.b, "hot-session", "hot 1")
            self.assertEqual(self.pair_of("hot 1")[1], d1)
            self.assertEqual(self.b.metrics()["pdrouter_session_affinity_hits_total"], 1)
        finally:
            for st in streams:
                st.close()

    def test_bad_bindings_in_etcd_are_refused_and_counted(self):
        sessions = self.prefix + "conversations/session/"
        sid = base64.urlsafe_b64encode(b"victim").decode().rstrip("=")
        future = int(time.time() * 1000) + 300_000
        good = {"writer": "x", "binding": "anonymous", "prefill": self.prefills[1].http_address,
                "decode": self.decodes[1].http_address, "expires_ms": future}
        for key, value in ((sessions + "anonymous/" + sid, b"{not json"),
                           (sessions + "anonymous/" + sid, json.dumps(dict(good, expires_ms=1)).encode()),
                           (sessions + "anonymous/" + sid, json.dumps(dict(good, binding="ab" * 32)).encode()),
                           (sessions + "anonymous/" + sid, json.dumps(dict(good, decode="")).encode()),
                           (sessions + "anonymous/%%%", json.dumps(good).encode())):
            body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                               "value": base64.b64encode(value).decode()}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{self.etcd.client_port}/v3/kv/put", data=body,
                                         method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                self.assertEqual(resp.status, 200)
        bad = 'pdrouter_session_affinity_etcd_failures_total{reason="bad_value"}'
        for r in (self.a, self.b):
            # The expired one decodes: it is dropped as gone, not counted as bad.
            r.wait_for(lambda r=r: r.metrics().get(bad) == 4, timeout=10)
            self.assertEqual(r.metrics()["pdrouter_session_affinity_sessions"], 0)
        # A well-formed binding of another writer is taken (the control for the refusals above).
        body = json.dumps({"key": base64.b64encode((sessions + "anonymous/" + sid).encode()).decode(),
                           "value": base64.b64encode(json.dumps(good).encode()).decode()}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{self.etcd.client_port}/v3/kv/put", data=body,
                                     method="POST", headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            self.assertEqual(resp.status, 200)
        self.a.wait_for(lambda: self.a.metrics()["pdrouter_session_affinity_sessions"] == 1, timeout=10)
        self.turn(self.a, "victim", "victim turn")
        self.assertEqual(self.pair_of("victim turn"), (1, 1))


if __name__ == "__main__":
    unittest.main()
