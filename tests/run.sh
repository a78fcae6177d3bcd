#!/usr/bin/env bash
# The README's second command: installs what is missing, builds, and runs every test.
#   1. Release (-O3) build of what ships, as the README's first command builds it: the benchmarks'
#      smoke runs (label bench) and the integration tests whose checks hold only at full speed
#      (label full_speed: the README's first command, the 1,000-client load, resident-memory
#      bounds; tests/integration/CMakeLists.txt)
#   2. everything under ASan+UBSan: every unit test and every integration test (real processes
#      on loopback)
#   3. TSan: the unit tests of code that runs threads or event loops, and the integration modules
#      that exercise the multi-threaded router (tests/CMakeLists.txt and tests/integration/
#      CMakeLists.txt list what is left to the other stages, and why). Debian's libzmq and
#      libsodium are not TSan-built: tests/tsan.supp has TSan ignore what their libc calls touch
#      (called_from_lib), rather than detect, symbolise and then match each such report, or build
#      an instrumented libzmq here (its reasons); tests/tsan/tsan_canary checks that races in
#      pdrouter's own code, callbacks from libzmq included, are still reported. The simulated
#      nodes and the bench client (test tools) come from stage 1's build (PDR_NODE_FROM): TSan
#      watches the router, and the sims' -O3 build leaves it more of the two cores
#   4. each libFuzzer target for a short run (PDR_FUZZ_SECONDS, default 10), PDR_JOBS at a time
# Every test thus runs in at least one stage; the split keeps the run within CI's time budget
# (the unit tests' -O3 build cost as much as the product's).
# ccache is used when installed (set CCACHE_DISABLE=1 to time a cold build).
# Options via environment: PDR_JOBS (default: nproc), PDR_SKIP_ASAN=1, PDR_SKIP_TSAN=1,
# PDR_SKIP_FUZZ=1, PDR_BUILD_ROOT (default: <repo>/build).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
jobs=${PDR_JOBS:-$(nproc)}
build_root=${PDR_BUILD_ROOT:-$root/build}
fuzz_seconds=${PDR_FUZZ_SECONDS:-10}

deploy/install-deps.sh --tests

launcher=()
if command -v ccache > /dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # The sanitizer builds use precompiled headers (PDR_PCH, cmake/pch/); ccache caches such compiles only
  # with these sloppiness settings.
  export CCACHE_SLOPPINESS=${CCACHE_SLOPPINESS:-pch_defines,time_macros,include_file_mtime,include_file_ctime}
  # Paths under the checkout are hashed relative to it, and the build directory is left out of
  # the hash, so that a clone elsewhere (CI's fresh clone) reuses what another clone compiled. The
  # cost: debug info names source paths relative to the build directory.
  export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root} CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
fi

failures=0
failed_stages=()
# CI keeps only the end of a long log: the summary at the end names each failed test and repeats the
# end of its output, which ctest printed long before.
summarise_failures() {  # stage name
  local dir=$build_root/$1 list
  list=$dir/Testing/Temporary/LastTestsFailed.log
  [[ -s $list ]] || { echo "  [$1] failed before any test failed (build or configure: see above)"; return; }
  local name
  while IFS=: read -r _ name; do
    echo "  [$1] FAILED: $name"
    # LastTest.log holds each test's output between "N/M Testing: <name>" and "<end of output>".
    awk -v t="$name" '$0 ~ "^[0-9]+/[0-9]+ Testing: " && $NF == t {on=1; n=0; next}
                      on && /^<end of output>/ {exit}
                      on {buf[n++ % 30] = $0}
                      END {s = n > 30 ? n - 30 : 0; for (i = s; i < n; i++) print "    | " buf[i % 30]}' \
      "$dir/Testing/Temporary/LastTest.log"
  done < "$list"
}
run_suite() {  # name, extra cmake args...
  local name=$1; shift
  local dir=$build_root/$name
  echo "=== [$name] configure + build"
  cmake -S "$root" -B "$dir" -G Ninja -DPDR_DEBUG_INFO=lines "${launcher[@]}" "$@" > "$dir.configure.log" 2>&1 ||
    { cat "$dir.configure.log"; return 1; }
  local started=$SECONDS rc=0
  rm -f "$dir/Testing/Temporary/LastTestsFailed.log"  # a failed build must not name an old run's tests
  ninja -C "$dir" -j "$jobs" || rc=$?
  echo "=== [$name] built in $((SECONDS - started)) s"
  [[ $rc -eq 0 ]] || return $rc
  echo "=== [$name] test"
  started=$SECONDS
  # PDR_CTEST_ARGS: a stage's selection of tests (the release stage's labels), split on spaces.
  # shellcheck disable=SC2086
  ctest --test-dir "$dir" -j "$jobs" --timeout 300 --output-on-failure --no-tests=error ${PDR_CTEST_ARGS:-} || rc=$?
  echo "=== [$name] tested in $((SECONDS - started)) s"
  return $rc
}

