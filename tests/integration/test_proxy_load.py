"""1,000 concurrent streaming chat completions through pdrouter, twice, with bounded memory.

pdrouter (2 workers, MoRIIO WRITE) in front of 2 prefill + 2 decode `pdnode sim` nodes. Each wave
opens 1,000 client connections first, then releases every request at once; the decode sims pace
tokens (TOKENS x DECODE_US), so all 1,000 streams are in flight together (checked on
pdrouter_requests_in_flight). Every client must get 200 and a complete SSE stream: token events,
a finish_reason, no error event, data: [DONE], then the chunked terminator. Afterwards: zero 5xx
and every request DONE in /metrics, and pdrouter's VmRSS bounded (before / peak / after each wave:
after wave 1 within +64 MiB of before, peak < 512 MiB, after wave 2 within +16 MiB of after wave 1;
printed but not asserted under ASan/TSan). pdrouter's own open-file limit (/proc/PID/limits) must
allow the streams: ~2 descriptors each (client + decode leg), checked as >= 3,000.

Clients are asyncio streams on raw sockets (standard library only); every wait has a deadline.
"""
import asyncio
import json
import os
import re
import resource
import threading
import time
import unittest

from pd_fixture import PdCluster
from pdrouter_fixture import TIME_SCALE

# Under ASan (quarantine, shadow memory) or TSan, RSS says nothing about pdrouter's own memory:
# the bounds are printed but not asserted there (tests/run.sh sets these variables per stage).
SANITIZED = bool(os.environ.get("ASAN_OPTIONS") or os.environ.get("TSAN_OPTIONS"))

# The release stage runs the 1,000; sanitizer builds (ASan ~4x, TSan ~10x slower sims and
# router on 2 cores) run a quarter, which still exercises every path concurrently.
CLIENTS = 250 if SANITIZED else 1000
TOKENS = 24
DECODE_US = 60000            # 24 tokens x 60 ms: each stream lasts ~1.5 s, so all overlap
CONNECT_PARALLELISM = 100    # connects in flight at once (the accept backlog is 1024)
WAVE_TIMEOUT_S = 45.0
MIB = 1024 * 1024

TOPOLOGY = """\
workers: 2
limits:
  max_concurrent_requests: 4096
  max_connections: 8192
timeouts:
  connect_ms: %d
  stream_idle_ms: 20000
  first_byte_ms: 20000
""" % int(2000 * TIME_SCALE)

BODY = json.dumps({"model": "sim-model", "stream": True, "max_tokens": TOKENS,
                   "messages": [{"role": "user", "content": "Tell me about routers."}]}).encode()


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for pid %d" % pid)


def soft_nofile(pid):
    with open("/proc/%d/limits" % pid) as f:
        for line in f:
            if line.startswith("Max open files"):
                soft = line.split()[3]
                return float("inf") if soft == "unlimited" else int(soft)
    raise AssertionError("no Max open files for pid %d" % pid)


def raise_nofile(wanted):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < wanted:
        new = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


async def read_chunked(reader):
    """Body of a chunked response, up to and including the terminating 0-size chunk."""
    body = bytearray()
    while True:
        size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
        if size == 0:
            await reader.readuntil(b"\r\n")  # no trailers expected: the blank line
            return bytes(body)
        body += await reader.readexactly(size)
        await reader.readexactly(2)


def check_stream(status, head, body):
    """'' when the answer is a complete, well-formed stream; else what is wrong."""
    if status != 200:
        return "status %d: %r" % (status, body[:300])
    if b"text/event-stream" not in head.lower():
        return "content type: %r" % head
    text = body.decode("utf-8", "replace")
    if not text.endswith("\n\n"):
        return "stream does not end with a blank line: %r" % text[-80:]
    events = []
    for block in text.split("\n\n"):
        if block:
            if not block.startswith("data: "):
                return "not a data event: %r" % block[:120]
            events.append(block[len("data: "):])
    if not events or events[-1] != "[DONE]":
        return "no final data: [DONE] (last %r)" % (events[-1:] or None)
    finish = None
    content = 0
    for raw in events[:-1]:
        event = json.loads(raw)
        if "error" in event:
            return "error event: %s" % raw[:300]
        for choice in event.get("choices", []):
            if choice.get("delta", {}).get("content"):
                content += 1
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    if finish is None:
        return "no finish_reason in %d events" % len(events)
    if content == 0:
        return "no content tokens"
    return ""


class Barrier:
    """Counts clients that finished connecting (or failed to); `all_in` is set at `total`."""

    def __init__(self, total):
        self.total, self.count = total, 0
        self.all_in = asyncio.Event()

    def arrive(self):
        self.count += 1
        if self.count == self.total:
            self.all_in.set()


