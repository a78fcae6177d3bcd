"""What pdrouter puts on each leg, per connector dialect, checked from the sims' request logs.

For MoRIIO WRITE, MoRIIO READ, NIXL, NIXL push, Mooncake, P2P-NCCL and SGLang, requests go through pdrouter to
registered `pdnode sim` nodes (pd_fixture.PdCluster); the prefill's and the decode's
GET /sim/requests entries are checked field by field against proto/REQUEST_LEGS.md and
docs/design/wire-formats.md: path, headers (X-Request-Id, Authorization, X-data-parallel-rank), the
prefill edits, kv_transfer_params (or SGLang's bootstrap fields), every other client field passed
through byte for byte, serial vs concurrent dispatch. The client's answer is checked for its
OpenAI shape and its X-Request-Id header.

Also: GET /v1/models through pdrouter, GET /ready with missing or incompatible peers, and the
/start_profile and /stop_profile fan-out.

One cluster per test class (setUpClass); the sims' logs are reset before each test.
"""
import json
import re
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

GEN_PATHS = ("/v1/completions", "/v1/chat/completions")
UUID4 = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
CLIENT_AUTH = "Bearer client-key-7f3a"
WAIT_S = 15.0 * TIME_SCALE
PREFILL_DELAY_MS = int(600 * TIME_SCALE)  # a prefill slower than its concurrent decode
# The prefill edits of REQUEST_LEGS.md ("P7"), for the dialects that apply them.
P7_KEYS = {"stream", "max_tokens", "max_completion_tokens", "stream_options", "min_tokens",
           "min_completion_tokens", "kv_transfer_params"}


def flag(node, name):
    """The value a SimNode was started with for `name` (e.g. "--handshake-port")."""
    args = node.proc.args
    return args[args.index(name) + 1]


def gen_entries(log):
    return [r for r in log["requests"] if r["method"] == "POST" and r["path"] in GEN_PATHS]


def wait_gen(node, count, timeout=WAIT_S):
    """The node's generation requests once `count` of them arrived and were answered (or aborted:
    pdrouter closes a concurrent prefill leg still open when the decode's answer is complete)."""
    log = node.wait_for_requests(
        lambda log: len(gen_entries(log)) >= count
        and all(r["status"] != 0 or r["aborted"] for r in gen_entries(log)), timeout)
    return gen_entries(log)


def member_text(key, value):
    """`"key": value` exactly as json.dumps() wrote it into the client body."""
    return json.dumps({key: value})[1:-1]


def client_body(path, stream, **override):
    body = {"model": "sim-model"}
    if path == "/v1/completions":
        body.update(prompt="The quick brown fox jumps over the lazy dog", max_tokens=5)
    else:
        body.update(messages=[{"role": "user", "content": "Tell me about \u00e9 foxes"}],
                    max_completion_tokens=5)
    body.update(temperature=0.5, foo={"bar": [1, 2]}, min_tokens=1)
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    body.update(override)
    return {k: v for k, v in body.items() if v is not None}


def decremented(body):
    """The MoRIIO decode's max_* rule (REQUEST_LEGS.md, MoRIIO "D body")."""
    out = dict(body)
    for key in ("max_completion_tokens", "max_tokens"):
        if isinstance(out.get(key), int) and not isinstance(out.get(key), bool):
            if out[key] > 1:
                out[key] -= 1
            break
    return out


