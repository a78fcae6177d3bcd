"""Multi-turn KV entries shared through etcd (registry.backend: etcd with multi_turn.enabled), end
to end: a real etcd (Debian's etcd-server) on loopback ports, two pdrouter replicas, a NIXL
prefill and a decode (`pdnode sim --bidirectional-kv-xfer`) registered with replica A and known
to B through etcd.

  * turn 1 through A, turn 2 through B: B's prefill leg gets the decode's params (it pulls the
    blocks the decode kept) and the entry taken on B is gone on A; turn 3 through A reuses the
    entry B stored;
  * an entry taken on B whose turn leaves no new entry: replaying that turn through A is an
    ordinary turn (A no longer holds it);
  * etcd killed: each replica still reuses its own entries, and the writes it could not make are
    counted; etcd back: entries are shared again;
  * a malformed or expired entry written to etcd by someone else is rejected and counted, and so
    is an entry from a pdrouter before client bindings (it could belong to any client); a
    well-formed one whose params aim the next prefill at another host than the decode's is not
    reused (counted);
  * entries keep their client's binding on every replica: a client reusing another client's
    conversation_id through the other replica gets none of its KV, and each client's next turn
    (on either replica) pulls only its own blocks;
  * replica A restarted with the same replica_id reloads the entries it stored before: turn 2
    on A reuses the entry of turn 1.
"""

import base64
import json
import os
import time
import unittest
import urllib.request

from pdr_testlib import requires
from pdrouter_fixture import Router
from sim_fixture import SimNode
from test_etcd_replicas import ETCD, Etcd

GEN_PATHS = ("/v1/completions", "/v1/chat/completions")


def topology(etcd, replica, prefix):
    return f"""
connectors:
  default: nixl
discovery:
  ttl_ms: 3000
multi_turn:
  enabled: true
registry:
  backend: etcd
  etcd_endpoints: ["127.0.0.1:{etcd.client_port}"]
  etcd_prefix: "{prefix}"
  replica_id: "{replica}"
  lease_ttl_s: 2
"""


def gen_bodies(node):
    return [json.loads(r["body"]) for r in node.sim_requests()["requests"]
            if r["method"] == "POST" and r["path"] in GEN_PATHS]


