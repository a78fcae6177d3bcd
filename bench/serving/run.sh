#!/usr/bin/env bash
# The serving benchmark: the seed's `vllm bench serve` scenario (random prompts of 7,500 tokens,
# 200 output tokens, 200 prompts, 2 requests/s, burstiness 100) run with pdrouter-bench on
# simulated vLLM nodes, twice in the same script:
#   direct   straight to one decode sim, which prefills and decodes the prompt itself
#   routed   through pdrouter to a prefill sim + that decode sim in the seed's dialect (Mooncake:
#            prefill and decode legs at once, the prefill pushes real KV bytes over the
#            transfer engine (tcp), the decode streams all the asked tokens)
#   routed, no KV   the same through a second pdrouter and pair whose sims move no KV bytes
#            (--kv-backends none): the router's own share of the difference
# and records both and their difference in bench/serving/RESULTS.md, with the machine.
#   bench/serving/run.sh [--bin-dir DIR] [--smoke] [--num-prompts N] [--input-len N]
#                        [--output-len N] [--request-rate R] [--burstiness B]
#                        [--prefill-us-per-token US] [--decode-us-per-token US] [--results FILE]
#                        [--no-cache] [--no-goodput] [--no-handover]
# A full run takes ~5 min, then runs bench/serving/cache_bench.py (the cache workloads under
# round_robin, least_outstanding and cache_aware: bench/serving/CACHE_RESULTS.md, ~6 min) unless
# --no-cache, bench/serving/goodput_bench.py (the Mooncake trace swept over speed-ups per
# policy: bench/serving/GOODPUT_RESULTS.md, ~10 min) unless --no-goodput, and
# bench/serving/handover_bench.py (the P/D phases per dialect and NIXL push vs pull TTFT:
# bench/serving/HANDOVER_RESULTS.md, ~3 min) unless --no-handover.
# --smoke (CTest bench.serving_pd, ~15 s): 10 short prompts, results in a temporary file; fails
# if any request fails (cache_bench.py, goodput_bench.py and handover_bench.py have their own
# smoke tests: bench.serving_cache, bench.serving_goodput, bench.serving_handover).
# Every process started here is stopped on exit, also on failure or Ctrl-C.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin_dir=${PDR_BUILD_DIR:-$root/build/release}
smoke=0 cache=1 goodput=1 handover=1
num_prompts=200 input_len=7500 output_len=200 rate=2 burstiness=100
# Sim timings: prefill 20 us/token (7,500 tokens: 150 ms), decode 5 ms/token (200 tokens: 1 s).
prefill_us=20 decode_us=5000
results=$root/bench/serving/RESULTS.md
usage() { sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bin-dir) bin_dir=$2; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --num-prompts) num_prompts=$2; shift 2 ;;
    --input-len) input_len=$2; shift 2 ;;
    --output-len) output_len=$2; shift 2 ;;
    --request-rate) rate=$2; shift 2 ;;
    --burstiness) burstiness=$2; shift 2 ;;
    --prefill-us-per-token) prefill_us=$2; shift 2 ;;
    --decode-us-per-token) decode_us=$2; shift 2 ;;
    --results) results=$2; shift 2 ;;
    --no-cache) cache=0; shift ;;
    --no-goodput) goodput=0; shift ;;
    --no-handover) handover=0; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "run.sh: unknown option $1 (--help lists them)" >&2; exit 2 ;;
  esac
done
if [[ $smoke == 1 ]]; then
  num_prompts=10 input_len=500 output_len=20 rate=20 decode_us=1000
fi
pdrouter=$bin_dir/router/pdrouter pdnode=$bin_dir/node/pdnode bench=$bin_dir/bench/loadgen/pdrouter-bench
for b in "$pdrouter" "$pdnode" "$bench"; do
  [[ -x $b ]] || { echo "run.sh: $b is not built (ninja -C $bin_dir pdrouter pdnode pdrouter-bench)" >&2; exit 2; }
done

