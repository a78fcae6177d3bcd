"""Bad discovery input changes nothing: each malformed message is counted under its reason, the
registry stays as it was, and pdrouter keeps answering HTTP, even under a flood of garbage."""
import threading
import time
import unittest

import msgpack

from pdrouter_fixture import TIME_SCALE, Router
from test_registration import moriio_current

GOOD = moriio_current("127.9.0.1", 8100)


def rejected(metrics, reason):
    return metrics.get(f'pdrouter_registrations_rejected_total{{reason="{reason}"}}', 0)


def registry_view(router):
    """The registry minus fields that move with time."""
    return [{k: v for k, v in inst.items() if not k.endswith("_ms_ago") and k != "expires_in_ms"}
            for inst in router.status()["instances"]]


class BadInputTest(unittest.TestCase):
    def setUp(self):
        self.router = Router("discovery:\n  ttl_ms: 60000\n  max_message_bytes: 65536\n")
        self.addCleanup(self.router.stop)
        self.router.send(GOOD)
        self.router.wait_for(lambda: self.router.instance("127.9.0.1:8100"))
        self.before = registry_view(self.router)

    def assert_rejected(self, payload, reason, count=1, **send_args):
        start = rejected(self.router.metrics(), reason)
        self.router.send(payload, **send_args)
        self.router.wait_for(lambda: rejected(self.router.metrics(), reason) >= start + count)
        self.assertEqual(registry_view(self.router), self.before)

    def test_malformed_msgpack(self):
        self.assert_rejected(b"\xc1", "malformed")            # 0xc1 is never valid msgpack
        self.assert_rejected(b"\x86\xa4type", "malformed")    # truncated map
        self.assert_rejected(msgpack.packb(GOOD) + b"\x00", "malformed")  # trailing bytes

    def test_not_a_map(self):
        self.assert_rejected(msgpack.packb(["P", "127.9.0.2:1"]), "wrong_type")

    def test_wrong_types(self):
        for key, value in (("dp_size", "2"), ("tp_size", 1.5), ("http_address", 8100), ("transfer_mode", True)):
            payload = dict(moriio_current("127.9.0.3", 8100))
            payload[key] = value
            self.assert_rejected(payload, "wrong_type")

    def test_missing_keys(self):
        for key in ("http_address", "dp_size", "tp_size", "transfer_mode"):
            payload = dict(moriio_current("127.9.0.4", 8100))
            del payload[key]
            self.assert_rejected(payload, "missing_key")
        self.assert_rejected({"http_address": "127.9.0.4:1"}, "missing_key")  # no type

    def test_bad_values(self):
        self.assert_rejected(moriio_current("127.9.0.5", 70000), "bad_address")
        payload = moriio_current("127.9.0.5", 8100)
        payload["zmq_address"] = "host:127.9.0.5,handshake:6301"  # notify missing
        self.assert_rejected(payload, "bad_address")
        self.assert_rejected(moriio_current("127.9.0.5", 8100, dp=0), "out_of_range")
        self.assert_rejected(moriio_current("127.9.0.5", 8100, mode="PUSH"), "invalid_value")
        self.assert_rejected({"type": "X", "http_address": "127.9.0.5:1"}, "unknown_type")

    def test_wrong_frame_count(self):
        sock = self.router.dealer()
        start = rejected(self.router.metrics(), "bad_frames")
        sock.send_multipart([b"", msgpack.packb(GOOD)])  # REQ-style envelope: 3 frames at the ROUTER
        sock.send_multipart([msgpack.packb(GOOD), b"x", b"y"])
        self.router.wait_for(lambda: rejected(self.router.metrics(), "bad_frames") >= start + 2)
        self.assertEqual(registry_view(self.router), self.before)

    def test_oversized_frames(self):
        # Over max_message_bytes but under the hard limit: read, counted too_large.
        self.assert_rejected(b"\x81" + msgpack.packb("type") + msgpack.packb("x" * 100_000), "too_large")
        # 10 MB: libzmq drops the connection before pdrouter buffers it; counted as a disconnect.
        disconnects = self.router.metrics()["pdrouter_discovery_peer_disconnects_total"]
        self.router.send(b"\x00" * (10 * 1024 * 1024))
        self.router.wait_for(
            lambda: self.router.metrics()["pdrouter_discovery_peer_disconnects_total"] > disconnects)
        self.assertEqual(registry_view(self.router), self.before)
        code, _, _ = self.router.request("GET", "/health")
        self.assertEqual(code, 200)

    def test_garbage_flood_keeps_router_responsive(self):
        rate, seconds = 10_000, 3.0
        sent = [0]
        stop = threading.Event()

        def flood():
            sock = self.router.dealer()
            garbage = [b"\xc1", b"\x93\x01\x02\x03", msgpack.packb({"type": 7}), b"\xdd\xff\xff\xff\xff"]
            period = 1.0 / rate
            start = time.monotonic()
            while not stop.is_set() and time.monotonic() - start < seconds:
                # Paced to `rate` on average: send the messages due by now.
                due = int((time.monotonic() - start) / period)
                while sent[0] < due:
                    sock.send(garbage[sent[0] % len(garbage)])
                    sent[0] += 1
                time.sleep(0.001)
            sock.close()

        thread = threading.Thread(target=flood)
        thread.start()
        worst = 0.0
        try:
            while thread.is_alive():
                t0 = time.monotonic()
                code, _, _ = self.router.request("GET", "/health", timeout=2)
                worst = max(worst, time.monotonic() - t0)
                self.assertEqual(code, 200)
                time.sleep(0.05)  # sampling period of the probe
        finally:
            stop.set()
            thread.join(timeout=10)
        self.assertGreater(sent[0], rate * seconds * 0.8, "the flood did not reach its rate")
        self.assertLess(worst, 0.5 * TIME_SCALE, f"/health took {worst * 1000:.0f} ms during the flood")

        def all_counted():
            m = self.router.metrics()
            return sum(v for k, v in m.items() if k.startswith("pdrouter_registrations_rejected_total")) >= sent[0]

        self.router.wait_for(all_counted, timeout=10)
        self.assertEqual(registry_view(self.router), self.before)


if __name__ == "__main__":
    unittest.main()