class DialectCase:
    """Mixin: one cluster of CONNECTOR/MODE, with the checks every dialect shares."""
    CONNECTOR = None
    MODE = None
    PREFILL_DP = 1
    CONCURRENT = False
    ADDRESS_ID = False  # X-Request-Id names the peers' zmq addresses (MoRIIO, P2P-NCCL)
    P7 = True           # prefill gets the REQUEST_LEGS.md prefill edits

    @classmethod
    def setUpClass(cls):
        flags = ("--dp-size", str(cls.PREFILL_DP)) if cls.PREFILL_DP > 1 else ()
        cls.cluster = PdCluster(cls.CONNECTOR, transfer_mode=cls.MODE, prefill_flags=flags)
        cls.p, cls.d = cls.cluster.prefills[0], cls.cluster.decodes[0]

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def setUp(self):
        for node in (self.p, self.d):
            node.reset()

    # --- one request, end to end ------------------------------------------------------------------
    def send(self, path, body):
        """Sends `body`; returns (raw client body, client answer info) after checking the answer."""
        raw = json.dumps(body)
        # A client X-Request-Id is not used: pdrouter mints each dialect's own (checked below).
        headers = {"Authorization": CLIENT_AUTH, "X-Request-Id": "client-chosen-id"}
        if body.get("stream"):
            with self.cluster.stream(path, raw, headers=headers, timeout=WAIT_S) as s:
                status, head = s.status, {k.lower(): v for k, v in s.headers}
                events = list(s) if status == 200 else [s.body()]
            self.assertEqual(status, 200, events)
            self.assertTrue(head["content-type"].startswith("text/event-stream"), head)
            self.assertEqual(events[-1], "[DONE]")
            chunks = [json.loads(e) for e in events[:-1]]
            self.assertTrue(chunks)
            want = "text_completion" if path == "/v1/completions" else "chat.completion.chunk"
            for chunk in chunks:
                self.assertEqual(chunk["object"], want, chunk)
                self.assertIn("choices", chunk)
                self.assertNotIn("kv_transfer_params", chunk)
            self.assertTrue(any(c["choices"] and c["choices"][0].get("finish_reason") in
                                ("length", "stop") for c in chunks), chunks)
            self.assertTrue(any(c.get("usage") for c in chunks), chunks)
        else:
            status, head, answer = self.cluster.post(path, raw, headers=headers, timeout=WAIT_S)
            self.assertEqual(status, 200, answer)
            self.assertTrue(head["content-type"].startswith("application/json"), head)
            doc = json.loads(answer)
            want = "text_completion" if path == "/v1/completions" else "chat.completion"
            self.assertEqual(doc["object"], want, doc)
            self.assertEqual(len(doc["choices"]), 1, doc)
            choice = doc["choices"][0]
            self.assertIn(choice["finish_reason"], ("length", "stop"), doc)
            if path == "/v1/completions":
                self.assertIsInstance(choice["text"], str)
            else:
                self.assertEqual(choice["message"]["role"], "assistant")
                self.assertIsInstance(choice["message"]["content"], str)
            usage = doc["usage"]
            self.assertEqual(usage["total_tokens"],
                             usage["prompt_tokens"] + usage["completion_tokens"], usage)
        return raw, head["x-request-id"]

    def roundtrip(self, path, stream, **override):
        body = client_body(path, stream, **override)
        raw, answer_id = self.send(path, body)
        [p] = wait_gen(self.p, 1)
        [d] = wait_gen(self.d, 1)
        self.check_legs(path, body, raw, answer_id, p, d)
        return p, d

    # --- checks ----------------------------------------------------------------------------------
    def check_legs(self, path, body, raw, answer_id, p, d):
        self.assertEqual(d["status"], 200, d)
        if not (self.CONCURRENT and p["aborted"]):
            self.assertEqual(p["status"], 200, p)
        for leg in (p, d):
            self.assertEqual(leg["path"], path)
            self.assertEqual(leg["headers"]["authorization"], CLIENT_AUTH)
            self.assertEqual(leg["headers"]["content-type"], "application/json")
            self.assertEqual(leg["headers"]["x-request-id"], answer_id)
            # Every field the dialect does not edit arrives byte for byte.
            for key in ("model", "prompt", "messages", "temperature", "foo"):
                if key in body:
                    self.assertIn(member_text(key, body[key]), leg["body"], key)
        rid = answer_id
        if self.ADDRESS_ID:
            pattern = ("^___prefill_addr_%s___decode_addr_%s_[0-9a-f]{32}$"
                       % (re.escape(self.zmq(self.p)), re.escape(self.zmq(self.d))))
            self.assertRegex(rid, pattern)
        else:
            self.assertRegex(rid, "^%s$" % UUID4)
        self.assertNotIn("x-data-parallel-rank", d["headers"])  # decode dp_size is 1
        if self.PREFILL_DP > 1:
            self.assertIn(p["headers"]["x-data-parallel-rank"],
                          [str(r) for r in range(self.PREFILL_DP)])
        else:
            self.assertNotIn("x-data-parallel-rank", p["headers"])
        pb, db = json.loads(p["body"]), json.loads(d["body"])
        if "kv_transfer_params" in body:
            # The client's own kv_transfer_params are replaced on both legs (checked exactly by
            # check_dialect); compare the rest as if the client had sent none.
            body = {k: v for k, v in body.items() if k != "kv_transfer_params"}
            raw = json.dumps(body)
        if self.P7:
            self.assertIs(pb["stream"], False)
            self.assertEqual(pb["max_tokens"], 1)
            if "max_completion_tokens" in body:
                self.assertEqual(pb["max_completion_tokens"], 1)
            else:
                self.assertNotIn("max_completion_tokens", pb)
            for key in ("stream_options", "min_tokens", "min_completion_tokens"):
                self.assertNotIn(key, pb)
            self.assertEqual({k: v for k, v in pb.items() if k not in P7_KEYS},
                             {k: v for k, v in body.items() if k not in P7_KEYS})
        self.check_dialect(body, raw, rid, p, d, pb, db)

    def check_dialect(self, body, raw, rid, p, d, pb, db):
        raise NotImplementedError

    def zmq(self, node):
        raise NotImplementedError

    def without_kv(self, doc):
        return {k: v for k, v in doc.items() if k != "kv_transfer_params"}

    # --- tests every dialect runs ----------------------------------------------------------------
    def test_completions(self):
        self.roundtrip("/v1/completions", stream=False)

    def test_completions_stream(self):
        self.roundtrip("/v1/completions", stream=True)

    def test_chat(self):
        self.roundtrip("/v1/chat/completions", stream=False)

    def test_chat_stream(self):
        self.roundtrip("/v1/chat/completions", stream=True)

    def test_chat_with_both_max_keys(self):
        self.roundtrip("/v1/chat/completions", stream=False, max_tokens=6, min_completion_tokens=1)

    def test_client_kv_transfer_params_replaced(self):
        client_params = {"do_remote_prefill": True, "evil": [1]}
        if not self.P7:
            # P2P-NCCL and SGLang set no kv_transfer_params. P2P-NCCL's legs drop the client's
            # (it must not reach the nodes: a client could steer their KV transfer); SGLang's carry it as sent.
            body = client_body("/v1/completions", False, kv_transfer_params=client_params)
            self.send("/v1/completions", body)
            for leg in (wait_gen(self.p, 1)[0], wait_gen(self.d, 1)[0]):
                if self.CONNECTOR == "p2p-nccl":
                    self.assertNotIn("kv_transfer_params", json.loads(leg["body"]))
                else:
                    self.assertEqual(json.loads(leg["body"])["kv_transfer_params"], client_params)
            return
        p, d = self.roundtrip("/v1/completions", stream=False, kv_transfer_params=client_params)
        for leg in (p, d):
            self.assertNotIn("evil", leg["body"])
            self.assertEqual(leg["body"].count('"kv_transfer_params"'), 1)

    def test_serial_or_concurrent(self):
        # The prefill answers PREFILL_DELAY_MS late. Serial dialects
        # send the decode only after the prefill's answer; concurrent ones send it at once (well
        # before the prefill could have answered).
        delay_ms = PREFILL_DELAY_MS
        self.p.set_fault(delay_ms=delay_ms)
        self.roundtrip("/v1/completions", stream=False)
        [p], [d] = wait_gen(self.p, 1), wait_gen(self.d, 1)
        gap = d["arrival_unix_ms"] - p["arrival_unix_ms"]
        self.assertEqual(p["fault"]["delay_ms"], delay_ms)
        if self.CONCURRENT:
            self.assertLess(gap, delay_ms, "decode waited for the prefill")
        else:
            self.assertGreaterEqual(gap, delay_ms - 5, "decode sent before the prefill answered")

    def check_prefill_answer_read(self):
        """docs/design/wire-formats.md rule 8: in concurrent dialects the prefill's answer is still read
        (and its errors surfaced), not cut off when the decode finishes first: a prefill slower
        than its decode must still complete, unaborted."""
        self.p.set_fault(delay_ms=PREFILL_DELAY_MS)
        self.roundtrip("/v1/completions", stream=False)
        [p] = wait_gen(self.p, 1)
        self.assertFalse(p["aborted"], "pdrouter aborted the concurrent prefill leg")
        self.assertEqual(p["status"], 200)


