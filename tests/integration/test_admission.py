"""Discovery admission control against a real pdrouter (nodes from unlisted hosts,
weaker senders overwriting entries, goodbyes for static instances, stale epochs): who may join, what a weaker sender may change, CURVE sidecars, and the opt-in for
discovery open to the network. Every peer is a real ZMQ DEALER or a real `pdnode register`."""
import json
import os
import re
import tempfile
import unittest
import urllib.request

import msgpack
import zmq

from pdr_testlib import HealthServer, ProcessHandle, free_port, pdnode_path, pdrouter_path
from pdrouter_fixture import TIME_SCALE, Router, recv_with_deadline


def moriio(host, port, role="D", zmq_host=None):
    zmq_host = zmq_host or host
    return {"type": role, "http_address": f"{host}:{port}",
            "zmq_address": f"host:{zmq_host},handshake:6301,notify:61005",
            "dp_size": 1, "tp_size": 1, "transfer_mode": "WRITE"}


def metric(router, name, **labels):
    key = name
    if labels:
        key += "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
    return router.metrics().get(key, 0.0)


class AdmissionTest(unittest.TestCase):
    def dealer_from(self, router, source):
        """A DEALER whose TCP connection starts from `source` (a loopback address)."""
        sock = router.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        port = router.discovery.rsplit(":", 1)[1]
        sock.connect(f"tcp://{source}:0;127.0.0.1:{port}")
        router.sockets.append(sock)
        return sock

    def test_rogue_node_outside_the_allow_list_never_joins(self):
        # One MoRIIO message from a host nobody listed made a node that got real traffic.
        with Router('discovery:\n  allowed_peers: ["127.0.0.7/32"]\n') as router:
            router.send(moriio("127.0.0.1", 48700))  # from 127.0.0.1: not listed
            router.wait_for(lambda: metric(router, "pdrouter_discovery_handshakes_refused_total",
                                           reason="address_not_allowed") >= 1)
            self.dealer_from(router, "127.0.0.7").send(msgpack.packb(moriio("127.0.0.7", 48701)))
            inst, _ = router.wait_for(lambda: router.instance("127.0.0.7:48701"))
            self.assertEqual(inst["admission"], "address")
            self.assertIsNone(router.instance("127.0.0.1:48700"))
            self.assertEqual(metric(router, "pdrouter_discovery_frames_total"), 1)
            # The refusal is counted before it is logged, and the log reaches this process through
            # a pipe and a reader thread: wait for the line rather than read the log once.
            router.wait_for(lambda: re.search(r"refused connection \(address_not_allowed\): peer 127\.0\.0\.1",
                                              router.log()))

    def test_unauthenticated_token_less_message_cannot_overwrite_an_authenticated_node(self):
        # With a token set, a token-less vLLM message rewrote a token node's entry.
        with Router("discovery:\n  auth_token_env: PDR_TEST_DISC_TOKEN\n",
                    env={"PDR_TEST_DISC_TOKEN": "s3cret"}) as router:
            legit = {"type": "D", "pdr_v": 1, "http_address": "127.0.0.1:48703", "connector": "moriio",
                     "zmq_address": "host:127.0.0.1,handshake:6301,notify:61005",
                     "transfer_mode": "WRITE", "auth": "s3cret", "epoch": 7}
            sock = router.send(legit)
            self.assertIsNotNone(recv_with_deadline(sock, 2 * TIME_SCALE), "no ack")
            self.assertEqual(router.instance("127.0.0.1:48703")["admission"], "token")
            rogue = moriio("127.0.0.1", 48703, role="P", zmq_host="127.0.0.66")
            for _ in range(3):
                router.send(rogue)
            router.wait_for(lambda: metric(router, "pdrouter_registrations_rejected_total",
                                           reason="weaker_sender") >= 3)
            inst = router.instance("127.0.0.1:48703")
            self.assertEqual(inst["role"], "decode")
            self.assertEqual(inst["registration_format"], "pdrouter")
            self.assertEqual(inst["epoch"], 7)
            self.assertIn("127.0.0.1", inst["zmq_address"])

    def test_spoofed_goodbye_and_drain_leave_a_static_instance_alone(self):
        # A goodbye from anyone expired a static instance until the next reload.
        with Router("instances:\n  - {role: decode, http_address: \"127.0.0.1:48720\", connector: nixl}\n"
                    "  - {role: prefill, http_address: \"127.0.0.1:48721\", connector: nixl}\n") as router:
            sock = router.send({"type": "goodbye", "pdr_v": 1, "http_address": "127.0.0.1:48720"})
            ack = recv_with_deadline(sock, 2 * TIME_SCALE)
            self.assertIsNotNone(ack, "no ack for the goodbye")
            self.assertFalse(msgpack.unpackb(ack)["ok"])
            draining = {"type": "D", "pdr_v": 1, "http_address": "127.0.0.1:48720", "connector": "nixl",
                        "draining": True}
            router.send(draining)
            router.wait_for(lambda: metric(router, "pdrouter_discovery_frames_total") >= 2)
            router.wait_for(lambda: router.instance("127.0.0.1:48720")["messages"] >= 1)
            inst = router.instance("127.0.0.1:48720")
            self.assertEqual(inst["state"], "up")
            self.assertEqual(metric(router, "pdrouter_registrations_rejected_total", reason="operator_owned"), 1)
            code, _, _ = router.request("GET", "/ready")
            self.assertEqual(code, 200)

    def test_older_epoch_and_epochless_goodbye_are_refused(self):
        # An older epoch counted as a restart; a goodbye without an epoch removed the node.
        with Router() as router:
            beat = {"type": "D", "pdr_v": 1, "http_address": "127.0.0.1:48730", "connector": "nixl"}
            router.send(dict(beat, epoch=6))
            router.wait_for(lambda: router.instance("127.0.0.1:48730"))
            router.send(dict(beat, epoch=1))
            router.send({"type": "goodbye", "pdr_v": 1, "http_address": "127.0.0.1:48730"})
            router.wait_for(lambda: metric(router, "pdrouter_registrations_rejected_total", reason="stale_goodbye") >= 1
                            and metric(router, "pdrouter_registrations_rejected_total", reason="stale_epoch") >= 1)
            inst = router.instance("127.0.0.1:48730")
            self.assertEqual((inst["epoch"], inst["restarts"], inst["state"]), (6, 0, "up"))
            router.send({"type": "goodbye", "pdr_v": 1, "http_address": "127.0.0.1:48730", "epoch": 6})
            router.wait_for(lambda: router.instance("127.0.0.1:48730") is None)

    def test_registry_flood_stops_at_the_cap_of_its_class_and_shows_it(self):
        with Router("discovery:\n  max_instances_per_class: {address: 5}\n") as router:
            for i in range(20):
                router.send(moriio("127.0.0.1", 49000 + i))
            router.wait_for(lambda: metric(router, "pdrouter_registrations_rejected_total", reason="class_full") >= 15)
            # The discovery thread counts a refusal as it reads the message and publishes the
            # registry snapshot (which /status and pdrouter_registered_instances show) at the end
            # of that pass: on a busy machine the count can be read in between. Wait for the
            # snapshot, then check that it stays at the cap.
            router.wait_for(lambda: router.status()["admission"]["address"]["instances"] >= 5)
            self.assertEqual(router.status()["admission"]["address"], {"instances": 5, "max": 5})
            self.assertEqual(metric(router, "pdrouter_registered_instances", admission="address"), 5)
            self.assertEqual(metric(router, "pdrouter_registrations_rejected_total", reason="class_full"), 15)


