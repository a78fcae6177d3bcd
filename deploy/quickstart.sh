#!/usr/bin/env bash
# The README's first command: installs what is missing, builds, and runs pdrouter with the example
# topology while a few nodes register, printing the live registry as it fills. Ctrl-C stops every
# process it started.
#
#   deploy/quickstart.sh [--once] [--skip-install] [--build-dir DIR] [--http-port N] [--discovery-port N]
#     --once          exit 0 as soon as every demo node is visible (used by the test suite)
#     --skip-install  do not run deploy/install-deps.sh
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
once=0; install=1; build_dir=$root/build/quickstart; http_port=10001; discovery_port=36367
while [[ $# -gt 0 ]]; do
  case $1 in
    --once) once=1 ;;
    --skip-install) install=0 ;;
    --build-dir) build_dir=$2; shift ;;
    --http-port) http_port=$2; shift ;;
    --discovery-port) discovery_port=$2; shift ;;
    -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
    *) echo "quickstart: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

if [[ $install -eq 1 ]]; then deploy/install-deps.sh; fi
if [[ ! -x $build_dir/router/pdrouter || ! -x $build_dir/node/pdnode || $once -eq 0 ]]; then
  echo "==> building pdrouter and pdnode (Release) in $build_dir"
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPDR_TESTS=OFF \
    -DPDR_BENCHMARKS=OFF > "$build_dir.configure.log" 2>&1 || { cat "$build_dir.configure.log"; exit 1; }
  ninja -C "$build_dir" pdrouter pdnode
fi

logs=$(mktemp -d /tmp/pdrouter-quickstart.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "==> stopped everything; logs in $logs"
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
print("    %-8s %-22s %-9s %-14s %-6s %-5s %-11s %s" % ("ROLE", "HTTP_ADDRESS", "DIALECT", "FORMAT", "MODE", "DPxTP", "SOURCE", "STATE"))
for i in s["instances"]:
    seen = "never heard from" if i["last_seen_ms_ago"] is None else "seen %d ms ago" % i["last_seen_ms_ago"]
    print("    %-8s %-22s %-9s %-14s %-6s %-5s %-11s %s (%s)" % (i["role"], i["http_address"], i["dialect"],
        i["registration_format"], i["transfer_mode"], "%dx%d" % (i["dp_size"], i["tp_size"]), i["source"], i["state"], seen))
c = s["counts"]
print("    up: %d prefill, %d decode" % (c["prefill"]["up"], c["decode"]["up"]))'
}
wait_for_instances() {  # N: wait until /status lists N instances (10 s deadline)
  for _ in $(seq 1 200); do
    n=$(status | $py -c 'import json,sys; print(len(json.load(sys.stdin)["instances"]))')
    [[ $n -ge $1 ]] && return 0
    sleep 0.05
  done
  echo "quickstart: registry did not reach $1 instances; see $logs" >&2; return 1
}

echo "==> starting pdrouter with deploy/topology.example.yaml (http $http, discovery $discovery)"
"$build_dir/router/pdrouter" --config deploy/topology.example.yaml --http "$http" --discovery "$discovery" \
  > "$logs/pdrouter.out" 2> "$logs/pdrouter.log" &
pids+=($!)
for _ in $(seq 1 100); do grep -q "listening" "$logs/pdrouter.out" 2>/dev/null && break; sleep 0.05; done
grep -q "listening" "$logs/pdrouter.out" || { cat "$logs/pdrouter.log"; echo "pdrouter did not start" >&2; exit 1; }
echo "==> registry from the topology file alone (static instances):"
show_registry; expected=$(status | $py -c 'import json,sys; print(len(json.load(sys.stdin)["instances"]))')

step() {  # description, command...
  echo; echo "==> $1"; shift
  "$@" > "$logs/node$expected.log" 2>&1 &
  pids+=($!)
  expected=$((expected + 1))
  wait_for_instances "$expected"
  show_registry
}
step "a vLLM MoRIIO prefill node registers (its heartbeat, every 3 s)" \
  $py deploy/demo_nodes.py "$discovery" moriio-prefill 8100
step "a vLLM MoRIIO decode node registers" \
  $py deploy/demo_nodes.py "$discovery" moriio-decode 8200
step "a vLLM P2P-NCCL prefill node registers" \
  $py deploy/demo_nodes.py "$discovery" p2p-prefill 8300
$py deploy/demo_nodes.py - health-server 8400 > "$logs/health.log" 2>&1 &
pids+=($!)
step "pdnode register speaks for a node (NIXL decode at 127.0.0.1:8400) once its /health answers 200" \
  "$build_dir/node/pdnode" register --router "$discovery" --role decode --http-address 127.0.0.1:8400 \
  --connector nixl --model demo-model --label zone=a

if [[ $once -eq 1 ]]; then echo; echo "quickstart: ok"; exit 0; fi
cat <<MSG

pdrouter is running. Try:
  curl -s http://$http/status | python3 -m json.tool     # the live registry
  curl -s http://$http/metrics | grep pdrouter_           # Prometheus metrics
Nodes heartbeat every 3 s; stop one (kill its process) and watch it expire after the 5 s TTL.
Edit deploy/topology.example.yaml (e.g. the static instances) and pdrouter reloads it live.
Logs: $logs.  Press Ctrl-C to stop everything.
MSG
wait "${pids[0]}"
