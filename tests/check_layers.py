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
            for number, line in enumerate(path.read_text().splitlines(), 1):
                m = INCLUDE.match(line)
                if m and m.group(1) != layer and m.group(1) not in allowed:
                    print(f"{path.relative_to(root)}:{number}: {layer}/ may not include {m.group(1)}/: {line.strip()}")
                    bad += 1
    if checked == 0:
        print("no sources found under", root)
        return 1
    print(f"{checked} files checked, {bad} includes against the layering")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
