#!/usr/bin/env python3
"""Cache-aware routing benchmark: the same cache workloads through pdrouter under the
routing policies round_robin (the baseline), least_outstanding and cache_aware, on 4 prefill +
4 decode `pdnode sim` nodes (NIXL), all on this machine's loopback, in one run.

Workloads (pdrouter-bench --dataset-name, deterministic by --seed):
  shared_prefix       prefix_repetition: a few long shared prefixes + random suffixes, text
  shared_prefix_ids   the same with token-id prompts (/v1/completions with an integer array)
  multi_turn          chat conversations whose turns extend the previous prompt and answer
  multi_turn_reuse    the same conversations with a conversation_id, under cache_aware, with
                      pdrouter's multi-turn KV reuse (multi_turn.enabled) off and on: the sims run
                      --bidirectional-kv-xfer, so with reuse on each turn's prefill pulls the
                      blocks (prompt and answer) the last turn's decode kept

For each (workload, policy) a fresh pdrouter and fresh sims (cold caches) are started, the workload
is run, and the table reports mean and P99 TTFT, throughput, failures and three prefix-hit rates:
  router   pdrouter's own estimate, /metrics pdrouter_cache_routing_matched_units_total /
           _prompt_units_total of the prefill leg (tokens from KV events, bytes of prompt text from
           its prefix tree); only a cache_aware policy looks up, else n/a
  sims     the prefill sims' own prefix caches: hit / queried tokens (GET /sim/prefix_cache, or
           /sim/requests counters) when the sims have a prefix cache, else n/a
  oracle   from the workload itself: share of prompt tokens, in whole blocks, already sent in an
           earlier request (pdrouter-bench's oracle: every cache known, nothing evicted)
TTFT is compared with round_robin's on the same workload. The issue's target: cache_aware cuts
mean TTFT at least 2x versus round_robin on the shared-prefix and multi-turn workloads at a load
where round robin is not saturated, and its sim hit rate is within 10 points of the oracle.

  bench/serving/cache_bench.py [--bin-dir DIR] [--smoke] [--results FILE] [--request-rate R]
      [--prefill-us-per-token US] [--decode-us-per-token US] [--policies a,b,c]
      [--workloads a,b] [--kv-backends LIST] [--prefix-cache-blocks N] [--sim-flag=FLAG ...]
      [--note TEXT]

--smoke (CTest bench.serving_cache): tiny workloads, results in a temporary file; fails if any
request fails or a number is missing. Every process started here is stopped on exit.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
from machine import machine  # noqa: E402

POLICIES = ["round_robin", "least_outstanding", "cache_aware"]
BASELINE = "round_robin"
# The multi-turn reuse comparison: its own rows, cache_aware with multi_turn.enabled off / on.
REUSE_WORKLOAD = "multi_turn_reuse"
REUSE_VARIANTS = [("reuse off", False), ("reuse on", True)]
NODES_PER_ROLE = 4
START_TIMEOUT_S = 20.0 * float(os.environ.get("PDR_TIME_SCALE", "1"))


def workloads(smoke):
    """name -> (pdrouter-bench flags, what it is)."""
    if smoke:
        prefix = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "160",
                  "--prefix-repetition-suffix-len", "16", "--prefix-repetition-num-prefixes", "2",
                  "--prefix-repetition-output-len", "4", "--num-prompts", "12"]
        multi = ["--dataset-name", "multi_turn", "--backend", "openai-chat",
                 "--multi-turn-num-conversations", "3", "--multi-turn-num-turns", "3",
                 "--multi-turn-input-len", "48", "--multi-turn-output-len", "4"]
    else:
        # Sized against the sims' prefix caches (--prefix-cache-blocks, default 1024 blocks of 16
        # tokens per node): 16 prefixes of 2,000 tokens are 2,000 blocks, 4 per node (500 blocks)
        # when each prefix stays on one node, all 16 on every node under round robin; 23
        # conversations end at ~2,100 tokens (~130 blocks), 6 per node (~780 blocks) when each
        # stays on one node. A cache that holds everything would make every policy hit. 23, not
        # 24: turns go out turn by turn, so with a multiple of the 4 nodes round robin would
        # keep every conversation on one node by accident.
        prefix = ["--dataset-name", "prefix_repetition", "--prefix-repetition-prefix-len", "2000",
                  "--prefix-repetition-suffix-len", "100", "--prefix-repetition-num-prefixes", "16",
                  "--prefix-repetition-output-len", "16", "--num-prompts", "240"]
        multi = ["--dataset-name", "multi_turn", "--backend", "openai-chat",
                 "--multi-turn-num-conversations", "23", "--multi-turn-num-turns", "5",
                 "--multi-turn-input-len", "400", "--multi-turn-output-len", "32"]
    return {
        "shared_prefix": (prefix, "prefix_repetition, text prompts, /v1/completions"),
        "shared_prefix_ids": (prefix + ["--prompt-format", "token-ids"],
                              "prefix_repetition, token-id prompts, /v1/completions"),
        "multi_turn": (multi, "multi_turn, chat messages, /v1/chat/completions"),
        REUSE_WORKLOAD: (multi + ["--multi-turn-conversation-id"],
                         "multi_turn with conversation_id, cache_aware, multi-turn KV reuse off vs on"),
    }


class Processes:
    """Every process started, stopped (SIGTERM, then SIGKILL) by stop_all."""

    def __init__(self, work):
        self.work = work
        self.procs = []

    def start(self, name, argv):
        out = open(os.path.join(self.work, name + ".out"), "w")
        err = open(os.path.join(self.work, name + ".err"), "w")
        proc = subprocess.Popen(argv, stdout=out, stderr=err)
        self.procs.append(proc)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(out.name) as f:
                for line in f:
                    if "listening" in line:
                        return line
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        with open(err.name) as f:
            raise RuntimeError("%s did not start: %s" % (name, f.read()[-2000:]))

    def stop_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.procs = []


def field(line, key):
    m = re.search(r"\b%s=(\S+)" % key, line)
    if not m:
        raise RuntimeError("no %s= in %r" % (key, line))
    return m.group(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def get(url, timeout=5.0):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def get_json(url):
    try:
        return json.loads(get(url))
    except (OSError, ValueError):
        return None


def sim_help(pdnode):
    return subprocess.run([pdnode, "sim", "--help"], capture_output=True, text=True).stdout


class Deployment:
    """One pdrouter with the policy on both roles and 4 prefill + 4 decode NIXL sims registered."""

    def __init__(self, procs, args, policy, kv_events, reuse=None):
        """reuse: None (no multi-turn setting), False / True: multi_turn.enabled, with sims that
        play bidirectional NIXL (--bidirectional-kv-xfer) either way."""
        self.procs, self.args = procs, args
        topo = os.path.join(procs.work, "topology-%s.yaml" % policy)
        with open(topo, "w") as f:
            f.write("policies:\n  prefill: %s\n  decode: %s\n" % (policy, policy))
            f.write("kv_events:\n  enabled: %s\n" % ("true" if kv_events else "false"))
            if reuse is not None:
                f.write("multi_turn:\n  enabled: %s\n" % ("true" if reuse else "false"))
        line = procs.start("pdrouter-" + policy, [args.pdrouter, "-c", topo, "--http", "127.0.0.1:0",
                                                  "--discovery", "tcp://127.0.0.1:0",
                                                  "--log-level", "warn"])
        self.http = field(line, "http")
        discovery = field(line, "discovery")
        flags = ["--connector", "nixl", "--kv-backends", args.kv_backends,
                 "--prefill-us-per-token", str(args.prefill_us), "--decode-us-per-token",
                 str(args.decode_us), "--max-model-len", "65536", "--register", discovery,
                 "--register-interval-ms", "500", "--log-level", "warn"] + args.sim_flag
        if args.kv_backends != "none":
            flags += ["--kv-port", "0"]
        if args.sim_has_prefix_cache:
            flags += ["--prefix-cache-blocks", str(args.prefix_cache_blocks)]
        if reuse is not None:
            flags += ["--bidirectional-kv-xfer"]
        self.prefills = []
        for role in ("prefill", "decode"):
            for i in range(NODES_PER_ROLE):
                node_flags = list(flags)
                if kv_events:
                    node_flags += ["--kv-events-endpoint", "tcp://127.0.0.1:%d" % free_port()]
                line = procs.start("%s-%s%d" % (policy, role, i),
                                   [args.pdnode, "sim", "--role", role] + node_flags)
                if role == "prefill":
                    self.prefills.append(field(line, "http"))
        self.wait_ready()

    def wait_ready(self):
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            status = get_json("http://%s/status" % self.http) or {}
            up = [i for i in status.get("instances", []) if i.get("state") == "up"]
            if len(up) == 2 * NODES_PER_ROLE:
                return
            time.sleep(0.1)
        raise RuntimeError("pdrouter %s: the %d sims did not all register" % (self.http, 2 * NODES_PER_ROLE))

    def router_hit_rate(self):
        """matched / prompt units of the prefill leg from /metrics, None without lookups."""
        text = get("http://%s/metrics" % self.http)
        sums = {"matched": 0.0, "prompt": 0.0}
        for line in text.splitlines():
            m = re.match(r'pdrouter_cache_routing_(matched|prompt)_units_total\{([^}]*)\}\s+(\S+)', line)
            if m and 'leg="prefill"' in m.group(2):
                sums[m.group(1)] += float(m.group(3))
        return sums["matched"] / sums["prompt"] if sums["prompt"] > 0 else None

    def sim_hit_rate(self):
        """hit / queried tokens summed over the prefill sims' prefix caches, None without one."""
        hit = queried = 0
        for node in self.prefills:
            stats = get_json("http://%s/sim/prefix_cache" % node)
            if isinstance(stats, dict) and isinstance(stats.get("ranks"), list):
                for rank in stats["ranks"]:
                    hit += rank.get("hit_tokens", 0)
                    queried += rank.get("queried_tokens", 0)
                continue
            counters = (get_json("http://%s/sim/requests" % node) or {}).get("counters", {})
            if "prefix_cache_hit_tokens" in counters and "prefix_cache_queried_tokens" in counters:
                hit += counters["prefix_cache_hit_tokens"]
                queried += counters["prefix_cache_queried_tokens"]
            else:
                return None
        return hit / queried if queried > 0 else None

    def reuse_rates(self):
        """(share of turns that reused the last turn's decode KV, per pdrouter's
        pdrouter_multi_turn_turns_total; share of the prefill sims' prompt tokens pulled from a
        decode instead of computed, per their kv_reused_tokens / prefix_cache_queried_tokens)."""
        text = get("http://%s/metrics" % self.http)
        turns = {}
        for line in text.splitlines():
            m = re.match(r'pdrouter_multi_turn_turns_total\{result="(\w+)"\}\s+(\S+)', line)
            if m:
                turns[m.group(1)] = float(m.group(2))
        total = sum(turns.values())
        reused = turns.get("reused", 0.0) / total if total > 0 else None
        pulled = queried = 0
        for node in self.prefills:
            counters = (get_json("http://%s/sim/requests" % node) or {}).get("counters", {})
            pulled += counters.get("kv_reused_tokens", 0)
            queried += counters.get("prefix_cache_queried_tokens", 0)
        return reused, (min(pulled, queried) / queried if queried > 0 else None)


