#!/usr/bin/env python3
"""Checks that no #include runs back up a layer (ARCHITECTURE.md). Each top-level folder may
include only from itself and the folders listed for it below; tests/ and bench/ may include
anything. Prints every offending line and exits 1 if there is one."""
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
# Sub-folders that may include more than their layer: the discovery sources talk HTTP to the
# etcd and Kubernetes API servers (http/upstream_client, http/tls_client); the rest of discovery/
# may not.
ALLOWED_BELOW = {
    "discovery/sources": {"http"},
}
INCLUDE = re.compile(r'\s*#\s*include\s+"([A-Za-z0-9_]+)/')


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
    print(f"{checked} files checked, {bad} includes against the layering")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
