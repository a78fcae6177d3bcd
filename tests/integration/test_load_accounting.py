"""The router-side load ledger (discovery/load_ledger.h) stays true: what /status shows per node
and per DP rank under `router_load` (requests in flight, queued uncached prefill tokens, decode
sequences, KV tokens held) returns to exactly zero on every node after each way a request can end
(a normal burst, clients leaving mid-stream, retries after a prefill that refuses connections,
a decode killed mid-stream, a node drained by the operator while requests run, a node restarted
with a new epoch while requests run), and shows a running request on the node and DP rank that
serve it. Real pdrouter, real `pdnode sim` nodes, loopback only; every wait is on /status."""
import json
import socket
import threading
import unittest

from pd_fixture import CHAT, COMPLETIONS, PdCluster, chat, completion
from pdrouter_fixture import TIME_SCALE

FIGURES = ("requests", "prefill_tokens_queued", "decode_sequences", "kv_tokens")
ADMIN_KEY = "load-ledger-admin-key"
LOAD_GAUGES = {"pdrouter_node%s_%s" % (scope, figure) for scope in ("", "_rank")
               for figure in ("requests_in_flight", "prefill_tokens_queued", "decode_sequences", "kv_tokens")}


def figures(load):
    return {k: load[k] for k in FIGURES}


def rank_sum(load):
    total = {k: load["ranks_beyond"][k] for k in FIGURES}
    for rank in load["ranks"]:
        for k in FIGURES:
            total[k] += rank[k]
    return total


def nonzero(load):
    """The non-zero figures of a node's router_load (totals, ranks, beyond), for messages."""
    out = {k: v for k, v in figures(load).items() if v}
    for i, rank in enumerate(load["ranks"]):
        out.update({"rank%d.%s" % (i, k): v for k, v in figures(rank).items() if v})
    out.update({"beyond.%s" % k: v for k, v in figures(load["ranks_beyond"]).items() if v})
    return out