class MoriioCase(DialectCase):
    CONNECTOR = "moriio"
    ADDRESS_ID = True

    def zmq(self, node):
        return "host:127.0.0.1,handshake:%s,notify:%s" % (flag(node, "--handshake-port"),
                                                          flag(node, "--notify-port"))

    def check_dialect(self, body, raw, rid, p, d, pb, db):
        pk, dk = pb["kv_transfer_params"], db["kv_transfer_params"]
        transfer_id = pk["transfer_id"]
        self.assertRegex(transfer_id, "^tx-%s$" % UUID4)
        self.assertEqual(pk, {
            "remote_dp_size": 1, "remote_tp_size": 1, "transfer_id": transfer_id,
            "do_remote_decode": True, "do_remote_prefill": False,
            "remote_engine_id": None, "remote_block_ids": None,
            "remote_host": "127.0.0.1",
            "remote_handshake_port": int(flag(self.d, "--handshake-port")),
            "remote_notify_port": int(flag(self.d, "--notify-port"))})
        want = {"do_remote_decode": False, "do_remote_prefill": True,
                "remote_engine_id": None, "remote_block_ids": None, "transfer_id": transfer_id,
                "remote_dp_size": self.PREFILL_DP, "remote_tp_size": 1,
                "remote_host": "127.0.0.1",
                "remote_handshake_port": int(flag(self.p, "--handshake-port")),
                "remote_notify_port": int(flag(self.p, "--notify-port"))}
        if self.PREFILL_DP > 1:
            want["remote_dp_rank"] = int(p["headers"]["x-data-parallel-rank"])
        if self.MODE == "READ":
            # Copied from the prefill's answer (node/sim/kv.cc prefill_response_params).
            want["remote_engine_id"] = "127.0.0.1:%s" % flag(self.p, "--handshake-port")
            want["tp_size"] = 1
            blocks = dk.get("remote_block_ids")
            self.assertIsInstance(blocks, list)
            self.assertTrue(blocks and all(isinstance(b, int) for b in blocks), blocks)
            want["remote_block_ids"] = blocks
        self.assertEqual(dk, want)
        self.assertEqual(self.without_kv(db), decremented(body))

    def test_max_tokens_one_not_decremented(self):
        _, d = self.roundtrip("/v1/completions", stream=False, max_tokens=1)
        self.assertEqual(json.loads(d["body"])["max_tokens"], 1)


