#!/usr/bin/env python3
"""Goodput benchmark: the Mooncake synthetic trace (bench/serving/traces/) replayed with
`pdrouter-bench --trace` through pdrouter onto P prefill + D decode `pdnode sim` nodes, swept over
speed-ups, once per routing policy, once with conditional disaggregation by prediction (a decode
computes a prompt itself while the prefills are busy: conditional_disaggregation.prefill_busy_ms,
with a TPOT SLO its chunks must keep; the decode sims run with a small token budget,
--decode-token-budget) and once with two pdrouter replicas sharing their registry through etcd. Each
run reports SLO attainment (share of requests meeting both TTFT <= 10 s and TBT <= 100 ms, TBT
being the mean of a request's slowest 10% token gaps, as Mooncake's paper judges) and goodput
(requests/s meeting both); a policy's goodput is the highest speed-up at which it keeps >= 90%
attainment (DistServe's definition), i.e. where it saturates.

The sims stand in for GPUs, so how they are timed decides what this measures:
with `pdnode sim --engine vllm` (a vLLM V1 scheduler model: token budget, seats, KV blocks,
preemption, prefix cache) a node contends like a GPU and a bad route costs queueing; the default
per-token sims time each request on its own and never saturate, so the sweep then shows the
machine, not the policy. --engine auto (default) uses the engine model when `pdnode sim --help`
lists it. The engine runs at --time-scale (wall seconds per modelled second, default 0.2: five
times faster than a GPU); arrivals are compressed by the same factor and the SLOs scaled by it, so
every figure in the results is in modelled (GPU) time.

  bench/serving/goodput_bench.py [--bin-dir DIR] [--smoke] [--results FILE] [--trace FILE]
      [--num-prompts N] [--first I] [--speedups LIST] [--policies LIST] [--etcd-policies LIST]
      [--busy-decode-policies LIST] [--prefill-busy-ms MS] [--decode-token-budget N]
      [--prefills P] [--decodes D] [--engine auto|vllm|per-token] [--time-scale T]
      [--sim-flag=FLAG ...] [--backend completions|generate] [--slo-ttft-ms MS] [--slo-tbt-ms MS]
      [--target 0.9] [--request-timeout S] [--note TEXT] [--overload-policy P]
      [--overload-speedup S] [--overload-max-concurrent N]

After the sweep, one overload run: --overload-policy (predicted_latency) with pdrouter's admission
queue on (limits.max_concurrent_requests 8 per prefill node, limits.queue_timeout_ms the TTFT SLO in
wall time) at 1.5x the speed-up where round_robin saturated: the results say how many requests
were answered, refused 429/503 or lost, and the queue wait's p50/p99 against its deadline.

Every (variant, speed-up) starts a fresh deployment (cold caches). Runs go speed-up by speed-up,
every variant at each (a machine whose load drifts weighs on all alike); a variant stops after a
speed-up below 50% attainment (higher ones would only queue longer). --smoke (CTest
bench.serving_goodput): a few dozen requests at two speed-ups, round_robin, cache_aware and
predicted_latency and,
when /usr/bin/etcd exists, the two-replica variant; results in a temporary file; fails if a run
produced no result or lost requests for a reason other than an HTTP answer (the overload run, at
the highest speed-up with 2 slots, included). Every process started here is stopped on exit.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)
from machine import machine  # noqa: E402
from cache_bench import Processes, field, free_port, get, get_json  # noqa: E402
from fleet_ceiling import ceilings, engine_settings  # noqa: E402

# "a/b": policy a for prefill, b for decode; "a": a for both.
POLICIES = ["round_robin", "least_outstanding", "cache_aware", "cache_aware/least_outstanding", "predicted_latency"]
ETCD = "/usr/bin/etcd"
START_TIMEOUT_S = 20.0 * float(os.environ.get("PDR_TIME_SCALE", "1"))
STOP_BELOW = 0.5  # a sweep stops after a speed-up under this attainment
TRACE = os.path.join(HERE, "traces", "mooncake_synthetic_trace.jsonl")
MAX_MODEL_LEN = 131072  # the engine model's default (an 8B model's context), set on per-token sims too


def sim_help(pdnode):
    return subprocess.run([pdnode, "sim", "--help"], capture_output=True, text=True).stdout


class Etcd:
    """etcd on two bind-probed loopback ports (it cannot take port 0), data in a temp dir."""

    def __init__(self, work):
        self.dir = tempfile.mkdtemp(prefix="etcd.", dir=work)
        self.proc = None
        for _ in range(5):
            self.client_port, peer_port = free_port(), free_port()
            if self.client_port == peer_port:
                continue
            client = "http://127.0.0.1:%d" % self.client_port
            peer = "http://127.0.0.1:%d" % peer_port
            log = open(os.path.join(self.dir, "etcd.log"), "a")
            self.proc = subprocess.Popen(
                [ETCD, "--data-dir", os.path.join(self.dir, "data"), "--listen-client-urls", client,
                 "--advertise-client-urls", client, "--listen-peer-urls", peer,
                 "--initial-advertise-peer-urls", peer, "--initial-cluster", "default=" + peer,
                 "--log-level", "warn"], stdout=log, stderr=log)
            log.close()
            deadline = time.monotonic() + START_TIMEOUT_S
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if "true" in get(client + "/health", timeout=0.5):
                        return
                except OSError:
                    pass
                time.sleep(0.05)
            self.stop()
        raise RuntimeError("etcd did not start (see %s)" % self.dir)

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


class Deployment:
    """`replicas` pdrouters (two or more share their registry through etcd) with `policy` on both
    roles and KV events on, and P prefill + D decode NIXL sims; node i registers with router
    i % replicas only, so with etcd the others learn it from the shared registry."""

    def __init__(self, procs, args, policy, replicas, etcd, tag, limits=None, topology="", policy_options=None):
        self.procs, self.args = procs, args
        self.routers, discoveries = [], []
        self.access_logs = []  # with `limits`: each replica's access log (queue_ms per request)
        prefix = "/pdr-goodput-%d-%s/" % (os.getpid(), tag)
        prefill_policy, _, decode_policy = policy.partition("/")
        for r in range(replicas):
            topo = os.path.join(procs.work, "topology-%s-%d.yaml" % (tag, r))
            with open(topo, "w") as f:
                f.write("policies:\n  prefill: %s\n  decode: %s\n"
                        % (prefill_policy, decode_policy or prefill_policy))
                if "predicted_latency" in (prefill_policy, decode_policy):
                    options = dict(cost_model_in_sim_time(args), **(policy_options or {}))
                    f.write("  predicted_latency:\n" + "".join("    %s: %d\n" % kv for kv in options.items()))
                f.write("kv_events:\n  enabled: true\n")
                f.write(topology)
                if limits:
                    f.write("limits:\n" + "".join("  %s: %d\n" % kv for kv in sorted(limits.items())))
                    # Each request's queue_ms, exactly (the histogram's buckets are coarse).
                    self.access_logs.append(os.path.join(procs.work, "access-%s-%d.log" % (tag, r)))
                    f.write("access_log:\n  path: \"%s\"\n" % self.access_logs[-1])
                if etcd is not None:
                    f.write("registry:\n  backend: etcd\n  etcd_endpoints: [\"127.0.0.1:%d\"]\n"
                            "  etcd_prefix: \"%s\"\n  replica_id: \"r%d\"\n"
                            % (etcd.client_port, prefix, r))
            line = procs.start("pdrouter-%s-%d" % (tag, r),
                               [args.pdrouter, "-c", topo, "--http", "127.0.0.1:0", "--discovery",
                                "tcp://127.0.0.1:0", "--log-level", "warn"])
            self.routers.append(field(line, "http"))
            discoveries.append(field(line, "discovery"))
        self.prefills, self.decodes = [], []
        i = 0
        for role, count, nodes in (("prefill", args.prefills, self.prefills),
                                   ("decode", args.decodes, self.decodes)):
            for _ in range(count):
                flags = ["--role", role, "--connector", "nixl", "--kv-backends", "none",
                         "--register", discoveries[i % replicas], "--register-interval-ms", "500",
                         "--kv-events-endpoint", "tcp://127.0.0.1:0", "--log-level", "warn"]
                flags += args.node_flags
                if role == "decode":
                    flags += args.decode_flags
                line = procs.start("%s-%s%d" % (tag, role, len(nodes)), [args.pdnode, "sim"] + flags)
                nodes.append(field(line, "http"))
                i += 1
        self.wait_ready()

    def wait_ready(self):
        want = self.args.prefills + self.args.decodes
        deadline = time.monotonic() + START_TIMEOUT_S
        for router in self.routers:
            while True:
                status = get_json("http://%s/status" % router) or {}
                up = [i for i in status.get("instances", []) if i.get("state") == "up"]
                subscribed = self.kv_subscribed(router)
                if len(up) == want and subscribed >= self.args.prefills + self.args.decodes:
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError("pdrouter %s: %d of %d sims up, %d KV event subscriptions"
                                       % (router, len(up), want, subscribed))
                time.sleep(0.1)

    @staticmethod
    def kv_subscribed(router):
        try:
            text = get("http://%s/metrics" % router)
        except OSError:
            return 0
        m = re.search(r"^pdrouter_kv_events_subscribed_ranks (\S+)$", text, re.M)
        return int(float(m.group(1))) if m else 0

    FAMILIES = ("vllm:request_success_total", "vllm:num_preemptions_total",
                "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total")

    @classmethod
    def loads(cls, nodes):
        """Per node, from its /metrics (summed over labels; None where absent): requests
        completed, preemptions, and prompt tokens it computed (prefix-cache queries - hits)."""
        loads = []
        for node in nodes:
            try:
                text = get("http://%s/metrics" % node)
            except OSError:
                text = ""
            sums = {}
            for line in text.splitlines():
                m = re.match(r"([a-z_:]+)(\{[^}]*\})?\s+(\S+)", line)
                if m and m.group(1) in cls.FAMILIES:
                    sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
            queries, hits = sums.get(cls.FAMILIES[2]), sums.get(cls.FAMILIES[3])
            loads.append({"requests": sums.get(cls.FAMILIES[0]), "preemptions": sums.get(cls.FAMILIES[1]),
                          "computed": None if queries is None or hits is None else queries - hits})
        return loads


def admission_figures(router, access_log, requests):
    """The admission queue of a run: its refusals by reason (the router's /metrics) and the
    queue_ms of every request the access log has a line for (waiting up to 10 s for the log's
    writer to catch up with the `requests` lines due), as seconds: p50, p99 and the longest wait
    of the admitted (2xx) requests, and how many waited at all."""
    refused = {}
    for line in get("http://%s/metrics" % router).splitlines():
        m = re.match(r'pdrouter_requests_refused_total\{reason="([a-z_]+)"\} (\S+)', line)
        if m and float(m.group(2)) > 0:
            refused[m.group(1)] = int(float(m.group(2)))
    records, deadline = [], time.monotonic() + 10.0
    while True:
        try:
            with open(access_log) as f:
                records = [json.loads(x) for x in f if x.strip()]
        except (OSError, ValueError):
            records = []
        if len(records) >= requests or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    waits = sorted((r.get("queue_ms") or 0.0) / 1000.0 for r in records if 200 <= r.get("status", 0) < 300)

    def quantile(q):
        return waits[min(len(waits) - 1, int(q * len(waits)))] if waits else None
    return {"waited": sum(1 for w in waits if w > 0), "admitted": len(waits), "wait_p50_s": quantile(0.5),
            "wait_p99_s": quantile(0.99), "wait_max_s": waits[-1] if waits else None, "refused": refused,
            "logged": len(records)}


def run_one(args, procs, variant, speedup):
    policy, replicas = variant["policy"], variant["replicas"]
    tag = "%s-x%d-%s%s%s" % (policy.replace("/", "-"), replicas, speedup, "-limits" if variant.get("limits") else "",
                             "-busy" if variant.get("topology") else "")
    etcd = Etcd(procs.work) if replicas > 1 else None
    try:
        dep = Deployment(procs, args, policy, replicas, etcd, tag, variant.get("limits"), variant.get("topology", ""),
                         variant.get("policy_options"))
        out = os.path.join(procs.work, "%s.json" % tag)
        cmd = [args.bench, "--trace", args.window_file, "--num-prompts", str(args.num_prompts),
               "--trace-speedup", "%g" % (speedup / args.time_scale),
               "--slo-ttft-ms", "%g" % args.slo_ttft_ms, "--slo-tbt-ms", "%g" % args.slo_tbt_ms,
               "--slo-scale", "%g" % args.time_scale, "--timeout", str(args.request_timeout),
               "--seed", "1", "--no-progress", "--json", out]
        if args.backend == "generate":
            cmd += ["--backend", "generate"]
        for router in dep.routers:
            cmd += ["--base-url", "http://" + router, "--router-metrics-url",
                    "http://%s/metrics" % router]
        for node in dep.prefills:
            cmd += ["--engine-metrics-url", "http://%s/metrics" % node]
        print("=== %s, speed-up %g: %s" % (variant["name"], speedup, " ".join(cmd[1:])), flush=True)
        started = time.monotonic()
        load_before = os.getloadavg()[0]
        rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
        result = json.load(open(out)) if os.path.exists(out) else {}
        result["bench_rc"] = rc
        result["wall_s"] = time.monotonic() - started
        result["load"] = (load_before, os.getloadavg()[0])
        result["prefill_loads"] = dep.loads(dep.prefills)
        result["decode_loads"] = dep.loads(dep.decodes)
        if variant.get("limits"):
            # Every replayed request and pdrouter-bench's test request have a line.
            result["admission"] = admission_figures(dep.routers[0], dep.access_logs[0], args.num_prompts + 1)
        return result
    finally:
        procs.stop_all()
        if etcd is not None:
            etcd.stop()


def goodput_speedup(runs, target):
    """The highest speed-up s such that every swept speed-up up to s kept >= target attainment
    (None when the lowest did not)."""
    best = None
    for speedup in sorted(runs):
        if runs[speedup].get("slo_attainment", 0) >= target:
            best = speedup
        else:
            break
    return best


def pct(x):
    return "n/a" if x is None else "%.1f" % (100.0 * x)


def modelled_ms(r, key, scale):
    value = r.get(key)
    return "n/a" if value is None else "%.0f" % (value / scale)


def render(args, variants, results, started):
    m = machine()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    build_type = "unknown"
    try:
        with open(os.path.join(args.bin_dir, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    build_type = line.split("=", 1)[1].strip() or "unknown"
    except OSError:
        pass
    t = args.time_scale
    out = []
    w = out.append
    w("# Goodput benchmark: the Mooncake synthetic trace through pdrouter, by routing policy")
    w("")
    w("Produced by `bench/serving/goodput_bench.py`%s (do not edit by hand). %s UTC, commit %s, "
      "%s build." % (" --smoke" if args.smoke else "", started.strftime("%Y-%m-%d %H:%M"), commit,
                     build_type))
    w("")
    w("**What**: requests %d to %d of the %d in `%s` (Mooncake's synthetic trace: arrival times, "
      "prompt and output lengths, shared 512-token prefix blocks; %s) replayed with `pdrouter-bench --trace` "
      "(token-id prompts whose shared blocks are identical, `%s`, streamed, `ignore_eos`) at "
      "speed-ups %s of the trace's own rate, through pdrouter under each variant below. A request "
      "meets the SLO when its TTFT is at most %g ms and its TBT (the mean of its slowest 10%% "
      "inter-token gaps) at most %g ms; *attainment* is the share of requests that do (failures "
      "count as misses), *goodput* the requests/s that do. A variant's **goodput speed-up** is the "
      "highest speed-up up to which every swept one kept at least %d%% attainment: where it "
      "saturates."
      % (args.first + 1, args.first + args.num_prompts, args.trace_lines,
         os.path.relpath(args.trace, ROOT), args.window_text, "/inference/v1/generate"
         if args.backend == "generate" else "/v1/completions",
         ", ".join("%g" % s for s in args.speedups), args.slo_ttft_ms, args.slo_tbt_ms,
         round(100 * args.target)))
    w("")
    engine_text = ("`--engine vllm` (the simulated vLLM V1 engine with its default profile: an 8B "
                   "model on one H100, 8192-token steps, 1024 seats, 29,000 KV blocks of 16 tokens, "
                   "prefix cache, recompute preemption) at `--time-scale %g`" % t
        if args.engine == "vllm" else
        "the per-token model (`%s`): each request timed on its own, no batch, no queue, so no "
        "node ever saturates and the sweep measures this machine, not the policies"
        % " ".join(args.engine_flags))
    w("**How**: for every (variant, speed-up) a fresh deployment on this machine's loopback: "
      "pdrouter with the variant's policies and `kv_events.enabled` (predicted_latency's cost-model "
      "constants scaled to the sims' time: `cost_model_in_sim_time`), %d prefill + %d "
      "decode `pdnode sim` nodes (connector nixl, no KV bytes moved, KV events published), timed "
      "by %s%s. Times are modelled (GPU) time: the sims run %gx faster than the modelled GPU, "
      "the trace is replayed %gx faster on top of the speed-up and the SLOs are scaled by %g, so "
      "the TTFT and TBT columns are wall-clock figures divided by %g. Hit rates: *router* = "
      "pdrouter's own prefix estimate for the prefill leg (the tokens the chosen node held by its "
      "KV events, or by pdrouter's record of what it sent it, over every prompt token sent); *engine* = the prefill sims' "
      "`vllm:prefix_cache_hits_total / vllm:prefix_cache_queries_total`; *oracle* = the share of "
      "prompt tokens an infinite cache with perfect routing would hold. *Prefill requests* and "
      "*prefill computed* = requests each prefill node completed and the prompt tokens it "
      "computed (its prefix-cache queries minus hits), and *decode requests* the same for each "
      "decode node: a hot spot shows as one node taking most; *preemptions* per node, prefill "
      "nodes first; "
      "*lag* = how late pdrouter-bench sent its latest request (wall s; a lagging client "
      "understates the load); *load* = the machine's 1-minute load average at the run's start and "
      "end. Runs go speed-up by speed-up, every variant at each, so a busy spell on the machine "
      "weighs on all variants alike; a variant stops after a speed-up below %d%% attainment."
      % (args.prefills, args.decodes, engine_text,
         ((", extra sim flags `%s`" % " ".join(args.sim_flag)) if args.sim_flag else "") +
         ((", decodes with `%s` (vLLM's --max-num-batched-tokens on the decode instances: a prompt a "
           "decode computes alone runs in chunks that short)" % " ".join(args.decode_flags)) if args.decode_flags else ""),
         1 / t, 1 / t, t, t, round(100 * STOP_BELOW)))
    w("")
    w("Variants: " + "; ".join("*%s*: %s" % (v["name"], v["what"]) for v in variants) + ".")
    w("")
    if args.note:
        w("**Note**: %s" % args.note)
        w("")
    loads = [x for runs in results.values() for r in runs.values() for x in r.get("load", ())]
    w("**Machine**: %s, %d cores, %s; 1-minute load average %s over the runs (sampled at the start "
      "and end of each), %s at the end."
      % (m["cpu"], m["nproc"], m["kernel"],
         "%.1f to %.1f" % (min(loads), max(loads)) if loads else "unknown", m["load"]))
    w("")
    w("## Where each variant saturates")
    w("")
    w("| variant | goodput speed-up (>= %d%% attainment) | goodput there (req/s, modelled) | "
      "attainment at the next speed-up |" % round(100 * args.target))
    w("| --- | ---: | ---: | ---: |")
    for v in variants:
        runs = results.get(v["name"], {})
        best = goodput_speedup(runs, args.target)
        higher = [s for s in sorted(runs) if best is None or s > best]
        nxt = ("%s%% at %g" % (pct(runs[higher[0]].get("slo_attainment")), higher[0])
               if higher else "none swept above")
        w("| %s | %s | %s | %s |" % (
            v["name"], "below %g" % min(runs) if best is None and runs else
            ("%g" % best if best is not None else "n/a"),
            "%.2f" % (runs[best].get("goodput", 0) * t) if best is not None else "n/a", nxt))
    w("")
    base = goodput_speedup(results.get(variants[0]["name"], {}), args.target) if variants else None
    if base:
        w("Against *%s* (goodput speed-up %g): %s." % (
            variants[0]["name"], base, "; ".join(
                "*%s* %s" % (v["name"], "%.2fx" % (goodput_speedup(results.get(v["name"], {}), args.target) / base)
                             if goodput_speedup(results.get(v["name"], {}), args.target) else "below the sweep")
                for v in variants[1:])))
        w("")
    if args.engine == "vllm":
        w("## What any router could reach")
        w("")
        w("The prefill work this window needs and the speed-up at which it fills the %d prefill "
          "node%s (utilisation 1; `bench/serving/fleet_ceiling.py`, the engine model's step time for "
          "each prompt's uncached tokens after its cached prefix): with the fleet's KV as one LRU "
          "cache, a router that never duplicates a prefix nor loses one it could keep, and with an "
          "unbounded cache. A router holding TTFT within the SLO saturates below the first ceiling "
          "while only the prefill nodes compute prompts; a decode that computes prompts itself when "
          "idle (conditional disaggregation) adds its spare time to that capacity."
          % (args.prefills, "" if args.prefills == 1 else "s"))
        w("")
        w("| cache | hit rate | prefill work (modelled s) | ceiling speed-up |")
        w("| --- | ---: | ---: | ---: |")
        for label, hit, work_s, ceiling in ceilings(args.window_rows, args.prefills,
                                                    engine_settings(args.help_text, args.sim_flag),
                                                    MAX_MODEL_LEN):
            w("| %s | %.1f%% | %.1f | %.2f |" % (label, 100 * hit, work_s, ceiling))
        w("")
    over = getattr(args, "overload_result", None)
    if over is not None:
        v, speedup, r = over
        a = r.get("admission", {})
        deadline_s = v["limits"]["queue_timeout_ms"] / 1000.0
        lost = r.get("failed", 0) - sum(r.get("failed_http_status", {}).values())
        w("## Overload: %s at speed-up %g" % (v["name"], speedup))
        w("")
        w("At %s, pdrouter with `limits: %s` (the queue's deadline is the TTFT SLO in wall time): "
          "what happened to every request, and how long the admitted (2xx) ones waited in the "
          "queue (their access log lines' `queue_ms`, in modelled seconds)."
          % (v["overload_why"], ", ".join("%s: %d" % kv for kv in sorted(v["limits"].items()))))
        w("")
        w("| requests | answered 2xx | refused 429 | refused 503 | failed otherwise (HTTP) | lost (no HTTP answer) "
          "| attainment % | admitted after waiting | queue wait p50 / p99 / longest (s, modelled) | deadline (s, modelled) "
          "| refusals by reason |")
        w("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        failed_http = sum(r.get("failed_http_status", {}).values())

        def secs(x):
            return "n/a" if x is None else "%.3g" % (x / t)
        w("| %s | %s | %s | %s | %s | %s | %s | %s | %s / %s / %s | %g | %s |" % (
            r.get("slo_requests", "?"), r.get("slo_requests", 0) - r.get("failed", 0), r.get("http_429", 0),
            r.get("http_503", 0), failed_http - r.get("http_429", 0) - r.get("http_503", 0), lost,
            pct(r.get("slo_attainment")), a.get("waited", "?"), secs(a.get("wait_p50_s")), secs(a.get("wait_p99_s")),
            secs(a.get("wait_max_s")),
            deadline_s / t, ", ".join("%s %d" % kv for kv in sorted(a.get("refused", {}).items())) or "none"))
        w("")
    w("## Every run")
    w("")
    w("| variant | speed-up | requests | failed (429/503/other) | attainment % | goodput req/s "
      "| TTFT p50 / p99 (ms) | TBT p50 / p99 (ms) | router hit % | engine hit % | oracle hit % "
      "| prefill requests | prefill computed (k tokens) | decode requests | preemptions | lag (s) | load |")
    w("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- | --- | --- | ---: | ---: |")
    for v in variants:
        runs = results.get(v["name"], {})
        for speedup in sorted(runs):
            r = runs[speedup]
            failed = r.get("failed", 0)
            other = failed - r.get("http_429", 0) - r.get("http_503", 0)
            loads = r.get("prefill_loads", [])
            spread = "/".join("?" if l["requests"] is None else "%d" % l["requests"] for l in loads) or "n/a"
            work = ("/".join("%.0f" % (l["computed"] / 1000.0) for l in loads)
                    if loads and all(l["computed"] is not None for l in loads) else "n/a")
            decodes = r.get("decode_loads", [])
            decode_spread = "/".join("?" if l["requests"] is None else "%d" % l["requests"]
                                     for l in decodes) or "n/a"
            preempt = ["?" if l["preemptions"] is None else "%d" % l["preemptions"]
                       for l in loads + decodes]
            w("| %s | %g | %s | %s (%s/%s/%s) | %s | %.2f | %s / %s | %s / %s | %s | %s | %s | %s | %s | %s | %s | %.2f | %s |" % (
                v["name"], speedup, r.get("slo_requests", "?"), failed, r.get("http_429", 0),
                r.get("http_503", 0), other, pct(r.get("slo_attainment")),
                r.get("goodput", 0) * t,
                modelled_ms(r, "median_ttft_ms", t), modelled_ms(r, "p99_ttft_ms", t),
                modelled_ms(r, "median_tbt_ms", t), modelled_ms(r, "p99_tbt_ms", t),
                pct(r.get("router_prefix_hit_rate")), pct(r.get("engine_prefix_hit_rate")),
                pct(r.get("oracle_prefix_hit_rate")), spread, work, decode_spread,
                "/".join(preempt) or "n/a", r.get("max_send_lag_s", 0),
                "%.0f-%.0f" % tuple(r["load"]) if r.get("load") else "?"))
    w("")
    errors, runs_total = {}, 0
    for v in variants:
        for speedup, r in results.get(v["name"], {}).items():
            runs_total += 1
            for message, count in r.get("error_counts", {}).items():
                # One reason per kind: messages that differ only in numbers are one.
                key = re.sub(r"\d+", "N", message)[:200]
                entry = errors.setdefault(key, {"requests": 0, "runs": set()})
                entry["requests"] += count
                entry["runs"].add((v["name"], speedup))
    if errors:
        w("Failures by reason (numbers in a message shown as N), over the %d runs: " % runs_total
          + "; ".join("`%s`: %d requests in %d runs" % (k, e["requests"], len(e["runs"]))
                      for k, e in errors.items()) + ".")
        w("")
    return "\n".join(out) + "\n"


def write_window(args, work):
    """The replayed requests as a trace file of their own (pdrouter-bench times arrivals from its
    first line), and a sentence on what the window holds: its span, rate, prompts and the share of
    its prompt tokens an oracle cache (cold at its start) would hold."""
    with open(args.trace) as f:
        lines = [line for line in f if line.strip()]
    args.trace_lines = len(lines)
    if args.first is None:
        args.first = max(0, len(lines) - args.num_prompts)
    window = lines[args.first:args.first + args.num_prompts]
    if not window:
        raise SystemExit("goodput_bench.py: --first %d is past the trace's %d requests"
                         % (args.first, len(lines)))
    args.num_prompts = len(window)
    args.window_file = os.path.join(work, "window.jsonl")
    with open(args.window_file, "w") as f:
        f.writelines(window)
    rows = [json.loads(line) for line in window]
    args.window_rows = rows
    seen, hit, total = set(), 0, 0
    for r in rows:
        ids, hitting = r["hash_ids"], True
        total += r["input_length"]
        for i in range(min(len(ids), r["input_length"] // 512)):
            key = tuple(ids[:i + 1])
            if hitting and key in seen:
                hit += 512
            else:
                hitting = False
                seen.add(key)
    span = (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000.0
    too_long = sum(1 for r in rows if r["input_length"] + r["output_length"] > MAX_MODEL_LEN)
    args.window_text = ("%.0f s of trace, %.2f requests/s, prompts of %.0f tokens on average, "
                        "%.0f%% of prompt tokens in blocks an earlier request of the window shared%s"
                        % (span, (len(rows) - 1) / span if span > 0 else 0.0,
                           total / len(rows), 100.0 * hit / total,
                           "; %d of its requests exceed a max_model_len of %d tokens and are refused "
                           "(HTTP 400), so attainment tops out at %.1f%%"
                           % (too_long, MAX_MODEL_LEN, 100.0 * (len(rows) - too_long) / len(rows))
                           if too_long else ""))


def cost_model_in_sim_time(args):
    """predicted_latency's cost-model constants (topology defaults: GPU times) in the sims' time:
    pdrouter measures the sims' rates and step times in wall time, which runs 1/time-scale faster,
    and a constant left in GPU time would weigh that much more beside them (and an SLO compared
    with the prediction would be met or missed on the wrong figures)."""
    t = args.time_scale
    return {"default_prefill_tokens_per_second": max(1, round(8000 / t)),
            "default_decode_step_us": max(1, round(7500 * t)),
            "decode_step_us_per_sequence": round(18 * t),
            "decode_step_ns_per_kv_token": round(45 * t),
            "kv_transfer_ns_per_token": round(5000 * t),
            "kv_full_penalty_ms": round(1000 * t)}


def policy_text(policy):
    prefill, _, decode = policy.partition("/")
    return ("`%s` on both roles" % prefill if not decode else
            "`%s` for prefill, `%s` for decode" % (prefill, decode))


def variants_of(args):
    out = [{"name": p, "policy": p, "replicas": 1, "what": "%s, one pdrouter" % policy_text(p)}
           for p in args.policies]
    busy_ms = max(1, round(args.prefill_busy_ms * args.time_scale))
    # Half the TBT SLO as the TPOT SLO pdrouter predicts against: its prediction is a mean step,
    # while the TBT SLO judges each request's slowest tenth of token gaps, and a step carrying a
    # late chunk of a long prompt (its attention over the tokens before) costs about twice the
    # mean chunk. The full TBT SLO there let p99 TBT reach 150 ms (modelled) at speed-up 1.75.
    tpot_ms = max(1, round(args.slo_tbt_ms * args.time_scale / 2))
    for p in args.busy_decode_policies:
        # The decodes' token budget and that TPOT SLO: a decode that streams may take a prompt
        # whose one chunk a step keeps its steps within it.
        options = {"step_token_budget": args.decode_token_budget, "slo_tpot_ms": tpot_ms}
        out.append({"name": "%s + busy decode alone" % p, "policy": p, "replicas": 1,
                    "topology": "conditional_disaggregation:\n  enabled: true\n  prefill_busy_ms: %d\n" % busy_ms,
                    "policy_options": options,
                    "what": "%s, one pdrouter, with `conditional_disaggregation: {enabled: true, prefill_busy_ms: %d}` "
                            "(%g ms modelled) and `policies.predicted_latency: {step_token_budget: %d, "
                            "slo_tpot_ms: %d}` (the decodes' token budget; half the TBT SLO): a request goes to a "
                            "decode alone, which computes its prompt, while the prompts queued on its prefill "
                            "take that long or more and that decode's steps with one chunk of it stay within "
                            "the SLO"
                            % (policy_text(p), busy_ms, args.prefill_busy_ms, args.decode_token_budget, tpot_ms)})
    if args.etcd_policies and not os.access(ETCD, os.X_OK):
        print("goodput_bench.py: %s not found: no two-replica variant" % ETCD, file=sys.stderr)
        return out
    for p in args.etcd_policies:
        out.append({"name": "%s x2 etcd" % p, "policy": p, "replicas": 2,
                    "what": "%s, two pdrouter replicas sharing the registry through etcd "
                            "(`registry.backend: etcd`), each node registered with one of them, "
                            "requests sent to each replica in turn" % policy_text(p)})
    return out


def overload_variant(args, results):
    """The overload run after the sweep: (variant, speed-up), or None when there is none to run."""
    if not args.overload_policy:
        return None
    if args.overload_speedup is not None:
        speedup, why = args.overload_speedup, "speed-up %g (given)" % args.overload_speedup
    elif args.smoke:
        speedup, why = max(args.speedups), "the highest speed-up swept (smoke)"
    else:
        base = goodput_speedup(results.get("round_robin", {}), args.target)
        if not base:
            print("goodput_bench.py: round_robin has no goodput speed-up in this sweep: no overload run "
                  "(give --overload-speedup)", file=sys.stderr)
            return None
        speedup, why = 1.5 * base, "1.5x the speed-up where round_robin saturates (%g)" % base
    limit = args.overload_max_concurrent or (2 if args.smoke else 8 * args.prefills)
    limits = {"max_concurrent_requests": limit,
              "queue_timeout_ms": max(1, round(args.slo_ttft_ms * args.time_scale))}
    return ({"name": "%s + admission queue" % args.overload_policy, "policy": args.overload_policy,
             "replicas": 1, "limits": limits, "overload_why": why,
             "what": "%s, limits %s" % (policy_text(args.overload_policy), limits)}, speedup)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.environ.get("PDR_BUILD_DIR", os.path.join(ROOT, "build", "release")))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--results", default=os.path.join(HERE, "GOODPUT_RESULTS.md"))
    parser.add_argument("--trace", default=TRACE)
    parser.add_argument("--num-prompts", type=int, default=None,
                        help="requests replayed (default 400; smoke 24)")
    parser.add_argument("--first", type=int, default=None,
                        help="index of the first request replayed (default: the last --num-prompts "
                        "of the trace, where its prompts reuse the most)")
    parser.add_argument("--speedups", default=None,
                        help="comma-separated speed-ups of the trace's rate (default 0.5,0.75,0.875,1,1.125,1.25,1.5,2; smoke 2,8)")
    parser.add_argument("--policies", default=",".join(POLICIES),
                        help="routing policies by name, one variant each (any policy pdrouter knows; "
                        "PREFILL/DECODE for a different decode policy)")
    parser.add_argument("--etcd-policies", default="cache_aware",
                        help="policies also run with two replicas sharing an etcd registry ('' for none)")
    parser.add_argument("--busy-decode-policies", default="predicted_latency",
                        help="policies also run with conditional_disaggregation.prefill_busy_ms, an idle decode "
                        "computing a prompt itself while the prefills are busy ('' for none)")
    parser.add_argument("--prefill-busy-ms", type=float, default=250.0,
                        help="their prefill_busy_ms in modelled ms (scaled by --time-scale; default 250)")
    parser.add_argument("--decode-token-budget", type=int, default=512,
                        help="the decode sims' --max-num-batched-tokens (engine vllm; default 512: small "
                        "chunks, so a decode computing a prompt keeps its streams' steps short)")
    parser.add_argument("--prefills", type=int, default=None, help="prefill sims (default 2; smoke 1)")
    parser.add_argument("--decodes", type=int, default=None, help="decode sims (default 2; smoke 1)")
    parser.add_argument("--engine", choices=["auto", "vllm", "per-token"], default="auto")
    parser.add_argument("--time-scale", type=float, default=0.2,
                        help="wall seconds per modelled second (sims, arrivals, SLOs); default 0.2")
    parser.add_argument("--sim-flag", action="append", default=[],
                        help="extra pdnode sim flag, repeatable (e.g. --sim-flag=--num-gpu-blocks-override=4000)")
    parser.add_argument("--backend", choices=["completions", "generate"], default="completions")
    parser.add_argument("--slo-ttft-ms", type=float, default=10000.0)
    parser.add_argument("--slo-tbt-ms", type=float, default=100.0)
    parser.add_argument("--target", type=float, default=0.9, help="attainment a goodput needs")
    parser.add_argument("--request-timeout", type=float, default=120.0,
                        help="pdrouter-bench --timeout, wall seconds (a request waiting longer failed)")
    parser.add_argument("--note", default="", help="a sentence added to the results")
    parser.add_argument("--overload-policy", default="predicted_latency",
                        help="after the sweep, one run of this policy with the admission queue on, at "
                        "1.5x the speed-up where round_robin saturates ('' for none)")
    parser.add_argument("--overload-speedup", type=float, default=None,
                        help="the overload run's speed-up (default: 1.5x round_robin's goodput speed-up; "
                        "smoke: the highest swept)")
    parser.add_argument("--overload-max-concurrent", type=int, default=None,
                        help="limits.max_concurrent_requests of the overload run (default 8 per prefill "
                        "node; smoke 2); limits.queue_timeout_ms is the TTFT SLO in wall time")
    args = parser.parse_args()
    if args.num_prompts is None:
        args.num_prompts = 24 if args.smoke else 400
    if args.speedups is None:
        args.speedups = "2,8" if args.smoke else "0.5,0.75,0.875,1,1.125,1.25,1.5,2"
    args.speedups = sorted(float(s) for s in args.speedups.split(",") if s)
    args.policies = [p for p in args.policies.split(",") if p]
    args.etcd_policies = [p for p in args.etcd_policies.split(",") if p]
    args.busy_decode_policies = [p for p in args.busy_decode_policies.split(",") if p]
    if args.smoke and args.policies == POLICIES:
        args.policies = ["round_robin", "cache_aware", "predicted_latency"]
    if args.prefills is None:
        args.prefills = 1 if args.smoke else 2
    if args.decodes is None:
        args.decodes = 1 if args.smoke else 2
    if not 0 < args.time_scale <= 1000:
        parser.error("--time-scale must be in (0, 1000]")
    args.pdrouter = os.path.join(args.bin_dir, "router", "pdrouter")
    args.pdnode = os.path.join(args.bin_dir, "node", "pdnode")
    args.bench = os.path.join(args.bin_dir, "bench", "loadgen", "pdrouter-bench")
    for b in (args.pdrouter, args.pdnode, args.bench):
        if not os.access(b, os.X_OK):
            print("goodput_bench.py: %s is not built (ninja -C %s pdrouter pdnode pdrouter-bench)"
                  % (b, args.bin_dir), file=sys.stderr)
            return 2
    help_text = sim_help(args.pdnode)
    args.help_text = help_text
    has_engine = "--engine" in help_text and "--time-scale" in help_text
    if args.engine == "auto":
        args.engine = "vllm" if has_engine else "per-token"
    if args.engine == "vllm" and not has_engine:
        print("goodput_bench.py: this pdnode has no --engine vllm", file=sys.stderr)
        return 2
    if args.engine == "vllm":
        args.engine_flags = ["--engine", "vllm", "--time-scale", "%g" % args.time_scale]
    else:
        # The per-token sims have no time scale: their per-token times are scaled here. Prefill
        # 20 us/token and 7.5 ms per decoded token: an 8B model on one H100, one request alone.
        args.engine_flags = ["--prefill-us-per-token", "%d" % max(1, round(20 * args.time_scale)),
                             "--decode-us-per-token", "%d" % max(1, round(7500 * args.time_scale)),
                             "--max-model-len", str(MAX_MODEL_LEN)]
    args.node_flags = args.engine_flags + args.sim_flag
    args.decode_flags = (["--max-num-batched-tokens", str(args.decode_token_budget)]
                         if args.engine == "vllm" and args.decode_token_budget > 0 else [])

    variants = variants_of(args)
    work = tempfile.mkdtemp(prefix="pdr-goodput-bench.")
    write_window(args, work)
    procs = Processes(work)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    started = datetime.datetime.now(datetime.timezone.utc)
    results = {}
    status = 0
    # Speed-up by speed-up, every variant at each: a machine whose load changes over the sweep
    # then weighs on every variant alike, not on whichever ran during a busy spell.
    saturated = set()
    try:
        for speedup in args.speedups:
            for v in variants:
                if v["name"] in saturated:
                    continue
                runs = results.setdefault(v["name"], {})
                r = run_one(args, procs, v, speedup)
                runs[speedup] = r
                lost = r.get("failed", 0) - sum(r.get("failed_http_status", {}).values())
                if "slo_attainment" not in r or r["bench_rc"] not in (0, 1):
                    print("goodput_bench.py: %s at %g: pdrouter-bench exit %d, no result"
                          % (v["name"], speedup, r["bench_rc"]), file=sys.stderr)
                    status = 1
                elif args.smoke and lost > 0:
                    print("goodput_bench.py: %s at %g: %d requests failed without an HTTP answer: %s"
                          % (v["name"], speedup, lost, r.get("error_counts")), file=sys.stderr)
                    status = 1
                print("    attainment %s%%, goodput %.2f req/s (modelled), %.1f s wall"
                      % (pct(r.get("slo_attainment")), r.get("goodput", 0) * args.time_scale,
                         r["wall_s"]), flush=True)
                if not args.smoke and r.get("slo_attainment", 0) < STOP_BELOW:
                    saturated.add(v["name"])
        over = overload_variant(args, results)
        if over is not None and status == 0:
            v, speedup = over
            r = run_one(args, procs, v, speedup)
            lost = r.get("failed", 0) - sum(r.get("failed_http_status", {}).values())
            if "slo_attainment" not in r or r["bench_rc"] not in (0, 1):
                print("goodput_bench.py: overload run: pdrouter-bench exit %d, no result" % r["bench_rc"],
                      file=sys.stderr)
                status = 1
            elif lost > 0 or "admission" not in r:
                print("goodput_bench.py: overload run: %d requests got no HTTP answer: %s"
                      % (lost, r.get("error_counts")), file=sys.stderr)
                status = 1
            args.overload_result = (v, speedup, r)
            print("    overload: attainment %s%%, %d answered 429, %d 503, queue %s"
                  % (pct(r.get("slo_attainment")), r.get("http_429", 0), r.get("http_503", 0),
                     r.get("admission")), flush=True)
    except KeyboardInterrupt:
        status = 130
    except (RuntimeError, OSError) as e:
        print("goodput_bench.py: %s" % e, file=sys.stderr)
        status = 1
    finally:
        procs.stop_all()
    if status == 0 or (results and status != 130):
        text = render(args, variants, results, started)
        results_path = os.path.join(work, "GOODPUT_RESULTS.md") if args.smoke else args.results
        with open(results_path, "w") as f:
            f.write(text)
        print(text)
        if not args.smoke:
            print("goodput_bench.py: wrote %s" % results_path)
    shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