class CurveSidecarTest(unittest.TestCase):
    def setUp(self):
        self.router = None
        self.sidecars = []
        self.health = HealthServer(status=200)
        self.keys = tempfile.mkdtemp(prefix="pdr-curve-")
        for name in ("router", "node", "stranger"):
            keygen = ProcessHandle([pdnode_path(), "keygen", os.path.join(self.keys, name)], name="keygen")
            self.assertEqual(keygen.wait(10), 0, keygen.output())
        self.assertEqual(os.stat(os.path.join(self.keys, "router.key")).st_mode & 0o777, 0o600)
        with open(os.path.join(self.keys, "clients.txt"), "w") as f, \
                open(os.path.join(self.keys, "node.pub")) as pub:
            f.write(pub.read())
        self.curve_port = free_port()

    def tearDown(self):
        for sidecar in self.sidecars:
            sidecar.stop()
        if self.router is not None:
            self.router.stop()
        self.health.close()

    def sidecar(self, key_name, port):
        args = [pdnode_path(), "register", "--router", f"tcp://127.0.0.1:{self.curve_port}",
                "--role", "decode", "--http-address", f"127.0.0.1:{port}", "--connector", "nixl",
                "--health-url", f"http://{self.health.address}/health", "--interval-ms", "100",
                "--curve-server-key", os.path.join(self.keys, "router.pub"),
                "--curve-key", os.path.join(self.keys, key_name + ".key")]
        proc = ProcessHandle(args, name="pdnode")
        self.sidecars.append(proc)
        return proc

    def test_listed_sidecar_joins_over_curve_and_a_stranger_is_refused(self):
        self.router = Router(
            f'listeners:\n  discovery_curve: "tcp://127.0.0.1:{self.curve_port}"\n'
            f"discovery:\n  curve:\n    secret_key_file: {self.keys}/router.key\n"
            f"    allowed_client_keys_file: {self.keys}/clients.txt\n")
        self.assertEqual(self.router.status()["listeners"]["discovery_curve"], f"tcp://127.0.0.1:{self.curve_port}")
        self.sidecar("node", 48750)
        inst, _ = self.router.wait_for(lambda: self.router.instance("127.0.0.1:48750"), timeout=10)
        self.assertEqual(inst["admission"], "curve")
        self.sidecar("stranger", 48751)
        self.router.wait_for(lambda: metric(self.router, "pdrouter_discovery_handshakes_refused_total",
                                            reason="key_not_allowed") >= 1, timeout=10)
        self.assertIsNone(self.router.instance("127.0.0.1:48751"))
        # The plain endpoint (vLLM nodes) cannot change what the CURVE sidecar registered.
        self.router.send(moriio("127.0.0.1", 48750, role="P"))
        self.router.wait_for(lambda: metric(self.router, "pdrouter_registrations_rejected_total",
                                            reason="weaker_sender") >= 1)
        self.assertEqual(self.router.instance("127.0.0.1:48750")["role"], "decode")
        # Its own goodbye (SIGTERM) removes it.
        self.sidecars[0].stop()
        self.router.wait_for(lambda: self.router.instance("127.0.0.1:48750") is None, timeout=10)


