"""Real KV bytes through pdrouter: every P/D request moves its prompt's KV from the prefill sim to
the decode sim with the transfer engine, and the decode verifies every byte (node/sim/kv_mover.h).

  * 200 mixed requests (completions and chat, streamed and not, 1..700-token prompts, 16 at a
    time) through pdrouter to 2 prefill + 2 decode sims, in MoRIIO READ mode (the decode READs the
    prefill's blocks) and MoRIIO WRITE mode (the prefill WRITEs into the decode's blocks), over tcp
    and (WRITE) over shm,tcp: every request succeeds, no byte mismatches, bytes moved on every decode, and every sim ends up
    holding no KV blocks.
  * One request per other dialect (NIXL, Mooncake, P2P-NCCL, SGLang) moves bytes; those sims bind
    ephemeral side-channel ports (port 0) and advertise what they bound.
  * A decode given another request's blocks (same transfer id, different prompt) fails loudly with
    kv_mismatch; a WRITE decode whose KV never comes fails with kv_timeout and frees its blocks.
  * A raw TCP peer that says HELLO without the prefill's secret and asks for its first region gets
    nothing but a close, counted as auth_failures.

The sims' GET /sim/kv counters are the evidence. Every wait polls with a deadline.
"""
import concurrent.futures
import json
import socket
import struct
import time
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

REQUESTS = 200
CONCURRENCY = 16
WAIT_S = 30.0 * TIME_SCALE
WORDS = ("alpha", "beta", "gamma", "delta", "kv", "cache", "block", "token")


def prompt_text(i):
    """A prompt of 1..700 words (= tokens for the sim), different for every i."""
    length = 1 + (i * 37) % 700
    return " ".join(WORDS[(i + k) % len(WORDS)] for k in range(length)) + " #%d" % i


def request_for(i):
    """(path, body) of the i-th mixed request."""
    stream = i % 3 == 0
    if i % 2 == 0:
        path, body = "/v1/completions", {"model": "sim-model", "prompt": prompt_text(i),
                                         "max_tokens": 2 + i % 4}
    else:
        path, body = "/v1/chat/completions", {
            "model": "sim-model", "messages": [{"role": "user", "content": prompt_text(i)}],
            "max_completion_tokens": 2 + i % 4}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    return path, body


def send(cluster, path, body):
    """Sends one request through pdrouter; returns None on success, else what went wrong."""
    if body.get("stream"):
        with cluster.stream(path, body, timeout=WAIT_S) as s:
            if s.status != 200:
                return "status %d: %s" % (s.status, s.body()[:300])
            events = list(s)
        if not events or events[-1] != "[DONE]":
            return "stream did not end with [DONE]: %s" % events[-3:]
        for event in events[:-1]:
            chunk = json.loads(event)
            if "error" in chunk:
                return "error event: %s" % event
        return None
    status, _, raw = cluster.post(path, body, timeout=WAIT_S)
    if status != 200:
        return "status %d: %s" % (status, raw[:300])
    answer = json.loads(raw)
    if not answer.get("choices"):
        return "no choices: %s" % raw[:300]
    return None


def wait_kv(test, nodes, predicate, what, timeout=10.0):
    """Polls every node's /sim/kv until predicate(stats) holds for all; returns the stats."""
    deadline = time.monotonic() + timeout * TIME_SCALE
    while True:
        stats = [n.kv_stats() for n in nodes]
        if all(predicate(s) for s in stats):
            return stats
        if time.monotonic() >= deadline:
            test.fail("%s not reached within %.1fs:\n%s" % (
                what, timeout * TIME_SCALE, json.dumps(stats, indent=1)))
        time.sleep(0.05)


def no_blocks_held(stats):
    return stats["kv_blocks_held"] == 0 and stats["kv_pending_requests"] == 0


