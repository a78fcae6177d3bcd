"""The deployment artifacts under deploy/ stay honest: the systemd unit passes
`systemd-analyze verify` (and its offline security review), the Kubernetes manifests render with
`kubectl kustomize` and agree with pdrouter (probe paths and ports, the topology in the ConfigMap
loads in the real binary), and the container image builds offline and serves /health when its
file system is run with chroot. Every address the tests use is on loopback."""

import json
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml  # python3-yaml (deploy/install-deps.sh --tests)

from pdr_testlib import http_get, pdrouter_path
from pdrouter_fixture import Router

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DEPLOY = os.path.join(ROOT, "deploy")
UNIT = os.path.join(DEPLOY, "systemd", "pdrouter.service")
# Default timeouts.drain_ms (deploy/topology.example.yaml).
DEFAULT_DRAIN_MS = 30000


def run(args, timeout, **kwargs):
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, **kwargs)


def unit_settings(text):
    """{key: [values]} of a unit file (sections merged: keys are unique across ours)."""
    settings = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


class SystemdUnitTest(unittest.TestCase):
    def setUp(self):
        with open(UNIT, encoding="utf-8") as f:
            self.text = f.read()
        self.settings = unit_settings(self.text)
        self.dir = tempfile.mkdtemp(prefix="pdr-unit-")
        self.addCleanup(shutil.rmtree, self.dir, True)
        # verify needs ExecStart's binary to exist: point it at this build's pdrouter.
        self.assertIn("/usr/local/bin/pdrouter ", self.text)
        self.copy = os.path.join(self.dir, "pdrouter.service")
        with open(self.copy, "w", encoding="utf-8") as f:
            f.write(self.text.replace("/usr/local/bin/pdrouter ", os.path.abspath(pdrouter_path()) + " "))

    def test_verify_is_clean(self):
        # Unknown keys and bad values are only warnings (exit 0): any output fails the test.
        done = run(["systemd-analyze", "verify", self.copy], timeout=60, cwd=self.dir)
        self.assertEqual(done.returncode, 0, done.stderr)
        self.assertEqual((done.stdout + done.stderr).strip(), "")

    def test_security_exposure_is_low(self):
        done = run(["systemd-analyze", "security", "--offline=yes", "--no-pager", self.copy],
                   timeout=60, cwd=self.dir)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        level = re.search(r"Overall exposure level for \S+: ([0-9.]+)", done.stdout)
        self.assertIsNotNone(level, done.stdout)
        self.assertLessEqual(float(level.group(1)), 2.0, done.stdout)

    def test_runs_the_topology_as_a_non_root_user(self):
        self.assertEqual(self.settings["ExecStart"],
                         ["/usr/local/bin/pdrouter --config /etc/pdrouter/topology.yaml"])
        self.assertEqual(self.settings["DynamicUser"], ["yes"])
        self.assertNotIn("User", self.settings)
        self.assertEqual(self.settings["CapabilityBoundingSet"], [""])
        self.assertEqual(self.settings["NoNewPrivileges"], ["yes"])
        self.assertEqual(self.settings["RestrictAddressFamilies"], ["AF_INET AF_INET6 AF_UNIX"])

    def test_stop_outlasts_the_drain_and_reload_is_sighup(self):
        # pdrouter drains for timeouts.drain_ms on SIGTERM (--help says so): systemd must not
        # SIGKILL it earlier. And it reloads on SIGHUP, which ExecReload sends.
        help_text = run([pdrouter_path(), "--help"], timeout=30).stdout
        self.assertIn("SIGTERM/SIGINT stop gracefully (in-flight requests drain for timeouts.drain_ms)",
                      help_text)
        self.assertIn("SIGHUP reloads the topology file", help_text)
        stop = re.fullmatch(r"(\d+)s", self.settings["TimeoutStopSec"][0])
        self.assertIsNotNone(stop)
        self.assertGreater(int(stop.group(1)) * 1000, DEFAULT_DRAIN_MS)
        self.assertEqual(self.settings["ExecReload"], ["/bin/kill -HUP $MAINPID"])
        self.assertEqual(self.settings["Restart"], ["on-failure"])
        # Sized by the README's formula for the default limits.max_connections (16384 streams
        # at most): 3N + 256.
        self.assertGreaterEqual(int(self.settings["LimitNOFILE"][0]), 3 * 16384 + 256)

    def test_admin_key_credential_path_is_a_valid_topology(self):
        # The README's pattern: LoadCredential copies the key where admin.api_key_file reads it.
        self.assertIn("#LoadCredential=admin-api-key:/etc/pdrouter/admin-api-key", self.text)
        key = os.path.join(self.dir, "admin-api-key")
        with open(key, "w") as f:
            f.write("k" * 32 + "\n")
        with Router("admin: {api_key_file: %s}\n" % key) as router:
            code, _, _ = router.request("GET", "/admin/instances",
                                        headers={"Authorization": "Bearer " + "k" * 32})
            self.assertEqual(code, 200)
        router.dir.cleanup()


if __name__ == "__main__":
    unittest.main()
