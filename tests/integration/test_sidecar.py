"""`pdnode register` end to end: the test is both the router (a ZMQ ROUTER) and the vLLM node (an
HTTP server whose /health it switches between 200 and 503)."""

import signal
import time
import unittest

from pdr_testlib import FakeRouter, HealthServer, ProcessHandle, pdnode_path

HEALTH_INTERVAL = 0.1  # seconds; --health-interval-ms 100
HEARTBEAT_INTERVAL = 0.2  # seconds; --interval-ms 200


class SidecarTest(unittest.TestCase):
    def setUp(self):
        self.health = HealthServer(status=503)
        # Only this test's node: another test's node may still reconnect to this ephemeral port.
        self.router = FakeRouter(accept=lambda payload: isinstance(payload, dict)
                                 and payload.get("http_address") == self.health.address)
        self.sidecar = None

    def tearDown(self):
        if self.sidecar is not None:
            self.sidecar.stop()
        self.health.close()
        self.router.close()

    def start_sidecar(self, *extra):
        args = [pdnode_path(), "register", "--router", self.router.endpoint, "--role", "decode",
                "--http-address", self.health.address,
                "--interval-ms", str(int(HEARTBEAT_INTERVAL * 1000)),
                "--health-interval-ms", str(int(HEALTH_INTERVAL * 1000))]
        args += list(extra) or ["--format", "pdrouter", "--model", "tiny"]
        self.sidecar = ProcessHandle(args, name="pdnode")
        return self.sidecar

    def wait_registered(self):
        message = self.router.receive(5.0)
        self.assertIsNotNone(message, "no heartbeat; stderr:\n" + self.sidecar.output())
        return message[1]

    def test_registers_only_once_health_answers_200(self):
        self.start_sidecar()
        self.assertIsNone(self.router.receive(5 * HEALTH_INTERVAL),
                          "registered while /health answered 503")
        self.assertGreater(self.health.requests, 0, "the sidecar never probed /health")

        healthy_at = time.monotonic()
        self.health.set_status(200)
        message = self.router.receive(1.0)
        delay = time.monotonic() - healthy_at
        self.assertIsNotNone(message, "no heartbeat within 1 s of /health turning 200")
        self.assertLess(delay, 1.0)
        payload = message[1]
        self.assertEqual(payload["type"], "D")
        self.assertEqual(payload["http_address"], self.health.address)
        self.assertEqual(payload["pdr_v"], 1)
        self.assertEqual(payload["model"], "tiny")
        self.assertIsNotNone(self.sidecar.wait_for_line(r"target healthy, registering with 1 router",
                                                        timeout=2.0))

    def test_kv_events_endpoints_are_sent(self):
        self.health.set_status(200)
        self.start_sidecar("--format", "pdrouter", "--kv-events-endpoint", "tcp://127.0.0.1:5557",
                           "--kv-events-replay-endpoint", "tcp://127.0.0.1:5600")
        payload = self.wait_registered()
        self.assertEqual(payload["kv_events_endpoint"], "tcp://127.0.0.1:5557")
        self.assertEqual(payload["kv_events_replay_endpoint"], "tcp://127.0.0.1:5600")

    def test_heartbeats_follow_the_interval(self):
        self.health.set_status(200)
        self.start_sidecar()
        self.wait_registered()
        first = time.monotonic()
        for _ in range(5):
            self.assertIsNotNone(self.router.receive(3 * HEARTBEAT_INTERVAL), "heartbeat missing")
        mean = (time.monotonic() - first) / 5
        self.assertGreater(mean, 0.75 * HEARTBEAT_INTERVAL)
        self.assertLess(mean, 1.5 * HEARTBEAT_INTERVAL)

    def test_health_failure_pauses_and_recovery_resumes(self):
        self.health.set_status(200)
        self.start_sidecar()
        self.wait_registered()

        mark = self.sidecar.mark()
        self.health.set_status(503)
        self.assertIsNotNone(
            self.sidecar.wait_for_line(r"health failed \(.*503.*\), pausing heartbeats",
                                       timeout=2.0, start=mark),
            "no pause logged; stderr:\n" + self.sidecar.output())
        # One heartbeat may already have been on its way when the pause was decided.
        self.router.drain(HEARTBEAT_INTERVAL)
        self.assertIsNone(self.router.receive(3 * HEARTBEAT_INTERVAL),
                          "heartbeat while /health fails")

        healthy_at = time.monotonic()
        self.health.set_status(200)
        self.assertIsNotNone(self.router.receive(1.0), "heartbeats did not resume")
        self.assertLess(time.monotonic() - healthy_at, 1.0)
        self.assertIsNotNone(self.router.receive(3 * HEARTBEAT_INTERVAL), "resumed only once")

    def test_sigterm_sends_goodbye_and_exits_0(self):
        self.health.set_status(200)
        self.start_sidecar()
        registration = self.wait_registered()

        signalled_at = time.monotonic()
        self.sidecar.send_signal(signal.SIGTERM)
        goodbye = self.router.receive_until(lambda m: m.get("type") == "goodbye", 2.0)
        self.assertIsNotNone(goodbye, "no goodbye after SIGTERM")
        self.assertEqual(goodbye["http_address"], self.health.address)
        self.assertEqual(goodbye["instance_id"], registration["instance_id"])
        self.assertEqual(goodbye["epoch"], registration["epoch"])
        code = self.sidecar.wait(max(0.0, 2.0 - (time.monotonic() - signalled_at)))
        self.assertEqual(code, 0, "stderr:\n" + self.sidecar.output())
        self.assertRegex(self.sidecar.output(), r"goodbye sent")

    def test_plain_moriio_dialect_has_no_extension_and_stops_cleanly(self):
        self.health.set_status(200)
        self.start_sidecar("--format", "moriio", "--transfer-mode", "WRITE", "--tp-size", "8",
                           "--zmq-address", "host:127.0.0.1,handshake:6301,notify:61005")
        payload = self.wait_registered()
        self.assertEqual(payload, {
            "type": "D", "http_address": self.health.address,
            "zmq_address": "host:127.0.0.1,handshake:6301,notify:61005",
            "dp_size": 1, "tp_size": 8, "transfer_mode": "WRITE"})
        self.sidecar.send_signal(signal.SIGINT)
        self.assertEqual(self.sidecar.wait(2.0), 0)

    def test_bad_flags_exit_2_with_a_message(self):
        cases = [
            (["--role", "middle"], r"--role 'middle'"),
            (["--role", "decode", "--format", "moriio"], r"--zmq-address is required"),
            (["--role", "decode", "--dp-size", "0"], r"--dp-size"),
            (["--role", "decode", "--health-url", "https://x:1/health"], r"--health-url"),
            # Accepted by every individual flag, refused by the router's decoder as a whole.
            (["--role", "decode", "--connector", "moriio",
              "--zmq-address", "host:127.0.10.1,handshake:6301,notify:61005"],
             r"router would reject.*transfer_mode"),
        ]
        for extra, expected in cases:
            with self.subTest(flags=extra):
                args = [pdnode_path(), "register", "--router", self.router.endpoint,
                        "--http-address", self.health.address] + extra
                with ProcessHandle(args, name="pdnode-bad") as proc:
                    self.assertEqual(proc.wait(5.0), 2)
                    self.assertRegex(proc.output("stderr"), expected)
        with ProcessHandle([pdnode_path(), "register", "--role", "decode"], name="pdnode-bad") as proc:
            self.assertEqual(proc.wait(5.0), 2)
            self.assertRegex(proc.output("stderr"), r"--router")


if __name__ == "__main__":
    unittest.main()
