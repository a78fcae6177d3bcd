"""Start-up failures of the real pdrouter, one per stage that can fail on loopback: each exits
with its code (2 for a bad topology, flag or file, 1 for a part that cannot start) and its
message within a bounded time, with every thread it had started joined (the process exits) and,
in the ASan build (ASAN_OPTIONS=detect_leaks=1), nothing leaked: a leak or a sanitizer error would
replace the exit code with the sanitizer's (or an abort) and write its report on stderr.

The failures that stop start-up late unwind the most: the busy admin port comes after the
discovery service, the KV events subscriber, the etcd replicator, the pod watcher, the span
exporter, the access log, the proxy and the HTTP server have all started.

Covered elsewhere and not repeated here (test_topology.StartupTest): a busy discovery port (exit
1), an admin listener on the HTTP port, invalid YAML, an out-of-range port, an unknown policy and a
bad flag (exit 2).
"""
import os
import re
import signal
import socket
import tempfile
import unittest

from pdr_testlib import ProcessHandle, free_port, pdnode_path, pdrouter_path
from pdrouter_fixture import LISTENING, TIME_SCALE
from tls_pki import make_pki

# What a sanitizer writes when it replaces the exit code (a leak, a use after free, ...).
SANITIZER_REPORT = re.compile(r"(Address|Leak|Thread|UndefinedBehavior)Sanitizer|runtime error:")

GARBAGE_CERTIFICATE = "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n"


def refused_port():
    """A loopback port nothing listens on (connections are refused at once)."""
    return free_port()


class StartupFailureTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory(prefix="pdr-startup-")
        self.dir = self.tmp.name
        self.addCleanup(self.tmp.cleanup)

    def path(self, name, text=None):
        path = os.path.join(self.dir, name)
        if text is not None:
            with open(path, "w") as f:
                f.write(text)
        return path

    def busy_port(self):
        """A loopback port another socket listens on (without SO_REUSEPORT) for the test's length."""
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.addCleanup(s.close)
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        return s.getsockname()[1]

    def start(self, topology=None, args=("--http", "127.0.0.1:0", "--discovery", "tcp://127.0.0.1:0")):
        argv = [pdrouter_path(), "--workers", "2", *args]
        if topology is not None:
            argv += ["--config", self.path("topology.yaml", topology)]
        proc = ProcessHandle(argv, name="pdrouter", log_dir=self.dir)
        self.addCleanup(proc.stop)
        return proc

    def assert_exits(self, proc, code, message):
        """pdrouter exits by itself with `code`, says `message` (a regex) on stderr, and no
        sanitizer reports anything."""
        got = proc.wait(10 * TIME_SCALE)
        err = proc.output("stderr")
        self.assertIsNotNone(got, "pdrouter still running (a thread left hanging?):\n" + err)
        self.assertEqual(got, code, err)
        self.assertRegex(err, message)
        self.assertNotRegex(err, SANITIZER_REPORT)
        self.assertNotIn("pdrouter listening", proc.output("stdout"))
        return err

    # ---- exit 1: a part that cannot start -------------------------------------------------------

    def test_busy_http_port_exits_1(self):
        port = self.busy_port()
        proc = self.start(args=("--http", f"127.0.0.1:{port}", "--discovery", "tcp://127.0.0.1:0"))
        self.assert_exits(proc, 1, re.escape(f"cannot listen on 127.0.0.1:{port}: "))

    def every_part(self):
        """Topology lines that start every optional part, each pointed at a loopback port that
        refuses connections (none of them fails start for that: they retry)."""
        return (f"kv_events:\n  enabled: true\n"
                f"registry:\n  backend: etcd\n  etcd_endpoints: [\"127.0.0.1:{refused_port()}\"]\n"
                f"kubernetes:\n  enabled: true\n  api_server: \"http://127.0.0.1:{refused_port()}\"\n"
                f"  namespace: ns\n  token_file: \"\"\n"
                f"tracing:\n  endpoint: \"http://127.0.0.1:{refused_port()}/v1/traces\"\n"
                f"access_log:\n  path: \"{self.path('access.log')}\"\n")

    def test_busy_admin_port_unwinds_every_started_part(self):
        port = self.busy_port()
        proc = self.start(f"listeners:\n  admin: \"127.0.0.1:{port}\"\n" + self.every_part())
        err = self.assert_exits(proc, 1, re.escape(f"cannot listen on 127.0.0.1:{port} (listeners.admin): "))
        # Each part had started before the admin listener failed.
        self.assertIn("registry shared through etcd", err)
        self.assertIn("kubernetes pod discovery", err)
        self.assertRegex(err, r"http: listening on 127\.0\.0\.1:\d+")

    def test_busy_curve_discovery_port_exits_1(self):
        keys = os.path.join(self.dir, "router")
        keygen = ProcessHandle([pdnode_path(), "keygen", keys], name="keygen", log_dir=self.dir)
        self.addCleanup(keygen.stop)
        self.assertEqual(keygen.wait(10 * TIME_SCALE), 0, keygen.output())
        port = self.busy_port()
        proc = self.start(f"listeners:\n  discovery_curve: \"tcp://127.0.0.1:{port}\"\n"
                          f"discovery:\n  curve:\n    secret_key_file: \"{keys}.key\"\n")
        self.assert_exits(proc, 1, re.escape("cannot bind"))

    def test_unusable_etcd_tls_files_exit_1(self):
        ca = self.path("etcd-ca.crt", GARBAGE_CERTIFICATE)
        proc = self.start(f"kv_events:\n  enabled: true\n"
                          f"registry:\n  backend: etcd\n  etcd_endpoints: [\"https://127.0.0.1:{refused_port()}\"]\n"
                          f"  etcd_ca_file: \"{ca}\"\n")
        self.assert_exits(proc, 1, re.escape("registry: etcd TLS files unusable: "))

    def test_unusable_kubernetes_ca_file_exits_1(self):
        # The replicator (etcd) has started by then: it must be stopped too.
        ca = self.path("k8s-ca.crt", GARBAGE_CERTIFICATE)
        proc = self.start(f"registry:\n  backend: etcd\n  etcd_endpoints: [\"127.0.0.1:{refused_port()}\"]\n"
                          f"kubernetes:\n  enabled: true\n  api_server: \"https://127.0.0.1:{refused_port()}\"\n"
                          f"  namespace: ns\n  token_file: \"\"\n  ca_file: \"{ca}\"\n")
        err = self.assert_exits(proc, 1, re.escape("kubernetes: ca_file unusable: "))
        self.assertIn("registry shared through etcd", err)

    # ---- exit 2: a bad topology, flag or file ---------------------------------------------------

    def test_missing_config_file_exits_2(self):
        proc = self.start(args=("--config", self.path("absent.yaml")))
        self.assert_exits(proc, 2, "absent.yaml")

    def test_bad_http_flag_exits_2(self):
        proc = self.start(args=("--http", "127.0.0.1:http", "--discovery", "tcp://127.0.0.1:0"))
        self.assert_exits(proc, 2, r"pdrouter: --http: ")

    def test_open_discovery_flag_without_allow_open_exits_2(self):
        # The file alone passes (its discovery endpoint is loopback); the flag opens it to every
        # address allowed_peers covers, which is all of them.
        config = self.path("topology.yaml", "listeners:\n  discovery: \"tcp://127.0.0.1:0\"\n"
                                            "discovery:\n  allowed_peers: [\"0.0.0.0/0\"]\n")
        proc = self.start(args=("--config", config, "--http", "127.0.0.1:0", "--discovery", "tcp://0.0.0.0:0"))
        self.assert_exits(proc, 2, re.escape("pdrouter: discovery on tcp://0.0.0.0:0 admits every address"))

    def test_missing_listener_certificate_exits_2(self):
        proc = self.start(f"listeners:\n  tls:\n    cert_file: \"{self.path('absent.crt')}\"\n"
                          f"    key_file: \"{self.path('absent.key')}\"\n")
        self.assert_exits(proc, 2, "absent")

    def test_unreadable_listener_certificate_exits_2(self):
        # A directory where the certificate file should be: no open() succeeds on it, even as root.
        make_pki(self.dir)
        os.mkdir(self.path("directory.crt"))
        proc = self.start(f"listeners:\n  tls:\n    cert_file: \"{self.path('directory.crt')}\"\n"
                          f"    key_file: \"{self.path('server.key')}\"\n")
        self.assert_exits(proc, 2, "directory.crt")

    def test_listener_certificate_that_does_not_parse_exits_2(self):
        make_pki(self.dir)
        cert = self.path("garbage.crt", GARBAGE_CERTIFICATE)
        proc = self.start(f"listeners:\n  tls:\n    cert_file: \"{cert}\"\n"
                          f"    key_file: \"{self.path('server.key')}\"\n")
        self.assert_exits(proc, 2, r"^pdrouter: .*tls")

    def test_missing_client_key_file_exits_2(self):
        proc = self.start(f"client_auth:\n  keys_file: \"{self.path('absent-keys.yaml')}\"\n")
        self.assert_exits(proc, 2, "absent-keys.yaml")

    def test_missing_curve_key_file_exits_2(self):
        proc = self.start(f"listeners:\n  discovery_curve: \"tcp://127.0.0.1:0\"\n"
                          f"discovery:\n  curve:\n    secret_key_file: \"{self.path('absent.key')}\"\n")
        self.assert_exits(proc, 2, "absent.key")

    def test_invalid_tracing_endpoint_exits_2(self):
        proc = self.start("tracing:\n  endpoint: \"ftp://127.0.0.1:4318/v1/traces\"\n")
        self.assert_exits(proc, 2, r"tracing\.endpoint")


