#!/usr/bin/env python3
"""What any router could reach on a trace window: the prefill work the window needs and the
speed-up at which it fills the prefill nodes, (a) when the fleet's KV cache behaves as one LRU
cache of all the prefill nodes' blocks (a router that never duplicates a prefix and never loses
one it could have kept), and (b) with an unbounded cache (every shared block hit: the oracle).

The work of one prompt is the engine model's step time (`pdnode sim --help`, --engine vllm) for
its uncached tokens in chunks of the step's token budget, after its cached prefix:
  step-overhead-ms + max(step-weight-read-ms, step-ms-per-token x q)
  + step-ms-per-attention-pair x q x (p + q/2)
per chunk of q tokens with p tokens before it. That is the prompt alone on the GPU; batching
shares the overhead and the weights' read between requests, but for the window's long prompts the
per-token and attention terms are nearly all of it. The ceiling speed-up is the one at which the
work equals the prefill nodes' time (utilisation 1): no router reaches it with bounded queues, and
one that keeps TTFT within an SLO saturates below it.

  bench/serving/fleet_ceiling.py [--pdnode PATH] [--trace FILE] [--first I] [--num-prompts N]
      [--prefills P] [--sim-flag=--num-gpu-blocks-override=N ...]
"""
import argparse
import collections
import json
import os
import re
import subprocess

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
TRACE_BLOCK = 512  # tokens per hash id in Mooncake's traces
SETTINGS = ["num-gpu-blocks-override", "kv-block-tokens", "max-num-batched-tokens", "step-overhead-ms",
            "step-weight-read-ms", "step-ms-per-token", "step-ms-per-attention-pair"]


def engine_settings(help_text, sim_flags=()):
    """The engine model's settings: the defaults `pdnode sim --help` states, then --sim-flag
    overrides of the form --name=value."""
    entries, name = {}, None
    for line in help_text.splitlines():
        m = re.match(r"\s{1,4}--([a-z0-9-]+)", line)
        if m:
            name = m.group(1)
            entries[name] = line
        elif name is not None and line.startswith(" " * 10):
            entries[name] += " " + line.strip()
        else:
            name = None
    out = {}
    for name in SETTINGS:
        text = entries.get(name, "")
        m = re.search(r"Default ([0-9][0-9.e+-]*)", text) or re.search(r"the profile's, ([0-9]+)\)", text)
        if m is None:
            raise ValueError("pdnode sim --help states no default for --%s" % name)
        out[name] = float(m.group(1).rstrip("."))
    for flag in sim_flags:
        name, _, value = flag.lstrip("-").partition("=")
        if name in out and value:
            out[name] = float(value)
    return out


def prefill_ms(cached, uncached, s):
    """Modelled ms to compute `uncached` tokens after `cached` ones, alone, in budget chunks."""
    t, p, left = 0.0, cached, uncached
    budget = int(s["max-num-batched-tokens"])
    while left > 0:
        q = min(budget, left)
        t += (s["step-overhead-ms"] + max(s["step-weight-read-ms"], s["step-ms-per-token"] * q)
              + s["step-ms-per-attention-pair"] * q * (p + q / 2.0))
        p += q
        left -= q
    return t


def work_seconds(rows, capacity_blocks, s, max_len):
    """Prefill work of `rows` (seconds) and their hit rate with one LRU cache of `capacity_blocks`
    trace blocks (None: unbounded). Blocks are prefix-keyed, as the engines' block hashes chain."""
    cache = collections.OrderedDict()
    work, hit, total = 0.0, 0, 0
    for r in rows:
        n = r["input_length"]
        if n + r["output_length"] > max_len:
            continue  # refused by the engine: no work
        keys = [tuple(r["hash_ids"][:i + 1]) for i in range(min(len(r["hash_ids"]), n // TRACE_BLOCK))]
        matched = 0
        for k in keys:
            if k not in cache:
                break
            matched += 1
        cached = min(matched * TRACE_BLOCK, n - 1)  # the engine always computes the last token
        work += prefill_ms(cached, n - cached, s) / 1000.0
        hit += cached
        total += n
        for k in keys:
            cache[k] = True
            cache.move_to_end(k)
        while capacity_blocks is not None and len(cache) > capacity_blocks:
            cache.popitem(last=False)
    return work, (hit / total if total else 0.0)


def ceilings(rows, prefills, s, max_len):
    """[(label, hit rate, work s, ceiling speed-up)] for the fleet's cache and an unbounded one."""
    span = (rows[-1]["timestamp"] - rows[0]["timestamp"]) / 1000.0
    tokens = prefills * (s["num-gpu-blocks-override"] - 1) * s["kv-block-tokens"]
    out = []
    for label, cap in (("the fleet's KV as one LRU cache (%d prefill node%s x %.0f tokens)"
                        % (prefills, "" if prefills == 1 else "s", tokens / prefills), int(tokens // TRACE_BLOCK)),
                       ("an unbounded cache (the oracle)", None)):
        work, hit = work_seconds(rows, cap, s, max_len)
        out.append((label, hit, work, prefills * span / work if work > 0 else float("inf")))
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pdnode", default=os.path.join(ROOT, "build", "release", "node", "pdnode"))
    parser.add_argument("--trace", default=os.path.join(HERE, "traces", "mooncake_synthetic_trace.jsonl"))
    parser.add_argument("--first", type=int, default=None)
    parser.add_argument("--num-prompts", type=int, default=400)
    parser.add_argument("--prefills", type=int, default=2)
    parser.add_argument("--max-model-len", type=int, default=131072)
    parser.add_argument("--sim-flag", action="append", default=[])
    args = parser.parse_args()
    with open(args.trace) as f:
        lines = [line for line in f if line.strip()]
    first = max(0, len(lines) - args.num_prompts) if args.first is None else args.first
    rows = [json.loads(line) for line in lines[first:first + args.num_prompts]]
    help_text = subprocess.run([args.pdnode, "sim", "--help"], capture_output=True, text=True).stdout
    s = engine_settings(help_text, args.sim_flag)
    print("| cache | hit rate | prefill work (modelled s) | ceiling speed-up |")
    print("| --- | ---: | ---: | ---: |")
    for label, hit, work, ceiling in ceilings(rows, args.prefills, s, args.max_model_len):
        print("| %s | %.1f%% | %.1f | %.2f |" % (label, 100 * hit, work, ceiling))


if __name__ == "__main__":
    main()
