"""TLS on pdrouter's listeners (listeners.tls, listeners.admin_tls), against the real binary with
certificates made by the openssl CLI (tls_pki.py) and Python's ssl module as the client:

  * keep-alive over one TLS connection (one handshake for several requests, ALPN http/1.1) and
    a streamed P/D request through TLS to simulated nodes;
  * handshakes that fail (plain HTTP to the TLS port, a client that does not trust the
    certificate, TLS 1.0/1.1 only, garbage, a client that never finishes, one that hangs up) are
    counted in pdrouter_listener_tls_errors_total by reason, and pdrouter keeps serving;
  * a certificate renewed on disk is picked up on SIGHUP while requests keep succeeding: new
    connections get the new certificate, a connection opened before keeps working; files that do
    not go together are refused and the running certificate stays;
  * the operator listener with client_ca_file refuses clients without a certificate from that CA;
  * GET /health_generate reaches pdrouter's own TLS listener (its certificate pinned).
"""
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import tempfile
import threading
import time
import unittest
import warnings

from pd_fixture import PdCluster
from pdr_testlib import requires
from pdrouter_fixture import Router, TIME_SCALE
from tls_pki import OPENSSL, client_context, make_pki, peer_cn

def stopped_cleanly(test, router):
    """Cleanup: the router exits 0 (a sanitizer report or a leak found at exit would not)."""
    code = router.stop()
    test.assertEqual(code, 0, router.log()[-4000:])


COMPLETION = {"model": "sim-model", "prompt": "hello over tls", "max_tokens": 4}
CHAT_STREAM = {"model": "sim-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
               "stream": True}


def tls_errors(router, reason, listener="http"):
    return router.metrics().get(
        'pdrouter_listener_tls_errors_total{listener="%s",reason="%s"}' % (listener, reason), 0)


def handshakes(router, listener="http"):
    return router.metrics()['pdrouter_listener_tls_handshakes_total{listener="%s"}' % listener]


def listener_topology(pki, cert="server.crt", key="server.key", extra=""):
    return f"""
connectors:
  default: nixl
listeners:
  tls:
    cert_file: "{os.path.join(pki, cert)}"
    key_file: "{os.path.join(pki, key)}"
timeouts:
  header_read_ms: {int(1000 * TIME_SCALE)}
{extra}"""


def host_port(address):
    host, port = address.rsplit(":", 1)
    return host, int(port)