@requires(os.access(ETCD, os.X_OK), "etcd-server")
class EtcdMultiTurn(unittest.TestCase):
    def setUp(self):
        self.etcd = Etcd()
        self.addCleanup(self.etcd.close)
        prefix = f"/pdr-mt-{os.getpid()}-{time.monotonic_ns()}/"
        self.prefix = prefix
        self.a = Router(topology_yaml=topology(self.etcd, "a", prefix))
        self.addCleanup(self.a.stop)
        self.b = Router(topology_yaml=topology(self.etcd, "b", prefix))
        self.addCleanup(self.b.stop)
        kv = os.environ.get("PDR_SIM_KV_BACKENDS", "tcp")
        self.prefill, self.decode = (
            SimNode("--role", role, "--connector", "nixl", "--handshake-port", "0", "--notify-port", "0",
                    "--kv-port", "0", "--kv-backends", kv, "--bidirectional-kv-xfer",
                    "--register", self.a.discovery, "--register-interval-ms", "200")
            for role in ("prefill", "decode"))
        self.addCleanup(self.prefill.kill)
        self.addCleanup(self.decode.kill)
        for r, source in ((self.a, "registered"), (self.b, "replica")):
            r.wait_for(lambda r=r, source=source: all(
                (r.instance(n.http_address) or {}).get("state") == "up"
                and r.instance(n.http_address)["source"] == source for n in (self.prefill, self.decode))
                and r.request("GET", "/ready")[0] == 200, timeout=15)

    def turn(self, router, conversation, text, authorization=None):
        body = json.dumps({"model": "sim-model", "conversation_id": conversation, "max_tokens": 3,
                           "messages": [{"role": "user", "content": text}]}).encode()
        headers = {"Content-Type": "application/json"}
        if authorization:
            headers["Authorization"] = authorization
        return router.request("POST", "/v1/chat/completions", body=body, timeout=10, headers=headers)

    def ok_turn(self, router, conversation, text, authorization=None):
        code, _, raw = self.turn(router, conversation, text, authorization)
        self.assertEqual(code, 200, raw)

    def prefill_params(self, text):
        found = [b for b in gen_bodies(self.prefill) if b["messages"][0]["content"] == text]
        self.assertEqual(len(found), 1, (text, found))
        self.assertNotIn("conversation_id", found[0])
        return found[0]["kv_transfer_params"]

    def assert_reused(self, text):
        params = self.prefill_params(text)
        self.assertIs(params["do_remote_decode"], True)
        self.assertIs(params["do_remote_prefill"], False)
        self.assertEqual(params["remote_host"], "127.0.0.1")
        self.assertTrue(params["remote_block_ids"])

    def assert_ordinary(self, text):
        self.assertIsNone(self.prefill_params(text)["remote_block_ids"])

    def wait_entries(self, router, local, mirrored):
        """Polls until `router` holds `local` entries it stored and `mirrored` ones from the other
        replica. /status is reused for up to 1 s, so a render from before the change could match:
        /metrics (live) must agree on the total."""
        router.wait_for(lambda: router.metrics()["pdrouter_multi_turn_entries"] == local + mirrored
                        and router.status()["registry_backend"]["conversation_entries"]
                        == {"local": local, "mirrored": mirrored}, timeout=10)

    @staticmethod
    def turns(router, result):
        return router.metrics().get('pdrouter_multi_turn_turns_total{result="%s"}' % result, 0)

    def test_the_next_turn_works_on_the_other_replica(self):
        self.ok_turn(self.a, "conv-1", "turn 1")
        self.assert_ordinary("turn 1")
        self.a.wait_for(lambda: self.a.metrics()["pdrouter_etcd_conversation_puts_total"] == 1, timeout=10)
        self.wait_entries(self.b, 0, 1)
        self.wait_entries(self.a, 1, 0)

        self.ok_turn(self.b, "conv-1", "turn 2")
        self.assert_reused("turn 2")
        self.assertEqual(self.turns(self.b, "reused"), 1)
        self.b.wait_for(lambda: self.b.metrics()["pdrouter_etcd_conversation_deletes_total"] == 1, timeout=10)
        # A's entry went with B's delete; B's own entry for turn 3 replaced it there.
        self.b.wait_for(lambda: self.b.metrics()["pdrouter_etcd_conversation_puts_total"] == 1, timeout=10)
        self.wait_entries(self.a, 0, 1)

        self.ok_turn(self.a, "conv-1", "turn 3")
        self.assert_reused("turn 3")
        self.assertEqual(self.turns(self.a, "reused"), 1)
        for r in (self.a, self.b):
            m = r.metrics()
            self.assertEqual(m["pdrouter_etcd_conversation_failures_total"], 0)
            self.assertEqual(m["pdrouter_etcd_conversation_rejected_total"], 0)

    def test_a_replica_restarted_with_the_same_id_reuses_its_entries(self):
        self.ok_turn(self.a, "conv-r", "before restart")
        self.assert_ordinary("before restart")
        self.a.wait_for(lambda: self.a.metrics()["pdrouter_etcd_conversation_puts_total"] == 1, timeout=10)
        self.wait_entries(self.b, 0, 1)
        discovery = self.a.discovery
        self.a.stop()
        # The same replica_id, and the same discovery address: the nodes' registrations reach
        # the new process (same node processes, same epochs).
        self.a = Router(topology_yaml=topology(self.etcd, "a", self.prefix), discovery=discovery)
        self.addCleanup(self.a.stop)
        self.a.wait_for(lambda: all((self.a.instance(n.http_address) or {}).get("state") == "up"
                                    for n in (self.prefill, self.decode))
                        and self.a.request("GET", "/ready")[0] == 200, timeout=15)
        self.wait_entries(self.a, 0, 1)  # restored from etcd (held there, like a mirrored one)
        self.ok_turn(self.a, "conv-r", "after restart")
        self.assert_reused("after restart")
        self.assertEqual(self.turns(self.a, "reused"), 1)
        # Taken: its key is deleted, so B no longer holds it either (only turn 2's own entry).
        self.a.wait_for(lambda: self.a.metrics()["pdrouter_etcd_conversation_deletes_total"] == 1, timeout=10)
        self.wait_entries(self.b, 0, 1)

    def test_an_entry_taken_on_one_replica_is_gone_on_the_other(self):
        self.ok_turn(self.a, "conv-2", "first")
        self.wait_entries(self.b, 0, 1)
        # B takes the entry; the decode then fails the turn, so no new entry is stored anywhere.
        self.decode.set_fault(status=400)
        code, _, raw = self.turn(self.b, "conv-2", "second")
        self.assertNotEqual(code, 200, raw)
        self.assert_reused("second")
        self.wait_entries(self.a, 0, 0)
        self.wait_entries(self.b, 0, 0)
        # Replayed through A: an ordinary turn, not a second use of the blocks B's prefill pulled.
        self.ok_turn(self.a, "conv-2", "second again")
        self.assert_ordinary("second again")
        self.assertEqual(self.turns(self.a, "reused"), 0)
        self.assertEqual(self.turns(self.a, "no_entry"), 2)

    def test_etcd_killed_each_replica_still_does_multi_turn_locally(self):
        self.etcd.kill()
        for r in (self.a, self.b):
            r.wait_for(lambda r=r: not r.status()["registry_backend"]["etcd_reachable"], timeout=15)
        for r, conversation in ((self.a, "conv-a"), (self.b, "conv-b")):
            self.ok_turn(r, conversation, conversation + " 1")
            self.assert_ordinary(conversation + " 1")
            self.ok_turn(r, conversation, conversation + " 2")
            self.assert_reused(conversation + " 2")
            self.assertEqual(self.turns(r, "reused"), 1)
            # The put of each turn's entry and the delete of the taken one were not made.
            r.wait_for(lambda r=r: r.metrics()["pdrouter_etcd_conversation_failures_total"] >= 3, timeout=10)
            self.assertEqual(r.metrics()["pdrouter_etcd_conversation_puts_total"], 0)
        # etcd back: both resync, and entries are shared again.
        self.assertTrue(self.etcd.start(), self.etcd.log())
        for r in (self.a, self.b):
            r.wait_for(lambda r=r: r.status()["registry_backend"]["etcd_reachable"], timeout=15)
        self.ok_turn(self.a, "conv-c", "conv-c 1")
        self.wait_entries(self.b, 1, 1)  # conv-b's own entry, and conv-c's from A
        self.ok_turn(self.b, "conv-c", "conv-c 2")
        self.assert_reused("conv-c 2")

    def test_a_malformed_entry_in_etcd_is_rejected_and_counted(self):
        key = self.prefix + "conversations/anonymous/Zm9v"  # id "foo", no credential
        old_key = self.prefix + "conversations/Zm9v"  # the layout from before client bindings
        decode = self.decode.http_address
        future = int(time.time() * 1000) + 300_000
        for key, value in ((key, b"{not json"),
                           (key, json.dumps({"writer": "x", "binding": "anonymous", "decode": "127.0.0.1:1",
                                             "epoch": 1, "expires_ms": 1, "params": {}}).encode()),  # expired
                           # Usable but for its missing binding: could be any client's.
                           (old_key, json.dumps({"writer": "x", "decode": decode, "epoch": 1, "expires_ms": future,
                                                 "params": {"remote_block_ids": [1], "remote_engine_id": "e"}
                                                 }).encode())):
            body = json.dumps({"key": base64.b64encode(key.encode()).decode(),
                               "value": base64.b64encode(value).decode()}).encode()
            req = urllib.request.Request(f"http://127.0.0.1:{self.etcd.client_port}/v3/kv/put", data=body,
                                         method="POST", headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as resp:
                self.assertEqual(resp.status, 200)
        for r in (self.a, self.b):
            r.wait_for(lambda r=r: r.metrics()["pdrouter_etcd_conversation_rejected_total"] == 3, timeout=10)
            self.assertEqual(r.metrics()["pdrouter_multi_turn_entries"], 0)
        self.ok_turn(self.a, "foo", "foo 1")  # an ordinary turn
        self.assert_ordinary("foo 1")

    def etcd_call(self, method, body):
        req = urllib.request.Request(f"http://127.0.0.1:{self.etcd.client_port}/v3/kv/{method}",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            self.assertEqual(resp.status, 200)
            return json.loads(resp.read())

    def test_a_mirrored_entry_naming_another_host_is_not_reused(self):
        # A real entry, copied under another conversation id with its remote_host changed: what a
        # replica, or anyone able to write to etcd, could plant for the next turn's prefill.
        self.ok_turn(self.a, "conv-h", "h 1")
        self.a.wait_for(lambda: self.a.metrics()["pdrouter_etcd_conversation_puts_total"] == 1, timeout=10)
        self.wait_entries(self.b, 0, 1)
        begin = self.prefix + "conversations/"
        found = self.etcd_call("range", {"key": base64.b64encode(begin.encode()).decode(),
                                         "range_end": base64.b64encode((begin[:-1] + "0").encode()).decode()})
        self.assertEqual(len(found["kvs"]), 1, found)
        key = base64.b64decode(found["kvs"][0]["key"]).decode()
        entry = json.loads(base64.b64decode(found["kvs"][0]["value"]))
        self.assertEqual(entry["params"]["remote_host"], "127.0.0.1")
        entry["params"]["remote_host"] = "victim.invalid"  # RFC 6761: never resolves
        planted = key.rsplit("/", 1)[0] + "/" + base64.urlsafe_b64encode(b"conv-p").decode().rstrip("=")
        self.etcd_call("put", {"key": base64.b64encode(planted.encode()).decode(),
                               "value": base64.b64encode(json.dumps(entry).encode()).decode()})
        self.wait_entries(self.b, 0, 2)
        self.ok_turn(self.b, "conv-p", "p 2")
        self.assert_ordinary("p 2")
        self.assertEqual(self.turns(self.b, "remote_host_mismatch"), 1)
        self.assertEqual(self.turns(self.b, "reused"), 0)
        # The genuine entry still serves its conversation.
        self.ok_turn(self.b, "conv-h", "h 2")
        self.assert_reused("h 2")

    def decode_request_id(self, text):
        found = [r for r in self.decode.sim_requests()["requests"] if r["path"] in GEN_PATHS
                 and json.loads(r["body"])["messages"][0]["content"] == text]
        self.assertEqual(len(found), 1, (text, found))
        return found[0]["headers"]["x-request-id"]

    def test_each_replica_keeps_another_clients_turn_away_from_an_entry(self):
        alice, mallory = "Bearer alice-token", "Bearer mallory-token"
        self.ok_turn(self.a, "conv-x", "alice 1", alice)
        self.wait_entries(self.b, 0, 1)
        # Mallory, through the other replica, with Alice's conversation_id: nothing of Alice's.
        self.ok_turn(self.b, "conv-x", "mallory 1", mallory)
        self.assert_ordinary("mallory 1")
        self.assertEqual(self.turns(self.b, "binding_mismatch"), 1)
        self.wait_entries(self.a, 1, 1)  # Alice's own, and Mallory's from B
        # Alice's next turn, through B, pulls her own blocks.
        self.ok_turn(self.b, "conv-x", "alice 2", alice)
        self.assert_reused("alice 2")
        self.assertTrue(self.prefill_params("alice 2")["remote_request_id"].startswith(
            "chatcmpl-" + self.decode_request_id("alice 1") + "-"))
        # Mallory's, through A, hers.
        self.ok_turn(self.a, "conv-x", "mallory 2", mallory)
        self.assert_reused("mallory 2")
        self.assertTrue(self.prefill_params("mallory 2")["remote_request_id"].startswith(
            "chatcmpl-" + self.decode_request_id("mallory 1") + "-"))


if __name__ == "__main__":
    unittest.main()
