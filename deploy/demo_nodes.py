#!/usr/bin/env python3
"""Stand-ins for vLLM nodes for the quick start: each heartbeats pdrouter's discovery socket with
exactly the message an unmodified vLLM node of that connector sends (shared/PROTOCOLS.md), every
3 s, until killed. A tiny HTTP server answers /health for the node `pdnode register` speaks for.

  demo_nodes.py ENDPOINT moriio-prefill|moriio-decode|p2p-prefill|health-server PORT
"""
import http.server
import signal
import sys
import threading

import msgpack
import zmq

MESSAGES = {
    # MoRIIO (current vLLM): one DEALER frame with this map, every 3 s.
    "moriio-prefill": {"type": "P", "http_address": "127.0.0.1:{port}",
                       "zmq_address": "host:127.0.0.1,handshake:6301,notify:61005",
                       "dp_size": 1, "tp_size": 1, "transfer_mode": "WRITE"},
    "moriio-decode": {"type": "D", "http_address": "127.0.0.1:{port}",
                      "zmq_address": "host:127.0.0.1,handshake:6401,notify:61105",
                      "dp_size": 1, "tp_size": 1, "transfer_mode": "WRITE"},
    # P2P-NCCL: DEALER identity = zmq_address.
    "p2p-prefill": {"type": "P", "http_address": "127.0.0.1:{port}", "zmq_address": "127.0.0.1:21001"},
}


def heartbeat(endpoint, kind, port):
    msg = {k: v.format(port=port) if isinstance(v, str) else v for k, v in MESSAGES[kind].items()}
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    if kind.startswith("p2p"):
        sock.setsockopt(zmq.IDENTITY, msg["zmq_address"].encode())
    sock.connect(endpoint)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.is_set():
        sock.send(msgpack.packb(msg))
        stop.wait(3.0)


def health_server(port):
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", port), Health)
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    server.serve_forever()


if __name__ == "__main__":
    endpoint, kind, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if kind == "health-server":
        health_server(port)
    else:
        heartbeat(endpoint, kind, port)
