"""Registration through a real ZMQ DEALER into a real pdrouter, shaped exactly as vLLM's node code
sends it (docs/design/wire-formats.md sections 1 and 2), visible in /status and /metrics."""
import time
import unittest

import msgpack
import zmq

from pdrouter_fixture import TIME_SCALE, Router, recv_with_deadline

TOPOLOGY = """
discovery:
  ttl_ms: 1500
  min_ttl_ms: 500
"""

VISIBLE_WITHIN_S = 0.2 * TIME_SCALE  # registration-to-/status bound asserted for every dialect


def moriio_current(host, port, role="P", mode="WRITE", dp=2, tp=8):
    # Key order and types as MoRIIO's heartbeat builds the dict.
    return {"type": role, "http_address": f"{host}:{port}",
            "zmq_address": f"host:{host},handshake:6301,notify:61005",
            "dp_size": dp, "tp_size": tp, "transfer_mode": mode}


def moriio_legacy(host, port, role="D", index=0):
    return {"type": "register", "role": role, "index": str(index),
            "request_address": f"http://{host}:{port}/v1/completions",
            "handshake_port": 6301, "notify_port": 61005, "dp_size": 1, "tp_size": 8,
            "transfer_mode": "READ"}


def p2p_nccl(host, port, role="P"):
    return {"type": role, "http_address": f"{host}:{port}", "zmq_address": f"{host}:21001"}


def extended(host, port, role="D", epoch=1, **extra):
    msg = {"type": role, "http_address": f"{host}:{port}", "pdr_v": 1, "connector": "nixl",
           "instance_id": f"node-{port}", "epoch": epoch, "model": "meta-llama/Llama-3.1-8B",
           "labels": {"zone": "a"}, "load": {"running": 3, "waiting": 1, "free_kv_blocks": 900}}
    msg.update(extra)
    return msg