class OpenDiscoveryTest(unittest.TestCase):
    def start(self, topology_text):
        path = os.path.join(tempfile.mkdtemp(prefix="pdr-open-"), "topology.yaml")
        with open(path, "w") as f:
            f.write(topology_text)
        return ProcessHandle([pdrouter_path(), "--http", "127.0.0.1:0", "--discovery", "tcp://*:0",
                              "--config", path, "--workers", "1"], name="pdrouter")

    def test_open_discovery_needs_the_opt_in_and_says_so(self):
        open_list = 'discovery:\n  allowed_peers: ["0.0.0.0/0", "::/0"]\n'
        refused = self.start(open_list)
        self.assertEqual(refused.wait(10 * TIME_SCALE), 2, refused.output())
        self.assertIn("discovery.allow_open: true", refused.output())
        with self.start(open_list + "  allow_open: true\n") as router:
            line = router.wait_for_line(r"pdrouter listening http=(\S+)", timeout=10 * TIME_SCALE,
                                        streams=("stdout",))
            self.assertIsNotNone(line, router.output())
            http = re.search(r"http=(\S+)", line).group(1)
            self.assertIsNotNone(router.wait_for_line(r"discovery is OPEN", timeout=5 * TIME_SCALE))
            with urllib.request.urlopen(f"http://{http}/status", timeout=5 * TIME_SCALE) as resp:
                self.assertTrue(json.loads(resp.read())["discovery_open"])


if __name__ == "__main__":
    unittest.main()
