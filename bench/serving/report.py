"""Writes bench/serving/RESULTS.md (on stdout) from two pdrouter-bench --json results of the same
scenario: straight to the decode sim, and through pdrouter to a prefill + decode sim pair."""
import argparse
import datetime
import json
import os
import platform

ROWS = [  # (label, key, unit, format)
    ("Successful requests", "completed", "", "%d"),
    ("Failed requests", "failed", "", "%d"),
    ("Benchmark duration", "duration", "s", "%.2f"),
    ("Request throughput", "request_throughput", "req/s", "%.3f"),
    ("Output token throughput", "output_throughput", "tok/s", "%.1f"),
    ("Mean TTFT", "mean_ttft_ms", "ms", "%.2f"),
    ("Median TTFT", "median_ttft_ms", "ms", "%.2f"),
    ("P99 TTFT", "p99_ttft_ms", "ms", "%.2f"),
    ("Mean TPOT", "mean_tpot_ms", "ms", "%.3f"),
    ("Median TPOT", "median_tpot_ms", "ms", "%.3f"),
    ("P99 TPOT", "p99_tpot_ms", "ms", "%.3f"),
    ("Mean ITL", "mean_itl_ms", "ms", "%.3f"),
    ("Median ITL", "median_itl_ms", "ms", "%.3f"),
    ("P99 ITL", "p99_itl_ms", "ms", "%.3f"),
    ("Mean E2EL", "mean_e2el_ms", "ms", "%.2f"),
    ("P99 E2EL", "p99_e2el_ms", "ms", "%.2f"),
]


def machine():
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return "%s, %d cores, %s %s, load %s" % (
        cpu, os.cpu_count(), platform.system(), platform.release(),
        " ".join(open("/proc/loadavg").read().split()[:3]))


def main():
    parser = argparse.ArgumentParser()
    for name in ("--direct", "--routed", "--decode-kv", "--commit", "--build-type",
                 "--prefill-us", "--decode-us"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    direct = json.load(open(args.direct))
    routed = json.load(open(args.routed))
    kv = json.load(open(args.decode_kv))
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    out = []
    w = out.append
    w("# Serving benchmark: direct to one decode node vs through pdrouter")
    w("")
    w("Produced by `bench/serving/run.sh` (do not edit by hand). %s, commit %s, %s build."
      % (now, args.commit, args.build_type))
    w("")
    w("**What**: the scenario of the seed's `vllm bench serve` run: random prompts of %s tokens, "
      "%s output tokens, %s prompts, %s requests/s with burstiness %s (gamma-distributed gaps), "
      "streamed `/v1/completions`, measured by `pdrouter-bench` with vLLM's definitions (TTFT, "
      "TPOT, ITL, E2EL)." % (direct["random_input_len"], direct["random_output_len"],
                              direct["num_prompts"], direct["request_rate"], direct["burstiness"]))
    w("")
    w("**How**: simulated vLLM nodes (`pdnode sim`, prefill %s us/token, decode %s us/token), all "
      "on this machine's loopback, run twice in one script with the same seed (the same prompts "
      "and arrival times):" % (args.prefill_us, args.decode_us))
    w("")
    w("- *direct*: straight to the decode sim, which prefills the prompt itself and decodes;")
    w("- *via pdrouter*: pdrouter (Mooncake, the seed's connector) sends the prefill leg to the "
      "prefill sim and the decode leg to the decode sim at once; the prefill pushes the prompt's "
      "real KV bytes into the decode sim with the transfer engine over tcp, the decode verifies "
      "every byte and streams its tokens back through pdrouter.")
    w("")
    w("The difference is what disaggregation through pdrouter costs on top of a single node "
      "when compute is free: the router's two HTTP legs, the KV transfer and the decode's wait "
      "for it. On real GPUs the prefill runs on other hardware than the decode, which is the "
      "point of P/D; this benchmark isolates the overhead, not that gain.")
    w("")
    w("**Machine**: %s." % machine())
    w("")
    w("| metric | direct | via pdrouter | difference |")
    w("| --- | ---: | ---: | ---: |")
    for label, key, unit, fmt in ROWS:
        a, b = direct.get(key, 0), routed.get(key, 0)
        diff = b - a
        rel = (" (%+.1f%%)" % (100.0 * diff / a)) if a else ""
        name = label + (" (%s)" % unit if unit else "")
        w("| %s | %s | %s | %s%s |" % (name, fmt % a, fmt % b, ("%+" + fmt[1:]) % diff, rel))
    w("")
    w("KV moved into the decode sim during the routed run: %s bytes (decode sim `/sim/kv`: "
      "%s mismatches)." % (kv.get("kv_bytes_moved", "?"), kv.get("kv_mismatches", "?")))
    w("")
    failures = {"direct": direct.get("error_counts", {}), "via pdrouter": routed.get("error_counts", {})}
    if any(failures.values()):
        w("Failures: %s" % json.dumps(failures))
        w("")
    print("\n".join(out))
    return 0 if direct["failed"] == 0 and routed["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
