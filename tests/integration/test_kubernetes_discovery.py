"""Kubernetes pod discovery (topology `kubernetes:`), end to end against a fake API server
(fake_kube_api.py: real HTTP, list then chunked watch with resourceVersion, bookmarks, 410 Gone)
and `pdnode sim` nodes listening on the pods' IPs (127.0.0.2, 127.0.0.3, ...: pdrouter really
connects to them).

  * pods that are Running and Ready with a role label become nodes (source "kubernetes") and
    serve a real P/D request; a pod that is not ready, not running or has no role label is not
    a node; a pod losing readiness leaves, regaining it returns; deletionTimestamp drains it;
    DELETED removes it; the service-account style token is sent and never logged;
  * the watch is opened again from its resourceVersion when the server ends it; 410 Gone (HTTP
    status or ERROR event) makes pdrouter list again, and a pod deleted meanwhile goes;
  * bookmarks move the resourceVersion; lines that do not decode are counted and skipped;
  * with prefill_selector / decode_selector, the selectors (not the role label) give pods their
    role, matched locally on one list+watch; a pod in both is refused and counted; relabelling
    moves a pod in, out, or to the other role; setting both ways, or a bad selector, fails at load;
    the fake filters by labelSelector as the API does (equality, !=, in, notin, exists, !exists);
  * an https api_server (the fake served over TLS with a certificate made by the openssl CLI) is
    verified against kubernetes.ca_file: the right CA discovers the pods, another CA fails with
    a clear error and a counter, and no pod becomes a node.
"""

import json
import os
import re
import socket
import subprocess
import tempfile
import unittest

from fake_kube_api import FakeKubeApi, pod
from test_etcd_replicas import ETCD, Etcd
from test_etcd_tls import OPENSSL, VERIFY_ERRORS, make_pki
from pdr_testlib import ProcessHandle, pdnode_path, pdrouter_path, requires
from pdrouter_fixture import Router

TOKEN = "k8s-test-token-3f9a1c"


def port_free_on(hosts):
    """A TCP port free on every host (bind-probed)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((hosts[0], 0))
            port = s.getsockname()[1]
        ok = True
        for host in hosts[1:]:
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    ok = False
                    break
        if ok:
            return port
    raise AssertionError("no port free on " + ", ".join(hosts))


class PodSim:
    """`pdnode sim` on a pod IP (127.0.0.x) and the shared pod port."""

    def __init__(self, ip, port, role):
        self.ip, self.port = ip, port
        self.http_address = f"{ip}:{port}"
        self.proc = ProcessHandle([pdnode_path(), "sim", "--http", self.http_address, "--role", role,
                                   "--connector", "nixl", "--kv-backends", "none"], name="pdnode-sim")
        if self.proc.wait_for_line(r"pdnode sim listening http=", 10, streams=("stdout",)) is None:
            self.proc.stop()
            raise AssertionError("pdnode sim did not start:\n" + self.proc.output())

    def requests_served(self):
        import http.client
        conn = http.client.HTTPConnection(self.ip, self.port, timeout=5)
        try:
            conn.request("GET", "/sim/requests")
            return json.loads(conn.getresponse().read())["requests"]
        finally:
            conn.close()

    def stop(self):
        self.proc.stop()


def topology(api, port, token_file, extra="", label_selector="app=vllm"):
    return f"""
connectors:
  default: nixl
