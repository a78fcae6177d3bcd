"""The admin API over real HTTP: disabled without a key, keys refused, list/add/remove, operator
drain that a node's heartbeats do not undo, vLLM's demo-proxy POST /instances/add, strict bodies
that change nothing when refused, and the pdrouter_admin_requests_total counters."""
import http.client
import json
import socket
import time
import unittest

import msgpack

from pdr_testlib import allow_by_path, pdrouter_help_routes
from pdrouter_fixture import TIME_SCALE, Router
from sim_fixture import SimNode
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
                                {"role": "prefill", "http_address": "[::1]:8000"})
        self.assertEqual(code, 201)
        code, _, inst = self.admin("POST", "/admin/instances/%5B::1%5D:8000/drain")
        self.assertEqual((code, inst["state"]), (200, "draining"))
        self.assertEqual(self.admin("DELETE", "/admin/instances/[::1]:8000")[0], 200)

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
        self.assertEqual((code, hdrs["allow"]), (405, "GET, HEAD, POST"))
        code, hdrs, _ = self.admin("GET", f"/admin/instances/{STATIC}/drain")
        self.assertEqual((code, hdrs["allow"]), (405, "POST"))
        code, hdrs, _ = self.admin("POST", f"/admin/instances/{STATIC}")
        self.assertEqual((code, hdrs["allow"]), (405, "GET, HEAD, DELETE"))
        code, hdrs, _ = self.admin("GET", "/instances/add")
        self.assertEqual((code, hdrs["allow"]), (405, "POST"))
        self.assertEqual(self.admin("GET", "/admin/nothing")[0], 404)
        self.assertEqual(self.admin("POST", f"/admin/instances/{STATIC}/reboot")[0], 404)

    def test_every_route_in_help_is_routed_and_405_allows_its_methods(self):
        """--help's endpoint list is the route table the server dispatches with: every path it
        lists is served, and a method the path does not accept gets 405 whose Allow names
        exactly the methods --help lists for it."""
        routes = pdrouter_help_routes()
        for path, allow in allow_by_path(routes).items():
            concrete = path.replace("{host:port}", STATIC)
            code, hdrs, doc = self.admin("PATCH", concrete)
            self.assertEqual((code, hdrs.get("allow")), (405, allow), path)
            if path.startswith("/v1/messages"):  # Anthropic's error shape on its paths
                self.assertEqual((doc["type"], doc["error"]["type"]), ("error", "invalid_request_error"), path)
            else:
                self.assertEqual(doc["error"]["code"], "method_not_allowed", path)
        for method, path, _ in routes:
            concrete = path.replace("{host:port}", "127.8.99.1:1")  # not in the registry
            code, _, raw = self.router.request(method, concrete, b"{}" if method == "POST" else None,
                                               headers=AUTH)
            if code == 404:  # the endpoint's own 404 (unknown instance), not the router's
                self.assertNotIn("no route for", raw.decode(), (method, path))
                self.assertNotIn("no admin route", raw.decode(), (method, path))
            self.assertNotEqual(code, 405, (method, path, raw))

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


UPSTREAM_KEY = "upstream-secret-123"


