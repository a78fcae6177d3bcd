"""Client API keys, tenants and their limits, end to end: a real pdrouter in front of real
`pdnode sim` nodes (NIXL), with a key file (client_auth.keys_file), per-tenant limits (tenants:)
and the access log (access_log:). docs/endpoints.md ("Client keys, tenants and the access log") describes what is checked here:

  * every client endpoint but /health and /ready needs a key of the file, as `Authorization:
    Bearer` or `x-api-key` (401 in OpenAI's error shape, Anthropic's on /v1/messages; nothing is
    sent to a node), and a missing key looks exactly like a wrong one;
  * the nodes never see a client's key unless client_auth.forward_client_key says so;
  * the key file is reread when it changes: a removed key stops working, an added one starts;
  * each key names a tenant; metrics labels are the tenants the configuration names plus
    "other", whatever header values clients send;
  * requests_per_second (a token bucket: 429 with Retry-After, refilled over time),
    tokens_per_minute (prompt + max_tokens reserved, settled from the answer's usage; a stream
    without usage keeps its reservation), max_in_flight.
The access log's lines are checked in test_access_log.py.
"""
import http.client
import itertools
import json
import os
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402
from pdrouter_fixture import TIME_SCALE  # noqa: E402

MODEL = "sim-model"
KEY_A = "sk-team-a-4f1c9a7e2b8d4c06"
KEY_B = "sk-team-b-91d2e7c4a3f05b18"
KEY_C = "sk-team-c-0b7e3d9a1c5f2e84"
KEY_PACED = "sk-paced-7a1e5c3b9d2f4a60"
KEY_CAPPED = "sk-capped-2d8f6b1a4e9c7d35"
KEY_FREE = "sk-free-6e0a2c8b4d1f9e37"
KEY_METERED = {name: "sk-%s-%s" % (name, "5c2e8a4f1b7d3e96") for name in
               ("metered-a", "metered-b", "metered-c", "metered-d")}


# Wrong keys are throttled per address and per /24 (router/clients/admin_throttle.h): each refused request
# of these tests comes from an address of its own network, 127.0.N.1, so only the global budget
# (60 failures, then 10 a second) counts them.
_networks = itertools.count(250)


def fresh_source():
    n = next(_networks)
    return "127.%d.%d.1" % (n // 250, n % 250 + 1)


def request_from(cluster, source, method, path, body=None, headers=None):
    """cluster.request(), from the local address `source`."""
    host, port = cluster._host_port()
    conn = http.client.HTTPConnection(host, port, timeout=10 * TIME_SCALE, source_address=(source, 0))
    try:
        data = None if body is None else json.dumps(body)
        all_headers = {"Content-Type": "application/json"} if data is not None else {}
        all_headers.update(headers or {})
        conn.request(method, path, body=data, headers=all_headers)
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def bearer(key):
    return {"Authorization": "Bearer " + key}


def completion(max_tokens=4, **extra):
    body = {"model": MODEL, "prompt": "Tell me about the sea", "max_tokens": max_tokens}
    body.update(extra)
    return body


def keys_text(*entries):
    return "".join("%s %s\n" % (key, tenant) for key, tenant in entries)


def write_atomically(path, text):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


class KeyedCluster:
    """Mixin: one cluster whose router reads TOPOLOGY (with {keys} replaced by the key file's path)."""
    KEYS = keys_text((KEY_A, "team-a"), (KEY_B, "team-b"))
    TOPOLOGY = "client_auth:\n  keys_file: {keys}\n"

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="pdr-keys-")
        cls.keys_path = os.path.join(cls.tmp.name, "clients.keys")
        write_atomically(cls.keys_path, cls.KEYS)
        cls.cluster = PdCluster("nixl", topology=cls.TOPOLOGY.format(keys=cls.keys_path, dir=cls.tmp.name))
        cls.p, cls.d = cls.cluster.prefills[0], cls.cluster.decodes[0]

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()
        cls.tmp.cleanup()

    def node_requests(self):
        return len(self.p.sim_requests()["requests"]) + len(self.d.sim_requests()["requests"])

    def metric(self, name):
        return self.cluster.metric(name)