class TestMoriioWrite(MoriioCase, unittest.TestCase):
    MODE = "WRITE"
    CONCURRENT = True

    def test_concurrent_prefill_answer_is_read(self):
        self.check_prefill_answer_read()


class TestMoriioRead(MoriioCase, unittest.TestCase):
    MODE = "READ"
    PREFILL_DP = 2

    def test_dp_rank_alternates(self):
        ranks = []
        for _ in range(4):
            self.setUp()
            p, d = self.roundtrip("/v1/completions", stream=False)
            rank = int(p["headers"]["x-data-parallel-rank"])
            self.assertEqual(json.loads(d["body"])["kv_transfer_params"]["remote_dp_rank"], rank)
            ranks.append(rank)
        self.assertEqual(ranks, [ranks[0], 1 - ranks[0], ranks[0], 1 - ranks[0]])


class TestNixl(DialectCase, unittest.TestCase):
    CONNECTOR = "nixl"

    def check_dialect(self, body, raw, rid, p, d, pb, db):
        self.assertEqual(pb["kv_transfer_params"], {
            "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
            "remote_block_ids": None, "remote_host": None, "remote_port": None})
        # The decode body is the client's, byte for byte, plus the prefill's kv_transfer_params
        # (node/sim/kv.cc prefill_response_params; the internal id and block ids are random).
        self.assertTrue(d["body"].startswith(raw[:-1]), (raw, d["body"]))
        self.assertEqual(self.without_kv(db), body)
        dk = db["kv_transfer_params"]
        prefix = "cmpl" if p["path"] == "/v1/completions" else "chatcmpl"
        self.assertRegex(dk.get("remote_request_id", ""),
                         r"^%s-%s(-0)?-[0-9a-f]{8}$" % (prefix, re.escape(rid)))
        blocks = dk.get("remote_block_ids")
        self.assertTrue(isinstance(blocks, list) and blocks
                        and all(isinstance(b, int) for b in blocks), blocks)
        self.assertEqual(dk, {
            "do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": blocks,
            "remote_engine_id": "sim-127.0.0.1-%d" % self.p.port,
            "remote_request_id": dk["remote_request_id"], "remote_host": "127.0.0.1",
            "remote_port": int(flag(self.p, "--kv-port")), "tp_size": 1})