class MixedLoadCase:
    """Mixin: 200 mixed requests through a 2P+2D MoRIIO cluster in MODE over BACKENDS."""
    MODE = None
    BACKENDS = "tcp"

    def test_mixed_requests_move_verified_kv(self):
        cluster = PdCluster("moriio", transfer_mode=self.MODE, prefills=2, decodes=2,
                            kv_backends=self.BACKENDS)
        try:
            with concurrent.futures.ThreadPoolExecutor(CONCURRENCY) as pool:
                failures = [f for f in pool.map(lambda i: send(cluster, *request_for(i)),
                                                range(REQUESTS)) if f]
            self.assertEqual(failures, [], "%d of %d requests failed" % (len(failures), REQUESTS))
            nodes = cluster.prefills + cluster.decodes
            stats = wait_kv(self, nodes, no_blocks_held, "no KV blocks held on any sim")
            by_node = dict(zip((n.http_address for n in nodes), stats))
            transfers = 0
            for node in cluster.decodes:
                s = by_node[node.http_address]
                self.assertEqual((s["kv_mismatches"], s["kv_errors"]), (0, 0), s)
                self.assertGreater(s["kv_bytes_moved"], 0, s)
                self.assertEqual(s["mode"], self.MODE.lower(), s)
                transfers += s["kv_transfers"]
            self.assertEqual(transfers, REQUESTS)
            for node in cluster.prefills:
                s = by_node[node.http_address]
                self.assertEqual((s["kv_errors"], s["kv_blocks_reaped"], s["kv_bad_messages"]),
                                 (0, 0, 0), s)
                self.assertGreater(s["kv_bytes_moved"], 0, s)
            # The bytes went over the engine: what the decodes received, the prefills sent.
            moved = sum(by_node[n.http_address]["kv_bytes_moved"] for n in cluster.decodes)
            self.assertEqual(moved,
                             sum(by_node[n.http_address]["kv_bytes_moved"] for n in cluster.prefills))
        finally:
            cluster.close()


class TestMoriioReadLoad(MixedLoadCase, unittest.TestCase):
    MODE = "READ"


class TestMoriioWriteLoad(MixedLoadCase, unittest.TestCase):
    MODE = "WRITE"


class TestMoriioWriteLoadShm(MixedLoadCase, unittest.TestCase):
    """The same over shared memory (both sims on this host), TCP as the fallback."""
    MODE = "WRITE"
    BACKENDS = "shm,tcp"


class TestOtherDialects(unittest.TestCase):
    def test_one_request_per_dialect_moves_bytes(self):
        for connector, mode in (("nixl", "read"), ("mooncake", "write"), ("p2p-nccl", "write"),
                                ("sglang", "write")):
            with self.subTest(connector=connector):
                cluster = PdCluster(connector, prefills=1, decodes=1, ephemeral_ports=True)
                try:
                    self.assertIsNone(send(cluster, *request_for(5)))
                    self.assertIsNone(send(cluster, *request_for(6)))  # streamed
                    stats = wait_kv(self, cluster.prefills + cluster.decodes,
                                    lambda s: no_blocks_held(s) and s["kv_transfers"] == 2,
                                    connector + ": both transfers done, no blocks held")
                    for s in stats:
                        self.assertEqual(s["mode"], mode, s)
                        self.assertGreater(s["kv_bytes_moved"], 0, s)
                        self.assertEqual((s["kv_mismatches"], s["kv_errors"]), (0, 0), s)
                finally:
                    cluster.close()


