"""What an admitted but unauthenticated node may name, against a real pdrouter over real ZMQ:

  * "a node may register only itself" covers host names: a sender admitted by address (no token,
    no CURVE key) that names a host name anywhere in its registration (http_address, the MoRIIO or
    P2P-NCCL zmq_address host, a KV events endpoint) is refused with reason host_name, before the
    name is ever resolved; "localhost" is a loopback peer's own host; a token holder may name any
    host;
  * a NIXL prefill whose answer names another host as its side channel (remote_host) never gets
    that host to a decode: the leg fails (counted), the request is retried on another prefill;
  * CURVE handshakes that fail before the ZAP handler is asked (wrong server key, NULL mechanism
    on the CURVE endpoint) are counted as refused handshakes.

Every address is in 127.0.0.0/8. Since any loopback address counts as this machine's own host,
"another host" is spelled with names under .invalid (RFC 6761: they never resolve); nothing
connects to them, which the tests check too.
"""
import http.server
import json
import os
import socket
import tempfile
import threading
import unittest

import msgpack
import zmq

from pd_fixture import PdCluster
from pdr_testlib import ProcessHandle, free_port, pdnode_path
from pdrouter_fixture import TIME_SCALE, Router, recv_with_deadline


def rejected(router, reason):
    return router.metrics().get(f'pdrouter_registrations_rejected_total{{reason="{reason}"}}', 0.0)


def ack_of(sock):
    raw = recv_with_deadline(sock, 5 * TIME_SCALE)
    assert raw is not None, "no ack"
    return msgpack.unpackb(raw)


def pdr_registration(http_address, **extra):
    # model "never-routed": even where a registration is accepted, no request goes to it.
    return {"type": "D", "pdr_v": 1, "http_address": http_address, "connector": "nixl",
            "model": "never-routed", **extra}


class HostNamesTest(unittest.TestCase):
    def test_unauthenticated_senders_may_not_name_hosts(self):
        with Router() as router:
            # pdrouter-format registrations get an ack saying why.
            ack = ack_of(router.send(pdr_registration("victim.invalid:5432")))
            self.assertFalse(ack["ok"])
            self.assertIn("forbidden: http_address is a host name", ack["reason"])
            ack = ack_of(router.send(pdr_registration("127.0.0.1:48801",
                                                      kv_events_endpoint="tcp://kv-victim.invalid:5557")))
            self.assertFalse(ack["ok"])
            self.assertIn("kv_events_endpoint is a host name", ack["reason"])
            ack = ack_of(router.send(pdr_registration("127.0.0.1:48802",
                                                      kv_events_replay_endpoint="tcp://kv-victim.invalid:5558")))
            self.assertIn("kv_events_replay_endpoint is a host name", ack["reason"])
            # vLLM's own formats get no ack: counted. A MoRIIO side channel and a P2P-NCCL one on
            # a named host (the paired node would connect there).
            router.send({"type": "P", "http_address": "127.0.0.1:48803",
                         "zmq_address": "host:victim.invalid,handshake:6301,notify:61005",
                         "dp_size": 1, "tp_size": 1, "transfer_mode": "WRITE"})
            router.send({"type": "D", "http_address": "127.0.0.1:48804", "zmq_address": "victim.invalid:14579"})
            router.wait_for(lambda: rejected(router, "host_name") == 5)
            for port in range(48801, 48805):
                self.assertIsNone(router.instance(f"127.0.0.1:{port}"))
            self.assertEqual([i["http_address"] for i in router.status()["instances"]], [])
            # Refused before any lookup: no name was ever resolved or connected to.
            self.assertNotIn("cannot resolve", router.log())
            self.assertRegex(router.log(), r"rejected message \(host_name\): message for victim\.invalid:5432 "
                                           r"from 127\.0\.0\.1 names the host victim\.invalid in http_address")

            # "localhost" names this machine without a lookup: a loopback peer's own host.
            ack = ack_of(router.send(pdr_registration("localhost:48805",
                                                      kv_events_endpoint="tcp://localhost:5557")))
            self.assertTrue(ack["ok"], ack)
            self.assertEqual(router.instance("localhost:48805")["admission"], "address")
            router.send({"type": "P", "http_address": "127.0.0.1:48806",
                         "zmq_address": "host:localhost,handshake:6301,notify:61005",
                         "dp_size": 1, "tp_size": 1, "transfer_mode": "WRITE"})
            router.wait_for(lambda: router.instance("127.0.0.1:48806"))
            self.assertEqual(rejected(router, "host_name"), 5)

    def test_a_token_holder_may_name_a_host(self):
        with Router("discovery:\n  auth_token_env: PDR_TEST_DISC_TOKEN\n",
                    env={"PDR_TEST_DISC_TOKEN": "s3cret"}) as router:
            ack = ack_of(router.send(pdr_registration("node-9.invalid:8000", auth="s3cret", epoch=3)))
            self.assertTrue(ack["ok"], ack)
            self.assertEqual(router.instance("node-9.invalid:8000")["admission"], "token")
            # A plain vLLM message (address class) naming a host is refused even so.
            router.send({"type": "D", "http_address": "127.0.0.1:48807", "zmq_address": "victim.invalid:14579"})
            router.wait_for(lambda: rejected(router, "host_name") == 1)
            ack = ack_of(router.send({"type": "goodbye", "pdr_v": 1, "http_address": "node-9.invalid:8000",
                                      "auth": "s3cret", "epoch": 3}))
            self.assertTrue(ack["ok"], ack)