def push_demo_legs(request, request_id, transfer_id, prefill):
    """vLLM's examples/disaggregated/disaggregated_serving/disagg_proxy_pushconnector_demo.py,
    restated: the headers and bodies its two concurrent legs carry for one client request, given
    the ids it minted and the prefill's coordinates (the demo takes them from its command line)."""
    headers = {"x-request-id": request_id}
    p = dict(request)
    p["max_tokens"] = 1
    if "max_completion_tokens" in p:
        p["max_completion_tokens"] = 1
    p["kv_transfer_params"] = {
        "do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
        "remote_block_ids": None, "remote_host": None, "remote_port": None,
        "transfer_id": transfer_id}
    d = dict(request)
    d["kv_transfer_params"] = {
        "do_remote_decode": False, "do_remote_prefill": True,
        "remote_engine_id": prefill["engine_id"], "remote_host": prefill["kv_host"],
        "remote_port": prefill["side_channel_port"], "tp_size": prefill["tp_size"],
        "pp_size": prefill["pp_size"], "remote_request_id": request_id,
        "transfer_id": transfer_id}
    return (headers, p), (headers, d)


class TestNixlPush(DialectCase, unittest.TestCase):
    """Differential: each leg pdrouter sends equals what the push demo proxy would send for the
    same client request and ids, but for one documented difference: pdrouter's prefill also gets
    the rest of the prefill edits (stream false, no stream_options / min_tokens), which the demo
    leaves as the client sent them (REQUEST_LEGS.md)."""
    CONNECTOR = "nixl-push"
    CONCURRENT = True

    def check_dialect(self, body, raw, rid, p, d, pb, db):
        transfer_id = pb["kv_transfer_params"]["transfer_id"]
        self.assertRegex(transfer_id, "^xfer-%s$" % UUID4)
        prefill = {"engine_id": "sim-127.0.0.1-%d" % self.p.port, "kv_host": "127.0.0.1",
                   "side_channel_port": int(flag(self.p, "--kv-port")), "tp_size": 1, "pp_size": 1}
        (ph, want_p), (dh, want_d) = push_demo_legs(body, rid, transfer_id, prefill)
        for leg, want in ((p, ph), (d, dh)):
            self.assertEqual({k: leg["headers"][k] for k in want}, want)
        want_p["stream"] = False
        for key in ("stream_options", "min_tokens", "min_completion_tokens"):
            want_p.pop(key, None)
        self.assertEqual(pb, want_p)
        self.assertEqual(db, want_d)
        self.assertTrue(d["body"].startswith(raw[:-1]), (raw, d["body"]))

    def test_concurrent_prefill_answer_is_read(self):
        self.check_prefill_answer_read()

    def test_every_request_has_its_own_transfer_id(self):
        ids = set()
        for _ in range(3):
            self.setUp()
            p, d = self.roundtrip("/v1/completions", stream=False)
            ids.add(json.loads(p["body"])["kv_transfer_params"]["transfer_id"])
        self.assertEqual(len(ids), 3, ids)