class ProfileNeedsTheAdminKeyTest(unittest.TestCase):
    """security-review #7: /start_profile and /stop_profile were open fan-outs that carried the
    router's upstream key and copied the client's body to every node."""

    def setUp(self):
        self.nodes = [SimNode(), SimNode()]
        for node in self.nodes:
            self.addCleanup(node.stop)
        topology = f"""
admin:
  api_key_env: PDR_TEST_ADMIN_KEY
connectors:
  default: nixl
  upstream_api_key_env: PDR_TEST_UPSTREAM_KEY
instances:
  - role: prefill
    http_address: "{self.nodes[0].http_address}"
  - role: decode
    http_address: "{self.nodes[1].http_address}"
"""
        self.router = Router(topology, env={**ENV, "PDR_TEST_UPSTREAM_KEY": UPSTREAM_KEY})
        self.addCleanup(self.router.stop)

    def profile_calls(self, node, path):
        return [r for r in node.sim_requests()["requests"] if r["path"] == path]

    def test_unauthenticated_profile_is_401_and_reaches_no_node(self):
        for path in ("/start_profile", "/stop_profile"):
            for headers in [{}, {"Authorization": "Bearer nope"}, {"X-API-Key": "nope"}]:
                code, hdrs, raw = self.router.request("POST", path, b'{"x":1}', headers=headers)
                self.assertEqual(code, 401, (path, headers, raw))
                self.assertEqual(json.loads(raw)["error"]["code"], "invalid_api_key")
                self.assertIn("www-authenticate", hdrs)
            # Over the body cap: refused before any node is called.
            code, _, raw = self.router.request("POST", path, b"x" * 5000, headers=AUTH)
            self.assertEqual(code, 413, raw)
            self.assertEqual(json.loads(raw)["error"]["code"], "body_too_large")
            for node in self.nodes:
                self.assertEqual(self.profile_calls(node, path), [])
            # With the key it fans out, with the router's upstream key and never the admin key.
            code, _, raw = self.router.request("POST", path, b'{"x":1}',
                                               headers={**AUTH, "Content-Type": "application/json"})
            # The sim answers 404 unless profiling is enabled on it (as vLLM without
            # VLLM_TORCH_PROFILER_DIR): 502 with every node's answer.
            self.assertIn(code, (200, 502), raw)
            results = {r["instance"]: r["status"] for r in json.loads(raw)["results"]}
            self.assertEqual(set(results), {n.http_address for n in self.nodes})
            for node in self.nodes:
                # The authorised call has arrived: had a refused one been forwarded, it would be
                # in the log too.
                log = node.wait_for_requests(
                    lambda log: any(r["path"] == path and r["status"] for r in log["requests"]))
                calls = [r for r in log["requests"] if r["path"] == path]
                self.assertEqual(len(calls), 1, calls)
                self.assertEqual(calls[0]["status"], results[node.http_address])
                self.assertEqual(calls[0]["headers"].get("authorization"), f"Bearer {UPSTREAM_KEY}")
        self.assertEqual(counter(self.router, "unauthorized"), 6)
        self.assertEqual(counter(self.router, "bad_request"), 2)
        self.assertEqual(self.router.metrics()["pdrouter_profile_fanouts_total"], 2)

    def test_profile_with_the_admin_api_disabled_is_403(self):
        self.router.write_topology("connectors:\n  default: nixl\n")
        self.router.wait_for(
            lambda: self.router.request("GET", "/admin/instances", headers=AUTH)[0] == 403)
        for path in ("/start_profile", "/stop_profile"):
            code, _, raw = self.router.request("POST", path, headers=AUTH)
            self.assertEqual((code, json.loads(raw)["error"]["code"]), (403, "admin_disabled"))
        for node in self.nodes:
            self.assertEqual(self.profile_calls(node, "/start_profile") +
                             self.profile_calls(node, "/stop_profile"), [])


