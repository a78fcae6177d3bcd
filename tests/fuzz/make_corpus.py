#!/usr/bin/python3
"""Writes the seed corpus for discovery_message_fuzz: one msgpack file per valid message shape.

Run with Debian's interpreter (python3-msgpack): /usr/bin/python3 tests/fuzz/make_corpus.py
The dicts are shaped as vLLM builds them (shared/PROTOCOLS.md sections 1 and 2); `--hex` prints
each vector as hex instead, for pasting into tests/proto/discovery_message_test.cc.
"""
import os
import sys

import msgpack

VECTORS = {
    # MoRIIO current: moriio_connector.py heartbeat dict, in its key order.
    "moriio_current": {
        "type": "P",
        "http_address": "127.0.10.5:8000",
        "zmq_address": "host:127.0.10.5,handshake:6301,notify:61005",
        "dp_size": 2,
        "tp_size": 8,
        "transfer_mode": "READ",
    },
    # MoRIIO legacy: older moriio_connector.py, what vllm-project/router's MoRIIO mode parses.
    "moriio_legacy": {
        "type": "register",
        "role": "P",
        "index": "7",
        "request_address": "http://127.0.10.5:8000/v1/completions",
        "handshake_port": 6301,
        "notify_port": 61005,
        "dp_size": 1,
        "tp_size": 4,
        "transfer_mode": "WRITE",
    },
    # P2P-NCCL: p2p_nccl_engine.py ping dict.
    "p2p_nccl": {
        "type": "D",
        "http_address": "127.0.10.6:8100",
        "zmq_address": "127.0.10.6:21001",
    },
    "hello": {"type": "HELLO"},
    # IPv6 form (fd00::/8, not ::1: the decoder's IPv6 handling is the point); only decoded.
    "moriio_current_ipv6": {
        "type": "D",
        "http_address": "[fd00::6]:8200",
        "zmq_address": "host:fd00::6,handshake:6301,notify:61005",
        "dp_size": 1,
        "tp_size": 1,
        "transfer_mode": "write",
    },
    "pdrouter_full": {
        "type": "P",
        "http_address": "node-3.example:8000",
        "zmq_address": "host:127.0.10.7,handshake:6301,notify:61005",
        "dp_size": 4,
        "tp_size": 2,
        "transfer_mode": "READ",
        "pdr_v": 1,
        "connector": "moriio",
        "instance_id": "node-3-a1b2",
        "epoch": 1700000000123,
        "model": "meta-llama/Llama-3.1-8B-Instruct",
        "bootstrap_port": 8998,
        "labels": {"rack": "r1", "gpu": "mi300x"},
        "load": {"running": 3, "waiting": 1, "free_kv_blocks": 4096},
        "draining": True,
        "ttl_ms": 9000,
        "auth": "s3cret",
    },
    "pdrouter_hello": {
        "type": "HELLO",
        "pdr_v": 1,
        "role": "decode",
        "http_address": "127.0.10.8:8000",
        "connector": "nixl",
    },
    "goodbye": {
        "type": "goodbye",
        "pdr_v": 1,
        "http_address": "127.0.10.5:8000",
        "instance_id": "node-3-a1b2",
        "epoch": 42,
        "auth": "s3cret",
    },
    # What a replica publishes per registry entry in etcd (proto/etcd_registry_entry.h): a
    # pdrouter registration plus the class the node was admitted with on that replica.
    "etcd_registry_entry": {
        "type": "D",
        "http_address": "127.0.10.9:8000",
        "dp_size": 1,
        "tp_size": 1,
        "pdr_v": 1,
        "connector": "nixl",
        "epoch": 7,
        "pdr_admission": "curve",
    },
    "ack": {
        "type": "ack",
        "pdr_v": 1,
        "ok": True,
        "reason": "",
        "ttl_ms": 9000,
        "registry_version": 17,
    },
}


def main():
    if "--hex" in sys.argv:
        for name, message in VECTORS.items():
            print(name, msgpack.packb(message).hex())
        return
    out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "discovery_message")
    os.makedirs(out_dir, exist_ok=True)
    for name, message in VECTORS.items():
        with open(os.path.join(out_dir, name + ".msgpack"), "wb") as f:
            f.write(msgpack.packb(message))


if __name__ == "__main__":
    main()