class TestMooncake(DialectCase, unittest.TestCase):
    CONNECTOR = "mooncake"
    PREFILL_DP = 2
    CONCURRENT = True

    def test_concurrent_prefill_answer_is_read(self):
        self.check_prefill_answer_read()

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        status, raw, _ = cls.p.request("GET", "/query", port=cls.p.bootstrap_port)
        assert status == 200, (status, raw)
        cls.engines = {int(k): v["engine_id"] for k, v in json.loads(raw).items()}
        assert sorted(cls.engines) == [0, 1], cls.engines

    def check_dialect(self, body, raw, rid, p, d, pb, db):
        transfer_id = "xfer-" + rid
        self.assertEqual(pb["kv_transfer_params"], {
            "do_remote_decode": True, "do_remote_prefill": False, "transfer_id": transfer_id})
        rank = int(p["headers"]["x-data-parallel-rank"])
        self.assertEqual(db["kv_transfer_params"], {
            "do_remote_decode": False, "do_remote_prefill": True,
            "remote_bootstrap_addr": "http://127.0.0.1:%d" % self.p.bootstrap_port,
            "remote_engine_id": self.engines[rank], "transfer_id": transfer_id})
        self.assertEqual(self.without_kv(db), body)
        self.assertTrue(d["body"].startswith(raw[:-1]), (raw, d["body"]))

    def test_dp_rank_alternates(self):
        ranks, engines = [], []
        for _ in range(4):
            self.setUp()
            p, d = self.roundtrip("/v1/completions", stream=False)
            ranks.append(int(p["headers"]["x-data-parallel-rank"]))
            engines.append(json.loads(d["body"])["kv_transfer_params"]["remote_engine_id"])
        self.assertEqual(ranks, [ranks[0], 1 - ranks[0], ranks[0], 1 - ranks[0]])
        self.assertEqual(engines, [self.engines[r] for r in ranks])
        self.assertNotEqual(self.engines[0], self.engines[1])


class TestMooncakeRanksFromQuery(unittest.TestCase):
    """A Mooncake prefill with two DP ranks that the topology lists without dp_size: the rank
    count comes from its bootstrap /query (as in the reference proxy), so each prefill leg is
    still pinned, ranks take turns, and the decode gets the engine id of the pinned rank."""

    def test_prefill_ranks_come_from_its_bootstrap_query(self):
        c = PdCluster("mooncake", prefill_flags=("--dp-size", "2"), register=False,
                      topology="connectors:\n  default: mooncake\n")
        self.addCleanup(c.close)
        p, d = c.prefills[0], c.decodes[0]
        c.router.write_topology(
            "connectors:\n  default: mooncake\ninstances:\n"
            "  - {role: prefill, http_address: \"%s\", bootstrap_port: %d}\n"
            "  - {role: decode, http_address: \"%s\"}\n"
            % (p.http_address, p.bootstrap_port, d.http_address))
        c.wait_registered([p, d])
        self.assertEqual(c.router.instance(p.http_address)["dp_size"], 1)
        status, raw, _ = p.request("GET", "/query", port=p.bootstrap_port)
        self.assertEqual(status, 200, raw)
        engines = {int(k): v["engine_id"] for k, v in json.loads(raw).items()}
        self.assertEqual(sorted(engines), [0, 1])
        for i in range(4):
            status, _, body = c.post("/v1/completions", {"model": "sim-model", "max_tokens": 2,
                                                         "prompt": "request %d" % i})
            self.assertEqual(status, 200, body)
        prefill_legs = wait_gen(p, 4)
        decode_by_id = {r["headers"]["x-request-id"]: r for r in wait_gen(d, 4)}
        ranks = [int(r["headers"]["x-data-parallel-rank"]) for r in prefill_legs]
        self.assertEqual(sorted(ranks), [0, 0, 1, 1], ranks)
        for r, rank in zip(prefill_legs, ranks):
            decode = decode_by_id[r["headers"]["x-request-id"]]
            params = json.loads(decode["body"])["kv_transfer_params"]
            self.assertEqual(params["remote_engine_id"], engines[rank])


