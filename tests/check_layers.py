#!/usr/bin/env python3
"""Checks that no #include runs back up a layer (ARCHITECTURE.md). Each top-level folder may
include only from itself and the folders listed for it below; tests/ and bench/ may include
anything. Inside router/, each sub-folder may include only from itself and the sub-folders
listed for it in ROUTER ("" is router/'s own files: main, the routes, the worker context), and
every sub-folder must be listed. Prints every offending line and exits 1 if there is one."""
import pathlib
import re
import sys

ALLOWED = {
    "base": set(),
    "proto": {"base"},
    "config": {"base", "proto"},
    "http": {"base", "proto"},
    "transfer": {"base", "proto"},
    "discovery": {"base", "proto", "config"},
    "sidecar": {"base", "proto"},
    "router": {"base", "proto", "config", "http", "discovery"},
    "node": {"base", "proto", "config", "http", "sidecar", "transfer"},
    "loadgen": {"base", "proto", "http"},
}
# Inside router/: the policies and the KV block index know nothing of requests; the proxy (the
# request path) uses them, the tracer and the client gate (keys, tenants, access log); router/'s
# own files wire everything together and no sub-folder includes them.
ROUTER = {
    "": {"proxy", "policies", "cache", "tracing", "clients"},
    "proxy": {"policies", "cache", "tracing", "clients"},
    "cache": {"policies"},
    "tracing": {"policies"},
    "policies": set(),
    "clients": set(),
}
# Sub-folders that may include more than their layer: the discovery sources talk HTTP to the
# etcd and Kubernetes API servers (router/http/upstream_client, router/http/tls_client); the rest of discovery/
# may not.
ALLOWED_BELOW = {
    "discovery/sources": {"http"},
}
INCLUDE = re.compile(r'\s*#\s*include\s+"([A-Za-z0-9_]+)/')
ROUTER_INCLUDE = re.compile(r'\s*#\s*include\s+"router/([^"]+)"')


def router_folder(relative: pathlib.PurePath) -> str:
    """The sub-folder of router/ a path below router/ is in ("" for router/'s own files)."""
    return relative.parts[0] if len(relative.parts) > 1 else ""


def check_router(root: pathlib.Path) -> int:
    bad = 0
    for sub in sorted(p.name for p in (root / "router").iterdir() if p.is_dir()):
        if sub not in ROUTER:
            print(f"router/{sub}/: not in check_layers.py's ROUTER table (say what it may include)")
            bad += 1
    for path in sorted((root / "router").rglob("*")):
        if path.suffix not in (".h", ".cc"):
            continue
        source = router_folder(path.relative_to(root / "router"))
        allowed = ROUTER.get(source, set())
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = ROUTER_INCLUDE.match(line)
            if not m:
                continue
            target = router_folder(pathlib.PurePath(m.group(1)))
            if target != source and target not in allowed:
                where = f"router/{source}/" if source else "router/"
                what = f"router/{target}/" if target else "router/'s own files"
                print(f"{path.relative_to(root)}:{number}: {where} may not include {what}: {line.strip()}")
                bad += 1
    return bad


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    bad = 0
    checked = 0
    for layer, allowed in ALLOWED.items():
        for path in sorted((root / layer).rglob("*")):
            if path.suffix not in (".h", ".cc"):
                continue
            checked += 1
            rel = path.relative_to(root).as_posix()
            extra = set().union(*(more for below, more in ALLOWED_BELOW.items() if rel.startswith(below + "/")))
            for number, line in enumerate(path.read_text().splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) != layer and m.group(1) not in allowed | extra:
                    print(f"{path.relative_to(root)}:{number}: {layer}/ may not include {m.group(1)}/: {line.strip()}")
                    bad += 1
    if checked == 0:
        print("no sources found under", root)
        return 1
    bad += check_router(root)
    print(f"{checked} files checked, {bad} includes against the layering")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
