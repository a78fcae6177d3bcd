#!/usr/bin/env python3
"""Checks that no #include runs back up a layer (ARCHITECTURE.md). A layer is a folder, named in
LAYERS by its path; a nested layer (proto/base/, router/http/...) is a layer of its own, not a part
of the folder around it. A file belongs to the layer of the longest LAYERS path it is under, and
so does each file it includes; a file may include only from its own layer and the layers listed
for it in ALLOWED. tests/ and bench/ (but bench/loadgen/, a layer) may include anything. Inside
router/, each sub-folder may include only from itself and the sub-folders listed for it in ROUTER
("" is router/'s own files: main, the routes, the worker context), and every sub-folder that is
not a layer of its own must be listed. Prints every offending line and exits 1 if there is one."""
import pathlib
import re
import sys

# Folder -> layer, lowest layers first (the order ARCHITECTURE.md's map draws).
LAYERS = {
    "proto/base": "base",
    "transfer/net": "net",
    "proto": "proto",
    "discovery/config": "config",
    "router/http": "http",
    "transfer": "transfer",
    "discovery": "discovery",
    "discovery/sidecar": "sidecar",
    "router": "router",
    "node": "node",
    "bench/loadgen": "loadgen",
}
ALLOWED = {
    "base": set(),
    "net": {"base"},
    "proto": {"base"},
    "config": {"base", "proto"},
    "http": {"base", "proto"},
    "transfer": {"base", "proto", "net"},
    "discovery": {"base", "proto", "config"},
    "sidecar": {"base", "proto", "net"},
    "router": {"base", "proto", "config", "http", "discovery"},
    "node": {"base", "proto", "config", "http", "sidecar", "transfer", "net"},
    "loadgen": {"base", "proto", "http"},
}
# Inside router/: the policies and the KV block index know nothing of requests; routing (where a
# request goes: pairing, the cache lookup, multi-turn, session affinity, the SLO wait) uses them and
# knows nothing of the proxy that carries requests; the proxy (the request path) uses routing, the
# policies, the index, the tracer and the client gate (keys, tenants, access log); router/'s
# own files wire everything together and no sub-folder includes them. (router/http/ is a layer of
# its own, checked with the others: it includes nothing from the rest of router/.)
ROUTER = {
    "": {"proxy", "routing", "policies", "cache", "tracing", "clients"},
    "proxy": {"routing", "policies", "cache", "tracing", "clients"},
    "routing": {"policies", "cache"},
    "cache": {"policies"},
    "tracing": {"policies"},
    "policies": set(),
    "clients": set(),
}
# Sub-folders that may include more than their layer: the discovery sources talk HTTP to the
# etcd and Kubernetes API servers (router/http/upstream_client, router/http/tls_client); the rest
# of discovery/ may not.
ALLOWED_BELOW = {
    "discovery/sources": {"http"},
}
INCLUDE = re.compile(r'\s*#\s*include\s+"([^"]+/[^"]+)"')
# Longest folder first, so a nested layer wins over the folder around it.
BY_LENGTH = sorted(LAYERS, key=len, reverse=True)


def folder_of(rel: str):
    """The LAYERS folder a repository-relative path is in (longest match), or None."""
    for folder in BY_LENGTH:
        if rel.startswith(folder + "/"):
            return folder
    return None


def router_folder(relative: pathlib.PurePath) -> str:
    """The sub-folder of router/ a path below router/ is in ("" for router/'s own files)."""
    return relative.parts[0] if len(relative.parts) > 1 else ""


def sources(root: pathlib.Path):
    """Every .h and .cc under a LAYERS folder, once, in path order."""
    found = set()
    for folder in LAYERS:
        found.update(p for p in (root / folder).rglob("*") if p.suffix in (".h", ".cc") and p.is_file())
    return sorted(found)


def check_layers(root: pathlib.Path, files) -> int:
    bad = 0
    for path in files:
        rel = path.relative_to(root).as_posix()
        folder = folder_of(rel)
        layer = LAYERS[folder]
        allowed = ALLOWED[layer].union(*(more for below, more in ALLOWED_BELOW.items()
                                         if rel.startswith(below + "/")))
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            target = folder_of(m.group(1))
            if target is None:
                what = m.group(1).split("/")[0] + "/ (no layer)"
            elif LAYERS[target] == layer or LAYERS[target] in allowed:
                continue
            else:
                what = f"{target}/"
            print(f"{rel}:{number}: {folder}/ may not include {what}: {line.strip()}")
            bad += 1
    return bad


def check_router(root: pathlib.Path, files) -> int:
    bad = 0
    for sub in sorted(p.name for p in (root / "router").iterdir() if p.is_dir()):
        if sub not in ROUTER and f"router/{sub}" not in LAYERS:
            print(f"router/{sub}/: not in check_layers.py's ROUTER table (say what it may include)")
            bad += 1
    for path in files:
        rel = path.relative_to(root).as_posix()
        if folder_of(rel) != "router":
            continue
        source = router_folder(path.relative_to(root / "router"))
        allowed = ROUTER.get(source, set())
        for number, line in enumerate(path.read_text().splitlines(), 1):
            m = INCLUDE.match(line)
            if not m or folder_of(m.group(1)) != "router":
                continue  # another layer (router/http/ too): check_layers' business
            target = router_folder(pathlib.PurePath(m.group(1)).relative_to("router"))
            if target != source and target not in allowed:
                where = f"router/{source}/" if source else "router/"
                what = f"router/{target}/" if target else "router/'s own files"
                print(f"{rel}:{number}: {where} may not include {what}: {line.strip()}")
                bad += 1
    return bad


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else pathlib.Path(__file__).parent.parent)
    files = sources(root)
    if not files:
        print("no sources found under", root)
        return 1
    missing = [folder for folder in LAYERS if not (root / folder).is_dir()]
    for folder in missing:
        print(f"{folder}/: in check_layers.py's LAYERS but not in the repository")
    bad = check_layers(root, files) + check_router(root, files)
    print(f"{len(files)} files checked, {bad} includes against the layering"
          + (f", {len(missing)} LAYERS folders missing" if missing else ""))
    bad += len(missing)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