class TestP2pNccl(DialectCase, unittest.TestCase):
    CONNECTOR = "p2p-nccl"
    ADDRESS_ID = True
    P7 = False

    def zmq(self, node):
        return "127.0.0.1:%s" % flag(node, "--kv-port")

    def check_dialect(self, body, raw, rid, p, d, pb, db):
        # Prefill: only max_tokens (and max_completion_tokens if present) become 1 and
        # min_tokens/min_completion_tokens go (vLLM refuses min over max); stream and everything
        # else as the client sent it; no kv params. Decode: the client body verbatim.
        want = {k: v for k, v in body.items() if k not in ("min_tokens", "min_completion_tokens")}
        want["max_tokens"] = 1
        if "max_completion_tokens" in body:
            want["max_completion_tokens"] = 1
        self.assertEqual(pb, want)
        self.assertEqual(d["body"], raw)


class TestSglang(DialectCase, unittest.TestCase):
    CONNECTOR = "sglang"
    CONCURRENT = True
    P7 = False

    def test_concurrent_prefill_answer_is_read(self):
        self.check_prefill_answer_read()

    def check_dialect(self, body, raw, rid, p, d, pb, db):
        self.assertEqual(p["body"], d["body"])
        self.assertTrue(p["body"].startswith(raw[:-1]), (raw, p["body"]))
        extra = {k: v for k, v in pb.items() if k not in body}
        self.assertEqual(set(extra), {"bootstrap_host", "bootstrap_port", "bootstrap_room"})
        self.assertEqual({k: v for k, v in pb.items() if k in body}, body)
        self.assertEqual(extra["bootstrap_host"], "127.0.0.1")
        port = extra["bootstrap_port"]
        self.assertTrue(port is None or (isinstance(port, int) and 0 < port < 65536), port)
        room = extra["bootstrap_room"]
        self.assertTrue(isinstance(room, int) and 0 <= room <= 2 ** 63 - 1, room)

    def test_rooms_differ(self):
        rooms = set()
        for _ in range(3):
            self.setUp()
            p, _ = self.roundtrip("/v1/completions", stream=False)
            rooms.add(json.loads(p["body"])["bootstrap_room"])
        self.assertEqual(len(rooms), 3)


