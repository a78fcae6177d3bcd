#!/usr/bin/env bash
# Installs the Debian 12 packages pdrouter needs, only if some are missing (idempotent).
#   deploy/install-deps.sh            build + run (the quick start)
#   deploy/install-deps.sh --tests    also tests, fuzzers and benchmarks
set -euo pipefail

packages=(
  cmake ninja-build pkg-config g++
  libzmq3-dev cppzmq-dev libmsgpack-cxx-dev libuv1-dev node-llhttp libyaml-cpp-dev libsodium-dev
  libssl-dev
  libibverbs-dev librdmacm-dev
  prometheus-cpp-dev nlohmann-json3-dev libsimdjson-dev libspdlog-dev libfmt-dev libcli11-dev
  libgtest-dev libgmock-dev googletest libbenchmark-dev
  python3 python3-zmq python3-msgpack curl
  # The system CA bundle: https etcd / Kubernetes API servers verified without a ca_file, and the
  # copy deploy/container/build-image.sh puts in the image.
  ca-certificates
)
if [[ "${1:-}" == "--tests" ]]; then
  packages+=(clang libclang-rt-14-dev)
  # bench/router (smoke-run by CTest) drives pdrouter and nginx with wrk; its
  # count_syscalls.sh (not in CTest) attaches strace.
  packages+=(wrk nginx strace)
  # tests/integration/test_openai_node.py runs the OpenAI Node SDK (installed from npm by the
  # test). An npm already on PATH is enough: NodeSource's nodejs bundles npm, and Debian's npm
  # package would conflict with it.
  if ! command -v npm >/dev/null 2>&1; then
    packages+=(nodejs npm)
  fi
  # tests/integration/test_deploy_artifacts.py: systemd-analyze checks the unit, PyYAML reads
  # the rendered manifests, buildah builds the image and podman exports it (offline, FROM
  # scratch). kubectl renders the kustomization; one already on PATH (e.g. Google Cloud SDK's)
  # is enough, and Debian's kubernetes-client would conflict with it.
  packages+=(systemd python3-yaml buildah podman)
  # tests/discovery/sources/etcd/etcd_client_test.cc and tests/integration/test_etcd_*.py start a real etcd
  # (registry.backend: etcd); etcdctl is handy for looking at what the replicas wrote.
  packages+=(etcd-server etcd-client)
  # tests/integration/test_etcd_tls.py makes a throwaway CA and certificates with the openssl CLI.
  packages+=(openssl)
  # tests/integration/test_prometheus.py starts its own Prometheus (private config, loopback port,
  # temporary TSDB) scraping pdrouter and runs the Grafana dashboard's queries on it; the packaged
  # service is not used (stopped and disabled below when this script installed it).
  packages+=(prometheus)
  if ! command -v kubectl >/dev/null 2>&1; then
    packages+=(kubernetes-client)
  fi
fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi

echo "install-deps: installing ${missing[*]}"
sudo=""
if [[ $(id -u) -ne 0 ]]; then sudo="sudo"; fi
# Another apt process may hold the dpkg lock (e.g. unattended upgrades): wait and retry.
for attempt in 1 2 3 4 5 6; do
  if $sudo apt-get update -qq &&
     DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"; then
    # Debian starts an installed prometheus as a service listening on 0.0.0.0:9090; the tests do
    # not need it.
    if [[ " ${missing[*]} " == *" prometheus "* ]] && [[ -d /run/systemd/system ]]; then
      $sudo systemctl disable --now prometheus.service >/dev/null 2>&1 || true
    fi
    exit 0
  fi
  echo "install-deps: apt-get failed (attempt $attempt), retrying in 10 s" >&2
  sleep 10
done
echo "install-deps: could not install: ${missing[*]}" >&2
exit 1
