"""routing.pass_through_unknown against paths that name a node's operator endpoints in another
spelling. vLLM's API server (Starlette) routes on the percent-decoded path, so "/start%5Fprofile"
is its /start_profile: pdrouter checks the same decoded, normalised path (router/http/request_path.h)
before any route lookup or pass-through decision, refuses the node admin paths
(router/proxy/pass_through.h), relays only the normalised spelling, and never lends
connectors.upstream_api_key to a pass-through request. Real pdrouter, real sims on 127.0.0.1;
what reached a node is read from the sims' request logs.
"""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pd_fixture import PdCluster  # noqa: E402

UPSTREAM_KEY = "upstream-secret-123"
ADMIN_KEY = "pass-through-test-admin-key"
# Spellings of node operator endpoints: percent-encoded, doubled slashes, dot segments.
DISGUISED = ["/start%5Fprofile", "/stop%5Fprofile", "/reset%5Fprefix%5Fcache", "/%73tart_profile",
             "//start_profile", "/x/../start_profile", "/./reset_prefix_cache", "/v1/load%5Flora%5Fadapter",
             "/%73leep", "/wake%5Fup", "/collective%5Frpc", "/v1/unload_lora_adapter", "/scale_elastic_ep/",
             "/pause/step", "/sleep"]
# Paths a decoding server would read differently than a raw matcher: refused outright.
MALFORMED = ["/a%2Fb", "/a%2fb", "/a%00b", "/a%zzb", "/a%4", "/..", "/a/%2E%2E/%2E%2E/x", "/a%0Ab", "/a%C3%A9"]


def node_admin_requests(nodes):
    """Requests any node received on an admin-ish path, in any spelling."""
    hits = []
    for node in nodes:
        for r in node.sim_requests()["requests"]:
            target = r["target"].lower()
            if any(word in target for word in ("profile", "prefix", "lora", "sleep", "wake", "rpc",
                                               "elastic", "pause", "%")):
                hits.append((node.http_address, r["method"], r["target"], r["headers"].get("authorization")))
    return hits


class PassThroughGuard(unittest.TestCase):
    def cluster(self, extra=""):
        topology = ("routing:\n  pass_through_unknown: true\n%s"
                    "connectors:\n  upstream_api_key_env: PDR_TEST_UPSTREAM_KEY\n"
                    "admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\n" % extra)
        c = PdCluster("nixl", prefills=1, decodes=1, kv_backends="none", topology=topology,
                      router_env={"PDR_TEST_UPSTREAM_KEY": UPSTREAM_KEY, "PDR_TEST_ADMIN_KEY": ADMIN_KEY})
        self.addCleanup(c.close)
        return c

    def refused(self, c):
        return c.metric('pdrouter_requests_refused_total{reason="pass_through_denied"}')

    def test_disguised_admin_paths_never_reach_a_node(self):
        # Before the fix every one of these but the plain spellings was relayed to the decode
        # with "Authorization: Bearer upstream-secret-123" and no client credential.
        c = self.cluster()
        for path in DISGUISED:
            status, _, body = c.post(path, {})
            # pdrouter's own admin routes (after decoding): its admin key guard (401); a node
            # admin path pdrouter does not route: 403.
            self.assertIn(status, (401, 403), (path, body))
        self.assertEqual(node_admin_requests(c.prefills + c.decodes), [])
        self.assertGreaterEqual(self.refused(c), 8)
        self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="pass_through",'
                                  'outcome="relayed"}'), 0)

    def test_malformed_paths_are_400_and_counted(self):
        c = self.cluster()
        for path in MALFORMED:
            status, _, body = c.post(path, {})
            self.assertEqual(status, 400, (path, body))
            self.assertIn(b"invalid_path", body)
        self.assertEqual(c.metric('pdrouter_requests_refused_total{reason="bad_path"}'), len(MALFORMED))
        self.assertEqual(node_admin_requests(c.prefills + c.decodes), [])
        for node in c.prefills + c.decodes:
            self.assertEqual(node.sim_requests()["counters"]["requests"], 0)

    def test_relayed_path_is_the_normalised_one_and_carries_only_the_clients_key(self):
        c = self.cluster()
        status, _, _ = c.request("GET", "/some//unknown/./dir/../thing%21?x=%2F1")
        self.assertEqual(status, 404)  # the decode's own 404, relayed
        status, _, _ = c.request("GET", "/some/unknown", headers={"Authorization": "Bearer client-own"})
        self.assertEqual(status, 404)
        log = c.decodes[0].sim_requests()["requests"]
        self.assertEqual([r["target"] for r in log], ["/some/unknown/thing!?x=%2F1", "/some/unknown"])
        # Never the router's upstream key: none without client credentials, the client's own else.
        self.assertNotIn("authorization", log[0]["headers"])
        self.assertEqual(log[1]["headers"].get("authorization"), "Bearer client-own")
        # A route pdrouter serves itself, spelled differently, is still pdrouter's.
        status, _, _ = c.get("/v1//%6Dodels")
        self.assertEqual(status, 200)
        self.assertEqual(c.metric('pdrouter_one_node_requests_total{endpoint_class="pass_through",'
                                  'outcome="relayed"}'), 2)

    def test_allow_list_limits_what_is_relayed(self):
        c = self.cluster("  pass_through_paths: [\"/v1/extra/**\", \"/sleep\"]\n")
        status, _, _ = c.post("/v1/extra/thing", {})
        self.assertEqual(status, 404)  # relayed: the decode's own 404
        status, _, body = c.post("/v1/other", {})
        self.assertEqual(status, 404, body)  # pdrouter's: not on the list
        status, _, body = c.post("/sl%65ep", {})
        self.assertEqual(status, 403, body)  # listed, but a node admin path
        targets = [r["target"] for r in c.decodes[0].sim_requests()["requests"]]
        self.assertEqual(targets, ["/v1/extra/thing"])
        self.assertEqual(self.refused(c), 2)

    def test_admin_paths_of_the_admin_listener_are_404_on_the_client_port(self):
        c = PdCluster("nixl", prefills=1, decodes=1, kv_backends="none",
                      topology="routing:\n  pass_through_unknown: true\n"
                               "listeners:\n  admin: \"127.0.0.1:0\"\n"
                               "connectors:\n  upstream_api_key_env: PDR_TEST_UPSTREAM_KEY\n",
                      router_env={"PDR_TEST_UPSTREAM_KEY": UPSTREAM_KEY})
        self.addCleanup(c.close)
        for path in ("/start%5Fprofile", "/%72eset_prefix_cache", "/metrics", "/admin//instances"):
            status, _, body = c.post(path, {})
            self.assertEqual(status, 404, (path, body))
        self.assertEqual(node_admin_requests(c.prefills + c.decodes), [])
        for node in c.prefills + c.decodes:
            self.assertFalse(any("metrics" in r["target"] or "admin" in r["target"]
                                 for r in node.sim_requests()["requests"]))
        self.assertEqual(self.refused(c), 4)


if __name__ == "__main__":
    unittest.main()
