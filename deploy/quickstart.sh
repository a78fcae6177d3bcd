#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, starts pdrouter with simulated
# prefill and decode nodes (`pdnode sim`, no GPU) that register themselves exactly as vLLM nodes
# of the chosen connector do, sends a streamed chat completion through pdrouter and prints its
# tokens as they arrive, shows the registry, and keeps everything running until Ctrl-C, which
# stops every process it started.
#
#   deploy/quickstart.sh [--dialect D] [--prefills N] [--decodes N] [--transfer B] [--once]
#                        [--skip-install] [--build-dir DIR] [--http-port N] [--discovery-port N]
#     --dialect       moriio-write (default), moriio-read, nixl, mooncake, p2p-nccl, sglang
#     --prefills N    simulated prefill nodes (default 2)
#     --decodes N     simulated decode nodes (default 2)
#     --transfer B    how the nodes move KV blocks: tcp (default), shm,tcp (shared memory on this
#                     host, tcp otherwise), or none (no KV bytes move)
#     --once          exit 0 after the streamed request (used by the test suite)
#     --skip-install  do not run deploy/install-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
once=0; install=1; build_dir=$root/build/quickstart; http_port=10001; discovery_port=36367
dialect=moriio-write; prefills=2; decodes=2; transfer=tcp
while [[ $# -gt 0 ]]; do
  case $1 in
    --dialect) dialect=$2; shift ;;
    --prefills) prefills=$2; shift ;;
    --decodes) decodes=$2; shift ;;
    --transfer) transfer=$2; shift ;;
    --once) once=1 ;;
    --skip-install) install=0 ;;
    --build-dir) build_dir=$2; shift ;;
    --http-port) http_port=$2; shift ;;
    --discovery-port) discovery_port=$2; shift ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "quickstart: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
case $dialect in
  moriio-write) connector=(--connector moriio --transfer-mode WRITE) ;;
  moriio-read) connector=(--connector moriio --transfer-mode READ) ;;
  nixl|mooncake|p2p-nccl|sglang) connector=(--connector "$dialect") ;;
  *) echo "quickstart: unknown dialect '$dialect' (see --help)" >&2; exit 2 ;;
esac
[[ $prefills =~ ^[1-9][0-9]?$ && $decodes =~ ^[1-9][0-9]?$ ]] ||
  { echo "quickstart: --prefills and --decodes take 1..99" >&2; exit 2; }

if [[ $install -eq 1 ]]; then deploy/install-deps.sh; fi
if [[ ! -x $build_dir/router/pdrouter || ! -x $build_dir/node/pdnode ||
      ! -x $build_dir/bench/loadgen/pdrouter-bench || $once -eq 0 ]]; then
  echo "==> building pdrouter, pdnode and pdrouter-bench (Release) in $build_dir"
  mkdir -p "$build_dir"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPDR_TESTS=OFF \
    -DPDR_BENCHMARKS=OFF > "$build_dir.configure.log" 2>&1 || { cat "$build_dir.configure.log"; exit 1; }
  ninja -C "$build_dir" pdrouter pdnode pdrouter-bench
fi

logs=$(mktemp -d /tmp/pdrouter-quickstart.XXXXXX)
pids=()
cleanup() {
  local status=$? rc
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do
    rc=0; wait "$pid" 2>/dev/null || rc=$?
    # Every process stops cleanly on SIGTERM (exit 0); anything else (a crash, a sanitizer
    # report) fails the run.
    if [[ $rc -ne 0 ]]; then echo "quickstart: process $pid exited $rc; see $logs" >&2; status=1; fi
  done
  echo "==> stopped pdrouter and the simulated nodes; logs in $logs"
  exit $status
}
trap cleanup EXIT
trap 'exit 130' INT TERM

http=127.0.0.1:$http_port
discovery=tcp://127.0.0.1:$discovery_port
py=/usr/bin/python3
status() { curl -fsS "http://$http/status"; }
show_registry() {
  status | $py -c '
import json, sys
s = json.load(sys.stdin)
print("    %-8s %-22s %-9s %-10s %-6s %-5s %s" % ("ROLE", "HTTP_ADDRESS", "DIALECT", "FORMAT", "MODE", "DPxTP", "STATE"))
for i in s["instances"]:
    print("    %-8s %-22s %-9s %-10s %-6s %-5s %s" % (i["role"], i["http_address"], i["dialect"],
        i["registration_format"], i["transfer_mode"], "%dx%d" % (i["dp_size"], i["tp_size"]), i["state"]))
c = s["counts"]
print("    up: %d prefill, %d decode" % (c["prefill"]["up"], c["decode"]["up"]))'
}
up_count() { status | $py -c 'import json,sys; c=json.load(sys.stdin)["counts"]; print(c["prefill"]["up"] + c["decode"]["up"])'; }