class AdminListenerTest(unittest.TestCase):
    """listeners.admin: the operator endpoints move off the client port."""

    @classmethod
    def setUpClass(cls):
        cls.router = Router(TOPOLOGY + "listeners:\n  admin: \"127.0.0.1:0\"\n", env=ENV)

    @classmethod
    def tearDownClass(cls):
        cls.router.stop()

    def test_operator_paths_are_only_on_the_admin_listener(self):
        router = self.router
        self.assertNotEqual(router.admin_http, router.http)
        operator = [("GET", "/status", None), ("GET", "/metrics", None),
                    ("GET", "/admin/instances", None), ("GET", f"/admin/instances/{STATIC}", None),
                    ("POST", "/instances/add", b'{"type":"decode","instance":"127.0.0.9:1"}'),
                    ("POST", "/start_profile", None), ("POST", "/stop_profile", None)]
        for method, path, body in operator:
            code, _, raw = router.request(method, path, body, headers=AUTH)
            self.assertEqual(code, 404, (path, raw))
            self.assertEqual(json.loads(raw)["error"]["code"], "not_found")
        # The client listener keeps the client endpoints.
        self.assertEqual(router.request("GET", "/health")[0], 200)
        self.assertEqual(router.request("GET", "/ready")[0], 503)  # served: no pair yet
        code, _, raw = router.request("POST", "/v1/completions", b"{}",
                                      headers={"Content-Type": "application/json"})
        self.assertNotEqual(json.loads(raw)["error"]["code"], "not_found", raw)
        # The admin listener has the operator endpoints, and none of the client ones.
        self.assertEqual(router.request("GET", "/status", admin=True)[0], 200)
        self.assertEqual(router.request("GET", "/metrics", admin=True)[0], 200)
        self.assertEqual(router.request("GET", "/health", admin=True)[0], 200)
        code, _, raw = router.request("GET", "/admin/instances", headers=AUTH, admin=True)
        self.assertEqual(code, 200, raw)
        self.assertIn(STATIC, [i["http_address"] for i in json.loads(raw)["instances"]])
        self.assertEqual(router.request("GET", "/admin/instances", admin=True)[0], 401)
        self.assertEqual(router.request("POST", "/start_profile", admin=True)[0], 401)
        for method, path in [("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/ready")]:
            code, _, raw = router.request(method, path, b"{}" if method == "POST" else None,
                                          admin=True)
            self.assertEqual(code, 404, (path, raw))
        # A change made on the admin listener is the one registry the client side routes from.
        added = "127.0.0.9:8100"
        code, _, raw = router.request(
            "POST", "/admin/instances",
            json.dumps({"role": "decode", "http_address": added}).encode(), headers=AUTH,
            admin=True)
        self.assertEqual(code, 201, raw)
        self.assertIsNotNone(router.instance(added))


    def test_each_route_is_on_the_listener_help_names(self):
        for method, path, listener in pdrouter_help_routes():
            concrete = path.replace("{host:port}", STATIC)
            for admin_side in (False, True):
                served = listener == "both" or (listener == "admin") == admin_side
                code, hdrs, raw = self.router.request("PATCH", concrete, headers=AUTH, admin=admin_side)
                self.assertEqual(code, 405 if served else 404, (method, path, admin_side, raw))
                if served:
                    self.assertIn(method, hdrs["allow"], (method, path, admin_side))


class AdminListenerProfileTest(unittest.TestCase):
    def test_profile_on_the_admin_listener_fans_out_and_is_counted(self):
        node = SimNode()
        self.addCleanup(node.stop)
        topology = (f"admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\nconnectors:\n  default: nixl\n"
                    f"listeners:\n  admin: \"127.0.0.1:0\"\ninstances:\n  - role: decode\n"
                    f"    http_address: \"{node.http_address}\"\n")
        with Router(topology, env=ENV) as router:
            self.assertEqual(router.request("POST", "/start_profile", headers=AUTH)[0], 404)
            code, _, raw = router.request("POST", "/start_profile", headers=AUTH, admin=True)
            self.assertIn(code, (200, 502), raw)
            self.assertEqual([r["instance"] for r in json.loads(raw)["results"]],
                             [node.http_address])
            node.wait_for_requests(
                lambda log: [r["path"] for r in log["requests"]] == ["/start_profile"])
            self.assertEqual(router.metrics()["pdrouter_profile_fanouts_total"], 1)


class ProtectedStatusTest(unittest.TestCase):
    def test_status_needs_the_key_with_protect_status(self):
        topology = TOPOLOGY.replace("admin:\n", "admin:\n  protect_status: true\n")
        with Router(topology, env=ENV) as router:
            code, _, raw = router.request("GET", "/status")
            self.assertEqual(code, 401, raw)
            self.assertEqual(json.loads(raw)["error"]["code"], "invalid_api_key")
            code, _, raw = router.request("GET", "/status", headers=AUTH)
            self.assertEqual(code, 200, raw)
            self.assertIn(STATIC, [i["http_address"] for i in json.loads(raw)["instances"]])
            self.assertEqual(router.request("GET", "/health")[0], 200)
            self.assertEqual(counter(router, "unauthorized"), 1)