class LoadAccountingTest(unittest.TestCase):
    def cluster(self, **kwargs):
        c = PdCluster(kwargs.pop("connector", "moriio"), transfer_mode=kwargs.pop("transfer_mode", "WRITE"),
                      **kwargs)
        self.addCleanup(c.close)
        return c

    def wait_all_idle(self, c, timeout=15):
        """Waits until every instance (also expired and ejected ones) shows zero load, per node
        and per rank: first in /metrics, rendered fresh on each scrape (so an idle reading cannot
        be one from before the requests), then in /status (reused for up to 1 s); fails with
        what was left."""
        last = {}

        def metrics_idle():
            last.clear()
            for name, value in c.router.metrics().items():
                if name.split("{")[0] in LOAD_GAUGES and value != 0:
                    last[name] = value
            return not last

        def status_idle():
            last.clear()
            for inst in c.router.status()["instances"]:
                left = nonzero(inst["router_load"])
                if left:
                    last[inst["http_address"]] = left
            return not last

        for idle in (metrics_idle, status_idle):
            try:
                c.router.wait_for(idle, timeout)
            except AssertionError:
                raise AssertionError("load left on nodes: %s" % last)

    def load_of(self, c, node):
        inst = c.router.instance(node.http_address)
        self.assertIsNotNone(inst)
        load = inst["router_load"]
        self.assertEqual(rank_sum(load), figures(load), load)  # the ranks sum to the totals
        return load

    def busiest_decode(self, c, sequences):
        """The decode running the most of `sequences` decode legs, once /metrics (rendered per
        scrape, unlike /status) shows them all running."""
        def counts():
            metrics = c.router.metrics()
            per_node = {d: metrics['pdrouter_node_decode_sequences{node="%s"}' % d.http_address] for d in c.decodes}
            return per_node if sum(per_node.values()) == sequences else None
        per_node = c.router.wait_for(counts, 10)[0]
        return max(per_node, key=per_node.get)

    def wait_load(self, c, node, predicate, timeout=10):
        return c.router.wait_for(lambda: (lambda load: load if predicate(load) else None)(
            self.load_of(c, node)), timeout)[0]

    def open_request(self, c, body, path=COMPLETIONS):
        host, port = c.router.http.rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=5 * TIME_SCALE)
        data = json.dumps(body).encode()
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (path.encode(), len(data), data))
        return sock

    def burst(self, c, bodies, timeout=30):
        """Sends every body at once (a thread each); returns the statuses."""
        statuses = [None] * len(bodies)

        def send(i, path, body):
            try:
                if body.get("stream"):
                    with c.stream(path, body, timeout=timeout) as events:
                        list(events)
                        statuses[i] = events.status
                else:
                    statuses[i] = c.post(path, body, timeout=timeout)[0]
            except OSError as e:
                statuses[i] = repr(e)

        threads = [threading.Thread(target=send, args=(i, path, body)) for i, (path, body) in enumerate(bodies)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout * TIME_SCALE)
        return statuses

    # --- while a request runs ---------------------------------------------------------------
    def test_a_running_request_shows_on_its_nodes_and_ranks(self):
        # A prefill that never answers holds its queued tokens; a slow decode (sent at once:
        # MoRIIO WRITE legs overlap) holds its sequence and the prompt's KV tokens.
        c = self.cluster(prefill_flags=("--dp-size", "2"),
                         decode_flags=("--dp-size", "2", "--decode-us-per-token", "300000"))
        self.wait_all_idle(c)
        prefill, decode = c.prefills[0], c.decodes[0]
        prefill.set_fault(hang=True)
        prompt = "word " * 400  # 2,000 bytes of text: ~500 tokens estimated (bytes / 4)
        sock = self.open_request(c, completion(max_tokens=50, prompt=prompt))
        load = self.wait_load(c, prefill, lambda l: l["requests"] == 1 and l["prefill_tokens_queued"] > 0)
        self.assertGreaterEqual(load["prefill_tokens_queued"], 400)
        self.assertLessEqual(load["prefill_tokens_queued"], 600)
        self.assertEqual((load["decode_sequences"], load["kv_tokens"]), (0, 0))
        self.assertEqual(len(load["ranks"]), 2)
        # On the rank the prefill leg was sent to, and only there.
        log = prefill.wait_for_requests(lambda log: [r for r in log["requests"] if r["path"] == COMPLETIONS],
                                        5 * TIME_SCALE)
        leg = [r for r in log["requests"] if r["path"] == COMPLETIONS][0]
        rank = int(leg["headers"].get("x-data-parallel-rank", "0"))
        self.assertEqual(figures(load["ranks"][rank]), figures(load))
        self.assertEqual(figures(load["ranks"][1 - rank]), dict.fromkeys(FIGURES, 0))
        load = self.wait_load(c, decode, lambda l: l["decode_sequences"] == 1)
        self.assertEqual(load["requests"], 1)
        self.assertEqual(load["prefill_tokens_queued"], 0)
        self.assertGreaterEqual(load["kv_tokens"], 400)  # the whole prompt's KV
        sock.close()  # the client leaves while its prefill hangs and its decode runs
        self.wait_all_idle(c)

    def test_streamed_tokens_grow_the_decodes_kv_tokens(self):
        c = self.cluster(decode_flags=("--decode-us-per-token", "200000"))
        decode = c.decodes[0]
        stream = c.stream(CHAT, chat(max_tokens=40, stream=True))
        self.addCleanup(stream.close)
        events = iter(stream)
        next(events)
        first = self.wait_load(c, decode, lambda l: l["decode_sequences"] == 1)["kv_tokens"]
        for _ in range(3):
            next(events)
        self.wait_load(c, decode, lambda l: l["kv_tokens"] >= first + 3)
        stream.close()
        self.wait_all_idle(c)

    def test_a_decode_serving_alone_queues_the_prompt_on_itself(self):
        # Conditional disaggregation: a short prompt goes to the decode alone, which computes it;
        # the pair's prefill carries nothing of it.
        c = self.cluster(connector="nixl", transfer_mode=None,
                         topology="conditional_disaggregation: {enabled: true, max_prompt_tokens: 64}\n")
        prefill, decode = c.prefills[0], c.decodes[0]
        decode.set_fault(hang=True)
        sock = self.open_request(c, completion(prompt=list(range(1, 21))))
        load = self.wait_load(c, decode, lambda l: l["decode_sequences"] == 1)
        self.assertEqual(figures(load), {"requests": 1, "prefill_tokens_queued": 20, "decode_sequences": 1,
                                         "kv_tokens": 20})  # 20 token ids, counted exactly
        self.assertEqual(figures(self.load_of(c, prefill)), dict.fromkeys(FIGURES, 0))
        sock.close()
        self.wait_all_idle(c)

    def test_an_orphaned_prefill_keeps_its_tokens_not_its_request(self):
        # MoRIIO WRITE is concurrent: the decode answers while the prefill leg hangs; the leg is
        # kept as an orphan for timeouts.orphan_grace_ms. The node still computes that prompt, so
        # its queued tokens stay charged until the orphan ends; its request left with the client's
        # (least_outstanding sees what it saw before the ledger).
        grace_ms = int(2000 * TIME_SCALE)
        c = self.cluster(kv_backends="none",
                         topology="timeouts:\n  prefill_ms: 60000\n  orphan_grace_ms: %d\n" % grace_ms)
        prefill = c.prefills[0]
        prefill.set_fault(hang=True, count=-1)
        status, _, body = c.post(COMPLETIONS, completion(prompt=list(range(1, 31))))
        self.assertEqual(status, 200, body)
        c.router.wait_for(lambda: c.metric("pdrouter_requests_in_flight") == 0, timeout=5)
        metrics = c.router.metrics()
        node = prefill.http_address
        self.assertEqual(metrics["pdrouter_orphan_prefill_legs"], 1)
        self.assertEqual(metrics['pdrouter_node_requests_in_flight{node="%s"}' % node], 0)
        self.assertEqual(metrics['pdrouter_node_prefill_tokens_queued{node="%s"}' % node], 30)
        c.router.wait_for(lambda: c.metric("pdrouter_orphan_prefill_legs") == 0, timeout=15)
        self.wait_all_idle(c)

    # --- after each way a request ends ------------------------------------------------------
    def test_a_normal_burst_leaves_nothing(self):
        # Decode tokens 20 ms apart: each streamed token is its own read (a decode step sample
        # needs two reads apart in time).
        c = self.cluster(prefills=2, decodes=2, decode_flags=("--decode-us-per-token", "20000"))
        bodies = []
        for i in range(24):
            if i % 3 == 0:
                bodies.append((CHAT, chat(max_tokens=6, stream=True)))
            elif i % 3 == 1:
                bodies.append((CHAT, chat(max_tokens=3)))
            else:
                bodies.append((COMPLETIONS, completion(prompt=list(range(1, 40)))))
        self.assertEqual(self.burst(c, bodies), [200] * len(bodies))
        self.wait_all_idle(c)
        # Prefill legs of 39 token ids and streamed decodes taught the rate estimates.
        metrics = c.router.metrics()
        samples = {estimate: sum(metrics['pdrouter_node_rate_samples_total{node="%s",estimate="%s"}'
                                         % (n.http_address, estimate)] for n in nodes)
                   for estimate, nodes in (("prefill", c.prefills), ("decode_step", c.decodes))}
        self.assertGreater(samples["prefill"], 0, samples)
        self.assertGreater(samples["decode_step"], 0, samples)
        for d in c.decodes:
            step = metrics['pdrouter_node_decode_step_seconds{node="%s"}' % d.http_address]
            if metrics['pdrouter_node_rate_samples_total{node="%s",estimate="decode_step"}' % d.http_address]:
                self.assertGreater(step, 0.005)  # tokens 20 ms apart (the sim's step)
                self.assertLess(step, 2 * TIME_SCALE)
        c.router.wait_for(lambda: all(c.router.instance(d.http_address)["router_load"]["decode_step_ms"]["samples"]
                                      == metrics['pdrouter_node_rate_samples_total{node="%s",estimate="decode_step"}'
                                                 % d.http_address] for d in c.decodes))

    def test_clients_leaving_mid_stream_leave_nothing(self):
        c = self.cluster(decode_flags=("--decode-us-per-token", "100000"))
        streams = [c.stream(CHAT, chat(max_tokens=50, stream=True)) for _ in range(4)]
        for s in streams:
            self.addCleanup(s.close)
            next(iter(s))
        self.wait_load(c, c.decodes[0], lambda l: l["decode_sequences"] == 4)
        for s in streams:
            s.close()
        self.wait_all_idle(c)

    def test_retries_after_a_prefill_refusing_connections_leave_nothing(self):
        # A static prefill nobody listens on beside a live one: legs to it fail to connect, are
        # retried on the live one, and it is ejected after three in a row.
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        dead = "127.0.0.1:%d" % probe.getsockname()[1]
        probe.close()
        topology = ("connectors:\n  default: nixl\npolicies:\n  prefill: round_robin\n"
                    "retries:\n  eject_ms: 600000\n"
                    "instances:\n  - {role: prefill, http_address: \"%s\"}\n" % dead)
        c = self.cluster(connector="nixl", transfer_mode=None, topology=topology)
        statuses = self.burst(c, [(COMPLETIONS, completion())] * 10)
        self.assertEqual(statuses, [200] * 10)
        self.assertGreaterEqual(c.metric('pdrouter_leg_retries_total{leg="prefill"}'), 1)
        self.wait_all_idle(c)

    def test_a_decode_killed_mid_stream_leaves_nothing(self):
        c = self.cluster(decodes=2, decode_flags=("--decode-us-per-token", "200000"))
        streams = [c.stream(CHAT, chat(max_tokens=40, stream=True)) for _ in range(4)]
        for s in streams:
            self.addCleanup(s.close)
            next(iter(s))
        victim = self.busiest_decode(c, 4)
        self.assertEqual(victim.kill(), -9)
        c.decodes.remove(victim)  # (the cluster's close() stops the live ones)
        for s in streams:
            list(s)  # the victim's end with an error event, the others run to their end
        self.wait_all_idle(c)

    def test_a_node_drained_while_requests_run_leaves_nothing(self):
        topology = "admin:\n  api_key_env: PDR_TEST_ADMIN_KEY\n"
        c = self.cluster(prefills=1, decodes=2, topology=topology, router_env={"PDR_TEST_ADMIN_KEY": ADMIN_KEY},
                         decode_flags=("--decode-us-per-token", "100000"))
        streams = [c.stream(CHAT, chat(max_tokens=20, stream=True)) for _ in range(4)]
        for s in streams:
            self.addCleanup(s.close)
            next(iter(s))
        busy = self.busiest_decode(c, 4)
        code, _, body = c.router.request("POST", "/admin/instances/%s/drain" % busy.http_address, b"",
                                         headers={"Authorization": "Bearer " + ADMIN_KEY}, admin=True)
        self.assertEqual(code, 200, body)
        c.router.wait_for(lambda: c.router.instance(busy.http_address)["state"] == "draining")
        # New requests go elsewhere while the drained node finishes its own.
        self.assertEqual(self.burst(c, [(CHAT, chat(max_tokens=2))] * 4), [200] * 4)
        for s in streams:
            self.assertEqual(s.status, 200)
            list(s)
        self.wait_all_idle(c)

    def test_a_node_restarted_with_a_new_epoch_while_requests_run_leaves_nothing(self):
        # pdrouter-format registrations (NIXL) carry an epoch; MoRIIO's do not.
        c = self.cluster(connector="nixl", transfer_mode=None, decode_flags=("--decode-us-per-token", "200000"))
        old = c.decodes[0]
        epoch = c.router.instance(old.http_address)["epoch"]
        streams = [c.stream(CHAT, chat(max_tokens=40, stream=True)) for _ in range(3)]
        for s in streams:
            self.addCleanup(s.close)
            next(iter(s))
        self.wait_load(c, old, lambda l: l["decode_sequences"] == 3)
        # A crash and a restart on the same address: the entry lives on with a new epoch.
        self.assertEqual(old.kill(), -9)
        new = c.start_node("decode", ("--decode-us-per-token", "1000", "--http", old.http_address))
        c.decodes[0] = new
        c.router.wait_for(lambda: (c.router.instance(old.http_address) or {}).get("epoch") not in (None, epoch)
                          and c.router.instance(old.http_address)["state"] == "up", timeout=10)
        for s in streams:
            list(s)
        self.assertEqual(self.burst(c, [(CHAT, chat(max_tokens=3, stream=True))] * 3), [200] * 3)
        self.wait_all_idle(c)


if __name__ == "__main__":
    unittest.main()