work=$(mktemp -d /tmp/pdr-serving-bench.XXXXXX)
pids=()
cleanup() {
  for pid in ${pids[@]+"${pids[@]}"}; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in ${pids[@]+"${pids[@]}"}; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Starts a process logging to $work/NAME.out/.err and waits (10 s) for its "listening" line;
# sets $line to it.
start() {
  local name=$1; shift
  "$@" > "$work/$name.out" 2> "$work/$name.err" &
  pids+=($!)
  for _ in $(seq 100); do
    line=$(grep -m1 "listening" "$work/$name.out" 2>/dev/null || true)
    [[ -n $line ]] && return 0
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  echo "run.sh: $name did not start:" >&2; cat "$work/$name.err" >&2; exit 1
}

# A pdrouter with one prefill and one decode sim registered; KV_BACKENDS is the sims' --kv-backends.
# Sets router_http and decode_http.
start_pair() {
  local name=$1 kv_backends=$2
  start "$name-pdrouter" "$pdrouter" --http 127.0.0.1:0 --discovery tcp://127.0.0.1:0
  router_http=$(sed -E 's/.*http=([^ ]+).*/\1/' <<< "$line")
  local discovery
  discovery=$(sed -E 's/.*discovery=([^ ]+).*/\1/' <<< "$line")
  # A 7,500-token prompt is 469 KV blocks of 16 tokens; 4,096 blocks hold 8 such requests.
  local sim_flags=(--connector mooncake --kv-backends "$kv_backends" --kv-blocks 4096
                   --max-model-len 16384 --prefill-us-per-token "$prefill_us"
                   --decode-us-per-token "$decode_us" --register "$discovery"
                   --register-interval-ms 500 --log-level warn)
  # Side-channel ports: ephemeral when KV moves; without KV nothing is bound.
  [[ $kv_backends == none ]] || sim_flags+=(--kv-port 0)
  start "$name-prefill" "$pdnode" sim --role prefill --bootstrap-port 0 "${sim_flags[@]}"
  start "$name-decode" "$pdnode" sim --role decode "${sim_flags[@]}"
  decode_http=$(sed -E 's/.*http=([^ ]+).*/\1/' <<< "$line")
  for _ in $(seq 100); do
    curl -sf "http://$router_http/ready" > /dev/null && return 0
    sleep 0.1
  done
  echo "run.sh: $name pdrouter never became ready" >&2; exit 1
}

bench_flags=(--dataset-name random --random-input-len "$input_len" --random-output-len "$output_len"
             --num-prompts "$num_prompts" --request-rate "$rate" --burstiness "$burstiness"
             --seed 1 --progress-interval 10)
status=0
start_pair kv tcp
echo "=== direct to the decode sim ($decode_http)"
"$bench" --base-url "http://$decode_http" "${bench_flags[@]}" --json "$work/direct.json" || status=1
echo "=== through pdrouter ($router_http -> prefill sim -> decode sim, real KV over tcp)"
"$bench" --base-url "http://$router_http" "${bench_flags[@]}" --json "$work/routed.json" || status=1
curl -s "http://${decode_http}/sim/kv" > "$work/decode_kv.json"
# The same through a second pair whose sims move no KV: what is left is pdrouter's own share.
start_pair nokv none
echo "=== through pdrouter, sims moving no KV ($router_http)"
"$bench" --base-url "http://$router_http" "${bench_flags[@]}" --json "$work/routed_nokv.json" || status=1

[[ $smoke == 1 ]] && results=$work/RESULTS.md
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
build_type=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$bin_dir/CMakeCache.txt" 2>/dev/null || echo unknown)
python3 "$root/bench/serving/report.py" --direct "$work/direct.json" --routed "$work/routed.json" \
  --routed-nokv "$work/routed_nokv.json" \
  --decode-kv "$work/decode_kv.json" --commit "$commit" --build-type "$build_type" \
  --prefill-us "$prefill_us" --decode-us "$decode_us" > "$results" || status=1
cat "$results"
[[ $smoke == 1 ]] || echo "run.sh: wrote $results"
if [[ $smoke == 0 && $cache == 1 ]]; then
  python3 "$root/bench/serving/cache_bench.py" --bin-dir "$bin_dir" || status=1
fi
if [[ $smoke == 0 && $goodput == 1 ]]; then
  python3 "$root/bench/serving/goodput_bench.py" --bin-dir "$bin_dir" || status=1
fi
if [[ $smoke == 0 && $handover == 1 ]]; then
  python3 "$root/bench/serving/handover_bench.py" --bin-dir "$bin_dir" || status=1
fi
exit $status
