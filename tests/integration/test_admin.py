"""The admin API over real HTTP: disabled without a key, keys refused, list/add/remove, operator
drain that a node's heartbeats do not undo, vLLM's demo-proxy POST /instances/add, strict bodies
that change nothing when refused, and the pdrouter_admin_requests_total counters."""
import json
import unittest

import msgpack

from pdrouter_fixture import Router
from test_registration import moriio_current

KEY = "s3cret-admin-key"
ENV = {"PDR_TEST_ADMIN_KEY": KEY}
AUTH = {"Authorization": f"Bearer {KEY}"}
STATIC = "127.8.0.1:8000"
TOPOLOGY = f"""
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
connectors:
  default: nixl
discovery:
  ttl_ms: 60000
instances:
  - role: prefill
    http_address: "{STATIC}"
"""


def counter(router, result):
    return router.metrics()[f'pdrouter_admin_requests_total{{result="{result}"}}']


class AdminDisabledTest(unittest.TestCase):
    def test_no_key_configured_means_403_everywhere(self):
        with Router("connectors:\n  default: nixl\n") as router:
            for method, path, body in [("GET", "/admin/instances", None),
                                       ("POST", "/admin/instances", b"{}"),
                                       ("POST", "/instances/add", b'{"type":"decode","instance":"a:1"}')]:
                code, _, body = router.request(method, path, body, headers=AUTH)
                self.assertEqual(code, 403, path)
                error = json.loads(body)["error"]
                self.assertEqual(error["code"], "admin_disabled")
                self.assertIn("admin.api_key_env", error["message"])
            self.assertEqual(counter(router, "disabled"), 3)
            self.assertEqual(len(router.status()["instances"]), 0)


class AdminKeyReloadTest(unittest.TestCase):
    def test_a_reload_without_the_key_disables_the_api(self):
        with Router(TOPOLOGY, env=ENV) as router:
            self.assertEqual(router.request("GET", "/admin/instances", headers=AUTH)[0], 200)
            router.write_topology("connectors:\n  default: nixl\n")
            router.wait_for(lambda: router.request("GET", "/admin/instances", headers=AUTH)[0] == 403)


class AdminApiTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.router = Router(TOPOLOGY, env=ENV)

    @classmethod
    def tearDownClass(cls):
        cls.router.stop()

    def admin(self, method, path, doc=None, raw=None, headers=AUTH):
        body = raw if raw is not None else (json.dumps(doc).encode() if doc is not None else None)
        code, hdrs, payload = self.router.request(method, path, body, headers=headers)
        return code, hdrs, (json.loads(payload) if payload else None)

    def test_missing_or_wrong_key_is_401(self):
        for headers in [{}, {"Authorization": "Bearer nope"}, {"X-API-Key": KEY + "x"},
                        {"Authorization": KEY}]:
            code, hdrs, doc = self.admin("GET", "/admin/instances", headers=headers)
            self.assertEqual(code, 401, headers)
            self.assertEqual(doc["error"]["code"], "invalid_api_key")
            self.assertIn("www-authenticate", hdrs)
        code, _, _ = self.admin("GET", "/admin/instances", headers={"X-API-Key": KEY})
        self.assertEqual(code, 200)

    def test_list_shows_what_status_shows(self):
        code, _, doc = self.admin("GET", "/admin/instances")
        self.assertEqual(code, 200)
        listed = {i["http_address"]: i for i in doc["instances"]}
        shown = self.router.instance(STATIC)
        self.assertEqual(set(listed[STATIC]), set(shown))
        self.assertEqual(listed[STATIC]["source"], "static")
        self.assertIn("registry_version", doc)

    def test_add_is_visible_at_once_then_remove(self):
        address = "127.8.0.2:8200"
        code, hdrs, inst = self.admin("POST", "/admin/instances", {
            "role": "decode", "http_address": address, "connector": "moriio", "transfer_mode": "READ",
            "zmq_address": "host:127.8.0.2,handshake:6301,notify:61005", "dp_size": 2, "tp_size": 4,
            "model": "m", "labels": {"zone": "b"}})
        self.assertEqual(code, 201, inst)
        self.assertEqual(hdrs["location"], f"/admin/instances/{address}")
        self.assertEqual((inst["source"], inst["role"], inst["dp_size"]), ("admin", "decode", 2))
        # Answered only once published: no waiting needed to see it.
        shown = self.router.instance(address)
        self.assertEqual((shown["source"], shown["state"], shown["dialect"]), ("admin", "up", "moriio"))
        self.assertIsNone(shown["expires_in_ms"])
        self.assertEqual(self.admin("GET", f"/admin/instances/{address}")[0], 200)

        code, _, doc = self.admin("POST", "/admin/instances",
                                  {"role": "decode", "http_address": address, "connector": "nixl"})
        self.assertEqual(code, 409)
        self.assertIn("already added", doc["error"]["message"])

        code, _, removed = self.admin("DELETE", f"/admin/instances/{address}")
        self.assertEqual((code, removed["http_address"]), (200, address))
        self.assertIsNone(self.router.instance(address))
        self.assertEqual(self.admin("DELETE", f"/admin/instances/{address}")[0], 404)
        self.assertEqual(self.admin("GET", f"/admin/instances/{address}")[0], 404)

    def test_static_instances_cannot_be_removed_or_overwritten(self):
        code, _, doc = self.admin("DELETE", f"/admin/instances/{STATIC}")
        self.assertEqual(code, 409)
        self.assertIn("topology file", doc["error"]["message"])
        code, _, _ = self.admin("POST", "/admin/instances", {"role": "decode", "http_address": STATIC})
        self.assertEqual(code, 409)
        self.assertEqual(self.router.instance(STATIC)["role"], "prefill")

    def test_drain_survives_heartbeats_and_undrain_restores(self):
        address = "127.8.0.3:8100"
        node = self.router.dealer()
        beat = moriio_current("127.8.0.3", 8100, role="D")
        node.send(msgpack.packb(beat))
        self.router.wait_for(lambda: self.router.instance(address))

        code, _, inst = self.admin("POST", f"/admin/instances/{address}/drain")
        self.assertEqual((code, inst["state"], inst["operator_drain"]), (200, "draining", True))
        self.assertEqual(self.router.instance(address)["state"], "draining")
        self.assertEqual(self.router.status()["counts"]["decode"]["draining"], 1)

        def beats_seen(target):
            def check():
                node.send(msgpack.packb(beat))  # the node keeps heartbeating (draining: no)
                inst = self.router.instance(address)
                self.assertEqual(inst["state"], "draining")
                return inst["messages"] >= target
            return check
        start = self.router.instance(address)["messages"]
        self.router.wait_for(beats_seen(start + 3), interval=0.05)

        code, _, inst = self.admin("POST", f"/admin/instances/{address}/undrain")
        self.assertEqual((code, inst["state"], inst["operator_drain"]), (200, "up", False))
        node.send(msgpack.packb(beat))
        self.router.wait_for(lambda: self.router.instance(address)["messages"] >= start + 4)
        self.assertEqual(self.router.instance(address)["state"], "up")
        self.assertEqual(self.admin("POST", "/admin/instances/127.8.9.9:1/drain")[0], 404)

    def test_ipv6_address_in_path(self):
        code, _, _ = self.admin("POST", "/admin/instances",
                                {"role": "prefill", "http_address": "[fd00::8]:8000"})
        self.assertEqual(code, 201)
        code, _, inst = self.admin("POST", "/admin/instances/%5Bfd00::8%5D:8000/drain")
        self.assertEqual((code, inst["state"]), (200, "draining"))
        self.assertEqual(self.admin("DELETE", "/admin/instances/[fd00::8]:8000")[0], 200)

    def test_seed_instances_add(self):
        address = "127.0.0.1:9301"
        seed = {"X-API-Key": KEY, "Content-Type": "application/json"}
        body = json.dumps({"type": "decode", "instance": address}).encode()
        code, _, raw = self.router.request("POST", "/instances/add", body, headers=seed)
        self.assertEqual(code, 200, raw)
        self.assertEqual(json.loads(raw), {"message": f"Added {address} to decode_instances."})
        shown = self.router.instance(address)
        self.assertEqual((shown["role"], shown["source"], shown["dialect"]), ("decode", "admin", "nixl"))

        code, _, raw = self.router.request("POST", "/instances/add", body, headers=seed)
        self.assertEqual(code, 400)
        self.assertTrue(json.loads(raw)["error"]["message"].startswith("Instance already exists."))
        code, _, raw = self.router.request("POST", "/instances/add", body, headers={"X-API-Key": "no"})
        self.assertEqual(code, 403)
        self.assertEqual(json.loads(raw)["error"]["message"], "Forbidden: Invalid API Key.")
        bad = json.dumps({"type": "both", "instance": address}).encode()
        code, _, raw = self.router.request("POST", "/instances/add", bad, headers=seed)
        self.assertEqual(code, 400)
        self.assertTrue(json.loads(raw)["error"]["message"].startswith("Invalid instance type."))
        self.assertEqual(self.admin("DELETE", f"/admin/instances/{address}")[0], 200)

    def test_bad_bodies_are_400_with_a_precise_message_and_change_nothing(self):
        before = self.router.status()
        cases = [
            (b"not json", "body is not valid JSON"),
            (b"[]", "body must be a JSON object"),
            (b'{"role":"decode"}', "missing key 'http_address'"),
            (b'{"role":"decode","http_address":"127.8.0.9:80","port":1}', "unknown key 'port'"),
            (b'{"role":"decode","http_address":"127.8.0.9:80","dp_size":"2"}', "dp_size: expected an integer"),
            (b'{"role":"decode","http_address":"127.8.0.9:80","tp_size":4096}', "tp_size: 4096 is out of range"),
            (b'{"role":"decode","http_address":"127.8.0.9"}', "http_address: "),
            (b'{"role":"decode","http_address":"127.8.0.9:80","connector":"moriio"}',
             "connector moriio needs zmq_address"),
            (b'{"role":"decode","http_address":"127.8.0.9:80","connector":"p2p-nccl","zmq_address":"x:1",'
             b'"transfer_mode":"READ"}', "transfer_mode: connector p2p-nccl has no transfer mode"),
            (b'{"role":"decode","role":"prefill","http_address":"127.8.0.9:80"}', "duplicate key 'role'"),
        ]
        for raw, message in cases:
            code, _, doc = self.admin("POST", "/admin/instances", raw=raw)
            self.assertEqual(code, 400, raw)
            self.assertIn(message, doc["error"]["message"], raw)
        code, _, _ = self.admin("POST", "/admin/instances", raw=b" " * (16 * 1024 + 1))
        self.assertEqual(code, 413)
        self.assertEqual(self.admin("DELETE", "/admin/instances/not-an-address")[0], 400)
        after = self.router.status()
        self.assertEqual(after["registry_version"], before["registry_version"])
        self.assertIsNone(self.router.instance("127.8.0.9:80"))

    def test_wrong_methods_and_unknown_paths(self):
        code, hdrs, _ = self.admin("PUT", "/admin/instances", {})
        self.assertEqual((code, hdrs["allow"]), (405, "GET, POST"))
        code, hdrs, _ = self.admin("GET", f"/admin/instances/{STATIC}/drain")
        self.assertEqual((code, hdrs["allow"]), (405, "POST"))
        code, hdrs, _ = self.admin("POST", f"/admin/instances/{STATIC}")
        self.assertEqual((code, hdrs["allow"]), (405, "GET, DELETE"))
        code, hdrs, _ = self.admin("GET", "/instances/add")
        self.assertEqual((code, hdrs["allow"]), (405, "POST"))
        self.assertEqual(self.admin("GET", "/admin/nothing")[0], 404)
        self.assertEqual(self.admin("POST", f"/admin/instances/{STATIC}/reboot")[0], 404)

    def test_metrics_count_each_result(self):
        names = ["ok", "unauthorized", "bad_request", "not_found", "conflict"]
        before = {n: counter(self.router, n) for n in names}
        self.admin("GET", "/admin/instances")
        self.admin("GET", "/admin/instances", headers={})
        self.admin("POST", "/admin/instances", raw=b"{")
        self.admin("DELETE", "/admin/instances/127.8.7.7:1")
        self.admin("DELETE", f"/admin/instances/{STATIC}")
        for name in names:
            self.assertEqual(counter(self.router, name), before[name] + 1, name)
        self.assertEqual(counter(self.router, "disabled"), 0)


if __name__ == "__main__":
    unittest.main()