class TestFailuresAreLoud(unittest.TestCase):
    def test_mispaired_blocks_are_a_mismatch(self):
        """The decode gets a real prefill's blocks for the same transfer id but another prompt:
        the bytes arrive and do not verify."""
        cluster = PdCluster("moriio", transfer_mode="READ", prefills=1, decodes=1, register=False)
        try:
            p, d = cluster.prefills[0], cluster.decodes[0]
            rid = ("___prefill_addr_host:127.0.0.1,handshake:%d,notify:%d___decode_addr_host:"
                   "127.0.0.1,handshake:1,notify:2_%s" % (p.kv_port, p.kv_port + 1, "ab" * 16))
            addresses = {"remote_host": "127.0.0.1", "remote_handshake_port": 1,
                         "remote_notify_port": 2}
            status, answer = p.post_json("/v1/completions", {
                "prompt": "one two three " * 20, "max_tokens": 1, "kv_transfer_params": dict(
                    addresses, do_remote_decode=True, do_remote_prefill=False,
                    transfer_id="tx-mismatch")}, {"X-Request-Id": rid})
            self.assertEqual(status, 200, answer)
            params = answer["kv_transfer_params"]
            decode_params = {"do_remote_decode": False, "do_remote_prefill": True,
                             "transfer_id": "tx-mismatch",
                             "remote_block_ids": params["remote_block_ids"],
                             "remote_engine_id": params["remote_engine_id"],
                             "remote_host": "127.0.0.1",
                             "remote_handshake_port": params["remote_handshake_port"],
                             "remote_notify_port": params["remote_notify_port"]}
            status, answer = d.post_json("/v1/completions", {
                "prompt": "one two FOUR " * 20, "max_tokens": 2,
                "kv_transfer_params": decode_params}, {"X-Request-Id": rid}, timeout=WAIT_S)
            self.assertEqual(status, 500, answer)
            self.assertIn("KV mismatch", answer["message"])
            self.assertIn("block 0", answer["message"])
            self.assertEqual(d.kv_stats()["kv_mismatches"], 1)
            self.assertEqual(d.sim_requests()["counters"]["errors_by_reason"].get("kv_mismatch"), 1)
            wait_kv(self, [p, d], no_blocks_held, "blocks freed after the mismatch")
        finally:
            cluster.close()

    def test_write_that_never_comes_times_out(self):
        cluster = PdCluster("moriio", transfer_mode="WRITE", prefills=1, decodes=1, register=False,
                            decode_flags=("--kv-timeout-ms", str(int(300 * TIME_SCALE)),
                                          "--kv-hold-ms", "200"))
        try:
            p, d = cluster.prefills[0], cluster.decodes[0]
            rid = ("___prefill_addr_host:127.0.0.1,handshake:%d,notify:%d___decode_addr_host:"
                   "127.0.0.1,handshake:1,notify:2_%s" % (p.kv_port, p.kv_port + 1, "cd" * 16))
            for stream in (False, True):
                body = {"prompt": "a b c " * 30, "max_tokens": 2, "stream": stream,
                        "kv_transfer_params": {
                            "do_remote_decode": False, "do_remote_prefill": True,
                            "transfer_id": "tx-never-%s" % stream, "remote_host": "127.0.0.1",
                            "remote_handshake_port": p.kv_port,
                            "remote_notify_port": p.kv_port + 1}}
                status, raw, _ = d.request("POST", "/v1/completions", body,
                                           {"X-Request-Id": rid}, timeout=WAIT_S)
                if stream:
                    self.assertEqual(status, 200)  # the head was sent; the error is an event
                    self.assertIn(b'"error"', raw)
                    self.assertIn(b"kv_timeout", raw + json.dumps(
                        d.sim_requests()["counters"]).encode())
                else:
                    self.assertEqual(status, 504, raw)
                    self.assertIn(b"no KV written by prefill", raw)
            self.assertEqual(d.sim_requests()["counters"]["errors_by_reason"]["kv_timeout"], 2)
            # The blocks a late WRITE could still land in are quarantined, then reaped.
            wait_kv(self, [d], lambda s: s["kv_blocks_held"] == 0, "decode blocks reaped")
            # The prefill holds the unmatched write requests until --kv-hold-ms (default 60 s).
            self.assertEqual(p.kv_stats()["kv_blocks_held"], 0)
        finally:
            cluster.close()


def frame(opcode, xfer_id=0, region_id=0, offset=0, length=0):
    """A 40-byte transfer frame header (proto/transfer_frame.h), version 1."""
    return struct.pack("<HBBIQIIQQ", 0x5850, 1, opcode, 0, xfer_id, region_id, 0, offset, length)


class TestTransferAuth(unittest.TestCase):
    def test_unauthenticated_peer_reads_nothing(self):
        """The reproduction against a prefill sim's tcp transfer port: HELLO 'attacker',
        then READ_REQ of region 0x10000. It used to answer READ_DATA with 4096 bytes of KV."""
        cluster = PdCluster("moriio", transfer_mode="READ", prefills=1, decodes=1, register=False)
        try:
            p = cluster.prefills[0]
            engine = p.kv_stats()["engine"]
            tcp = [b for b in engine["backends"] if b.startswith("tcp ")]
            self.assertEqual(len(tcp), 1, engine)
            host, port = tcp[0].split(" ", 1)[1].rsplit(":", 1)
            self.assertTrue(host.startswith("127."), host)
            with socket.create_connection((host, int(port)), timeout=10 * TIME_SCALE) as s:
                s.sendall(frame(6, length=8) + b"attacker" + frame(2, 42, 0x10000, 0, 4096))
                got, closed = b"", False
                while not closed:
                    try:
                        chunk = s.recv(65536)
                    except ConnectionResetError:
                        closed = True
                        break
                    except socket.timeout:
                        break
                    closed = not chunk
                    got += chunk
            # At most the server's CHALLENGE (header + 32-byte nonce) came back, then the close.
            self.assertTrue(closed, "connection still open; %d bytes came back" % len(got))
            if got:
                self.assertEqual(len(got), 72, got[:80])
                self.assertEqual(got[3], 8, "opcode of the only frame must be CHALLENGE")
            stats = wait_kv(self, [p], lambda st: st["engine"]["auth_failures"] >= 1,
                            "auth failure counted")[0]
            self.assertEqual(stats["engine"]["bytes_served"], 0, stats)
        finally:
            cluster.close()


if __name__ == "__main__":
    unittest.main()