async def one_client(host, port, start, connect_gate, connected, problems):
    try:
        async with connect_gate:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port),
                                                    10 * TIME_SCALE)
    except (OSError, asyncio.TimeoutError) as e:
        problems.append("connect: %r" % e)
        return
    finally:
        connected.arrive()
    try:
        await start.wait()
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: %s:%d\r\n"
                     b"Content-Type: application/json\r\nAccept: text/event-stream\r\n"
                     b"Content-Length: %d\r\n\r\n" % (host.encode(), port, len(BODY)) + BODY)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        lower = head.lower()
        if b"transfer-encoding: chunked" in lower:
            body = await read_chunked(reader)
        else:
            match = re.search(rb"content-length: *(\d+)", lower)
            body = await reader.readexactly(int(match.group(1))) if match else b""
        problem = check_stream(status, head, body)
        if problem:
            problems.append(problem)
    except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        problems.append("client: %r" % e)
    finally:
        writer.close()


class Sampler:
    """Samples pdrouter's VmRSS (and requests in flight) every 20 ms on a thread."""

    def __init__(self, cluster, pid):
        self.cluster, self.pid = cluster, pid
        self.peak_rss = 0
        self.peak_in_flight = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        last_metrics = 0.0
        while not self._stop.wait(0.02):
            self.peak_rss = max(self.peak_rss, rss_bytes(self.pid))
            if time.monotonic() - last_metrics > 0.1:
                last_metrics = time.monotonic()
                try:
                    in_flight = self.cluster.metric("pdrouter_requests_in_flight")
                except Exception:  # a slow /metrics under load is not a failure of the wave
                    continue
                self.peak_in_flight = max(self.peak_in_flight, in_flight)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)
        self.peak_rss = max(self.peak_rss, rss_bytes(self.pid))
        return False


def run_wave(cluster, pid, clients):
    """`clients` connect, then all send at once; returns (problems, seconds, sampler)."""
    host, port = cluster._host_port()
    problems = []

    async def run():
        start = asyncio.Event()
        gate = asyncio.Semaphore(CONNECT_PARALLELISM)
        connected = Barrier(clients)
        tasks = [asyncio.ensure_future(one_client(host, port, start, gate, connected, problems))
                 for _ in range(clients)]
        # Everyone connected (or failed to) before the requests go out together.
        try:
            await asyncio.wait_for(connected.all_in.wait(), 20 * TIME_SCALE)
        except asyncio.TimeoutError:
            problems.append("only %d of %d clients connected within %.0f s"
                            % (connected.count, clients, 20 * TIME_SCALE))
        start.set()
        began = time.monotonic()
        done, pending = await asyncio.wait(tasks, timeout=WAVE_TIMEOUT_S * TIME_SCALE)
        for task in pending:
            task.cancel()
        if pending:
            problems.append("%d clients still running after %.0f s"
                            % (len(pending), WAVE_TIMEOUT_S * TIME_SCALE))
        return time.monotonic() - began

    with Sampler(cluster, pid) as sampler:
        seconds = asyncio.run(run())
    return problems, seconds, sampler


class ProxyLoadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        sim_flags = ("--workers", "2", "--prefill-us-per-token", "5",
                     "--decode-us-per-token", str(DECODE_US))
        cls.cluster = PdCluster("moriio", transfer_mode="WRITE", prefills=2, decodes=2,
                                topology=TOPOLOGY, prefill_flags=sim_flags, decode_flags=sim_flags)
        cls.pid = cls.cluster.router.process.proc.pid
        # pdrouter runs with the limit it inherited (it does not raise its own soft limit), so it
        # is read before this process raises its own for the clients' sockets.
        cls.router_nofile = soft_nofile(cls.pid)
        cls.nofile = raise_nofile(CLIENTS + 1024)

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def wave(self):
        """1,000 clients connect, then all send at once; returns (problems, seconds, sampler)."""
        return run_wave(self.cluster, self.pid, CLIENTS)

    def wait_idle(self):
        self.cluster.router.wait_for(
            lambda: self.cluster.metric("pdrouter_requests_in_flight") == 0, timeout=10)

    def test_thousand_concurrent_streams_twice(self):
        self.assertGreaterEqual(self.nofile, CLIENTS + 1024, "RLIMIT_NOFILE too low for the clients")
        # Each stream holds a client socket and a decode-leg socket in pdrouter, plus prefill legs
        # and pooled connections: 1,000 streams need about 2,100 descriptors.
        self.assertGreaterEqual(self.router_nofile, 3 * CLIENTS,
                                "pdrouter's soft RLIMIT_NOFILE (inherited: `ulimit -n`) is too low "
                                "for %d concurrent streams" % CLIENTS)
        # Warm-up: a few streams, so lazily created per-worker state is in the baseline.
        for _ in range(4):
            with self.cluster.stream("/v1/chat/completions", json.loads(BODY)) as events:
                self.assertEqual(events.status, 200)
                self.assertEqual(list(events)[-1], "[DONE]")
        self.wait_idle()
        rss_before = rss_bytes(self.pid)
        metrics_before = self.cluster.router.metrics()

        results = []
        for number in (1, 2):
            problems, seconds, sampler = self.wave()
            self.wait_idle()
            rss_after = rss_bytes(self.pid)
            results.append((seconds, sampler.peak_rss, rss_after, sampler.peak_in_flight))
            print("wave %d: %d clients in %.1f s, peak in flight %d, VmRSS before %.1f MiB, "
                  "peak %.1f MiB, after %.1f MiB" % (
                      number, CLIENTS, seconds, sampler.peak_in_flight, rss_before / MIB,
                      sampler.peak_rss / MIB, rss_after / MIB), flush=True)
            self.assertEqual(problems[:5], [], "wave %d: %d of %d clients failed"
                             % (number, len(problems), CLIENTS))
            self.assertGreaterEqual(sampler.peak_in_flight, 0.9 * CLIENTS,
                                    "wave %d: the streams did not overlap" % number)
            if not SANITIZED:
                self.assertLess(sampler.peak_rss, 512 * MIB, "wave %d: peak VmRSS" % number)

        metrics = self.cluster.router.metrics()

        def delta(name):
            return metrics.get(name, 0.0) - metrics_before.get(name, 0.0)

        self.assertEqual(delta('pdrouter_http_responses_total{class="5xx"}'), 0)
        self.assertEqual(delta('pdrouter_requests_total{outcome="done"}'), 2 * CLIENTS)
        self.assertEqual(delta('pdrouter_requests_total{outcome="failed"}'), 0)
        self.assertEqual(delta('pdrouter_requests_total{outcome="cancelled"}'), 0)
        self.assertEqual(delta("pdrouter_stream_errors_total"), 0)
        # Every client connection is closed again (the scrape itself is the one left).
        self.cluster.router.wait_for(
            lambda: self.cluster.metric("pdrouter_http_connections_active") <= 1, timeout=10)

        if SANITIZED:
            return
        after1, after2 = results[0][2], results[1][2]
        self.assertLess(after1 - rss_before, 64 * MIB, "VmRSS after wave 1 vs before")
        self.assertLess(after2 - after1, 16 * MIB, "VmRSS grew from wave 1 to wave 2 (leak?)")