@requires(OPENSSL, "the openssl CLI")
class ListenerTlsWithNodes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pki = make_pki(tempfile.mkdtemp(prefix="pdr-pki-it-"))
        cls.context = client_context(cls.pki)
        cls.cluster = PdCluster("nixl", topology=listener_topology(cls.pki, cert="server-chain.crt"),
                                ssl_context=cls.context)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()
        shutil.rmtree(cls.pki, True)

    def test_keep_alive_and_a_streamed_pd_request_through_tls(self):
        router = self.cluster.router
        before = handshakes(router)
        host, port = host_port(router.http)
        context = client_context(self.pki, alpn=("h2", "http/1.1"))
        conn = http.client.HTTPSConnection(host, port, timeout=10 * TIME_SCALE, context=context)
        try:
            for _ in range(3):
                conn.request("GET", "/health")
                response = conn.getresponse()
                self.assertEqual(response.status, 200)
                response.read()
            conn.request("POST", "/v1/completions", body=json.dumps(COMPLETION),
                         headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            body = response.read()
            self.assertEqual(response.status, 200, body)
            self.assertIn(b"choices", body)
            self.assertEqual(conn.sock.selected_alpn_protocol(), "http/1.1")
            self.assertEqual(peer_cn(conn.sock), "server-a")
        finally:
            conn.close()
        # Our connection's one handshake, and the one of the /metrics read that follows.
        self.assertEqual(handshakes(router) - before, 2)

        with self.cluster.stream("/v1/chat/completions", CHAT_STREAM) as stream:
            self.assertEqual(stream.status, 200)
            events = list(stream)
        self.assertEqual(events[-1], "[DONE]")
        self.assertGreater(len(events), 2)

    def test_health_generate_reaches_its_own_tls_listener(self):
        status, _, body = self.cluster.get("/health_generate")
        self.assertEqual(status, 200, body)


@requires(OPENSSL, "the openssl CLI")
class ListenerTlsFailures(unittest.TestCase):
    def setUp(self):
        self.pki = make_pki(tempfile.mkdtemp(prefix="pdr-pki-it-"))
        self.addCleanup(shutil.rmtree, self.pki, True)
        self.router = Router(topology_yaml=listener_topology(self.pki), ssl_context=client_context(self.pki))
        self.addCleanup(stopped_cleanly, self, self.router)
        self.host, self.port = host_port(self.router.http)

    def raw(self, data, read=True):
        with socket.create_connection((self.host, self.port), timeout=5 * TIME_SCALE) as sock:
            if data:
                sock.sendall(data)
            if not read:
                return b""
            chunks = []
            while True:
                try:
                    chunk = sock.recv(4096)
                except (ConnectionResetError, socket.timeout):
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            return b"".join(chunks)

    def tls_client_fails(self, context):
        with socket.create_connection((self.host, self.port), timeout=5 * TIME_SCALE) as sock:
            with self.assertRaises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
                with context.wrap_socket(sock, server_hostname="127.0.0.1") as tls:
                    tls.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
                    if not tls.recv(1024):
                        raise ConnectionResetError("closed")

    def test_failed_handshakes_are_counted_by_reason_and_serving_goes_on(self):
        # Plain HTTP to the TLS port: a plain-text 400 saying why.
        answer = self.raw(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        self.assertTrue(answer.startswith(b"HTTP/1.1 400 "), answer)
        self.assertIn(b"https://", answer)
        # A client that does not trust the certificate aborts the handshake with an alert.
        self.tls_client_fails(client_context(self.pki, ca="other-ca.crt"))
        # TLS 1.0 and 1.1 only.
        old = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        old.check_hostname = False
        old.verify_mode = ssl.CERT_NONE
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # what this client is for
            old.minimum_version = ssl.TLSVersion.TLSv1
            old.maximum_version = ssl.TLSVersion.TLSv1_1
        old.set_ciphers("DEFAULT:@SECLEVEL=0")
        self.tls_client_fails(old)
        # Garbage, a record header announcing more than it sends then a hang-up, silence.
        self.raw(os.urandom(2048))
        self.raw(b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", read=False)
        with socket.create_connection((self.host, self.port), timeout=5 * TIME_SCALE) as silent:
            self.assertEqual(silent.recv(1), b"")  # closed at timeouts.header_read_ms
        expected = ("plain_http", "peer_alert", "version", "protocol", "closed", "timeout")
        self.router.wait_for(lambda: all(tls_errors(self.router, r) >= 1 for r in expected), timeout=10)
        self.assertIsNone(self.router.process.returncode)
        code, _, _ = self.router.request("GET", "/health")
        self.assertEqual(code, 200)

    def test_a_burst_of_garbage_connections_changes_nothing(self):
        deadline = time.monotonic() + 2
        sent = 0
        while time.monotonic() < deadline and sent < 300:
            self.raw(os.urandom(64 + sent % 700), read=False)
            sent += 1
        self.router.wait_for(
            lambda: tls_errors(self.router, "protocol") + tls_errors(self.router, "closed") +
            tls_errors(self.router, "version") >= sent, timeout=10)
        # Only the /metrics read itself stays open. The previous read's connection may still be
        # counted for a moment: the count drops in the close callback, one loop turn after the
        # client saw the connection end.
        self.router.wait_for(lambda: self.router.metrics()["pdrouter_http_connections_active"] == 1,
                             timeout=10)
        code, _, _ = self.router.request("GET", "/health")
        self.assertEqual(code, 200)


@requires(OPENSSL, "the openssl CLI")
class ListenerCertificateReload(unittest.TestCase):
    def setUp(self):
        self.pki = make_pki(tempfile.mkdtemp(prefix="pdr-pki-it-"))
        self.addCleanup(shutil.rmtree, self.pki, True)
        self.install("server")
        self.router = Router(topology_yaml=listener_topology(self.pki, cert="live.crt", key="live.key"),
                             ssl_context=client_context(self.pki))
        self.addCleanup(stopped_cleanly, self, self.router)
        self.host, self.port = host_port(self.router.http)

    def install(self, cert, key=None):
        # As certbot and friends do: new files renamed over the old ones.
        for src, dst in ((cert + ".crt", "live.crt"), ((key or cert) + ".key", "live.key")):
            shutil.copy(os.path.join(self.pki, src), os.path.join(self.pki, dst + ".new"))
            os.replace(os.path.join(self.pki, dst + ".new"), os.path.join(self.pki, dst))

    def new_connection_cn(self):
        conn = http.client.HTTPSConnection(self.host, self.port, timeout=5 * TIME_SCALE,
                                           context=client_context(self.pki))
        try:
            conn.request("GET", "/health")
            self.assertEqual(conn.getresponse().status, 200)
            return peer_cn(conn.sock)
        finally:
            conn.close()

    def test_a_renewed_certificate_serves_new_connections_while_requests_keep_succeeding(self):
        self.assertEqual(self.new_connection_cn(), "server-a")
        kept = http.client.HTTPSConnection(self.host, self.port, timeout=5 * TIME_SCALE,
                                           context=client_context(self.pki))
        kept.request("GET", "/health")
        self.assertEqual(kept.getresponse().read(), b'{"status":"ok"}')
        stop = threading.Event()
        results = {"ok": 0, "failed": []}

        def load():
            while not stop.is_set():
                try:
                    self.new_connection_cn()
                    results["ok"] += 1
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    results["failed"].append(repr(e))

        threads = [threading.Thread(target=load) for _ in range(3)]
        for t in threads:
            t.start()
        try:
            self.router.wait_for(lambda: results["ok"] >= 20, timeout=10)
            self.install("server2")
            self.router.process.send_signal(signal.SIGHUP)
            self.router.wait_for(
                lambda: self.router.metrics()['pdrouter_tls_reloads_total{result="ok"}'] >= 1, timeout=10)
            mark = results["ok"]
            self.router.wait_for(lambda: results["ok"] >= mark + 20, timeout=10)
        finally:
            stop.set()
            for t in threads:
                t.join()
        self.assertEqual(results["failed"], [])
        self.assertEqual(self.new_connection_cn(), "server-b")
        # The connection made before the reload goes on with its session.
        kept.request("GET", "/health")
        self.assertEqual(kept.getresponse().read(), b'{"status":"ok"}')
        self.assertEqual(peer_cn(kept.sock), "server-a")
        kept.close()

        # A certificate with another certificate's key: refused, the running one stays.
        self.install("server", key="server2")
        self.router.process.send_signal(signal.SIGHUP)
        self.router.wait_for(
            lambda: self.router.metrics()['pdrouter_tls_reloads_total{result="failed"}'] >= 1, timeout=10)
        self.assertEqual(self.new_connection_cn(), "server-b")
        self.assertIn("key does not match", self.router.log())


@requires(OPENSSL, "the openssl CLI")
class AdminListenerMutualTls(unittest.TestCase):
    def setUp(self):
        self.pki = make_pki(tempfile.mkdtemp(prefix="pdr-pki-it-"))
        self.addCleanup(shutil.rmtree, self.pki, True)
        path = lambda name: os.path.join(self.pki, name)  # noqa: E731
        topology = f"""
listeners:
  admin: 127.0.0.1:0
  admin_tls:
    cert_file: "{path('server.crt')}"
    key_file: "{path('server.key')}"
    client_ca_file: "{path('ca.crt')}"
"""
        self.router = Router(topology_yaml=topology,
                             admin_ssl_context=client_context(self.pki, cert="client"))
        self.addCleanup(stopped_cleanly, self, self.router)

    def admin_get(self, context):
        host, port = host_port(self.router.admin_http)
        conn = http.client.HTTPSConnection(host, port, timeout=5 * TIME_SCALE, context=context)
        try:
            conn.request("GET", "/status")
            response = conn.getresponse()
            return response.status
        finally:
            conn.close()

    def test_operators_need_a_certificate_from_the_configured_ca(self):
        for context in (client_context(self.pki), client_context(self.pki, cert="rogue-client")):
            with self.assertRaises((ssl.SSLError, ConnectionResetError, BrokenPipeError,
                                    http.client.RemoteDisconnected)):
                self.admin_get(context)
        self.assertEqual(self.admin_get(client_context(self.pki, cert="client")), 200)
        self.router.wait_for(lambda: tls_errors(self.router, "client_certificate", listener="admin") >= 2,
                             timeout=10)
        # The client listener is plain HTTP, as configured.
        code, _, _ = self.router.request("GET", "/health")
        self.assertEqual(code, 200)


if __name__ == "__main__":
    unittest.main()
