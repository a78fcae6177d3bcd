#!/usr/bin/env python3
"""The P/D handover per connector dialect, and NIXL push vs pull: the same streamed workload through
pdrouter to one prefill + one decode `pdnode sim` pair of each dialect (real KV bytes moved over the
transfer engine, tcp, and verified by the decode; the sims' per-token model: prefill US per prompt
token, decode US per output token), all on this machine's loopback, in one run.

For each dialect a fresh pdrouter and pair are started, pdrouter-bench sends the workload (random
prompts, streamed /v1/completions, fixed seed: the same prompts and arrival times every time), and
the table reports the client's TTFT (pdrouter-bench) next to pdrouter's own phase histograms for
that dialect (pdrouter_pd_prefill_seconds, pdrouter_pd_handover_seconds,
pdrouter_pd_decode_seconds{dialect}: router/proxy/pd_phases.h): their means, and p50 / p99
interpolated in the buckets as Prometheus' histogram_quantile does. Then NIXL pull (serial: the
decode is sent once the prefill answered, and READs the blocks) against NIXL push (both legs at
once: the decode registers its blocks while the prefill computes and the prefill WRITEs into them).

  bench/serving/handover_bench.py [--bin-dir DIR] [--smoke] [--results FILE] [--num-prompts N]
      [--input-len N] [--output-len N] [--request-rate R] [--prefill-us-per-token US]
      [--decode-us-per-token US] [--dialects a,b]

A full run takes ~2 min; writes bench/serving/HANDOVER_RESULTS.md. --smoke (CTest
bench.serving_handover): 6 short prompts per dialect, results in a temporary file; fails if a
request fails or a dialect's phases were not observed. Every process started here is stopped on exit.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
from cache_bench import Processes, field, get, get_json, START_TIMEOUT_S  # noqa: E402
from machine import machine  # noqa: E402

# (dialect label as pdrouter exports it, pdnode sim flags, order)
DIALECTS = [
    ("nixl", ["--connector", "nixl"], "serial"),
    ("nixl-push", ["--connector", "nixl-push"], "concurrent"),
    ("moriio-read", ["--connector", "moriio", "--transfer-mode", "READ"], "serial"),
    ("moriio-write", ["--connector", "moriio", "--transfer-mode", "WRITE"], "concurrent"),
    ("mooncake", ["--connector", "mooncake"], "concurrent"),
    ("p2p-nccl", ["--connector", "p2p-nccl"], "serial"),
    ("sglang", ["--connector", "sglang"], "concurrent"),
]
PHASES = ("prefill", "handover", "decode")


def histogram(metrics_text, family, dialect):
    """(bounds, cumulative counts, sum, count) of family{dialect=...} from /metrics text."""
    buckets, total, count = [], 0.0, 0.0
    for line in metrics_text.splitlines():
        m = re.match(r'%s_(bucket|sum|count)\{([^}]*)\}\s+(\S+)$' % family, line)
        if not m or ('dialect="%s"' % dialect) not in m.group(2):
            continue
        value = float(m.group(3))
        if m.group(1) == "bucket":
            le = re.search(r'le="([^"]+)"', m.group(2)).group(1)
            buckets.append((float("inf") if le == "+Inf" else float(le), value))
        elif m.group(1) == "sum":
            total = value
        else:
            count = value
    return sorted(buckets), total, count


def quantile(q, buckets):
    """Prometheus histogram_quantile over cumulative (le, count) buckets, in seconds."""
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    prev_le, prev_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            width = count - prev_count
            return prev_le + (le - prev_le) * ((rank - prev_count) / width if width else 0)
        prev_le, prev_count = le, count
    return prev_le


def ready(http):
    try:
        get("http://%s/ready" % http)
        return True
    except OSError:
        return False


def run_dialect(args, procs, name, sim_flags):
    line = procs.start("pdrouter-" + name, [args.pdrouter, "--http", "127.0.0.1:0",
                                            "--discovery", "tcp://127.0.0.1:0", "--log-level", "warn"])
    http, discovery = field(line, "http"), field(line, "discovery")
    common = sim_flags + ["--kv-backends", "tcp", "--kv-port", "0", "--handshake-port", "0",
                          "--notify-port", "0", "--kv-blocks", "4096", "--max-model-len", "16384",
                          "--prefill-us-per-token", str(args.prefill_us),
                          "--decode-us-per-token", str(args.decode_us),
                          "--register", discovery, "--register-interval-ms", "500",
                          "--log-level", "warn"]
    prefill_extra = ["--bootstrap-port", "0"] if name == "mooncake" else []
    procs.start(name + "-prefill", [args.pdnode, "sim", "--role", "prefill"] + common + prefill_extra)
    procs.start(name + "-decode", [args.pdnode, "sim", "--role", "decode"] + common)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        up = [i for i in (get_json("http://%s/status" % http) or {}).get("instances", []) if i.get("state") == "up"]
        if len(up) == 2 and ready(http):
            break
        time.sleep(0.1)
    else:
        raise RuntimeError("%s: the sims did not register" % name)
    out = os.path.join(procs.work, name + ".json")
    cmd = [args.bench, "--base-url", "http://" + http, "--dataset-name", "random",
           "--random-input-len", str(args.input_len), "--random-output-len", str(args.output_len),
           "--num-prompts", str(args.num_prompts), "--request-rate", str(args.request_rate),
           "--seed", "1", "--no-test-request", "--no-progress", "--json", out, "--timeout", "120"]
    print("=== %s: %s" % (name, " ".join(cmd[1:])), flush=True)
    rc = subprocess.run(cmd, stdout=subprocess.DEVNULL).returncode
    result = json.load(open(out)) if os.path.exists(out) else {}
    result["bench_rc"] = rc
    # The phases are recorded as each request ends (an orphaned concurrent prefill may end a little
    # after its answer): wait until every phase counted every request, or a few seconds.
    want = result.get("completed", 0)
    phases = {}
    deadline = time.monotonic() + 5
    while True:
        text = get("http://%s/metrics" % http)
        phases = {ph: histogram(text, "pdrouter_pd_%s_seconds" % ph, name) for ph in PHASES}
        if all(phases[ph][2] >= want for ph in PHASES) or time.monotonic() >= deadline:
            break
        time.sleep(0.1)
    result["phases"] = phases
    procs.stop_all()
    return result


def ms(x):
    return "n/a" if x is None else "%.2f" % (1000.0 * x)


def render(args, results, started):
    m = machine()
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "unknown"
    lines = []
    w = lines.append
    w("# P/D handover per dialect, and NIXL push vs pull")
    w("")
    w("Produced by `bench/serving/handover_bench.py`%s (do not edit by hand). %s, commit %s."
      % (" --smoke" if args.smoke else "", started, commit))
    w("")
    w("**What**: %d random prompts of %d tokens, %d output tokens, %s requests/s (Poisson), streamed "
      "`/v1/completions` (pdrouter-bench, seed 1: the same prompts and arrival times for every "
      "dialect), through pdrouter to one prefill + one decode `pdnode sim` of each dialect, "
      "moving each prompt's real KV bytes over the transfer engine (tcp) and verifying them on the "
      "decode. Sim model: prefill %d us per prompt token (%.0f ms a prompt), decode %d us per output "
      "token." % (args.num_prompts, args.input_len, args.output_len, args.request_rate,
                  args.prefill_us, args.prefill_us * args.input_len / 1000.0, args.decode_us))
    w("")
    w("**Columns**: TTFT as the client measured it; then pdrouter's own phase histograms for the "
      "dialect (`pdrouter_pd_*_seconds{dialect}`, router/proxy/pd_phases.h): *prefill* = the "
      "prefill leg sent to its answer complete; *handover* = the prefill's answer complete to the "
      "decode's first body byte (serial dialects: sending the decode, its KV pull and first token; "
      "concurrent ones, whose decode left with the prefill: the KV push and first token); "
      "*decode* = the decode leg sent to its answer complete. p50/p99 interpolated within the "
      "histogram buckets as Prometheus' `histogram_quantile` does (so coarse below 10 ms: the "
      "bounds there are 5, 10, 25 ms).")
    w("")
    w("**Machine**: %s, %d cores, %s, load %s." % (m["cpu"], m["nproc"], m["kernel"], m["load"]))
    w("")
    w("| dialect | legs | ok | failed | mean TTFT (ms) | median TTFT (ms) | P99 TTFT (ms) | prefill "
      "p50 (ms) | handover mean (ms) | handover p50 (ms) | handover p99 (ms) | decode p50 (ms) |")
    w("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    order = {name: how for name, _, how in DIALECTS}
    for name in args.dialects:
        r = results[name]
        ph = r["phases"]
        hb, hs, hc = ph["handover"]
        w("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            name, order[name], r.get("completed", 0), r.get("failed", "n/a"),
            "%.2f" % r["mean_ttft_ms"] if "mean_ttft_ms" in r else "n/a",
            "%.2f" % r["median_ttft_ms"] if "median_ttft_ms" in r else "n/a",
            "%.2f" % r["p99_ttft_ms"] if "p99_ttft_ms" in r else "n/a",
            ms(quantile(0.5, ph["prefill"][0])), ms(hs / hc if hc else None),
            ms(quantile(0.5, hb)), ms(quantile(0.99, hb)), ms(quantile(0.5, ph["decode"][0]))))
    w("")
    if "nixl" in results and "nixl-push" in results:
        pull, push = results["nixl"], results["nixl-push"]
        w("## NIXL push vs pull")
        w("")
        w("The same workload, the same sims' model; pull = `NixlConnector` (pdrouter sends the "
          "decode once the prefill answered, the decode READs the blocks), push = "
          "`NixlPushConnector` (both legs at once; the decode registers its blocks while the "
          "prefill computes, the prefill WRITEs into them when done).")
        w("")
        w("| TTFT | pull (ms) | push (ms) | push - pull (ms) |")
        w("| --- | ---: | ---: | ---: |")
        for label, key in (("mean", "mean_ttft_ms"), ("median", "median_ttft_ms"), ("P99", "p99_ttft_ms")):
            if key in pull and key in push:
                w("| %s | %.2f | %.2f | %+.2f |" % (label, pull[key], push[key], push[key] - pull[key]))
        w("")
    return "\n".join(lines) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", default=os.environ.get("PDR_BUILD_DIR", os.path.join(ROOT, "build", "release")))
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--results", default=os.path.join(HERE, "HANDOVER_RESULTS.md"))
    parser.add_argument("--num-prompts", type=int, default=60)
    parser.add_argument("--input-len", type=int, default=2000)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--request-rate", type=float, default=4.0)
    parser.add_argument("--prefill-us-per-token", dest="prefill_us", type=int, default=20)
    parser.add_argument("--decode-us-per-token", dest="decode_us", type=int, default=2000)
    parser.add_argument("--dialects", default=",".join(name for name, _, _ in DIALECTS))
    args = parser.parse_args()
    args.dialects = args.dialects.split(",")
    known = {name: flags for name, flags, _ in DIALECTS}
    for name in args.dialects:
        if name not in known:
            parser.error("unknown dialect %s (known: %s)" % (name, ", ".join(known)))
    if args.smoke:
        args.num_prompts, args.input_len, args.output_len, args.request_rate = 6, 300, 4, 20.0
    args.pdrouter = os.path.join(args.bin_dir, "router", "pdrouter")
    args.pdnode = os.path.join(args.bin_dir, "node", "pdnode")
    args.bench = os.path.join(args.bin_dir, "bench", "loadgen", "pdrouter-bench")
    for b in (args.pdrouter, args.pdnode, args.bench):
        if not os.access(b, os.X_OK):
            sys.exit("handover_bench.py: %s is not built" % b)
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    results = {}
    with tempfile.TemporaryDirectory(prefix="pdr-handover-bench.") as work:
        procs = Processes(work)
        try:
            for name in args.dialects:
                results[name] = run_dialect(args, procs, name, known[name])
        finally:
            procs.stop_all()
        text = render(args, results, started)
        if args.smoke:
            args.results = os.path.join(work, "HANDOVER_RESULTS.md")
        with open(args.results, "w") as f:
            f.write(text)
    print(text)
    failures = []
    for name, r in results.items():
        if r.get("bench_rc") != 0 or r.get("failed", 1) != 0 or r.get("completed", 0) != args.num_prompts:
            failures.append("%s: %s of %d requests completed (pdrouter-bench exit %s)"
                            % (name, r.get("completed", 0), args.num_prompts, r.get("bench_rc")))
        elif any(r["phases"][ph][2] < args.num_prompts for ph in PHASES):
            failures.append("%s: phases observed %s, want %d each" % (
                name, {ph: r["phases"][ph][2] for ph in PHASES}, args.num_prompts))
    if failures:
        sys.exit("handover_bench.py: " + "; ".join(failures))
    if not args.smoke:
        print("handover_bench.py: wrote %s" % args.results)


if __name__ == "__main__":
    main()