def run_one(args, procs, workload, flags, policy, kv_events, reuse=None):
    dep = Deployment(procs, args, policy, kv_events, reuse)
    out = os.path.join(procs.work, "%s-%s.json" % (workload, policy))
    cmd = [args.bench, "--base-url", "http://" + dep.http, "--seed", str(args.seed),
           "--request-rate", str(args.request_rate), "--no-test-request", "--no-progress",
           "--json", out, "--timeout", "120"] + flags
    print("=== %s, policy %s%s: %s" % (workload, policy, "" if reuse is None else
                                        ", multi-turn reuse %s" % ("on" if reuse else "off"),
                                        " ".join(cmd[1:])), flush=True)
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
    result = json.load(open(out)) if os.path.exists(out) else {}
    result["bench_rc"] = rc
    result["router_hit_rate"] = dep.router_hit_rate()
    result["sim_hit_rate"] = dep.sim_hit_rate()
    if reuse is not None:
        result["turns_reused"], result["kv_reused"] = dep.reuse_rates()
    procs.stop_all()
    return result


def pct(x):
    return "n/a" if x is None else "%.1f" % (100.0 * x)


def render(args, results, kv_events, started):
    m = machine()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    lines = []
    w = lines.append
    w("# Cache-aware routing benchmark: round_robin vs least_outstanding vs cache_aware")
    w("")
    w("Produced by `bench/serving/cache_bench.py`%s (do not edit by hand). %s UTC, commit %s."
      % (" --smoke" if args.smoke else "", started.strftime("%Y-%m-%d %H:%M"), commit))
    w("")
    w("**What**: pdrouter-bench's cache workloads through pdrouter, each under the routing "
      "policies %s (the same policy for prefill and decode), with the same seed (%d: the same "
      "prompts and arrival times) at %s requests/s (Poisson arrivals):" % (", ".join(args.policies),
                                                                        args.seed, args.request_rate))
    w("")
    for name in args.workloads:
        flags, what = workloads(args.smoke)[name]
        w("- `%s`: %s: `pdrouter-bench %s`" % (name, what, " ".join(flags)))
    w("")
    w("**How**: for each run a fresh pdrouter and %d prefill + %d decode `pdnode sim` nodes "
      "(connector nixl, KV backends `%s`, prefill %d us/token, decode %d us/token%s%s) are started "
      "on this machine's loopback, so every run begins with cold caches. TTFT includes the "
      "prefill leg (NIXL sends the prefill first). Hit rates: *router* = pdrouter's "
      "`pdrouter_cache_routing_matched_units_total / _prompt_units_total` for the prefill leg "
      "(tokens from KV events, else bytes of prompt text from its prefix tree; only cache_aware "
      "looks up); *sims* = the prefill sims' own prefix caches, hit / queried tokens; *oracle* = "
      "the workload's own reuse: prompt tokens, in whole %d-token blocks, already sent in an "
      "earlier request (every cache known, none evicted)."
      % (NODES_PER_ROLE, NODES_PER_ROLE, args.kv_backends, args.prefill_us, args.decode_us,
         (", KV events published and subscribed to" if kv_events else "") +
         (", prefix cache of %d blocks per node" % args.prefix_cache_blocks
          if args.sim_has_prefix_cache else ", no prefix cache in these sims"),
         (", sim flags `%s`" % " ".join(args.sim_flag)) if args.sim_flag else "", 16))
    w("")
    if args.note:
        w("**Note**: %s" % args.note)
        w("")
    w("**Machine**: %s, %d cores, %s, load %s." % (m["cpu"], m["nproc"], m["kernel"], m["load"]))
    w("")
    w("| workload | policy | ok | failed | mean TTFT (ms) | P99 TTFT (ms) | %s mean TTFT / this "
      "| req/s | output tok/s | router hit %% | sims hit %% | oracle hit %% |" % BASELINE)
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name in args.workloads:
        if name == REUSE_WORKLOAD:
            continue
        base = results.get((name, BASELINE), {}).get("mean_ttft_ms")
        for policy in args.policies:
            r = results.get((name, policy))
            if r is None:
                continue
            ttft = r.get("mean_ttft_ms")
            ratio = "%.2fx" % (base / ttft) if base and ttft else "n/a"
            if policy == BASELINE:
                ratio = "baseline"
            w("| %s | %s | %s | %s | %.2f | %.2f | %s | %.3f | %.1f | %s | %s | %s |" % (
                name, policy, r.get("completed", 0), r.get("failed", "?"), ttft or 0,
                r.get("p99_ttft_ms", 0), ratio, r.get("request_throughput", 0),
                r.get("output_throughput", 0), pct(r.get("router_hit_rate")),
                pct(r.get("sim_hit_rate")), pct(r.get("oracle_prefix_hit_rate"))))
    w("")
    if REUSE_WORKLOAD in args.workloads:
        w("**Multi-turn KV reuse** (`%s`: the `multi_turn` conversations sent with a "
          "`conversation_id`, policy cache_aware, sims with `--bidirectional-kv-xfer`; "
          "`multi_turn.enabled` off, then on). *turns reused* = pdrouter's "
          "`pdrouter_multi_turn_turns_total{result=\"reused\"}` / all turns; *sims KV pulled* = "
          "the prefill sims' prompt tokens pulled from the last turn's decode (`kv_reused_tokens`) "
          "/ prompt tokens; *sims hit* = their own prefix caches, as above. A prefill computes only "
          "what neither it nor the pulled blocks hold." % REUSE_WORKLOAD)
        w("")
        w("| workload | multi-turn reuse | ok | failed | mean TTFT (ms) | P99 TTFT (ms) | off mean TTFT / this "
          "| turns reused % | sims KV pulled % | sims hit % | oracle hit % |")
        w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        off = results.get((REUSE_WORKLOAD, REUSE_VARIANTS[0][0]), {}).get("mean_ttft_ms")
        for label, _ in REUSE_VARIANTS:
            r = results.get((REUSE_WORKLOAD, label))
            if r is None:
                continue
            ttft = r.get("mean_ttft_ms")
            ratio = "baseline" if label == REUSE_VARIANTS[0][0] else (
                "%.2fx" % (off / ttft) if off and ttft else "n/a")
            w("| %s | %s | %s | %s | %.2f | %.2f | %s | %s | %s | %s | %s |" % (
                REUSE_WORKLOAD, label.split()[1], r.get("completed", 0), r.get("failed", "?"), ttft or 0,
                r.get("p99_ttft_ms", 0), ratio, pct(r.get("turns_reused")), pct(r.get("kv_reused")),
                pct(r.get("sim_hit_rate")), pct(r.get("oracle_prefix_hit_rate"))))
        w("")
    if all(r.get("sim_hit_rate") is None for r in results.values()):
        w("**Read this first**: the sims in this build have no prefix cache (GET /sim/prefix_cache "
          "and prefix-cache counters in /sim/requests are absent): their prefill time does not "
          "depend on what they computed before, so no policy can lower TTFT through caching here. "
          "The TTFT columns show routing overhead and load spread only; the *router* and *oracle* "
          "columns show where cache_aware sent the prompts. The TTFT target can only be judged "
          "with sims whose prefill time counts uncached tokens only (the `simcache` work).")
        w("")
    w("**Against the issue's target** (cache_aware mean TTFT at least 2x lower than round_robin; "
      "its sims' hit rate within 10 points of the oracle):")
    w("")
    for name in args.workloads:
        if (name, "cache_aware") not in results or (name, BASELINE) not in results:
            continue
        ca, rr = results[(name, "cache_aware")], results[(name, BASELINE)]
        speedup = (rr.get("mean_ttft_ms") or 0) / ca["mean_ttft_ms"] if ca.get("mean_ttft_ms") else 0
        sim, oracle = ca.get("sim_hit_rate"), ca.get("oracle_prefix_hit_rate")
        hit_text = ("no sim prefix cache to read (n/a)" if sim is None else
                    "sims %.1f%% vs oracle %.1f%%: %s" % (100 * sim, 100 * (oracle or 0),
                                                          "met" if oracle is not None and
                                                          100 * (oracle - sim) <= 10 else "NOT met"))
        w("- `%s`: TTFT %.2fx: %s; hit rate: %s." % (name, speedup, "met" if speedup >= 2 else "NOT met",
                                                   hit_text))
    w("")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.environ.get("PDR_BUILD_DIR", os.path.join(ROOT, "build", "release")))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--results", default=os.path.join(HERE, "CACHE_RESULTS.md"))
    parser.add_argument("--request-rate", type=float, default=None,
                        help="requests/s (default 10; smoke 50)")
    parser.add_argument("--prefill-us-per-token", dest="prefill_us", type=int, default=50)
    parser.add_argument("--decode-us-per-token", dest="decode_us", type=int, default=2000)
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--workloads", default="shared_prefix,shared_prefix_ids,multi_turn," + REUSE_WORKLOAD)
    parser.add_argument("--kv-backends", default="none",
                        help="the sims' --kv-backends (default none: no KV bytes move, which on a "
                        "small machine would cost CPU that is not the subject here)")
    parser.add_argument("--sim-flag", action="append", default=[],
                        help="extra pdnode sim flag, repeatable (e.g. --sim-flag=--kv-block-tokens=16)")
    parser.add_argument("--prefix-cache-blocks", type=int, default=1024,
                        help="each sim's prefix cache, in 16-token blocks, when the sims have one "
                        "(default 1024: a node holds half a GPU's worth of a small model's cache, "
                        "less than the whole workload, as on a real fleet)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--note", default="",
                        help="a sentence added to the results (e.g. where the binaries came from)")
    args = parser.parse_args()
    args.policies = [p for p in args.policies.split(",") if p]
    args.workloads = [w for w in args.workloads.split(",") if w]
    for w in args.workloads:
        if w not in workloads(args.smoke):
            parser.error("unknown workload %s" % w)
    if args.request_rate is None:
        args.request_rate = 50.0 if args.smoke else 10.0
    if args.smoke:
        args.decode_us = min(args.decode_us, 1000)
    args.pdrouter = os.path.join(args.bin_dir, "router", "pdrouter")
    args.pdnode = os.path.join(args.bin_dir, "node", "pdnode")
    args.bench = os.path.join(args.bin_dir, "bench", "loadgen", "pdrouter-bench")
    for b in (args.pdrouter, args.pdnode, args.bench):
        if not os.access(b, os.X_OK):
            print("cache_bench.py: %s is not built (ninja -C %s pdrouter pdnode pdrouter-bench)"
                  % (b, args.bin_dir), file=sys.stderr)
            return 2
    # The sims' KV events publisher (the simcache work): subscribe when the sims have it.
    help_text = sim_help(args.pdnode)
    kv_events = "--kv-events-endpoint" in help_text
    args.sim_has_prefix_cache = "--prefix-cache-blocks" in help_text

    work = tempfile.mkdtemp(prefix="pdr-cache-bench.")
    procs = Processes(work)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(130))
    started = datetime.datetime.now(datetime.timezone.utc)
    results = {}
    status = 0
    try:
        for name in args.workloads:
            flags = workloads(args.smoke)[name][0]
            runs = ([(label, "cache_aware", reuse) for label, reuse in REUSE_VARIANTS]
                    if name == REUSE_WORKLOAD else [(policy, policy, None) for policy in args.policies])
            for key, policy, reuse in runs:
                r = run_one(args, procs, name, flags, policy, kv_events, reuse)
                results[(name, key)] = r
                if r["bench_rc"] != 0 or r.get("failed", 1) != 0 or not r.get("completed"):
                    print("cache_bench.py: %s under %s: pdrouter-bench exit %d, %s failed"
                          % (name, policy, r["bench_rc"], r.get("failed", "?")), file=sys.stderr)
                    status = 1
                if args.smoke and reuse and not r.get("turns_reused"):
                    print("cache_bench.py: %s: no turn reused the decode's KV" % name, file=sys.stderr)
                    status = 1
                if args.smoke and policy == "cache_aware" and r.get("router_hit_rate") is None:
                    print("cache_bench.py: %s under cache_aware: no cache lookups in /metrics" % name,
                          file=sys.stderr)
                    status = 1
    except KeyboardInterrupt:
        status = 130
    except (RuntimeError, OSError) as e:
        print("cache_bench.py: %s" % e, file=sys.stderr)
        status = 1
    finally:
        procs.stop_all()
    if status == 0 or (results and status != 130):
        text = render(args, results, kv_events, started)
        results_path = os.path.join(work, "CACHE_RESULTS.md") if args.smoke else args.results
        with open(results_path, "w") as f:
            f.write(text)
        print(text)
        if not args.smoke:
            print("cache_bench.py: wrote %s" % results_path)
    shutil.rmtree(work, ignore_errors=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