class RegistrationTest(unittest.TestCase):
    def setUp(self):
        self.router = Router(TOPOLOGY)
        self.addCleanup(self.router.stop)

    def register_and_wait(self, payload, key, identity=None):
        sock = self.router.send(payload, identity=identity)
        inst, waited = self.router.wait_for(lambda: self.router.instance(key), timeout=5)
        self.assertLess(waited, VISIBLE_WITHIN_S, f"{key} took {waited * 1000:.1f} ms to appear")
        return inst, sock

    def test_moriio_current(self):
        inst, _ = self.register_and_wait(moriio_current("127.1.0.5", 8100), "127.1.0.5:8100")
        self.assertEqual(inst["role"], "prefill")
        self.assertEqual(inst["dialect"], "moriio")
        self.assertEqual(inst["registration_format"], "moriio")
        self.assertEqual(inst["transfer_mode"], "WRITE")
        self.assertEqual((inst["dp_size"], inst["tp_size"]), (2, 8))
        self.assertEqual(inst["zmq_address"], "host:127.1.0.5,handshake:6301,notify:61005")
        self.assertEqual((inst["state"], inst["source"]), ("up", "registered"))
        self.assertLess(inst["last_seen_ms_ago"], 1000)
        status = self.router.status()
        self.assertEqual(status["counts"]["prefill"]["up"], 1)
        self.assertEqual(status["counts"]["decode"]["up"], 0)
        self.assertEqual(self.router.metrics()['pdrouter_registrations_accepted_total{format="moriio"}'], 1)

    def test_moriio_legacy(self):
        inst, _ = self.register_and_wait(moriio_legacy("127.1.0.6", 8200), "127.1.0.6:8200")
        self.assertEqual(inst["role"], "decode")
        self.assertEqual(inst["registration_format"], "moriio-legacy")
        self.assertEqual(inst["transfer_mode"], "READ")
        self.assertEqual(inst["zmq_address"], "host:127.1.0.6,handshake:6301,notify:61005")
        self.assertEqual((inst["dp_size"], inst["tp_size"]), (1, 8))

    def test_p2p_nccl_with_identity(self):
        # P2P-NCCL sets the DEALER identity to its zmq_address; pdrouter must not key on it.
        payload = p2p_nccl("127.1.0.7", 8300)
        inst, _ = self.register_and_wait(payload, "127.1.0.7:8300", identity=payload["zmq_address"])
        self.assertEqual(inst["dialect"], "p2p-nccl")
        self.assertEqual(inst["transfer_mode"], "none")
        self.assertEqual(inst["zmq_address"], "127.1.0.7:21001")

    def test_ipv6_address(self):
        payload = moriio_current("::1", 8100)
        payload["http_address"] = "[::1]:8100"
        inst, _ = self.register_and_wait(payload, "[::1]:8100")
        self.assertEqual(inst["zmq_address"], "host:::1,handshake:6301,notify:61005")

    def test_extended_registration_is_acknowledged(self):
        inst, sock = self.register_and_wait(extended("127.1.0.8", 8400), "127.1.0.8:8400")
        self.assertEqual(inst["dialect"], "nixl")
        self.assertEqual(inst["registration_format"], "pdrouter")
        self.assertEqual(inst["model"], "meta-llama/Llama-3.1-8B")
        self.assertEqual(inst["labels"], {"zone": "a"})
        self.assertEqual(inst["load"], {"running": 3, "waiting": 1, "free_kv_blocks": 900})
        ack = recv_with_deadline(sock)
        self.assertIsNotNone(ack, "no ack for a pdrouter-format registration")
        ack = msgpack.unpackb(ack)
        self.assertEqual(ack["type"], "ack")
        self.assertTrue(ack["ok"])
        self.assertEqual(ack["ttl_ms"], 1500)

    def test_plain_vllm_gets_no_reply(self):
        _, sock = self.register_and_wait(moriio_current("127.1.0.9", 8100), "127.1.0.9:8100")
        self.assertIsNone(recv_with_deadline(sock, timeout=0.3))

    def test_hello_is_ignored(self):
        before = self.router.status()["instances"]
        self.router.send({"type": "HELLO"})
        self.router.wait_for(lambda: self.router.metrics()["pdrouter_discovery_hellos_total"] == 1)
        self.assertEqual(self.router.status()["instances"], before)

    def test_heartbeats_keep_instance_then_it_expires_within_ttl(self):
        payload = moriio_current("127.2.0.1", 8100)
        sock = self.router.dealer()
        sock.send(msgpack.packb(payload))
        self.router.wait_for(lambda: self.router.instance("127.2.0.1:8100"))
        # Beat every 300 ms for twice the TTL: the instance must stay up throughout.
        end = time.monotonic() + 3.0
        while time.monotonic() < end:
            sock.send(msgpack.packb(payload))
            self.assertEqual(self.router.instance("127.2.0.1:8100")["state"], "up")
            time.sleep(0.3)  # the heartbeat period itself, not a synchronisation wait
        last_beat = time.monotonic()
        self.router.wait_for(lambda: self.router.instance("127.2.0.1:8100")["state"] == "expired", timeout=5)
        elapsed = time.monotonic() - last_beat
        self.assertLess(elapsed, (1.5 + 1.0) * TIME_SCALE, f"expired {elapsed:.2f}s after the last heartbeat")
        self.assertGreater(elapsed, 1.0, "expired before its TTL")
        self.assertEqual(self.router.metrics()["pdrouter_instance_expiries_total"], 1)
        # A new heartbeat brings it back.
        sock.send(msgpack.packb(payload))
        self.router.wait_for(lambda: self.router.instance("127.2.0.1:8100")["state"] == "up")
        self.assertEqual(self.router.metrics()["pdrouter_instance_revivals_total"], 1)

    def test_goodbye_removes_at_once(self):
        _, sock = self.register_and_wait(extended("127.3.0.1", 8100, epoch=7), "127.3.0.1:8100")
        recv_with_deadline(sock)
        sock.send(msgpack.packb({"type": "goodbye", "pdr_v": 1, "http_address": "127.3.0.1:8100", "epoch": 7}))
        _, waited = self.router.wait_for(lambda: self.router.instance("127.3.0.1:8100") is None)
        self.assertLess(waited, VISIBLE_WITHIN_S)
        self.assertEqual(self.router.metrics()["pdrouter_discovery_goodbyes_total"], 1)

    def test_new_epoch_counts_a_restart(self):
        self.register_and_wait(extended("127.3.0.2", 8100, epoch=100), "127.3.0.2:8100")
        self.router.send(extended("127.3.0.2", 8100, epoch=100))
        self.router.send(extended("127.3.0.2", 8100, epoch=101))
        inst, _ = self.router.wait_for(
            lambda: (i := self.router.instance("127.3.0.2:8100")) and i["epoch"] == 101 and i)
        self.assertEqual(inst["restarts"], 1)
        self.assertEqual(self.router.metrics()["pdrouter_instance_restarts_total"], 1)

    def test_mixed_transfer_modes_are_kept_per_instance(self):
        # The reference proxy fixes one global mode; pdrouter keeps each instance's own.
        self.register_and_wait(moriio_current("127.4.0.1", 8100, mode="READ"), "127.4.0.1:8100")
        inst, _ = self.register_and_wait(moriio_current("127.4.0.2", 8100, mode="write"), "127.4.0.2:8100")
        self.assertEqual(inst["transfer_mode"], "WRITE")
        self.assertEqual(self.router.instance("127.4.0.1:8100")["transfer_mode"], "READ")


if __name__ == "__main__":
    unittest.main()
