"""Writes bench/serving/RESULTS.md (on stdout) from three pdrouter-bench --json results of the same
scenario: straight to the decode sim, through pdrouter to a prefill + decode sim pair moving real
KV bytes, and through pdrouter to a pair moving none."""
import argparse
import datetime
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from machine import machine  # noqa: E402

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


def machine_text():
    m = machine()
    return "%s, %d cores, %s, load %s" % (m["cpu"], m["nproc"], m["kernel"], m["load"])


def main():
    parser = argparse.ArgumentParser()
    for name in ("--direct", "--routed", "--routed-nokv", "--decode-kv", "--commit", "--build-type",
                 "--prefill-us", "--decode-us"):
        parser.add_argument(name, required=True)
    args = parser.parse_args()
    direct = json.load(open(args.direct))
    routed = json.load(open(args.routed))
    nokv = json.load(open(args.routed_nokv))
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
      "every byte and streams its tokens back through pdrouter;")
    w("- *via pdrouter, no KV*: the same through a second pdrouter and sim pair started with "
      "`--kv-backends none`: no KV bytes move and the decode sim does not wait for the prefill "
      "(it takes the KV as already there), so its TTFT is pdrouter's routing path (both legs "
      "sent, the decode's answer streamed back) plus the decode sim's own answering time, with "
      "no prefill: an upper bound on what pdrouter itself adds to TTFT.")
    w("")
    w("*via pdrouter* minus *direct* is what disaggregation through pdrouter costs on top of a "
      "single node when compute is free: the router's two HTTP legs, the KV transfer (the sims "
      "also fill and check every byte) and the decode's wait for it. On real GPUs the prefill "
      "runs on other hardware than the decode, which is the point of P/D; this benchmark "
      "isolates the overhead, not that gain.")
    w("")
    w("**Machine**: %s." % machine_text())
    w("")
    w("| metric | direct | via pdrouter | difference | via pdrouter, no KV | difference |")
    w("| --- | ---: | ---: | ---: | ---: | ---: |")

    def difference(a, b, fmt):
        rel = (" (%+.1f%%)" % (100.0 * (b - a) / a)) if a else ""
        return ("%+" + fmt[1:]) % (b - a) + rel

    for label, key, unit, fmt in ROWS:
        a, b, c = direct.get(key, 0), routed.get(key, 0), nokv.get(key, 0)
        name = label + (" (%s)" % unit if unit else "")
        w("| %s | %s | %s | %s | %s | %s |" % (name, fmt % a, fmt % b, difference(a, b, fmt),
                                            fmt % c, difference(a, c, fmt)))
    w("")
    moved = kv.get("kv_bytes_moved")
    # pdrouter-bench's initial test request moved KV too.
    per_request = (" (%.1f MiB per request)" % (moved / (routed["completed"] + 1) / 2**20)
                   if isinstance(moved, int) else "")
    w("KV moved into the decode sim during the routed run: %s bytes%s, %s mismatches (decode "
      "sim `/sim/kv`)." % (moved, per_request, kv.get("kv_mismatches", "?")))
    w("")
    w("pdrouter's own share of TTFT is at most the *no KV* median TTFT, %.2f ms (P99 %.2f ms); "
      "its share of the time per output token is the TPOT difference in that column."
      % (nokv["median_ttft_ms"], nokv["p99_ttft_ms"]))
    w("")
    failures = {"direct": direct.get("error_counts", {}), "via pdrouter": routed.get("error_counts", {}),
                "via pdrouter, no KV": nokv.get("error_counts", {})}
    if any(failures.values()):
        w("Failures: %s" % json.dumps(failures))
        w("")
    print("\n".join(out))
    return 0 if direct["failed"] == routed["failed"] == nokv["failed"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
