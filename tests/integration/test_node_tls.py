"""TLS on the legs to nodes (connectors.tls, an instance's tls), against `pdnode sim` serving
HTTPS with vLLM's flags (--ssl-certfile, --ssl-keyfile, --ssl-ca-certs, --ssl-cert-reqs 2):

  * P/D requests (streamed and not) and /v1/models reach nodes that require a client
    certificate, pdrouter presenting connectors.tls' (mutual TLS);
  * a node whose certificate pdrouter does not trust fails the request clearly and counts
    pdrouter_upstream_tls_errors_total{reason="verify"};
  * an instance's own `tls: {enabled: false}` sends plain HTTP to that node while the others
    get TLS (static instances, no registration).
"""
import json
import os
import shutil
import tempfile
import unittest

from pd_fixture import PdCluster
from pdr_testlib import requires
from pdrouter_fixture import Router
from sim_fixture import SimNode
from tls_pki import OPENSSL, client_context, make_pki

def stopped_cleanly(test, router):
    """Cleanup: the router exits 0 (a sanitizer report or a leak found at exit would not)."""
    code = router.stop()
    test.assertEqual(code, 0, router.log()[-4000:])


VERIFY_ERRORS = 'pdrouter_upstream_tls_errors_total{reason="verify"}'
HANDSHAKE_ERRORS = 'pdrouter_upstream_tls_errors_total{reason="handshake"}'
COMPLETION = {"model": "sim-model", "prompt": "to a node over tls", "max_tokens": 4}
CHAT_STREAM = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
               "stream": True}


def tls_flags(pki):
    return ("--ssl-certfile", os.path.join(pki, "server.crt"), "--ssl-keyfile", os.path.join(pki, "server.key"),
            "--ssl-ca-certs", os.path.join(pki, "ca.crt"), "--ssl-cert-reqs", "2")


def connectors_tls(pki, ca="ca.crt", client="client"):
    lines = ["connectors:", "  default: nixl", "  tls:", f'    ca_file: "{os.path.join(pki, ca)}"']
    if client:
        lines += [f'    cert_file: "{os.path.join(pki, client + ".crt")}"',
                  f'    key_file: "{os.path.join(pki, client + ".key")}"']
    return "\n".join(lines) + "\n"


@requires(OPENSSL, "the openssl CLI")
class NodeTls(unittest.TestCase):
    def setUp(self):
        self.pki = make_pki(tempfile.mkdtemp(prefix="pdr-pki-it-"))
        self.addCleanup(shutil.rmtree, self.pki, True)

    def cluster(self, topology):
        flags = tls_flags(self.pki)
        cluster = PdCluster("nixl", topology=topology, prefill_flags=flags, decode_flags=flags)
        self.addCleanup(cluster.close)
        for node in cluster.prefills + cluster.decodes:
            node.ssl_context = client_context(self.pki, cert="client")
        return cluster

    def test_pd_requests_reach_nodes_that_require_a_client_certificate(self):
        cluster = self.cluster(connectors_tls(self.pki))
        status, _, body = cluster.post("/v1/completions", COMPLETION)
        self.assertEqual(status, 200, body)
        with cluster.stream("/v1/chat/completions", CHAT_STREAM) as stream:
            self.assertEqual(stream.status, 200)
            events = list(stream)
        self.assertEqual(events[-1], "[DONE]")
        status, _, body = cluster.get("/v1/models")
        self.assertEqual(status, 200, body)
        self.assertIn(b"sim-model", body)
        for node in cluster.prefills + cluster.decodes:
            self.assertTrue(any(r["path"] in ("/v1/completions", "/v1/chat/completions")
                                for r in node.sim_requests()["requests"]), node.http_address)
        metrics = cluster.router.metrics()
        self.assertEqual(metrics[VERIFY_ERRORS] + metrics[HANDSHAKE_ERRORS], 0)

    def test_a_node_certificate_pdrouter_does_not_trust_fails_the_request_clearly(self):
        cluster = self.cluster(connectors_tls(self.pki, ca="other-ca.crt"))
        status, _, body = cluster.post("/v1/completions", COMPLETION)
        self.assertIn(status, (502, 503), body)
        self.assertIn(b"certificate verify failed", body)
        self.assertGreater(cluster.metric(VERIFY_ERRORS), 0)

    def test_without_a_client_certificate_the_node_refuses_pdrouter(self):
        cluster = self.cluster(connectors_tls(self.pki, client=None))
        status, _, body = cluster.post("/v1/completions", COMPLETION)
        self.assertIn(status, (502, 503), body)
        self.assertGreater(cluster.metric(HANDSHAKE_ERRORS) + cluster.metric(
            'pdrouter_upstream_tls_errors_total{reason="protocol"}'), 0)


@requires(OPENSSL, "the openssl CLI")
class NodeTlsOverride(unittest.TestCase):
    def test_an_instance_can_stay_plain_while_the_others_speak_tls(self):
        pki = make_pki(tempfile.mkdtemp(prefix="pdr-pki-it-"))
        self.addCleanup(shutil.rmtree, pki, True)
        common = ("--connector", "nixl", "--kv-backends", "tcp", "--handshake-port", "0", "--notify-port", "0",
                  "--kv-port", "0")
        prefill = SimNode("--role", "prefill", *common)  # plain HTTP
        self.addCleanup(prefill.kill)
        decode = SimNode("--role", "decode", *common, *tls_flags(pki))
        self.addCleanup(decode.kill)
        decode.ssl_context = client_context(pki, cert="client")
        topology = connectors_tls(pki) + f"""instances:
  - role: prefill
    http_address: "{prefill.http_address}"
    tls: {{enabled: false}}
  - role: decode
    http_address: "{decode.http_address}"
"""
        router = Router(topology_yaml=topology)
        self.addCleanup(stopped_cleanly, self, router)
        router.wait_for(lambda: router.request("GET", "/ready")[0] == 200, timeout=10)
        status, _, body = router.request("POST", "/v1/completions", body=json.dumps(COMPLETION).encode(),
                                         headers={"Content-Type": "application/json"})
        self.assertEqual(status, 200, body)
        for node in (prefill, decode):
            served = [r for r in node.sim_requests()["requests"] if r["path"] == "/v1/completions"]
            self.assertEqual(len(served), 1, node.http_address)


if __name__ == "__main__":
    unittest.main()