class KeyCheck(KeyedCluster, unittest.TestCase):
    def assert_unauthorized(self, status, headers, body, anthropic=False):
        self.assertEqual(status, 401, body)
        self.assertEqual(headers.get("www-authenticate"), 'Bearer realm="pdrouter"')
        doc = json.loads(body)
        if anthropic:
            self.assertEqual(doc["type"], "error", doc)
            self.assertEqual(doc["error"]["type"], "authentication_error", doc)
            message = doc["error"]["message"]
        else:
            self.assertEqual(doc["error"]["code"], "invalid_api_key", doc)
            self.assertEqual(doc["error"]["type"], "invalid_request_error", doc)
            message = doc["error"]["message"]
        self.assertNotIn("sk-", message)
        return message

    def test_missing_and_wrong_keys_are_401_and_reach_no_node(self):
        before = self.node_requests()
        missing = self.metric('pdrouter_client_auth_failures_total{reason="missing"}')
        invalid = self.metric('pdrouter_client_auth_failures_total{reason="invalid"}')
        messages = set()
        endpoints = (("POST", "/v1/completions", completion()),
                     ("POST", "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}),
                     ("GET", "/v1/models", None),
                     ("POST", "/tokenize", {"model": MODEL, "prompt": "hi"}),
                     ("GET", "/health_generate", None),
                     ("POST", "/inference/v1/generate", {"token_ids": [1, 2]}),
                     ("POST", "/v1/messages", {"model": MODEL, "max_tokens": 4,
                                               "messages": [{"role": "user", "content": "hi"}]}))
        # Every endpoint without a key and with a wrong one; the other wrong spellings on one.
        attempts = [(None, e) for e in endpoints] + [(bearer("sk-wrong-0000000000000000"), e) for e in endpoints]
        attempts += [(h, endpoints[0]) for h in (bearer(KEY_A + "x"), bearer(KEY_A[:-1]), {"Authorization": KEY_A},
                                                 {"Authorization": "Basic " + KEY_A},
                                                 {"x-api-key": "sk-wrong-0000000000000000"})]
        for headers, (method, path, body) in attempts:
            status, head, raw = request_from(self.cluster, fresh_source(), method, path, body, headers)
            messages.add(self.assert_unauthorized(status, head, raw, anthropic=path == "/v1/messages"))
        # A wrong method is not revealed either: the key check comes first.
        status, head, raw = request_from(self.cluster, fresh_source(), "GET", "/v1/completions")
        self.assert_unauthorized(status, head, raw)
        self.assertEqual(len(messages), 1, messages)  # one answer, whatever failed
        self.assertEqual(self.node_requests(), before)  # nothing was sent to a node
        self.assertEqual(self.metric('pdrouter_client_auth_failures_total{reason="missing"}') - missing, 7 + 1)
        self.assertEqual(self.metric('pdrouter_client_auth_failures_total{reason="invalid"}') - invalid, 7 + 5)
        # The probes need no key.
        self.assertEqual(self.cluster.get("/health")[0], 200)
        self.assertEqual(self.cluster.get("/ready")[0], 200)
        self.assertNotIn(KEY_A, self.cluster.router.log())

    def test_guessing_is_throttled_but_the_right_key_passes(self):
        source = fresh_source()
        throttled = self.metric("pdrouter_client_auth_throttled_total")
        answers = [request_from(self.cluster, source, "GET", "/v1/models", None,
                                bearer("sk-guess-%016d" % i))[:3:2] for i in range(14)]
        statuses = [status for status, _ in answers]
        # 10 failures back to back from one address, then 2 more a second.
        self.assertEqual(statuses[:10], [401] * 10)
        self.assertIn(429, statuses[10:])
        refused = [raw for status, raw in answers if status == 429]
        self.assertEqual(json.loads(refused[0])["error"]["code"], "auth_throttled")
        self.assertGreaterEqual(self.metric("pdrouter_client_auth_throttled_total") - throttled, len(refused))
        # Whoever holds a key is let in from that same address.
        self.assertEqual(request_from(self.cluster, source, "GET", "/v1/models", None, bearer(KEY_A))[0], 200)

    def test_a_good_key_serves_and_never_reaches_the_nodes(self):
        self.p.reset()
        self.d.reset()
        status, _, raw = self.cluster.post("/v1/completions", completion(), headers=bearer(KEY_A))
        self.assertEqual(status, 200, raw)
        status, _, raw = self.cluster.post("/v1/completions", completion(),
                                           headers={"Authorization": "Bearer EMPTY", "x-api-key": KEY_B})
        self.assertEqual(status, 200, raw)
        status, _, raw = self.cluster.post("/tokenize", {"model": MODEL, "prompt": "hi"}, headers=bearer(KEY_A))
        self.assertEqual(status, 200, raw)
        status, _, raw = self.cluster.get("/v1/models", headers={"x-api-key": KEY_A})
        self.assertEqual(status, 200, raw)
        seen = self.p.sim_requests()["requests"] + self.d.sim_requests()["requests"]
        self.assertGreaterEqual(len([r for r in seen if r["path"] == "/v1/completions"]), 4)
        for r in seen:
            headers = {k.lower(): v for k, v in r.get("headers", {}).items()}
            self.assertNotIn("authorization", headers, r)
            self.assertNotIn("x-api-key", headers, r)
            self.assertNotIn(KEY_A, json.dumps(r))
            self.assertNotIn(KEY_B, json.dumps(r))
        # /health_generate's own request passes the key check with the prober's key.
        status, _, raw = self.cluster.get("/health_generate", headers=bearer(KEY_A))
        self.assertEqual(status, 200, raw)

    def test_x_api_key_on_the_messages_api(self):
        body = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
        self.d.reset()
        status, _, raw = self.cluster.post("/v1/messages", body,
                                           headers={"x-api-key": KEY_B, "anthropic-version": "2023-06-01"})
        self.assertEqual(status, 200, raw)
        self.assertEqual(json.loads(raw)["type"], "message")
        legs = [r for r in self.d.sim_requests()["requests"] if r["path"] == "/v1/messages"]
        self.assertEqual(len(legs), 1)
        self.assertNotIn("authorization", {k.lower() for k in legs[0]["headers"]})
        status, head, raw = request_from(self.cluster, fresh_source(), "POST", "/v1/messages", body,
                                         {"x-api-key": KEY_B + "0"})
        self.assert_unauthorized(status, head, raw, anthropic=True)
        status, _, raw = self.cluster.post("/v1/messages/count_tokens",
                                           {"model": MODEL, "messages": body["messages"]}, headers={"x-api-key": KEY_A})
        self.assertEqual(status, 200, raw)

    def test_tenant_labels_are_the_key_files_tenants(self):
        self.assertEqual(self.cluster.post("/v1/completions", completion(), headers=bearer(KEY_B))[0], 200)
        labels = {name.split('tenant="')[1].split('"')[0] for name in self.cluster.router.metrics()
                  if name.startswith("pdrouter_tenant_requests_total{")}
        self.assertEqual(labels, {"team-a", "team-b", "default", "other"})
        self.assertGreaterEqual(self.metric('pdrouter_tenant_requests_total{tenant="team-b"}'), 1)


class KeyForwarding(KeyedCluster, unittest.TestCase):
    """client_auth.forward_client_key, switched by a topology reload."""

    def legs_authorization(self):
        log = self.p.sim_requests()["requests"] + self.d.sim_requests()["requests"]
        return [{k.lower(): v for k, v in r["headers"].items()}.get("authorization")
                for r in log if r["path"] == "/v1/completions"]

    def reload(self, forward):
        reloads = self.cluster.router.metrics().get('pdrouter_topology_reloads_total{result="ok"}', 0)
        self.cluster.router.write_topology(
            "client_auth:\n  keys_file: %s\n  forward_client_key: %s\n" % (self.keys_path, "true" if forward else "false"))
        self.cluster.router.wait_for(
            lambda: self.cluster.router.metrics().get('pdrouter_topology_reloads_total{result="ok"}', 0) > reloads)

    def test_the_key_goes_on_only_when_the_topology_says_so(self):
        try:
            self.reload(True)
            self.p.reset()
            self.d.reset()
            self.assertEqual(self.cluster.post("/v1/completions", completion(), headers=bearer(KEY_A))[0], 200)
            self.assertEqual(self.legs_authorization(), ["Bearer " + KEY_A] * 2)
        finally:
            self.reload(False)
        self.p.reset()
        self.d.reset()
        self.assertEqual(self.cluster.post("/v1/completions", completion(), headers=bearer(KEY_A))[0], 200)
        self.assertEqual(self.legs_authorization(), [None, None])


class KeyFileReload(KeyedCluster, unittest.TestCase):
    def status_with(self, key):
        return request_from(self.cluster, fresh_source(), "POST", "/v1/completions", completion(), bearer(key))[0]

    def test_a_removed_key_stops_and_an_added_key_starts(self):
        self.assertEqual(self.status_with(KEY_A), 200)
        self.assertEqual(self.status_with(KEY_C), 401)
        # The file is rewritten (another program's doing): only its change tells pdrouter.
        write_atomically(self.keys_path, keys_text((KEY_B, "team-b"), (KEY_C, "team-c")))
        self.cluster.router.wait_for(lambda: self.status_with(KEY_C) == 200, timeout=10, interval=0.2)
        self.assertEqual(self.status_with(KEY_A), 401)
        self.assertEqual(self.status_with(KEY_B), 200)
        labels = {name.split('tenant="')[1].split('"')[0] for name in self.cluster.router.metrics()
                  if name.startswith("pdrouter_tenant_requests_total{")}
        self.assertEqual(labels, {"team-b", "team-c", "default", "other"})
        # A bad file is refused as a whole: the keys in force stay.
        failed = self.metric('pdrouter_topology_reloads_total{result="failed"}')
        write_atomically(self.keys_path, keys_text((KEY_A, "team-a"), ("sk-short", "x")))
        self.cluster.router.wait_for(
            lambda: self.metric('pdrouter_topology_reloads_total{result="failed"}') > failed, timeout=10)
        self.assertEqual(self.status_with(KEY_C), 200)
        self.assertEqual(self.status_with(KEY_A), 401)
        self.assertNotIn("sk-short", self.cluster.router.log())
        write_atomically(self.keys_path, self.KEYS)


class TenantLimits(KeyedCluster, unittest.TestCase):
    KEYS = keys_text((KEY_PACED, "paced"), (KEY_CAPPED, "capped"), (KEY_FREE, "free"),
                     *[(k, n) for n, k in KEY_METERED.items()])
    TOPOLOGY = """client_auth:
  keys_file: {keys}
tenants:
  defaults: {{tokens_per_minute: 600}}
  limits:
    paced: {{requests_per_second: 2, burst: 2, tokens_per_minute: 0}}
    capped: {{max_in_flight: 1, tokens_per_minute: 0}}
    free: {{tokens_per_minute: 0}}
"""

    def test_requests_per_second_refuses_then_refills(self):
        headers = bearer(KEY_PACED)
        start = time.monotonic()
        self.assertEqual(self.cluster.get("/v1/models", headers=headers)[0], 200)
        self.assertEqual(self.cluster.get("/v1/models", headers=headers)[0], 200)
        status, head, raw = self.cluster.get("/v1/models", headers=headers)
        # Unless the machine took half a second for the two requests above, the bucket is empty.
        if time.monotonic() - start < 0.45:
            self.assertEqual(status, 429, raw)
            self.assertEqual(head.get("retry-after"), "1")
            error = json.loads(raw)["error"]
            self.assertEqual(error["code"], "rate_limit_exceeded")
            self.assertIn("paced", error["message"])
            self.assertEqual(self.metric('pdrouter_tenant_refusals_total{tenant="paced",reason="requests_per_second"}'), 1)
        # One request every half second: the next one passes once the bucket refilled, not before.
        self.cluster.router.wait_for(lambda: self.cluster.get("/v1/models", headers=headers)[0] == 200,
                                     timeout=5, interval=0.05)
        self.assertGreaterEqual(time.monotonic() - start, 0.45)
        # Other tenants are not held back by this one's bucket.
        self.assertEqual(self.cluster.get("/v1/models", headers=bearer(KEY_FREE))[0], 200)

    def test_in_flight_cap(self):
        headers = bearer(KEY_CAPPED)
        with self.cluster.stream("/v1/completions", completion(max_tokens=300, stream=True), headers=headers) as s:
            self.assertEqual(s.status, 200)
            events = iter(s)
            next(events)  # the stream runs (about 300 ms of decode left)
            status, head, raw = self.cluster.post("/v1/completions", completion(), headers=headers)
            self.assertEqual(status, 429, raw)
            self.assertEqual(head.get("retry-after"), "1")
            self.assertIn("in flight", json.loads(raw)["error"]["message"])
            self.assertEqual(self.metric('pdrouter_tenant_in_flight{tenant="capped"}'), 1)
            # Another tenant is not capped by this one.
            self.assertEqual(self.cluster.post("/v1/completions", completion(), headers=bearer(KEY_FREE))[0], 200)
            for _ in events:
                pass
        self.cluster.router.wait_for(lambda: self.metric('pdrouter_tenant_in_flight{tenant="capped"}') == 0)
        self.assertEqual(self.cluster.post("/v1/completions", completion(), headers=headers)[0], 200)
        self.assertEqual(self.metric('pdrouter_tenant_refusals_total{tenant="capped",reason="in_flight"}'), 1)

    # tokens_per_minute 600: 10 tokens a second. A request reserves its body's bytes / 4 for the
    # prompt plus its max_tokens; the decode's usage settles it.

    def test_tokens_reserved_then_settled_from_usage(self):
        headers = bearer(KEY_METERED["metered-a"])
        tokens = lambda kind: self.metric('pdrouter_tenant_tokens_total{tenant="metered-a",type="%s"}' % kind)
        # A request that may write 500 tokens but writes one (an EOS): its reservation comes back.
        self.d.set_fault(stop_after_first_token=True, count=1, path="/v1/completions")
        status, _, raw = self.cluster.post("/v1/completions", completion(max_tokens=500), headers=headers)
        self.assertEqual(status, 200, raw)
        self.assertEqual(json.loads(raw)["usage"]["completion_tokens"], 1)
        self.assertEqual(tokens("output"), 1)
        prompt = tokens("prompt")
        self.assertGreater(prompt, 0)
        # So a second one fits (without the settlement only ~70 of the 600 would be left).
        status, _, raw = self.cluster.post("/v1/completions", completion(max_tokens=500), headers=headers)
        self.assertEqual(status, 200, raw)
        self.assertEqual(tokens("output"), 501)
        # That one used ~505: ~95 left, far from the ~530 a third needs.
        status, head, raw = self.cluster.post("/v1/completions", completion(max_tokens=500), headers=headers)
        self.assertEqual(status, 429, raw)
        error = json.loads(raw)["error"]
        self.assertEqual((error["type"], error["code"]), ("tokens", "rate_limit_exceeded"))
        retry = int(head["retry-after"])
        self.assertGreaterEqual(retry, 30)  # ~435 tokens short at 10 a second
        self.assertLessEqual(retry, 54)
        # A request larger than a minute's tokens can never pass: no Retry-After.
        status, head, raw = self.cluster.post("/v1/completions", completion(max_tokens=700), headers=headers)
        self.assertEqual(status, 429, raw)
        self.assertNotIn("retry-after", head)
        self.assertIn("tokens_per_minute = 600", json.loads(raw)["error"]["message"])
        self.assertEqual(self.metric('pdrouter_tenant_refusals_total{tenant="metered-a",reason="tokens_per_minute"}'), 1)
        self.assertEqual(self.metric('pdrouter_tenant_refusals_total{tenant="metered-a",reason="too_large"}'), 1)

    def test_a_stream_with_usage_settles_one_without_keeps_its_reservation(self):
        for tenant, include_usage in (("metered-b", True), ("metered-c", False)):
            headers = bearer(KEY_METERED[tenant])
            self.d.set_fault(stop_after_first_token=True, count=1, path="/v1/completions")
            body = completion(max_tokens=500, stream=True)
            if include_usage:
                body["stream_options"] = {"include_usage": True}
            with self.cluster.stream("/v1/completions", body, headers=headers) as s:
                self.assertEqual(s.status, 200)
                events = list(s)
            self.assertEqual(events[-1], "[DONE]")
            status, _, raw = self.cluster.post("/v1/completions", completion(max_tokens=500), headers=headers)
            if include_usage:  # the usage chunk said 1 token: the reservation came back
                self.assertEqual(status, 200, raw)
            else:  # pdrouter cannot tell what it used: the ~530 reserved stay taken
                self.assertEqual(status, 429, raw)
            self.d.clear_faults()

    def test_a_request_refused_before_any_leg_gives_its_tokens_back(self):
        headers = bearer(KEY_METERED["metered-d"])
        # A model no node serves: no pair, refused after the reservation was made (503).
        for _ in range(5):
            status, _, raw = self.cluster.post("/v1/completions", completion(max_tokens=500, model="no-such-model"),
                                               headers=headers)
            self.assertEqual(status, 503, raw)
        status, _, raw = self.cluster.post("/v1/completions", completion(max_tokens=500), headers=headers)
        self.assertEqual(status, 200, raw)


class TenantHeaderWithoutKeys(unittest.TestCase):
    """Without client keys, tenants.header names the tenant; labels stay bounded."""

    @classmethod
    def setUpClass(cls):
        cls.cluster = PdCluster("nixl", topology="tenants:\n  header: X-Tenant\n  limits:\n    listed: {}\n")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_labels_are_bounded_whatever_clients_send(self):
        for i in range(40):
            status, _, raw = self.cluster.get("/v1/models", headers={"X-Tenant": "tenant-%d" % i})
            self.assertEqual(status, 200, raw)
        self.assertEqual(self.cluster.get("/v1/models", headers={"X-Tenant": "listed"})[0], 200)
        self.assertEqual(self.cluster.get("/v1/models", headers={"X-Tenant": "bad name!"})[0], 200)
        self.assertEqual(self.cluster.get("/v1/models")[0], 200)
        metrics = self.cluster.router.metrics()
        labels = {name.split('tenant="')[1].split('"')[0] for name in metrics
                  if name.startswith("pdrouter_tenant_requests_total{")}
        self.assertEqual(labels, {"listed", "default", "other"})
        self.assertEqual(metrics['pdrouter_tenant_requests_total{tenant="other"}'], 41)
        self.assertEqual(metrics['pdrouter_tenant_requests_total{tenant="listed"}'], 1)
        self.assertEqual(metrics['pdrouter_tenant_requests_total{tenant="default"}'], 1)
        # Keys off: the client's own credential still reaches the nodes, as before keys existed.
        d = self.cluster.decodes[0]
        d.reset()
        status, _, raw = self.cluster.post("/v1/completions", completion(), headers=bearer("node-key-123"))
        self.assertEqual(status, 200, raw)
        legs = [r for r in d.sim_requests()["requests"] if r["path"] == "/v1/completions"]
        self.assertEqual({k.lower(): v for k, v in legs[0]["headers"].items()}["authorization"], "Bearer node-key-123")


if __name__ == "__main__":
    unittest.main()
