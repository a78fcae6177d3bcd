#!/usr/bin/python3
"""User-space instructions per P/D request in pdrouter, by function (a profiling aid, not a
benchmark: it has no baseline).

CPU time per request on these shared 2-core machines moves with the load other jobs put on them;
instruction counts do not. valgrind's callgrind runs pdrouter (`--workers 1`) in front of the
canned-answer nginx nodes of canned_nodes.py; after a warm-up its counters are zeroed, exactly
--requests requests are sent over --connections keep-alive connections (the checking client of
count_syscalls.py), and the counters are dumped. Printed: total instructions per request and the
functions with the most self instructions (callgrind's "Ir", exclusive), per request.

  bench/router/profile_instructions.py --bin-dir build/release [--dialect nixl] [--stream | --generate]

Needs valgrind (Debian `valgrind`), nginx and a built pdrouter. Kernel time (the syscalls) is
not counted: see count_syscalls.sh for those.
"""
import argparse
import collections
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import count_syscalls as cs  # noqa: E402
import router_bench as rb  # noqa: E402


def self_costs(path):
    """{function name: exclusive Ir} from one callgrind output file."""
    names, costs = {}, collections.Counter()
    fn, skip_next = None, False

    def name_of(token):
        m = re.match(r"\((\d+)\)(?: (.*))?", token)
        if m.group(2):
            names[m.group(1)] = m.group(2)
        return m.group(1)

    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if line.startswith("fn="):
                fn = name_of(line[3:])
            elif line.startswith("cfn="):
                name_of(line[4:])
            elif line.startswith("calls="):
                skip_next = True  # the next cost line is the call's inclusive cost
            elif line and (line[0].isdigit() or line[0] in "+-*"):
                if skip_next:
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    costs[fn] += int(parts[1])
    return {names.get(k, k): v for k, v in costs.items()}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin-dir", default=os.environ.get("PDR_BUILD_DIR", "build/release"))
    parser.add_argument("--dialect", default="nixl", choices=[d[0] for d in rb.DIALECTS])
    workload = parser.add_mutually_exclusive_group()
    workload.add_argument("--stream", action="store_true", help="streaming chat instead of completions")
    workload.add_argument("--generate", action="store_true",
                          help="tokens-in POST /inference/v1/generate instead of completions")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--save-dump", default="",
                        help="also copy callgrind's dump here (for callgrind_annotate --tree=caller)")
    args = parser.parse_args()
    for tool in ("valgrind", "callgrind_control", "nginx"):
        if not shutil.which(tool) and not os.access("/usr/sbin/" + tool, os.X_OK):
            sys.exit("%s not found (apt-get install valgrind nginx)" % tool)

    work = tempfile.mkdtemp(prefix="pdr-instructions-")
    # pdrouter under callgrind: a bin dir whose router/pdrouter is a wrapper script.
    wrapped = os.path.join(work, "bin")
    os.makedirs(os.path.join(wrapped, "router"))
    os.makedirs(os.path.join(wrapped, "node"))
    real = os.path.abspath(os.path.join(args.bin_dir, "router", "pdrouter"))
    out_pattern = os.path.join(work, "callgrind.out.%p")
    with open(os.path.join(wrapped, "router", "pdrouter"), "w") as f:
        f.write("#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file=%s %s \"$@\"\n" % (out_pattern, real))
    os.chmod(os.path.join(wrapped, "router", "pdrouter"), 0o755)
    os.symlink(os.path.abspath(os.path.join(args.bin_dir, "node", "pdnode")), os.path.join(wrapped, "node", "pdnode"))
    setup_args = argparse.Namespace(work_dir=work, bin_dir=wrapped, router_workers=1, sim_workers=1,
                                    wrk_threads=1, smoke=False)
    if args.stream:
        label, path, body = "streaming chat", "/v1/chat/completions", rb.CHAT_STREAM
    elif args.generate:
        label, path, body = "generate", "/inference/v1/generate", rb.GENERATE
    else:
        label, path, body = "completions", "/v1/completions", rb.COMPLETION
    try:
        setup = rb.DialectSetup(setup_args, "canned", args.dialect)
        pid = setup.router.pid
        cs.send_requests(setup.router_addr, path, body, 200, args.connections)  # warm-up
        subprocess.run(["callgrind_control", "-z", str(pid)], check=True, capture_output=True)
        stats = cs.send_requests(setup.router_addr, path, body, args.requests, args.connections)
        subprocess.run(["callgrind_control", "-d", str(pid)], check=True, capture_output=True)
        if stats["errors"]:
            sys.exit("%d requests failed" % stats["errors"])
        dumps = sorted(glob.glob(os.path.join(work, "callgrind.out.%d.*" % pid)))
        if not dumps:
            sys.exit("callgrind wrote no dump")
        costs = self_costs(dumps[-1])
        if args.save_dump:
            shutil.copyfile(dumps[-1], args.save_dump)
    finally:
        rb.stop_all()
        shutil.rmtree(work, ignore_errors=True)
    total = sum(costs.values())
    n = args.requests
    print("pdrouter, %s %s, %d requests over %d connections: %d user-space instructions per P/D request"
          % (args.dialect, label, n, args.connections, total // n))
    for name, cost in sorted(costs.items(), key=lambda kv: -kv[1])[:args.top]:
        print("%8d  %5.1f%%  %s" % (cost // n, 100.0 * cost / total, name[:140]))


if __name__ == "__main__":
    main()