class NixlPrefillAnswer(http.server.BaseHTTPRequestHandler):
    """A NIXL prefill whose answer names `remote_host` as its side channel."""
    remote_host = "victim.invalid"
    requests = 0

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).requests += 1
        body = json.dumps({"id": "cmpl-fake", "object": "text_completion", "model": "sim-model",
                           "choices": [{"index": 0, "text": "", "finish_reason": "length"}],
                           "kv_transfer_params": {"do_remote_prefill": True, "do_remote_decode": False,
                                                  "remote_engine_id": "fake", "remote_request_id": "cmpl-fake-0",
                                                  "remote_block_ids": [[1, 2]],
                                                  "remote_host": self.remote_host, "remote_port": 5600,
                                                  "tp_size": 1}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


class NixlRemoteHostTest(unittest.TestCase):
    def test_a_prefill_cannot_aim_the_decode_at_another_host(self):
        cluster = PdCluster("nixl", prefills=0, decodes=0, register=False, kv_backends="none")
        self.addCleanup(cluster.close)
        cluster.decodes.append(cluster.start_node("decode"))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NixlPrefillAnswer)
        self.addCleanup(server.server_close)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        self.addCleanup(server.shutdown)
        rogue = "127.0.0.1:%d" % server.server_address[1]
        router = cluster.router
        ack = ack_of(router.send({"type": "P", "pdr_v": 1, "http_address": rogue, "connector": "nixl",
                                  "ttl_ms": 120000}))
        self.assertTrue(ack["ok"], ack)
        cluster.wait_registered([cluster.decodes[0]])  # /ready: the rogue prefill pairs with it
        body = {"model": "sim-model", "prompt": "Hello there", "max_tokens": 4}
        status, _, raw = cluster.post("/v1/completions", body)
        self.assertGreaterEqual(status, 500, raw)
        self.assertEqual(NixlPrefillAnswer.requests, 1)
        decode = cluster.decodes[0]
        self.assertEqual([r for r in decode.sim_requests()["requests"] if r["path"] == "/v1/completions"], [],
                         "the decode never got the rogue prefill's side channel")
        self.assertGreaterEqual(cluster.metric('pdrouter_leg_failures_total{leg="prefill",cause="bad_response"}'), 1)
        self.assertIn("names remote_host 'victim.invalid', not the prefill's own host '127.0.0.1'", router.log())

        # With an honest prefill beside it, every request is served: a rogue answer is retried on
        # the other prefill, whose side channel the decode gets.
        honest = cluster.start_node("prefill")
        cluster.prefills.append(honest)  # closed with the cluster
        cluster.wait_registered([honest])
        for _ in range(4):
            status, _, raw = cluster.post("/v1/completions", body)
            self.assertEqual(status, 200, raw)
        served = [r for r in decode.sim_requests()["requests"] if r["path"] == "/v1/completions"]
        self.assertEqual(len(served), 4)
        hosts = {json.loads(r["body"])["kv_transfer_params"]["remote_host"] for r in served}
        self.assertEqual(hosts, {"127.0.0.1"}, served)


class CurveHandshakeFailuresTest(unittest.TestCase):
    def setUp(self):
        self.keys = tempfile.mkdtemp(prefix="pdr-curve-")
        for name in ("router", "node"):
            keygen = ProcessHandle([pdnode_path(), "keygen", os.path.join(self.keys, name)], name="keygen")
            self.assertEqual(keygen.wait(10), 0, keygen.output())
        with open(os.path.join(self.keys, "clients.txt"), "w") as f, \
                open(os.path.join(self.keys, "node.pub")) as pub:
            f.write(pub.read())
        self.curve_port = free_port()
        self.router = Router(
            f'listeners:\n  discovery_curve: "tcp://127.0.0.1:{self.curve_port}"\n'
            f"discovery:\n  curve:\n    secret_key_file: {self.keys}/router.key\n"
            f"    allowed_client_keys_file: {self.keys}/clients.txt\n")
        self.addCleanup(self.router.stop)

    def refused(self, reason):
        return self.router.metrics().get(
            f'pdrouter_discovery_handshakes_refused_total{{reason="{reason}"}}', 0.0)

    def dealer(self):
        sock = self.router.ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        self.router.sockets.append(sock)
        return sock

    def test_handshakes_that_fail_before_zap_are_counted(self):
        # A CURVE client that holds a listed key but the wrong server key: its HELLO does not open.
        wrong_server_public, _ = zmq.curve_keypair()
        with open(os.path.join(self.keys, "node.key")) as f:
            secret = [line.split('"')[1] for line in f if "secret-key" in line][0]
        with open(os.path.join(self.keys, "node.pub")) as f:
            public = [line.split('"')[1] for line in f if "public-key" in line][0]
        sock = self.dealer()
        sock.curve_serverkey = wrong_server_public
        sock.curve_publickey = public.encode()
        sock.curve_secretkey = secret.encode()
        sock.connect(f"tcp://127.0.0.1:{self.curve_port}")
        sock.send(msgpack.packb(pdr_registration("127.0.0.1:48810")))
        self.router.wait_for(lambda: self.refused("wrong_server_key") >= 1, timeout=10)
        sock.close(linger=0)
        # A plain (NULL) client on the CURVE endpoint. A libzmq client may see the mismatch in the
        # router's greeting first and hang up before the router has read its own, and then no
        # handshake failure happens on the router's side; a raw ZMTP 3.0 greeting naming NULL,
        # sent whole on a connection held open, is always read and refused.
        greeting = b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" * 32
        with socket.create_connection(("127.0.0.1", self.curve_port), timeout=10) as raw:
            raw.sendall(greeting)
            self.router.wait_for(lambda: self.refused("wrong_mechanism") >= 1, timeout=10)
        # Neither refused client registered. (Only these two addresses are looked at: a node another
        # test left running may still beat to the plain discovery port this router now holds.)
        registered = {i["http_address"] for i in self.router.status()["instances"]}
        self.assertEqual(registered & {"127.0.0.1:48810", "127.0.0.1:48811"}, set())
        self.assertRegex(self.router.log(), r"refused connection \(wrong_server_key\): handshake failed")


if __name__ == "__main__":
    unittest.main()