class StartupSuccessTest(unittest.TestCase):
    """Unreachable back ends are not start-up failures: etcd, the Kubernetes API server and the
    trace collector are retried. With every part started, a SIGTERM unwinds them all."""

    def test_unreachable_back_ends_start_and_stop_cleanly(self):
        with tempfile.TemporaryDirectory(prefix="pdr-startup-") as d:
            config = os.path.join(d, "topology.yaml")
            with open(config, "w") as f:
                f.write(f"listeners:\n  admin: \"127.0.0.1:0\"\n"
                        f"kv_events:\n  enabled: true\n"
                        f"registry:\n  backend: etcd\n  etcd_endpoints: [\"127.0.0.1:{refused_port()}\"]\n"
                        f"kubernetes:\n  enabled: true\n  api_server: \"http://127.0.0.1:{refused_port()}\"\n"
                        f"  namespace: ns\n  token_file: \"\"\n"
                        f"tracing:\n  endpoint: \"http://127.0.0.1:{refused_port()}/v1/traces\"\n"
                        f"access_log:\n  path: \"{os.path.join(d, 'access.log')}\"\n"
                        f"timeouts:\n  drain_ms: 1000\n")
            proc = ProcessHandle([pdrouter_path(), "--config", config, "--http", "127.0.0.1:0",
                                  "--discovery", "tcp://127.0.0.1:0", "--workers", "2"],
                                 name="pdrouter", log_dir=d)
            self.addCleanup(proc.stop)
            line = proc.wait_for_line(LISTENING + r" admin=", 10 * TIME_SCALE, streams=("stdout",))
            self.assertIsNotNone(line, proc.output())
            proc.send_signal(signal.SIGTERM)
            code = proc.wait(10 * TIME_SCALE)
            err = proc.output("stderr")
            self.assertEqual(code, 0, err)
            self.assertIn("SIGTERM received: draining", err)
            self.assertIn("pdrouter stopped", err)
            self.assertNotRegex(err, SANITIZER_REPORT)


if __name__ == "__main__":
    unittest.main()