class AuthThrottleTest(unittest.TestCase):
    """attacks bug 17: admin keys could be guessed at ~3,570/s."""

    def test_burst_of_wrong_keys_is_throttled_then_the_right_key_works(self):
        with Router(TOPOLOGY, env=ENV) as router:
            host, port = router.http.rsplit(":", 1)
            conn = http.client.HTTPConnection(host, int(port), timeout=10 * TIME_SCALE)
            codes = []
            try:
                for i in range(200):  # one keep-alive connection, as the attack did
                    conn.request("GET", "/admin/instances",
                                 headers={"Authorization": f"Bearer guess-{i}"})
                    response = conn.getresponse()
                    body = response.read()
                    codes.append(response.status)
                    if response.status == 429:
                        self.assertEqual(json.loads(body)["error"]["code"], "auth_throttled")
                        self.assertEqual(response.getheader("Retry-After"), "1")
            finally:
                conn.close()
            throttled = codes.count(429)
            self.assertGreaterEqual(throttled, 150, codes)
            self.assertEqual(codes.count(401) + throttled, 200, codes)
            metrics = router.metrics()
            self.assertEqual(metrics["pdrouter_admin_auth_throttled_total"], throttled)
            self.assertEqual(metrics['pdrouter_admin_requests_total{result="throttled"}'],
                             throttled)
            # Once the address has a failure token back, the right key is checked and works.
            router.wait_for(
                lambda: router.request("GET", "/admin/instances", headers=AUTH)[0] == 200,
                timeout=10)
            self.assertEqual(router.request("GET", "/health")[0], 200)

    def _ask(self, router, source, key, count=1):
        """`count` GET /admin/instances with `key` on one connection from `source` (a 127.x
        address the client socket is bound to); returns the statuses."""
        host, port = router.http.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10 * TIME_SCALE,
                                        source_address=(source, 0))
        conn = http.client.HTTPConnection(host, int(port), timeout=10 * TIME_SCALE)
        conn.sock = sock
        codes = []
        try:
            for _ in range(count):
                conn.request("GET", "/admin/instances", headers={"Authorization": f"Bearer {key}"})
                response = conn.getresponse()
                response.read()
                codes.append(response.status)
        finally:
            conn.close()
        return codes

    def test_many_source_addresses_share_a_global_budget(self):
        # Before the fix the throttle counted per address only: 300 loopback addresses (each in
        # its own /24) guessing 9 keys each got 2,700 x 401 and not one 429. Now every failure
        # also takes from the global budget (60 at once, 10 a second).
        with Router(TOPOLOGY, env=ENV) as router:
            codes = []
            start = time.monotonic()
            for i in range(300):
                codes += self._ask(router, "127.%d.%d.1" % (i % 250 + 1, i // 250 + 1), "guess-%d" % i, 9)
            took = time.monotonic() - start
            answered = codes.count(401)
            print("300 addresses x 9 wrong keys in %.1f s: %d x 401, %d x 429" % (took, answered, codes.count(429)))
            self.assertEqual(answered + codes.count(429), 2700, codes)
            self.assertLessEqual(answered, 60 + 10 * took + 10)
            # The right key still works from anywhere, at once.
            self.assertEqual(self._ask(router, "127.250.0.1", KEY), [200])

    def test_the_right_key_is_let_in_while_its_address_is_throttled(self):
        # Before the fix 12 wrong keys from an address (a proxy or NAT every client shares)
        # made its right key answer 429 too.
        with Router(TOPOLOGY, env=ENV) as router:
            codes = self._ask(router, "127.0.0.7", "wrong", 12)
            self.assertEqual(codes[-1], 429, codes)
            self.assertEqual(self._ask(router, "127.0.0.7", KEY, 3), [200, 200, 200])
            self.assertEqual(self._ask(router, "127.0.0.7", "wrong"), [429])


if __name__ == "__main__":
    unittest.main()