# docs/topology.md "Sizing the open-file limit": N concurrent streams need about 3N + 256 descriptors in
# pdrouter (client socket, decode leg, and the prefill leg the concurrent dialects keep open beside
# it, plus fixed headroom). At start pdrouter fits limits.max_connections into its RLIMIT_NOFILE
# with that formula. The reviewers' 10,000 streams need 30,256; this machine's hard limit (20,000,
# not raisable without CAP_SYS_RESOURCE) cannot hold that, so the formula is checked at a scale
# that fits: pdrouter gets exactly the documented limit for STREAMS (+ a few scrape connections)
# and every stream must complete, with no leg failing on a local EMFILE and no node ejected.
# At least 252 streams: below a limit of 1,024 pdrouter keeps a quarter of it as headroom instead
# of 256 (router/http/fd_budget.h), and the documented formula is for real limits.
# PDR_FD_STREAMS checks the documented formula at another scale (10,000 needs a hard limit of
# 30,268 for pdrouter, and the load client and sims one descriptor per stream each).
FD_STREAMS = int(os.environ.get("PDR_FD_STREAMS", "0")) or (260 if SANITIZED else 400)
FD_SPARE_CONNECTIONS = 4  # the sampler's /metrics scrapes share the client listener
FD_LIMIT = 3 * (FD_STREAMS + FD_SPARE_CONNECTIONS) + 256
# Streams last longer at larger scales, so that all of them are in flight before the first ends.
FD_DECODE_US = DECODE_US * max(1, FD_STREAMS // 1000)
# More connections asked for than the limit holds (pdrouter clamps them), and room for every
# stream that fits.
FD_TOPOLOGY = (TOPOLOGY.replace("max_concurrent_requests: 4096",
                                "max_concurrent_requests: %d" % max(4096, 2 * FD_STREAMS))
               .replace("max_connections: 8192", "max_connections: %d" % max(8192, 2 * FD_STREAMS)))


class FdLimitedLoadTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        # Each decode holds a stream's KV blocks until it ends: room for all of them (the sims'
        # default pool is 2,048 blocks).
        sim_flags = ("--workers", "2", "--prefill-us-per-token", "5",
                     "--decode-us-per-token", str(FD_DECODE_US), "--kv-blocks", str(max(2048, 4 * FD_STREAMS)))
        # MoRIIO WRITE: the concurrent dialect, three descriptors per stream at the peak.
        cls.cluster = PdCluster("moriio", transfer_mode="WRITE", prefills=2, decodes=2,
                                topology=FD_TOPOLOGY, prefill_flags=sim_flags, decode_flags=sim_flags,
                                router_nofile=FD_LIMIT)
        cls.pid = cls.cluster.router.process.proc.pid
        raise_nofile(FD_STREAMS * 3 // 2 + 1024)  # the second test sends 1.5 N

    @classmethod
    def tearDownClass(cls):
        cls.cluster.close()

    def test_documented_limit_holds_its_streams(self):
        self.assertEqual(soft_nofile(self.pid), FD_LIMIT)
        # TOPOLOGY asks for 8,192 connections: pdrouter says what it accepts instead and what to
        # raise the limit to.
        fitted = FD_STREAMS + FD_SPARE_CONNECTIONS
        self.assertIsNotNone(self.cluster.router.process.wait_for_line(
            r"accepting at most %d connections" % fitted, timeout=5), self.cluster.router.log())
        before = self.cluster.router.metrics()
        problems, seconds, sampler = run_wave(self.cluster, self.pid, FD_STREAMS)
        self.cluster.router.wait_for(
            lambda: self.cluster.metric("pdrouter_requests_in_flight") == 0, timeout=10 * TIME_SCALE)
        print("fd limit %d: %d streams in %.1f s, peak in flight %d"
              % (FD_LIMIT, FD_STREAMS, seconds, sampler.peak_in_flight), flush=True)
        self.assertEqual(problems[:5], [], "%d of %d streams failed" % (len(problems), FD_STREAMS))
        self.assertGreaterEqual(sampler.peak_in_flight, 0.9 * FD_STREAMS, "the streams did not overlap")
        after = self.cluster.router.metrics()

        def delta(name):
            return after.get(name, 0.0) - before.get(name, 0.0)

        self.assertEqual(delta('pdrouter_requests_total{outcome="done"}'), FD_STREAMS)
        self.assertEqual(sum(v for k, v in after.items()
                             if k.startswith("pdrouter_leg_failures_total")), 0, after)
        self.assertEqual(sum(v for k, v in after.items()
                             if k.startswith("pdrouter_node_ejections_total")), 0)
        self.assertEqual(delta("pdrouter_http_accept_errors_total"), 0)

    def test_more_clients_than_the_limit_holds_are_refused_cleanly(self):
        # Half as many again as fit: before pdrouter sized max_connections from the limit, the
        # extra streams' legs hit EMFILE (502/503 to clients, healthy nodes ejected). Now the
        # connections beyond the fit are answered 503 too_many_connections (Retry-After: 1) at
        # accept and closed, and every accepted stream completes.
        clients = FD_STREAMS * 3 // 2
        before = self.cluster.router.metrics()
        problems, _, _ = run_wave(self.cluster, self.pid, clients)
        self.cluster.router.wait_for(
            lambda: self.cluster.metric("pdrouter_requests_in_flight") == 0, timeout=10 * TIME_SCALE)
        after = self.cluster.router.metrics()

        def delta(name):
            return after.get(name, 0.0) - before.get(name, 0.0)

        # A refused client gets the 503 before its request is read; nothing else may fail.
        refused = [p for p in problems if p.startswith("status 503") and "too_many_connections" in p]
        self.assertEqual([p for p in problems if p not in refused][:5], [])
        self.assertGreaterEqual(clients - len(refused), FD_STREAMS - FD_SPARE_CONNECTIONS)
        self.assertGreaterEqual(delta("pdrouter_http_connections_rejected_total"), len(refused))
        self.assertGreaterEqual(delta("pdrouter_http_busy_refusals_total"), len(refused))
        self.assertEqual(delta('pdrouter_http_responses_total{class="5xx"}'), 0)
        self.assertEqual(delta('pdrouter_requests_total{outcome="done"}'), clients - len(refused))
        self.assertEqual(sum(v for k, v in after.items()
                             if k.startswith("pdrouter_leg_failures_total")), 0)
        self.assertEqual(sum(v for k, v in after.items()
                             if k.startswith("pdrouter_node_ejections_total")), 0)


if __name__ == "__main__":
    unittest.main()