mkdir -p "$build_root"
# Upper time bounds in tests scale with the build's slowdown (tests/support/time_scale.h).
# Release (-O3), as deploy/quickstart.sh builds: GCC reports some warnings only at -O3, and a
# warning is an error, so the suite must compile what the README's first command compiles.
PDR_TIME_SCALE=1 PDR_CTEST_ARGS="-L bench|full_speed" run_suite release -DCMAKE_BUILD_TYPE=Release -DPDR_UNIT_TESTS=OFF ||
  { failures=$((failures + 1)); failed_stages+=(release); }

if [[ "${PDR_SKIP_ASAN:-0}" != 1 ]]; then
  PDR_TIME_SCALE=4 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 run_suite asan -DCMAKE_BUILD_TYPE=Debug -DPDR_SANITIZE=address -DPDR_BENCHMARKS=OFF -DPDR_PCH=ON ||
    { failures=$((failures + 1)); failed_stages+=(asan); }
fi

if [[ "${PDR_SKIP_TSAN:-0}" != 1 ]]; then
  PDR_TIME_SCALE=10 TSAN_OPTIONS="suppressions=$root/tests/tsan.supp halt_on_error=1" \
    run_suite tsan -DCMAKE_BUILD_TYPE=Debug -DPDR_SANITIZE=thread -DPDR_BENCHMARKS=OFF -DPDR_PCH=ON \
      -DPDR_NODE_FROM="$build_root/release" ||
    { failures=$((failures + 1)); failed_stages+=(tsan); }
fi

if [[ "${PDR_SKIP_FUZZ:-0}" != 1 ]]; then
  echo "=== [fuzz] build (clang, libFuzzer)"
  fuzz_started=$SECONDS
  dir=$build_root/fuzz
  if CC=clang CXX=clang++ cmake -S "$root" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPDR_DEBUG_INFO=lines \
       -DPDR_FUZZERS=ON -DPDR_TESTS=ON -DPDR_BENCHMARKS=OFF "${launcher[@]}" > "$dir.configure.log" 2>&1 &&
     ninja -C "$dir" -j "$jobs" fuzzers; then
    run_fuzzer() {  # fuzzer binary; leaves <name>.log and <name>.rc in $dir
      local fuzzer=$1 name corpus
      name=$(basename "$fuzzer" _fuzz)
      corpus=$(mktemp -d)
      cp -r "$root/tests/fuzz/corpus/$name/." "$corpus/" 2>/dev/null || true
      local rc=0
      "$fuzzer" -max_total_time="$fuzz_seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
        "$corpus" > "$dir/$name.log" 2>&1 || rc=$?
      echo "$rc" > "$dir/$name.rc"
      rm -rf "$corpus"
    }
    echo "=== [fuzz] built in $((SECONDS - fuzz_started)) s"
    fuzz_started=$SECONDS
    fuzzers=("$dir"/tests/fuzz/*_fuzz)
    echo "=== [fuzz] ${#fuzzers[@]} targets for ${fuzz_seconds}s each, $jobs at a time"
    for fuzzer in "${fuzzers[@]}"; do
      rm -f "$dir/$(basename "$fuzzer" _fuzz).rc"
      run_fuzzer "$fuzzer" &
      while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do wait -n || true; done
    done
    wait
    echo "=== [fuzz] ran in $((SECONDS - fuzz_started)) s"
    for fuzzer in "${fuzzers[@]}"; do
      name=$(basename "$fuzzer" _fuzz)
      if [[ "$(cat "$dir/$name.rc" 2>/dev/null)" == 0 ]]; then
        grep -E "^stat::number_of_executed_runs|^Done" "$dir/$name.log" || true
        echo "fuzz $name: passed"
      else
        tail -40 "$dir/$name.log"
        echo "fuzz $name: FAILED (crash input saved next to $dir/$name.log)"
        failures=$((failures + 1)); failed_stages+=("fuzz:$name")
      fi
    done
  else
    echo "fuzz: build FAILED"; failures=$((failures + 1)); failed_stages+=("fuzz:build")
  fi
fi

echo "tests/run.sh: stages took $SECONDS s in all"
if [[ $failures -ne 0 ]]; then
  echo "tests/run.sh: $failures stage(s) failed: ${failed_stages[*]}"
  for stage in "${failed_stages[@]}"; do
    [[ $stage == fuzz:* ]] || summarise_failures "$stage"
  done
  exit 1
fi
echo "tests/run.sh: all stages passed"
