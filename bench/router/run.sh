#!/usr/bin/env bash
# The router benchmark: pdrouter vs direct-to-node vs nginx, on loopback, with wrk.
#   bench/router/run.sh [--bin-dir DIR] [--smoke] [--duration S] [--router-workers N] ...
#   bench/router/run.sh --help      every option
# Full run (~13 min, most of it the CPU comparison, saturated and at equal rates) prints a table
# and rewrites bench/router/RESULTS.md; --smoke (~1 min, the CTest bench.router_proxy) runs each
# measurement ~1-2 s and only checks that it worked.
# Needs wrk and nginx (deploy/install-deps.sh --tests) and a built pdrouter + pdnode: --bin-dir is
# the build directory (default: $PDR_BUILD_DIR, else build-rb, else build/release).
#
# Every process started here (sims, pdrouter, nginx with a private config, pid file and logs in a
# temporary directory; never the system service) is stopped on exit, also on failure or Ctrl-C.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/pdr-router-bench.XXXXXX)
cleanup() {
  # The Python driver stops everything itself; this is the backstop if it was killed hard.
  for pidfile in "$work"/*/nginx.pid; do
    [[ -f "$pidfile" ]] && kill -TERM "$(cat "$pidfile")" 2>/dev/null || true
  done
  if [[ -f "$work/pids" ]]; then
    while read -r pid; do kill -TERM "$pid" 2>/dev/null || true; done < "$work/pids"
  fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
/usr/bin/python3 "$here/router_bench.py" --work-dir "$work" "$@"
