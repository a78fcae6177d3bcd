#!/usr/bin/env bash
# Syscalls and heap allocations per request, pdrouter vs nginx, on canned-answer nginx nodes:
#   bench/router/count_syscalls.sh [--bin-dir DIR] [--column before|after] [--requests N] ...
#   bench/router/count_syscalls.sh --help      every option
# ~1 min. Writes bench/router/syscalls.json (the given column; others kept) and the syscalls
# block of bench/router/RESULTS.md. Needs strace, cc, nginx and a built pdrouter (--bin-dir: the
# build directory, default $PDR_BUILD_DIR, else build/release, else build-rb).
#
# Every process started here (pdrouter, nginx with private configs in a temporary directory,
# strace) is stopped on exit, also on failure or Ctrl-C.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/pdr-count-syscalls.XXXXXX)
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
/usr/bin/python3 "$here/count_syscalls.py" --work-dir "$work" "$@"