class TestRouterEndpoints(unittest.TestCase):
    """/v1/models, /ready and the profile fan-out; nodes are added one by one."""

    ADMIN_KEY = "profile-admin-key"

    def setUp(self):
        # Profiling needs the admin key.
        self.cluster = PdCluster("moriio", transfer_mode="READ", prefills=0, decodes=0,
                                 register=False,
                                 topology="admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\n",
                                 router_env={"PDR_TEST_ADMIN_KEY": self.ADMIN_KEY})
        self.addCleanup(self.cluster.close)

    def add_node(self, role, mode):
        self.cluster.transfer_mode = mode
        node = self.cluster.start_node(role, register=True)
        (self.cluster.prefills if role == "prefill" else self.cluster.decodes).append(node)
        self.cluster.router.wait_for(
            lambda: (self.cluster.router.instance(node.http_address) or {}).get("state") == "up",
            timeout=10)
        return node

    def error_of(self, status, raw, want_status):
        self.assertEqual(status, want_status, raw)
        error = json.loads(raw)["error"]
        self.assertTrue(error["message"] and error["type"] and error["code"], error)
        return error

    def test_ready_and_models(self):
        status, _, raw = self.cluster.get("/ready")
        self.assertIn("no prefill", self.error_of(status, raw, 503)["message"])

        p = self.add_node("prefill", "READ")
        status, _, raw = self.cluster.get("/ready")
        self.assertIn("no decode instance is up", self.error_of(status, raw, 503)["message"])
        status, _, raw = self.cluster.get("/v1/models")
        self.assertEqual(status, 503, raw)

        wrong = self.add_node("decode", "WRITE")
        status, _, raw = self.cluster.get("/ready")
        self.assertIn("compatible", self.error_of(status, raw, 503)["message"])
        status, _, raw = self.cluster.post("/v1/completions", client_body("/v1/completions", False))
        error = self.error_of(status, raw, 503)
        self.assertEqual(error["code"], "no_pair")
        self.assertIn("READ", error["message"])
        self.assertIn("WRITE", error["message"])
        self.assertEqual(
            self.cluster.metric('pdrouter_requests_refused_total{reason="no_pair"}'), 1)
        for node in (p, wrong):
            self.assertEqual(gen_entries(node.sim_requests()), [])

        good = self.add_node("decode", "READ")
        status, _, raw = self.cluster.get("/ready")
        self.assertEqual(status, 200, raw)
        self.assertEqual(json.loads(raw)["status"], "ready")
        status, _, raw = self.cluster.post("/v1/completions", client_body("/v1/completions", False))
        self.assertEqual(status, 200, raw)
        self.assertEqual(len(wait_gen(good, 1)), 1)
        self.assertEqual(gen_entries(wrong.sim_requests()), [])

        # /v1/models: the (only compatible or not) decodes' own list; both sims answer alike.
        _, own, own_type = good.request("GET", "/v1/models")
        status, head, raw = self.cluster.get("/v1/models")
        self.assertEqual(status, 200, raw)
        self.assertTrue(head["content-type"].startswith("application/json"), head)
        self.assertEqual(json.loads(raw)["data"][0]["id"], "sim-model")
        decoded = json.loads(raw)
        self.assertIn(decoded, [json.loads(own), json.loads(wrong.request("GET", "/v1/models")[1])])
        self.assertEqual(json.loads(own)["data"][0]["id"], decoded["data"][0]["id"])

    def test_models_equals_decode(self):
        self.add_node("prefill", "READ")
        d = self.add_node("decode", "READ")
        _, own, _ = d.request("GET", "/v1/models")
        status, _, raw = self.cluster.get("/v1/models")
        self.assertEqual(status, 200, raw)
        self.assertEqual(json.loads(raw), json.loads(own))
        self.assertEqual(raw, own)

    def test_profile_fan_out(self):
        nodes = [self.add_node("prefill", "READ"), self.add_node("decode", "READ")]
        for path in ("/start_profile", "/stop_profile"):
            for node in nodes:
                node.reset()
            status, _, raw = self.cluster.post(
                path, {"x": 1}, headers={"Authorization": f"Bearer {self.ADMIN_KEY}"})
            seen = []
            for node in nodes:
                log = node.wait_for_requests(
                    lambda log: any(r["path"] == path and r["status"] for r in log["requests"]),
                    WAIT_S)
                [entry] = [r for r in log["requests"] if r["path"] == path]
                self.assertEqual(entry["method"], "POST")
                # No upstream key configured: nothing; the admin key never reaches a node.
                self.assertIsNone(entry["headers"].get("authorization"))
                seen.append(entry["status"])
            doc = json.loads(raw)
            if all(s == 200 for s in seen):
                self.assertEqual(status, 200, raw)
            else:
                self.assertEqual(status, 502, raw)
            results = {r["instance"]: r for r in doc["results"]}
            self.assertEqual(set(results), {n.http_address for n in nodes})
            for node, sim_status in zip(nodes, seen):
                self.assertEqual(results[node.http_address]["status"], sim_status)
            self.assertEqual(results[nodes[0].http_address]["role"], "prefill")
            self.assertEqual(results[nodes[1].http_address]["role"], "decode")


if __name__ == "__main__":
    unittest.main()