kubernetes:
  enabled: true
  api_server: "{api.url}"
  namespace: llm
  label_selector: "{label_selector}"
  token_file: "{token_file}"
  port: {port}
  retry_ms: 100
{extra}"""


class KubernetesDiscovery(unittest.TestCase):
    def setUp(self):
        self.api = FakeKubeApi(token=TOKEN)
        self.addCleanup(self.api.close)
        self.dir = tempfile.TemporaryDirectory(prefix="pdr-k8s-it-")
        self.addCleanup(self.dir.cleanup)
        self.token_file = os.path.join(self.dir.name, "token")
        with open(self.token_file, "w") as f:
            f.write(TOKEN + "\n")
        self.ips = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
        self.port = port_free_on(self.ips)
        self.prefill = PodSim(self.ips[0], self.port, "prefill")
        self.addCleanup(self.prefill.stop)
        self.decode = PodSim(self.ips[1], self.port, "decode")
        self.addCleanup(self.decode.stop)

    def start_router(self, extra="", label_selector="app=vllm"):
        router = Router(topology(self.api, self.port, self.token_file, extra, label_selector))
        self.addCleanup(router.dir.cleanup)
        self.addCleanup(router.stop)
        return router

    def state(self, router, address):
        inst = router.instance(address)
        return None if inst is None else (inst["state"], inst["source"])

    def k8s(self, router):
        return router.status()["kubernetes"]

    def completion(self, router):
        body = json.dumps({"model": "sim-model", "prompt": "Hello pods", "max_tokens": 2}).encode()
        return router.request("POST", "/v1/completions", body=body, timeout=10,
                              headers={"Content-Type": "application/json"})

    def test_serving_pods_become_nodes_serve_and_leave(self):
        self.api.put_pod(pod("prefill-0", self.ips[0], "prefill"))
        self.api.put_pod(pod("decode-0", self.ips[1], "decode"))
        # Not nodes: not ready, not running, no role label, not selected, no IP yet.
        self.api.put_pod(pod("decode-1", self.ips[2], "decode", ready=False))
        self.api.put_pod(pod("pending-0", "127.0.0.5", "decode", phase="Pending"))
        self.api.put_pod(pod("sidecar-0", "127.0.0.6"))
        self.api.put_pod(pod("other-0", "127.0.0.7", "decode", labels={"app": "other"}))
        self.api.put_pod(pod("noip-0", "", "decode"))
        router = self.start_router()
        router.wait_for(lambda: self.state(router, self.prefill.http_address) == ("up", "kubernetes")
                        and self.state(router, self.decode.http_address) == ("up", "kubernetes"),
                        timeout=10)
        self.assertEqual(len(router.status()["instances"]), 2)
        code, _, body = self.completion(router)
        self.assertEqual(code, 200, body)
        self.assertEqual(len(self.prefill.requests_served()), 1)
        self.assertEqual(len(self.decode.requests_served()), 1)
        status = router.wait_for(lambda: (lambda s: s if s["watching"] else None)(self.k8s(router)),
                                 timeout=10)[0]
        self.assertEqual((status["enabled"], status["namespace"], status["label_selector"], status["pods"]),
                         (True, "llm", "app=vllm", 2))
        self.assertEqual(status["state"], "watching")
        metrics = router.metrics()
        self.assertEqual(metrics["pdrouter_kubernetes_pods"], 2)
        self.assertEqual(metrics["pdrouter_kubernetes_watching"], 1)
        self.assertGreaterEqual(metrics["pdrouter_kubernetes_bad_pods_total"], 1)  # sidecar-0
        # The token is sent on every request, the selector is the configured one, and the token
        # is nowhere in the log.
        self.assertTrue(self.api.requests)
        for path, auth in list(self.api.requests):
            self.assertEqual(auth, f"Bearer {TOKEN}")
            self.assertIn("labelSelector=app%3Dvllm", path)
        self.assertTrue(any("watch=1" in p and "allowWatchBookmarks=true" in p for p, _ in self.api.requests))

        # Readiness lost: the pod leaves; regained: it returns.
        self.api.put_pod(pod("decode-0", self.ips[1], "decode", ready=False))
        router.wait_for(lambda: self.state(router, self.decode.http_address) is None, timeout=5)
        self.assertEqual(router.request("GET", "/ready")[0], 503)
        self.api.put_pod(pod("decode-0", self.ips[1], "decode"))
        router.wait_for(lambda: self.state(router, self.decode.http_address) == ("up", "kubernetes"),
                        timeout=5)
        # The not-ready pod becomes ready: it is a node now (no sim behind it: not routed to here).
        self.api.put_pod(pod("decode-1", self.ips[2], "decode"))
        router.wait_for(lambda: self.state(router, f"{self.ips[2]}:{self.port}") == ("up", "kubernetes"),
                        timeout=5)
        self.api.delete_pod("decode-1")
        router.wait_for(lambda: self.state(router, f"{self.ips[2]}:{self.port}") is None, timeout=5)
        # Deletion started: draining; deleted: gone.
        self.api.put_pod(pod("prefill-0", self.ips[0], "prefill", deleting=True))
        router.wait_for(lambda: self.state(router, self.prefill.http_address) == ("draining", "kubernetes"),
                        timeout=5)
        # A new pod got the IP before the old one's DELETED arrived: the entry stays, the new pod's.
        self.api.put_pod(pod("prefill-1", self.ips[0], "prefill", uid="uid-new"))
        self.api.delete_pod("prefill-0")
        router.wait_for(lambda: (router.instance(self.prefill.http_address) or {}).get("instance_id") == "uid-new",
                        timeout=5)
        self.assertEqual(self.state(router, self.prefill.http_address), ("up", "kubernetes"))
        self.api.delete_pod("prefill-1")
        router.wait_for(lambda: self.state(router, self.prefill.http_address) is None, timeout=5)
        self.assertGreaterEqual(router.metrics()["pdrouter_kubernetes_events_total"], 6)
        self.assertNotIn(TOKEN, router.log())

    def test_annotations_describe_the_node(self):
        self.api.put_pod(pod("prefill-0", self.ips[0], "prefill", annotations={
            "pdrouter.io/model": "sim-model", "pdrouter.io/kv-events-port": "5557",
            "pdrouter.io/tp-size": "2"}))
        self.api.put_pod(pod("decode-9", self.ips[2], "decode", annotations={"pdrouter.io/port": "9"}))
        self.api.put_pod(pod("bad-0", "127.0.0.8", "decode", annotations={"pdrouter.io/connector": "carrier-pigeon"}))
        router = self.start_router()
        inst = router.wait_for(lambda: router.instance(self.prefill.http_address), timeout=10)[0]
        self.assertEqual((inst["model"], inst["tp_size"], inst["kv_events_endpoint"], inst["dialect"]),
                         ("sim-model", 2, f"tcp://{self.ips[0]}:5557", "nixl"))
        self.assertEqual(inst["instance_id"], "uid-prefill-0")
        router.wait_for(lambda: router.instance(f"{self.ips[2]}:9"), timeout=5)
        self.assertIsNone(router.instance(f"127.0.0.8:{self.port}"))
        router.wait_for(lambda: "carrier-pigeon" in router.log(), timeout=5)

    def test_watch_reopens_after_the_server_ends_it_and_relists_on_gone(self):
        self.api.put_pod(pod("prefill-0", self.ips[0], "prefill"))
        router = self.start_router()
        router.wait_for(lambda: self.k8s(router)["watching"] and self.api.watch_count() == 1, timeout=10)
        lists = router.metrics()["pdrouter_kubernetes_lists_total"]
        self.assertEqual(lists, 1)
        # The server ends the stream: pdrouter watches again from its resourceVersion (no list).
        self.api.close_watches()
        router.wait_for(lambda: router.metrics()["pdrouter_kubernetes_watches_total"] >= 2
                        and self.api.watch_count() == 1, timeout=10)
        self.api.put_pod(pod("decode-0", self.ips[1], "decode"))
        router.wait_for(lambda: self.state(router, self.decode.http_address) == ("up", "kubernetes"),
                        timeout=5)
        self.assertEqual(router.metrics()["pdrouter_kubernetes_lists_total"], 1)
        code, _, body = self.completion(router)
        self.assertEqual(code, 200, body)

        # A bookmark moves the resourceVersion.
        rv = self.api.bookmark()
        router.wait_for(lambda: self.k8s(router)["resource_version"] == str(rv), timeout=5)
        self.assertEqual(router.metrics()["pdrouter_kubernetes_bookmarks_total"], 1)

        # HTTP 410 on the re-watch: pdrouter lists again and sees that decode-0 went meanwhile.
        with self.api.cond:
            # Deleted, and the event compacted away: only a list can tell.
            self.api.pods.pop("decode-0")
            self.api.rv += 1
        self.api.compact()
        self.api.close_watches()
        router.wait_for(lambda: self.state(router, self.decode.http_address) is None, timeout=10)
        self.assertGreaterEqual(router.metrics()["pdrouter_kubernetes_relists_total"], 1)
        self.assertEqual(self.state(router, self.prefill.http_address), ("up", "kubernetes"))

        # An ERROR 410 event on the open stream: listed again too.
        router.wait_for(lambda: self.k8s(router)["watching"] and self.api.watch_count() == 1, timeout=10)
        relists = router.metrics()["pdrouter_kubernetes_relists_total"]
        self.api.gone_event()
        router.wait_for(lambda: router.metrics()["pdrouter_kubernetes_relists_total"] > relists, timeout=10)
        router.wait_for(lambda: self.k8s(router)["watching"], timeout=10)

    def test_bad_lines_are_counted_and_skipped(self):
        router = self.start_router()
        router.wait_for(lambda: self.k8s(router)["watching"] and self.api.watch_count() == 1, timeout=10)
        watches = router.metrics()["pdrouter_kubernetes_watches_total"]
        self.api.raw_line(b"this is not json\n")
        self.api.raw_line(b'{"type": "EXPLODED", "object": {}}\n')
        self.api.raw_line(b'{"type": "ADDED", "object": {"metadata": {"name": 7}}}\n')
        self.api.raw_line(b"[" * 100000 + b"\n")
        self.api.put_pod(pod("decode-0", self.ips[1], "decode"))
        router.wait_for(lambda: self.state(router, self.decode.http_address) == ("up", "kubernetes"),
                        timeout=5)
        metrics = router.metrics()
        self.assertEqual(metrics["pdrouter_kubernetes_bad_events_total"], 4)
        self.assertEqual(metrics["pdrouter_kubernetes_watches_total"], watches)  # the same stream
        self.assertIn("skipped", self.k8s(router)["last_error"])

    def test_unauthorized_is_retried_and_reported(self):
        with open(self.token_file, "w") as f:
            f.write("wrong-token")
        self.api.put_pod(pod("decode-0", self.ips[1], "decode"))
        router = self.start_router("  token_refresh_ms: 1000\n")
        router.wait_for(lambda: "401" in self.k8s(router)["last_error"], timeout=10)
        self.assertGreaterEqual(router.metrics()["pdrouter_kubernetes_errors_total"], 1)
        self.assertEqual(router.status()["instances"], [])
        # The token file is read again: the right token lets it in.
        with open(self.token_file, "w") as f:
            f.write(TOKEN)
        router.wait_for(lambda: self.state(router, self.decode.http_address) == ("up", "kubernetes"),
                        timeout=10)
        self.assertNotIn("wrong-token", router.log())

    def test_fake_api_filters_by_label_selector_as_the_api_does(self):
        # The selector syntax pod discovery relies on, answered by the fake like the real API.
        self.api.put_pod(pod("a", "127.0.0.2", labels={"llm-d.ai/role": "prefill", "tier": "gpu"}))
        self.api.put_pod(pod("b", "127.0.0.3", labels={"llm-d.ai/role": "decode"}))
        self.api.put_pod(pod("c", "127.0.0.4", labels={"app": "other"}))

        def names(selector):
            import http.client
            import urllib.parse
            conn = http.client.HTTPConnection("127.0.0.1", self.api.port, timeout=5)
            try:
                conn.request("GET", "/api/v1/namespaces/llm/pods?labelSelector=" + urllib.parse.quote(selector),
                             headers={"Authorization": f"Bearer {TOKEN}"})
                response = conn.getresponse()
                body = json.loads(response.read())
                if response.status != 200:
                    return response.status
                return sorted(p["metadata"]["name"] for p in body["items"])
            finally:
                conn.close()

        self.assertEqual(names(""), ["a", "b", "c"])
        self.assertEqual(names("app=vllm"), ["a", "b"])
        self.assertEqual(names("app==other"), ["c"])
        self.assertEqual(names("app!=vllm"), ["c"])
        self.assertEqual(names("llm-d.ai/role!=decode"), ["a", "c"])  # != holds without the label
        self.assertEqual(names("llm-d.ai/role in (prefill, decode)"), ["a", "b"])
        self.assertEqual(names("llm-d.ai/role notin (decode)"), ["a", "c"])
        self.assertEqual(names("tier"), ["a"])
        self.assertEqual(names("!tier"), ["b", "c"])
        self.assertEqual(names("app=vllm,llm-d.ai/role in (decode),!tier"), ["b"])
        self.assertEqual(names("app in (vllm"), 400)
        self.assertEqual(names("app=vllm,"), 400)

    def test_prefill_and_decode_selectors_give_pods_their_role(self):
        extra = ('  prefill_selector: "llm-d.ai/role in (prefill, both)"\n'
                 '  decode_selector: "llm-d.ai/role in (decode, both), !canary"\n')

        def labeled(name, ip, **labels):
            return pod(name, ip, labels=dict(labels))

        self.api.put_pod(labeled("prefill-0", self.ips[0], **{"llm-d.ai/role": "prefill"}))
        self.api.put_pod(labeled("decode-0", self.ips[1], **{"llm-d.ai/role": "decode"}))
        # In both selectors: refused and counted. In neither (canary; only the old role label; not
        # selected by the server-side label_selector): not nodes, not errors.
        self.api.put_pod(labeled("both-0", self.ips[2], **{"llm-d.ai/role": "both"}))
        self.api.put_pod(labeled("canary-0", "127.0.0.5", **{"llm-d.ai/role": "decode", "canary": "yes"}))
        self.api.put_pod(pod("legacy-0", "127.0.0.6", "decode"))
        self.api.put_pod(pod("other-0", "127.0.0.7", labels={"app": "other", "llm-d.ai/role": "decode"}))
        router = self.start_router(extra, label_selector="app in (vllm)")
        router.wait_for(lambda: self.state(router, self.prefill.http_address) == ("up", "kubernetes")
                        and self.state(router, self.decode.http_address) == ("up", "kubernetes"),
                        timeout=10)
        self.assertEqual(router.instance(self.prefill.http_address)["role"], "prefill")
        self.assertEqual(router.instance(self.decode.http_address)["role"], "decode")
        code, _, body = self.completion(router)
        self.assertEqual(code, 200, body)
        self.assertEqual(len(self.prefill.requests_served()), 1)
        self.assertEqual(len(self.decode.requests_served()), 1)
        router.wait_for(lambda: "both-0" in router.log() and "match both prefill_selector" in router.log(),
                        timeout=5)
        self.assertEqual(len(router.status()["instances"]), 2)
        metrics = router.metrics()
        self.assertGreaterEqual(metrics["pdrouter_kubernetes_ambiguous_pods_total"], 1)
        # Only the ambiguous pod was an error: canary-0 and legacy-0 are just not selected.
        self.assertEqual(metrics["pdrouter_kubernetes_bad_pods_total"],
                         metrics["pdrouter_kubernetes_ambiguous_pods_total"])
        status = self.k8s(router)
        self.assertEqual((status["label_selector"], status["prefill_selector"], status["decode_selector"]),
                         ("app in (vllm)", "llm-d.ai/role in (prefill, both)",
                          "llm-d.ai/role in (decode, both), !canary"))
        # The start-up line names the role selectors beside the server-side one.
        self.assertIn("selector 'app in (vllm)' prefill_selector 'llm-d.ai/role in (prefill, both)' "
                      "decode_selector 'llm-d.ai/role in (decode, both), !canary'", router.log())
        # One list and one watch, each with the server-side label_selector only.
        for path, _ in list(self.api.requests):
            self.assertIn("labelSelector=app%20in%20%28vllm%29", path)
            self.assertNotIn("llm-d.ai", path)
        self.assertEqual(router.metrics()["pdrouter_kubernetes_lists_total"], 1)

        # Relabelled out of the decode selector: it leaves; relabelled to prefill: it returns so.
        self.api.put_pod(labeled("decode-0", self.ips[1], **{"llm-d.ai/role": "decode", "canary": "yes"}))
        router.wait_for(lambda: self.state(router, self.decode.http_address) is None, timeout=5)
        self.api.put_pod(labeled("decode-0", self.ips[1], **{"llm-d.ai/role": "prefill"}))
        router.wait_for(lambda: (router.instance(self.decode.http_address) or {}).get("role") == "prefill",
                        timeout=5)
        # The ambiguous pod relabelled to decode becomes a node.
        self.api.put_pod(labeled("both-0", self.ips[2], **{"llm-d.ai/role": "decode"}))
        router.wait_for(lambda: (router.instance(f"{self.ips[2]}:{self.port}") or {}).get("role") == "decode",
                        timeout=5)

    def test_selectors_and_role_label_together_are_refused_at_load(self):
        path = os.path.join(self.dir.name, "both.yaml")
        cases = [
            ('  role_label: example.com/role\n  prefill_selector: "a=b"\n  decode_selector: "a=c"\n',
             "kubernetes: set role_label or prefill_selector/decode_selector, not both"),
            ('  prefill_selector: "a=b"\n', "kubernetes: prefill_selector and decode_selector go together"),
            ('  prefill_selector: "a in (b"\n  decode_selector: "a=c"\n',
             "kubernetes.prefill_selector: label selector at 7: expected ',' or ')', found the end"),
        ]
        for extra, message in cases:
            with open(path, "w") as f:
                f.write(f"kubernetes:\n  enabled: true\n  api_server: {self.api.url}\n  namespace: llm\n"
                        + extra)
            result = subprocess.run([pdrouter_path(), "--config", path, "--http", "127.0.0.1:0"],
                                    capture_output=True, text=True, timeout=20)
            self.assertEqual(result.returncode, 2, result.stderr)
            self.assertIn(message, result.stderr)

    @requires(os.access(ETCD, os.X_OK), "etcd-server")
    def test_replicas_sharing_etcd_each_watch_the_pods(self):
        # Pods are not published to etcd: every replica sees them from the API itself.
        etcd = Etcd()
        self.addCleanup(etcd.close)
        self.api.put_pod(pod("prefill-0", self.ips[0], "prefill"))
        self.api.put_pod(pod("decode-0", self.ips[1], "decode"))
        routers = []
        for replica in ("a", "b"):
            routers.append(self.start_router(
                f'registry:\n  backend: etcd\n  etcd_endpoints: ["127.0.0.1:{etcd.client_port}"]\n'
                f'  etcd_prefix: "/pdr-k8s-{os.getpid()}/"\n  replica_id: "{replica}"\n'))
        for router in routers:
            router.wait_for(lambda r=router: r.status()["registry_backend"]["etcd_reachable"]
                            and self.state(r, self.decode.http_address) == ("up", "kubernetes")
                            and self.state(r, self.prefill.http_address) == ("up", "kubernetes"),
                            timeout=10)
            code, _, body = self.completion(router)
            self.assertEqual(code, 200, body)
        for router in routers:
            metrics = router.metrics()
            self.assertEqual((metrics["pdrouter_etcd_puts_total"], metrics["pdrouter_etcd_replica_entries"]),
                             (0, 0))
        self.api.delete_pod("decode-0")
        for router in routers:
            router.wait_for(lambda r=router: self.state(r, self.decode.http_address) is None, timeout=5)

    def https_api(self):
        """A second fake API server, over TLS with a certificate for 127.0.0.1 signed by ca.crt."""
        make_pki(self.dir.name)
        api = FakeKubeApi(token=TOKEN, tls=(os.path.join(self.dir.name, "server.crt"),
                                            os.path.join(self.dir.name, "server.key")))
        self.addCleanup(api.close)
        api.put_pod(pod("prefill-0", self.ips[0], "prefill"))
        api.put_pod(pod("decode-0", self.ips[1], "decode"))
        return api

    def https_router(self, api, ca):
        router = Router(topology(api, self.port, self.token_file,
                                 f'  ca_file: "{os.path.join(self.dir.name, ca)}"\n'))
        self.addCleanup(router.dir.cleanup)
        self.addCleanup(router.stop)
        return router

    @requires(OPENSSL, "the openssl CLI")
    def test_https_api_server_is_verified_against_ca_file(self):
        api = self.https_api()
        self.assertTrue(api.url.startswith("https://"))
        router = self.https_router(api, "ca.crt")
        router.wait_for(lambda: self.state(router, self.prefill.http_address) == ("up", "kubernetes")
                        and self.state(router, self.decode.http_address) == ("up", "kubernetes"),
                        timeout=10)
        code, _, body = self.completion(router)
        self.assertEqual(code, 200, body)
        self.assertTrue(all(auth == "Bearer " + TOKEN for _, auth in api.requests), api.requests)

    @requires(OPENSSL, "the openssl CLI")
    def test_https_api_server_with_another_ca_fails_clearly(self):
        api = self.https_api()
        router = self.https_router(api, "other-ca.crt")
        router.wait_for(lambda: "certificate verify failed" in (self.k8s(router).get("last_error") or ""),
                        timeout=10)
        self.assertGreater(router.metrics()[VERIFY_ERRORS], 0)
        self.assertGreater(router.metrics()["pdrouter_kubernetes_errors_total"], 0)
        self.assertEqual(router.status()["instances"], [])
        self.assertEqual(api.requests, [])

    def test_ca_file_without_https_is_refused_at_load(self):
        path = os.path.join(self.dir.name, "plain.yaml")
        ca = os.path.join(self.dir.name, "looks-like-a.crt")
        with open(ca, "w") as f:
            f.write("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
        with open(path, "w") as f:
            f.write(f"kubernetes:\n  enabled: true\n  api_server: {self.api.url}\n  namespace: llm\n"
                    f"  ca_file: {ca}\n")
        result = subprocess.run([pdrouter_path(), "--config", path, "--http", "127.0.0.1:0"],
                                capture_output=True, text=True, timeout=20)
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertIn("kubernetes: ca_file needs an https:// api_server", result.stderr)


if __name__ == "__main__":
    unittest.main()
