#!/usr/bin/env bash
# Builds the pdrouter OCI image offline, FROM scratch: stages the Release binaries plus the
# shared libraries ldd finds for them into a root file system, then runs buildah (or podman).
#   deploy/container/build-image.sh [--build-dir DIR] [--tag NAME:TAG]
# Defaults: build/release (configure and build it first, see docs/development.md) and
# localhost/pdrouter:<project version>. Prints the tag on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build_dir="$root/build/release"
version=$(sed -n 's/^project(pdrouter VERSION \([0-9.]*\).*/\1/p' "$root/CMakeLists.txt")
tag="localhost/pdrouter:$version"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --build-dir) build_dir=$(cd "$2" && pwd); shift 2 ;;
    --tag) tag="$2"; shift 2 ;;
    -h|--help) sed -n '2,7p' "$0"; exit 0 ;;
    *) echo "build-image: unknown argument $1" >&2; exit 2 ;;
  esac
done
binaries=("$build_dir/router/pdrouter" "$build_dir/node/pdnode")
for b in "${binaries[@]}"; do
  [[ -x "$b" ]] || { echo "build-image: $b not built (ninja -C $build_dir pdrouter pdnode)" >&2; exit 1; }
done

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
rootfs="$context/rootfs"
mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/pdrouter"
install -m 0755 -s "${binaries[@]}" "$rootfs/usr/local/bin/"   # -s: no symbols, smaller image
install -m 0644 "$here/topology.yaml" "$rootfs/etc/pdrouter/topology.yaml"

# Every library the dynamic loader resolves (and the loader itself, at the path the binaries'
# PT_INTERP names), copied as regular files to the paths ldd prints: the loader's default search
# path covers them, so no ld.so.cache is needed. libibverbs is not here: pdnode dlopen()s it only
# for the rdma transfer backend, which the image does not support.
ldd "${binaries[@]}" | awk '/=> \// {print $3} /^\t\/[^ ]+ \(/ {print $1}' | sort -u |
  while read -r lib; do
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done

# glibc >= 2.34 has the files and dns name services built in; nsswitch.conf only sets the order
# (/etc/hosts before DNS, as on a normal host: instance addresses may be names). Kubernetes and
# podman mount /etc/hosts and /etc/resolv.conf. passwd/group name the user the image runs as.
# The system CA bundle where OpenSSL's default paths find it (OPENSSLDIR /usr/lib/ssl, cert.pem ->
# the Debian bundle), so https etcd endpoints and Kubernetes API servers with publicly or
# system-trusted certificates verify without registry.etcd_ca_file / kubernetes.ca_file.
bundle=/etc/ssl/certs/ca-certificates.crt
[[ -s "$bundle" ]] || { echo "build-image: $bundle missing (apt-get install ca-certificates)" >&2; exit 1; }
mkdir -p "$rootfs/etc/ssl/certs" "$rootfs/usr/lib/ssl"
install -m 0644 "$bundle" "$rootfs$bundle"
ln -s "$bundle" "$rootfs/usr/lib/ssl/cert.pem"

cat > "$rootfs/etc/nsswitch.conf" <<'NSS'
hosts: files dns
NSS
printf 'root:x:0:0:root:/:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/:/sbin/nologin\n' > "$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' > "$rootfs/etc/group"

cp "$here/Containerfile" "$context/Containerfile"
if command -v buildah >/dev/null 2>&1; then
  buildah bud --quiet --pull=false -f "$context/Containerfile" -t "$tag" "$context" >/dev/null
else
  podman build --quiet --pull=false -f "$context/Containerfile" -t "$tag" "$context" >/dev/null
fi
echo "$tag"
