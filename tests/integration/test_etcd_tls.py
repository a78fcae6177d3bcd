"""Replicas sharing one registry through a REAL etcd over mutual TLS (registry.backend: etcd,
https:// endpoints, registry.etcd_ca_file / etcd_cert_file / etcd_key_file). A throwaway CA, a
server certificate for 127.0.0.1 and a client certificate are made with the openssl CLI in the
test's temporary directory; etcd runs with --client-cert-auth.

  * two replicas share a node through etcd over mTLS (registered with A, routable from B);
  * a replica trusting the wrong CA cannot reach etcd: /status says why ("tls: certificate
    verify failed: ..."), pdrouter_upstream_tls_errors_total{reason="verify"} counts it, and the
    replica keeps serving its local registry;
  * a PEM file that holds no certificate stops pdrouter at load with a clear error.
"""

import os
import shutil
import ssl
import subprocess
import tempfile
import time
import unittest

from pdr_testlib import requires
from pdrouter_fixture import Router, TIME_SCALE, pdrouter_path
from sim_fixture import SimNode
from test_etcd_replicas import ETCD, Etcd, completion

OPENSSL = shutil.which("openssl")
VERIFY_ERRORS = 'pdrouter_upstream_tls_errors_total{reason="verify"}'


def openssl(directory, *args):
    subprocess.run([OPENSSL, *args], cwd=directory, check=True, timeout=60 * TIME_SCALE,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def make_pki(directory):
    """ca.crt/key, other-ca.crt, server.crt/key (SAN IP:127.0.0.1), client.crt/key."""
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ("ca", "other-ca"):
        openssl(directory, "req", "-x509", *ec, "-keyout", f"{ca}.key", "-out", f"{ca}.crt",
                "-days", "2", "-subj", f"/CN=pdrouter test {ca}")
    # etcd's JSON gateway dials etcd's own gRPC with the server certificate as a client
    # certificate (--client-cert-auth checks it too): the server certificate needs clientAuth.
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\n"),
                      ("client", "extendedKeyUsage=clientAuth\n")):
        with open(os.path.join(directory, f"{name}.ext"), "w") as f:
            f.write(ext)
        openssl(directory, "req", *ec, "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", f"/CN={'127.0.0.1' if name == 'server' else 'pdrouter'}")
        openssl(directory, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")


class TlsEtcd(Etcd):
    """etcd serving clients over https with --client-cert-auth, on bind-probed loopback ports."""

    SCHEME = "https"

    def __init__(self, pki):
        self.pki = pki
        super().__init__()

    def path(self, name):
        return os.path.join(self.pki, name)

    def extra_args(self):
        return ["--cert-file", self.path("server.crt"), "--key-file", self.path("server.key"),
                "--client-cert-auth", "--trusted-ca-file", self.path("ca.crt")]

    def ssl_context(self):
        context = ssl.create_default_context(cafile=self.path("ca.crt"))
        context.load_cert_chain(self.path("client.crt"), self.path("client.key"))
        return context


def topology(etcd, replica, prefix, ca="ca.crt"):
    return f"""
connectors:
  default: nixl
discovery:
  ttl_ms: 3000
registry:
  backend: etcd
  etcd_endpoints: ["https://127.0.0.1:{etcd.client_port}"]
  etcd_prefix: "{prefix}"
  replica_id: "{replica}"
  lease_ttl_s: 2
  etcd_ca_file: "{etcd.path(ca)}"
  etcd_cert_file: "{etcd.path('client.crt')}"
  etcd_key_file: "{etcd.path('client.key')}"
"""


@requires(os.access(ETCD, os.X_OK) and OPENSSL, "etcd-server or the openssl CLI")
class EtcdOverTls(unittest.TestCase):
    def setUp(self):
        self.pki = tempfile.mkdtemp(prefix="pdr-pki-it-")
        self.addCleanup(shutil.rmtree, self.pki, True)
        make_pki(self.pki)
        self.etcd = TlsEtcd(self.pki)
        self.addCleanup(self.etcd.close)
        self.prefix = f"/pdr-tls-it-{os.getpid()}-{time.monotonic_ns()}/"

    def router(self, replica, **kwargs):
        r = Router(topology_yaml=topology(self.etcd, replica, self.prefix, **kwargs))
        self.addCleanup(r.stop)
        return r

    def node(self, role, router):
        node = SimNode("--role", role, "--connector", "nixl", "--handshake-port", "0",
                       "--notify-port", "0", "--kv-port", "0", "--kv-backends", "tcp", "--register",
                       router.discovery, "--register-interval-ms", "200")
        self.addCleanup(node.kill)
        return node

    @staticmethod
    def state_on(router, node):
        inst = router.instance(node.http_address)
        return None if inst is None else (inst["state"], inst["source"])

    def test_two_replicas_share_a_node_through_etcd_over_mutual_tls(self):
        a, b = self.router("a"), self.router("b")
        for r in (a, b):
            r.wait_for(lambda r=r: r.status()["registry_backend"].get("etcd_reachable"), timeout=10)
        prefill, decode = self.node("prefill", a), self.node("decode", a)
        b.wait_for(lambda: self.state_on(b, decode) == ("up", "replica")
                   and self.state_on(b, prefill) == ("up", "replica"), timeout=10)
        code, _, body = completion(b)
        self.assertEqual(code, 200, body)
        for r in (a, b):
            self.assertEqual(r.metrics()[VERIFY_ERRORS], 0)

    def test_wrong_ca_fails_clearly_and_the_replica_keeps_its_local_registry(self):
        c = self.router("c", ca="other-ca.crt")
        c.wait_for(lambda: "tls: certificate verify failed: "
                   in (c.status()["registry_backend"].get("last_error") or ""), timeout=10)
        self.assertFalse(c.status()["registry_backend"]["etcd_reachable"])
        self.assertGreater(c.metrics()[VERIFY_ERRORS], 0)
        self.assertEqual(c.metrics()["pdrouter_etcd_up"], 0)
        prefill, decode = self.node("prefill", c), self.node("decode", c)
        c.wait_for(lambda: self.state_on(c, decode) == ("up", "registered")
                   and self.state_on(c, prefill) == ("up", "registered"), timeout=10)
        code, _, body = completion(c)
        self.assertEqual(code, 200, body)

    def test_a_file_without_a_certificate_stops_pdrouter_at_load(self):
        bad = os.path.join(self.pki, "not-a-cert.pem")
        with open(bad, "w") as f:
            f.write("hello\n")
        config = os.path.join(self.pki, "topology.yaml")
        with open(config, "w") as f:
            f.write(topology(self.etcd, "d", self.prefix).replace(self.etcd.path("ca.crt"), bad))
        proc = subprocess.run([pdrouter_path(), "--config", config, "--http", "127.0.0.1:0",
                               "--discovery", "tcp://127.0.0.1:0"],
                              capture_output=True, text=True, timeout=30 * TIME_SCALE)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("registry.etcd_ca_file", proc.stdout + proc.stderr)
        self.assertIn("holds no PEM CERTIFICATE", proc.stdout + proc.stderr)


if __name__ == "__main__":
    unittest.main()