echo "==> starting pdrouter (http $http, discovery $discovery)"
"$build_dir/router/pdrouter" --http "$http" --discovery "$discovery" \
  > "$logs/pdrouter.out" 2> "$logs/pdrouter.log" &
pids+=($!)
for _ in $(seq 1 100); do grep -q "listening" "$logs/pdrouter.out" 2>/dev/null && break; sleep 0.05; done
grep -q "listening" "$logs/pdrouter.out" || { cat "$logs/pdrouter.log"; echo "pdrouter did not start" >&2; exit 1; }

echo "==> starting $prefills prefill and $decodes decode simulated vLLM nodes ($dialect); they register themselves"
port=20100  # advertised side-channel ports (MoRIIO handshake/notify, NIXL/P2P KV): distinct per node
start_node() {  # role index
  local flags=(--role "$1" "${connector[@]}" --http 127.0.0.1:0 --register "$discovery"
               --handshake-port $port --notify-port $((port + 1)) --kv-port $((port + 2))
               --prefill-us-per-token 200 --decode-us-per-token 40000 --kv-backends "$transfer")
  [[ $dialect == mooncake && $1 == prefill ]] && flags+=(--bootstrap-port 0)
  port=$((port + 3))
  "$build_dir/node/pdnode" sim "${flags[@]}" > "$logs/$1-$2.out" 2> "$logs/$1-$2.log" &
  pids+=($!)
}
for i in $(seq 1 "$prefills"); do start_node prefill "$i"; done
for i in $(seq 1 "$decodes"); do start_node decode "$i"; done
want=$((prefills + decodes))
for _ in $(seq 1 200); do [[ $(up_count) -ge $want ]] && break; sleep 0.05; done
[[ $(up_count) -ge $want ]] || { show_registry; echo "quickstart: nodes did not register; see $logs" >&2; exit 1; }
echo "==> the registry (GET /status):"
show_registry

echo
echo "==> a streamed chat completion through pdrouter (tokens print as the decode node produces them):"
echo "    curl -N http://$http/v1/chat/completions -H 'Content-Type: application/json' \\"
echo "      -d '{\"model\": \"sim-model\", \"messages\": [{\"role\": \"user\", \"content\": \"Hello!\"}], \"max_tokens\": 24, \"stream\": true}'"
printf '    '
curl -fsSN "http://$http/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"model": "sim-model", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 24, "stream": true}' |
  $py -u -c '
import json, sys
done = finish = False
for line in sys.stdin:
    line = line.strip()
    if not line.startswith("data: "):
        continue
    data = line[6:]
    if data == "[DONE]":
        done = True
        break
    event = json.loads(data)
    if "error" in event:
        sys.exit("\nstream error: %s" % event["error"])
    for choice in event.get("choices", []):
        sys.stdout.write(choice.get("delta", {}).get("content") or "")
        finish = finish or choice.get("finish_reason")
    sys.stdout.flush()
print()
print("    (finish_reason=%s, stream ended with [DONE]: %s)" % (finish, done))
sys.exit(0 if done and finish else 1)'

legs=$(curl -fsS "http://$http/metrics" | grep '^pdrouter_requests_total{outcome="done"}' | awk '{print $2}')
echo "==> pdrouter_requests_total{outcome=\"done\"} = $legs"
if [[ $once -eq 1 ]]; then echo; echo "quickstart: ok"; exit 0; fi
cat <<MSG

pdrouter and $want simulated nodes are running. Try:
  curl -N http://$http/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{"model": "sim-model", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 16, "stream": true}'
  curl -s http://$http/status | python3 -m json.tool     # the live registry
  curl -s http://$http/metrics | grep pdrouter_           # Prometheus metrics
  $build_dir/bench/loadgen/pdrouter-bench --port $http_port --num-prompts 50 --request-rate 5
                                                          # TTFT, ITL, throughput, as vllm bench serve
Nodes heartbeat every 3 s; kill one (see its pid with: pgrep -af 'pdnode sim') and watch it expire.
Logs: $logs.  Press Ctrl-C to stop everything.
MSG
wait "${pids[0]}"
