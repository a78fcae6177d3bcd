"""The topology file seen from outside: static instances in /status, hot reload on file change and
on SIGHUP, a bad reload rejected with the old configuration kept, and bad files refused at start."""
import os
import re
import signal
import time
import unittest

from pdr_testlib import ProcessHandle, free_port, pdrouter_path
from pdrouter_fixture import Router


def topology(*instances, ttl_ms=5000):
    text = f"discovery:\n  ttl_ms: {ttl_ms}\ninstances:\n"
    for role, address in instances:
        text += (f"  - role: {role}\n    http_address: \"{address}\"\n    connector: moriio\n"
                 f"    transfer_mode: READ\n"
                 f"    zmq_address: \"host:{address.split(':')[0]},handshake:6301,notify:61005\"\n")
    return text


def reloads(router, result):
    return router.metrics()[f'pdrouter_topology_reloads_total{{result="{result}"}}']


class TopologyReloadTest(unittest.TestCase):
    def setUp(self):
        self.router = Router(topology(("prefill", "127.5.0.1:8000")))
        self.addCleanup(self.router.stop)

    def keys(self):
        return sorted(i["http_address"] for i in self.router.status()["instances"])

    def test_static_instances_are_listed(self):
        inst = self.router.instance("127.5.0.1:8000")
        self.assertEqual(inst["source"], "static")
        self.assertEqual(inst["registration_format"], "static")
        self.assertEqual(inst["transfer_mode"], "READ")
        self.assertEqual(inst["state"], "up")
        self.assertIsNone(inst["expires_in_ms"])
        self.assertIsNone(inst["last_seen_ms_ago"])  # never heard from

    def test_file_change_reloads(self):
        self.router.write_topology(topology(("prefill", "127.5.0.1:8000"), ("decode", "127.5.0.2:8000")))
        self.router.wait_for(lambda: self.keys() == ["127.5.0.1:8000", "127.5.0.2:8000"])
        self.assertGreaterEqual(reloads(self.router, "ok"), 1)  # one rewrite may be seen twice
        self.router.write_topology(topology(("decode", "127.5.0.2:8000")))
        self.router.wait_for(lambda: self.keys() == ["127.5.0.2:8000"])

    def test_invalid_reload_keeps_the_running_configuration(self):
        self.router.write_topology("listeners:\n  http: \"0.0.0.0:70000\"\n")
        self.router.wait_for(lambda: reloads(self.router, "failed") >= 1)
        self.assertEqual(self.keys(), ["127.5.0.1:8000"])
        topo = self.router.status()["topology"]
        self.assertRegex(topo["last_error"], r"topology\.yaml:2:\d+: listeners\.http: .*70000")
        self.assertEqual(reloads(self.router, "ok"), 0)
        # A valid file afterwards applies and clears the error.
        self.router.write_topology(topology(("decode", "127.5.0.3:8000")))
        self.router.wait_for(lambda: self.keys() == ["127.5.0.3:8000"])
        self.assertEqual(self.router.status()["topology"]["last_error"], "")

    def test_sighup_reloads(self):
        # No file event since start: the only possible reload is the one SIGHUP asks for.
        self.assertEqual(reloads(self.router, "ok"), 0)
        self.router.process.send_signal(signal.SIGHUP)
        self.router.wait_for(lambda: reloads(self.router, "ok") == 1)
        self.assertEqual(self.keys(), ["127.5.0.1:8000"])
        self.router.process.send_signal(signal.SIGHUP)
        self.router.wait_for(lambda: reloads(self.router, "ok") == 2)

    def test_tokenize_by_node_without_kv_events_is_warned_about_on_reload(self):
        warning = "policies.cache_aware.tokenize is node but kv_events.enabled is false"
        self.assertNotIn(warning, self.router.log())
        self.router.write_topology(topology(("prefill", "127.5.0.1:8000"))
                                   + "policies:\n  cache_aware: {tokenize: node}\n")
        self.router.wait_for(lambda: warning in self.router.log())
        # A warning, not a refusal. The warning is logged while the file is read, before the
        # reload is counted: wait for the count too (TSan's slower run saw it still at 0).
        self.router.wait_for(lambda: reloads(self.router, "ok") >= 1)
        self.assertEqual(reloads(self.router, "failed"), 0)

    def test_unknown_policy_rejected_on_reload(self):
        self.router.write_topology("policies:\n  decode: fastest\n")
        self.router.wait_for(lambda: reloads(self.router, "failed") >= 1)
        self.assertIn("fastest", self.router.status()["topology"]["last_error"])

    def test_sigterm_exits_cleanly(self):
        self.assertEqual(self.router.stop(), 0)



