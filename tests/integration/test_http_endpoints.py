"""pdrouter's operator endpoints over real HTTP: /health, /status and /metrics content, JSON errors
for unknown paths and wrong methods, keep-alive, and malformed requests answered and counted."""
import http.client
import json
import socket
import unittest

from pdrouter_fixture import Router
from test_registration import moriio_current

REQUIRED_METRICS = [
    "pdrouter_registrations_accepted_total", "pdrouter_registrations_rejected_total",
    "pdrouter_instances", "pdrouter_instance_expiries_total", "pdrouter_instance_restarts_total",
    "pdrouter_topology_reloads_total", "pdrouter_discovery_frames_total",
    "pdrouter_http_requests_total", "pdrouter_http_rejected_total",
]


class HttpEndpointsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.router = Router("discovery:\n  ttl_ms: 60000\n")
        cls.router.send(moriio_current("127.7.0.1", 8100, role="D"))
        cls.router.wait_for(lambda: cls.router.instance("127.7.0.1:8100"))

    @classmethod
    def tearDownClass(cls):
        cls.router.stop()

    def assert_openai_error(self, body, code):
        doc = json.loads(body)
        self.assertEqual(set(doc), {"error"})
        self.assertEqual(doc["error"]["code"], code)
        self.assertIsInstance(doc["error"]["message"], str)
        self.assertTrue(doc["error"]["message"])
        self.assertIn("type", doc["error"])

    def test_health(self):
        code, headers, body = self.router.request("GET", "/health")
        self.assertEqual(code, 200)
        self.assertEqual(json.loads(body), {"status": "ok"})
        self.assertTrue(headers["server"].startswith("pdrouter/"))

    def test_status_shape(self):
        status = self.router.status()
        for key in ("version", "uptime_ms", "listeners", "topology", "registry_version", "counts", "instances"):
            self.assertIn(key, status)
        self.assertEqual(status["listeners"]["http"], self.router.http)
        self.assertEqual(status["listeners"]["discovery"], self.router.discovery)
        self.assertEqual(status["counts"]["decode"], {"up": 1, "draining": 0, "expired": 0})
        inst = status["instances"][0]
        for key in ("role", "http_address", "dialect", "transfer_mode", "dp_size", "tp_size", "state",
                    "source", "last_seen_ms_ago"):
            self.assertIn(key, inst)

    def test_metrics_has_every_required_family(self):
        code, headers, body = self.router.request("GET", "/metrics")
        self.assertEqual(code, 200)
        self.assertTrue(headers["content-type"].startswith("text/plain"))
        text = body.decode()
        for name in REQUIRED_METRICS:
            self.assertRegex(text, rf"# TYPE {name} (counter|gauge)")
        self.assertIn('pdrouter_instances{role="decode",state="up"} 1', text)
        self.assertIn('pdrouter_registrations_rejected_total{reason="missing_key"}', text)

    def test_unknown_path_is_404_json(self):
        code, headers, body = self.router.request("GET", "/nope")
        self.assertEqual(code, 404)
        self.assertEqual(headers["content-type"], "application/json")
        self.assert_openai_error(body, "not_found")

    def test_wrong_method_is_405_json_with_allow(self):
        code, headers, body = self.router.request("POST", "/status", body=b"{}")
        self.assertEqual(code, 405)
        self.assertEqual(headers["allow"], "GET, HEAD")
        self.assert_openai_error(body, "method_not_allowed")

    def test_head_is_get_without_the_body_and_keeps_the_connection(self):
        # Raw bytes on one socket: a HEAD answer that carried its body would be read as the start
        # of the next answer.
        host, port = self.router.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            reader = sock.makefile("rb")

            def exchange(method, path):
                sock.sendall(b"%s %s HTTP/1.1\r\nHost: x\r\n\r\n" % (method.encode(), path.encode()))
                status = reader.readline()
                headers = {}
                while (line := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                body = b""
                if method != "HEAD":
                    body = reader.read(int(headers["content-length"]))
                return int(status.split()[1]), headers, body

            for path in ("/health", "/ready", "/metrics", "/v1/models"):
                with self.subTest(path=path):
                    get_status, get_headers, get_body = exchange("GET", path)
                    status, headers, _ = exchange("HEAD", path)
                    self.assertEqual(status, get_status)
                    self.assertEqual(headers.get("content-type"), get_headers.get("content-type"))
                    self.assertIn("content-length", headers)
                    if path in ("/health", "/ready"):  # the others may move between two answers
                        self.assertEqual(headers["content-length"], str(len(get_body)))
                    self.assertNotEqual(headers.get("connection"), "close")
            # Nothing of a HEAD body is left on the socket: the next answer is read whole.
            status, _, body = exchange("GET", "/health")
            self.assertEqual(status, 200)
            self.assertEqual(json.loads(body), {"status": "ok"})
            # HEAD on a path without GET is still a wrong method.
            status, headers, _ = exchange("HEAD", "/v1/completions")
            self.assertEqual(status, 405)
            self.assertEqual(headers["allow"], "POST")
            status, _, body = exchange("GET", "/health")
            self.assertEqual(status, 200)
            reader.close()

    def test_keep_alive(self):
        conn = http.client.HTTPConnection(*self.router.http.rsplit(":", 1), timeout=5)
        try:
            for _ in range(5):
                conn.request("GET", "/health")
                response = conn.getresponse()
                self.assertEqual(response.status, 200)
                response.read()
            self.assertIsNotNone(conn.sock, "server closed a keep-alive connection")
        finally:
            conn.close()

    def test_malformed_request_gets_400_json_and_is_counted(self):
        before = self.router.metrics()['pdrouter_http_rejected_total{reason="bad_request"}']
        host, port = self.router.http.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(b"NOT HTTP AT ALL\r\n\r\n")
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        self.assertTrue(head.startswith(b"HTTP/1.1 400"), head)
        self.assert_openai_error(body, "bad_request")
        after = self.router.metrics()['pdrouter_http_rejected_total{reason="bad_request"}']
        # At least this one: a ZMQ socket another test left behind may still reconnect to the port
        # this router now holds, and its greeting is a bad request too.
        self.assertGreaterEqual(after, before + 1)
        code, _, _ = self.router.request("GET", "/health")
        self.assertEqual(code, 200)


if __name__ == "__main__":
    unittest.main()