class TruncatedTopologyTest(unittest.TestCase):
    """A writer that truncates first (`: > f`, `cat good > f`, `cp`) made the
    watcher apply the empty file: all defaults, static instances gone, admin API disabled."""

    KEY = "trunc-admin-key"

    def good(self, *extra):
        return (topology(("prefill", "127.5.0.1:8000"), *extra) +
                "admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\n")

    def setUp(self):
        self.router = Router(self.good(), env={"PDR_TEST_ADMIN_KEY": self.KEY})
        self.addCleanup(self.router.stop)

    def write_in_place(self, text):
        with open(self.router.config, "w") as f:  # truncates, then writes: not atomic
            f.write(text)

    def running_config_kept(self):
        keys = [i["http_address"] for i in self.router.status()["instances"]]
        self.assertIn("127.5.0.1:8000", keys)
        code, _, _ = self.router.request("GET", "/admin/instances",
                                         headers={"Authorization": f"Bearer {self.KEY}"})
        self.assertEqual(code, 200)
        return keys

    def test_truncate_then_write_keeps_the_running_configuration(self):
        self.write_in_place("")  # left empty: refused once it has settled
        self.router.wait_for(lambda: self.running_config_kept() and reloads(self.router, "failed") >= 1)
        self.assertIn("empty", self.router.status()["topology"]["last_error"])
        self.assertEqual(reloads(self.router, "ok"), 0)
        self.running_config_kept()
        # The writer finishes later: the new file applies, and the old one was kept until then.
        self.write_in_place(self.good(("decode", "127.5.0.2:8000")))
        self.router.wait_for(lambda: "127.5.0.2:8000" in self.running_config_kept())
        self.assertEqual(self.router.status()["topology"]["last_error"], "")
        # The attack's rounds: truncate, a moment, write. The half-written state is never read.
        for n in range(3):
            before = reloads(self.router, "ok")
            self.write_in_place("")
            self.running_config_kept()
            time.sleep(0.05)  # part of the writer's behaviour being reproduced, not a wait
            self.write_in_place(self.good(("decode", f"127.5.0.{3 + n}:8000")))
            self.router.wait_for(lambda: f"127.5.0.{3 + n}:8000" in self.running_config_kept())
            self.router.wait_for(lambda: reloads(self.router, "ok") >= before + 1)
        self.running_config_kept()

class StartupTest(unittest.TestCase):
    """Bad files refused at start; test_startup.py covers the other start-up failures."""

    def start_with(self, text):
        path = os.path.join(self.dir, "bad.yaml")
        with open(path, "w") as f:
            f.write(text)
        proc = ProcessHandle([pdrouter_path(), "--config", path, "--http", "127.0.0.1:0",
                              "--discovery", "tcp://127.0.0.1:0"], name="pdrouter", log_dir=self.dir)
        self.addCleanup(proc.stop)
        code = proc.wait(10)
        return code, proc.output("stderr")

    def setUp(self):
        import tempfile
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name
        self.addCleanup(self.tmp.cleanup)

    def test_invalid_yaml_exits_2_with_location(self):
        code, err = self.start_with("listeners:\n  http: [unclosed\n")
        self.assertEqual(code, 2)
        self.assertRegex(err, r"bad\.yaml:\d+:\d+:")

    def test_port_out_of_range(self):
        code, err = self.start_with("listeners:\n  http: \"0.0.0.0:70000\"\n")
        self.assertEqual(code, 2)
        self.assertRegex(err, r"bad\.yaml:2:\d+: listeners\.http: .*70000")

    def test_admin_listener_on_the_http_port_is_refused(self):
        port = free_port()
        path = os.path.join(self.dir, "bad.yaml")
        with open(path, "w") as f:
            f.write(f"listeners:\n  admin: \"127.0.0.1:{port}\"\n")
        proc = ProcessHandle([pdrouter_path(), "--config", path, "--http", f"127.0.0.1:{port}",
                              "--discovery", "tcp://127.0.0.1:0"], name="pdrouter", log_dir=self.dir)
        self.addCleanup(proc.stop)
        self.assertEqual(proc.wait(10), 2)
        self.assertIn("listeners.admin", proc.output("stderr"))

    def test_unknown_policy(self):
        code, err = self.start_with("policies:\n  prefill: fastest\n")
        self.assertEqual(code, 2)
        self.assertIn("fastest", err)

    def test_bad_flag(self):
        proc = ProcessHandle([pdrouter_path(), "--workers", "nine"], name="pdrouter", log_dir=self.dir)
        self.addCleanup(proc.stop)
        self.assertEqual(proc.wait(10), 2)

    def test_busy_discovery_port_fails_start(self):
        with Router() as first:
            proc = ProcessHandle([pdrouter_path(), "--http", "127.0.0.1:0", "--discovery", first.discovery],
                                 name="second", log_dir=self.dir)
            self.addCleanup(proc.stop)
            self.assertEqual(proc.wait(10), 1)
            self.assertRegex(proc.output("stderr"), re.escape("cannot bind"))

    def test_kubernetes_token_over_plain_http_is_warned_about_at_start(self):
        # An http:// API server with a token file: the token would travel in clear. Nothing
        # listens on the port: the warning is about the file, logged before any call is made.
        token = os.path.join(self.dir, "token")
        with open(token, "w") as f:
            f.write("not-a-real-token\n")
        api = f"http://127.0.0.1:{free_port()}"
        warning = "is sent in clear on every call to the API server"
        with Router(f"kubernetes:\n  enabled: true\n  api_server: \"{api}\"\n  namespace: ns\n"
                    f"  token_file: \"{token}\"\n") as router:
            router.wait_for(lambda: warning in router.log())
            self.assertIn(f"kubernetes.api_server is {api} (http://)", router.log())
        with Router(f"kubernetes:\n  enabled: true\n  api_server: \"{api}\"\n  namespace: ns\n"
                    f"  token_file: \"\"\n") as router:
            self.assertEqual(router.request("GET", "/health")[0], 200)
            self.assertNotIn(warning, router.log())


if __name__ == "__main__":
    unittest.main()
