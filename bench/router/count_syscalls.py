#!/usr/bin/python3
"""Syscalls and heap allocations per request: pdrouter per P/D request, nginx per proxied request
(run through bench/router/count_syscalls.sh, which owns the temp directory).

Per dialect (default NIXL, serial; MoRIIO WRITE and Mooncake, concurrent) and workload (non-streaming
completions, streaming chat), on the canned-answer nginx nodes of canned_nodes.py (so nothing but
the proxies' own work is counted):
  1. start the canned nodes, pdrouter (`--workers 1`) and the baseline nginx proxy
     (`worker_processes 1`), both with malloc_count.so preloaded (built here from
     malloc_count.c with cc; counters in a shared file);
  2. warm up (--warmup requests through each: upstream pools, Mooncake's /query, lazy state);
  3. per target: attach `strace -c -f` to its processes (pdrouter: all threads; nginx: master and
     worker), read the allocation counters, send exactly --requests requests over --connections
     keep-alive connections (a small asyncio client that checks every answer), read the counters,
     detach strace (SIGINT: it prints its summary);
  4. divide by the requests.
Figures go to bench/router/syscalls.json under --column ("before" / "after"; other columns are
kept) and the tables in bench/router/RESULTS.md (the block between the syscalls markers) are
rendered from that file.

Standard library only (Debian's /usr/bin/python3), plus strace and cc.
"""
import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, ".."))
import router_bench as rb  # noqa: E402
from machine import machine  # noqa: E402

WORKLOADS = (("completions", "/v1/completions", rb.COMPLETION),
             ("streaming chat", "/v1/chat/completions", rb.CHAT_STREAM))
COUNT_FIELDS = ("mallocs", "reallocs", "frees", "bytes")
BEGIN = "<!-- BEGIN syscalls (rendered by count_syscalls.sh from syscalls.json) -->"
END = "<!-- END syscalls -->"


# --------------------------------------------------------------------------------------------
# Counting


def build_malloc_counter(work):
    out = os.path.join(work, "malloc_count.so")
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", out,
                    os.path.join(HERE, "malloc_count.c")], check=True)
    return out


def read_counts(path):
    with open(path, "rb") as f:
        return dict(zip(COUNT_FIELDS, struct.unpack("<4Q", f.read(32))))


class Strace:
    """`strace -c -f` attached to running processes until stop(); then calls/errors by name."""

    def __init__(self, pids, out_path):
        self.out_path = out_path
        args = ["strace", "-c", "-f", "-o", out_path]
        for pid in pids:
            args += ["-p", str(pid)]
        self.err_path = out_path + ".err"
        self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=open(self.err_path, "w"),
                                     preexec_fn=rb._die_with_parent)
        # strace says "Process N attached" per process, "... attached with K threads" for a
        # multi-threaded one, once it traces them all.
        deadline = time.monotonic() + 10
        while True:
            with open(self.err_path) as f:
                attached = len(re.findall(r"Process \d+ attached", f.read()))
            if attached >= len(pids):
                break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                with open(self.err_path) as f:
                    raise RuntimeError("strace did not attach to %r:\n%s" % (pids, f.read()))
            time.sleep(0.02)

    def stop(self):
        self.proc.send_signal(signal.SIGINT)
        self.proc.wait(20)
        calls, errors = {}, {}
        with open(self.out_path) as f:
            for line in f:
                # % time, seconds, usecs/call, calls, [errors], syscall
                fields = line.split()
                if len(fields) in (5, 6) and re.match(r"^[\d.]+$", fields[0]) and fields[-1] != "total":
                    calls[fields[-1]] = int(fields[3])
                    if len(fields) == 6:
                        errors[fields[-1]] = int(fields[4])
        if not calls:
            with open(self.out_path) as f:
                raise RuntimeError("no strace summary:\n" + f.read())
        return calls, errors


async def _client(host, port, path, body, tickets, stats):
    reader, writer = await asyncio.open_connection(host, port)
    data = json.dumps(body).encode()
    request = (b"POST %s HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % (path.encode(), host.encode(), port, len(data))) + data
    try:
        while tickets[0] > 0:
            tickets[0] -= 1
            parts = []
            writer.write(request)
            status = await asyncio.wait_for(rb._read_response(reader, parts.append), 20)
            text = b"".join(parts)
            ok = status == 200 and (text.rstrip().endswith(b"data: [DONE]") if body.get("stream")
                                    else b'"choices"' in text) and b'"error"' not in text
            stats["ok" if ok else "errors"] += 1
    finally:
        writer.close()


def send_requests(addr, path, body, count, connections):
    """Exactly `count` requests over `connections` keep-alive connections; {"ok", "errors"}."""
    host, port = addr.rsplit(":", 1)
    tickets, stats = [count], {"ok": 0, "errors": 0}

    async def main():
        await asyncio.gather(*[_client(host, int(port), path, body, tickets, stats)
                               for _ in range(connections)])

    asyncio.run(main())
    return stats


def measure(args, dialect, workload, malloc_so):
    label, path, body = workload
    counts = {name: os.path.join(args.work_dir, "%s-%s-%s.counts" % (name, dialect, label[:6]))
              for name in ("pdrouter", "nginx")}
    envs = {name: dict(os.environ, LD_PRELOAD=malloc_so, MALLOC_COUNT_FILE=counts[name])
            for name in counts}
    setup = rb.DialectSetup(args, "canned", dialect, router_env=envs["pdrouter"],
                            nginx_env=envs["nginx"], suffix="-" + label.split()[0])
    out = {}
    try:
        for name, addr in setup.targets():
            stats = send_requests(addr, path, body, args.warmup, args.connections)
            if stats["errors"]:
                raise RuntimeError("%s warm-up: %d errors" % (name, stats["errors"]))
            pids = setup.proxy_pids(name)
            trace = Strace(pids, os.path.join(args.work_dir, "strace-%s-%s-%s.txt"
                                              % (name, dialect, label[:6])))
            before = read_counts(counts[name])
            started = time.monotonic()
            stats = send_requests(addr, path, body, args.requests, args.connections)
            seconds = time.monotonic() - started
            after = read_counts(counts[name])
            calls, errors = trace.stop()
            if stats["errors"] or stats["ok"] != args.requests:
                raise RuntimeError("%s %s %s: %d of %d requests failed" % (
                    name, dialect, label, stats["errors"], args.requests))
            out[name] = {"requests": args.requests, "seconds": round(seconds, 3),
                         "calls": calls, "errors": errors,
                         "allocs": {k: after[k] - before[k] for k in COUNT_FIELDS}}
            per = sum(calls.values()) / args.requests
            print("  %-12s %-14s %-8s %6.1f syscalls/req  %6.1f allocations/req  (%.1f s)" % (
                dialect, label, name, per, out[name]["allocs"]["mallocs"] / args.requests, seconds),
                flush=True)
        if setup.router_5xx():
            raise RuntimeError("pdrouter answered 5xx")
        for child in setup.children():
            if child.proc.poll() is not None:
                raise RuntimeError("%s exited early:\n%s" % (child.name, child.log()))
    finally:
        rb.stop_all()
    return out


# --------------------------------------------------------------------------------------------
# Report: syscalls.json -> the markdown block in RESULTS.md


def fmt(value, digits=1):
    return "-" if value is None else "%.*f" % (digits, value)


def render(data):
    columns = [c for c in ("before", "after") if c in data]
    lines = [BEGIN, "## Syscalls and allocations per request (count_syscalls.sh)", ""]
    lines.append(
        "pdrouter per P/D request (two upstream exchanges), nginx per proxied request (one), on "
        "the canned-answer nginx nodes (`canned_nodes.py`), `--workers 1` / `worker_processes "
        "1`. After a warm-up, `strace -c -f` is attached to the proxy's processes (pdrouter: every "
        "thread; nginx: master and worker) for exactly N requests sent over C keep-alive "
        "connections by a small asyncio client that checks every answer, then detached; "
        "allocations are counted over the same requests by `malloc_count.so` (LD_PRELOAD, built "
        "from `bench/router/malloc_count.c` with cc: malloc, calloc, aligned allocations and "
        "realloc of a null pointer count as allocations, C++ `new` included). A few background "
        "syscalls (timers, the discovery thread) fall into the window too. strace slows the "
        "traced process, which changes how many events one `epoll_wait` returns; compare "
        "columns measured the same way, not with an untraced run.")
    lines.append("")
    for column in columns:
        meta = data[column]["meta"]
        lines.append("- **%s**: %s; %s requests over %s connections per row (%s warm-up); "
                     "measured %s on %s vCPU `%s`, %s; pdrouter build type %s; load average "
                     "%s at the start, %s at the end%s." % (
                         column, meta["commit"], meta["requests"], meta["connections"],
                         meta["warmup"], meta["date"], meta["nproc"], meta["cpu"],
                         meta["kernel"], meta["build_type"], meta["load"], meta["load_after"],
                         meta.get("note", "")))
    lines.append("- Rerun for the \"after\" column (the \"before\" one is kept in "
                 "`bench/router/syscalls.json`): `bench/router/count_syscalls.sh --bin-dir "
                 "build/release --column after`")
    lines.append("")
    keys = []
    for column in columns:
        for key in data[column]["runs"]:
            if key not in keys:
                keys.append(key)
    head = ["dialect (family), workload"]
    for what in ("pdrouter syscalls", "pdrouter allocations", "pdrouter bytes allocated"):
        head += ["%s/req %s" % (what, c) for c in columns]
    head += ["nginx syscalls/req (%s)" % columns[0], "nginx allocations/req (%s)" % columns[0]]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for key in keys:
        cells = [key]
        runs = [data[c]["runs"].get(key) for c in columns]
        cells += [fmt(sum(r["pdrouter"]["calls"].values()) / r["pdrouter"]["requests"]) if r else "-"
                  for r in runs]
        cells += [fmt(r["pdrouter"]["allocs"]["mallocs"] / r["pdrouter"]["requests"]) if r else "-"
                  for r in runs]
        cells += [fmt(r["pdrouter"]["allocs"]["bytes"] / r["pdrouter"]["requests"], 0) if r else "-"
                  for r in runs]
        first = runs[0]
        cells += [fmt(sum(first["nginx"]["calls"].values()) / first["nginx"]["requests"]) if first
                  else "-",
                  fmt(first["nginx"]["allocs"]["mallocs"] / first["nginx"]["requests"]) if first
                  else "-"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("By syscall (calls per request; names under 0.05 per request in every column are "
                 "summed as \"other\"; errors, e.g. EAGAIN on a drained socket, in brackets):")
    for key in keys:
        runs = [(c, data[c]["runs"].get(key)) for c in columns]
        named = [("pdrouter " + c, r["pdrouter"]) for c, r in runs if r]
        if runs[0][1]:
            named.append(("nginx " + columns[0], runs[0][1]["nginx"]))
        names = set()
        for _, run in named:
            names.update(run["calls"])
        big = sorted((n for n in names
                      if any(run["calls"].get(n, 0) / run["requests"] >= 0.05 for _, run in named)),
                     key=lambda n: -named[0][1]["calls"].get(n, 0))
        lines += ["", "%s:" % key, ""]
        lines += ["| syscall | " + " | ".join(title for title, _ in named) + " |",
                  "|" + " --- |" * (len(named) + 1)]
        for name in big + ["other", "total"]:
            cells = [name]
            for _, run in named:
                if name == "total":
                    calls, errs = sum(run["calls"].values()), sum(run["errors"].values())
                elif name == "other":
                    calls = sum(v for n, v in run["calls"].items() if n not in big)
                    errs = sum(v for n, v in run["errors"].items() if n not in big)
                else:
                    calls, errs = run["calls"].get(name, 0), run["errors"].get(name, 0)
                cell = fmt(calls / run["requests"], 2)
                if errs:
                    cell += " (%s)" % fmt(errs / run["requests"], 2)
                cells.append(cell)
            lines.append("| " + " | ".join(cells) + " |")
    lines.append(END)
    return "\n".join(lines)


def write_block(path, block):
    text = ""
    if os.path.exists(path):
        with open(path) as f:
            text = f.read()
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        text = head + block + rest.split(END, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + block + "\n"
    with open(path, "w") as f:
        f.write(text)


# --------------------------------------------------------------------------------------------


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work-dir", required=True, help="temp directory (the .sh makes it)")
    parser.add_argument("--bin-dir", default=None,
                        help="build directory with router/pdrouter and node/pdnode "
                             "(default $PDR_BUILD_DIR, else build/release, else build-rb)")
    parser.add_argument("--column", default="before",
                        help="column of syscalls.json to (re)write: before or after")
    parser.add_argument("--requests", type=int, default=2000, help="requests per measurement")
    parser.add_argument("--warmup", type=int, default=300, help="requests before counting")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--dialects", default="nixl,moriio-write,mooncake",
                        help="comma-separated: nixl, moriio-write, mooncake")
    parser.add_argument("--note", default="", help="appended to the column's description")
    parser.add_argument("--data", default=os.path.join(HERE, "syscalls.json"))
    parser.add_argument("--results", default=os.path.join(HERE, "RESULTS.md"),
                        help="markdown file whose syscalls block is rewritten ('' = none)")
    parser.add_argument("--render-only", action="store_true",
                        help="measure nothing: render --data into --results")
    args = parser.parse_args()
    if args.render_only:
        with open(args.data) as f:
            write_block(args.results, render(json.load(f)))
        print("wrote " + args.results)
        return 0
    if args.bin_dir is None:
        candidates = [os.environ.get("PDR_BUILD_DIR", ""), os.path.join(rb.ROOT, "build", "release"),
                      os.path.join(rb.ROOT, "build-rb")]
        args.bin_dir = next((c for c in candidates
                             if c and os.path.exists(os.path.join(c, "router", "pdrouter"))),
                            candidates[1])
    args.bin_dir = os.path.abspath(args.bin_dir)
    # DialectSetup reads these router_bench options.
    args.router_workers, args.sim_workers = 1, 1
    if shutil.which("strace") is None:
        print("strace not found: deploy/install-deps.sh --tests installs it", file=sys.stderr)
        return 1

    def on_signal(signum, _frame):
        raise KeyboardInterrupt("signal %d" % signum)

    signal.signal(signal.SIGTERM, on_signal)
    info = machine()
    meta = {"commit": rb.git_commit(), "date": info["date"], "nproc": info["nproc"],
            "cpu": info["cpu"], "kernel": info["kernel"], "load": info["load"],
            "build_type": rb.build_type(args.bin_dir), "requests": args.requests,
            "connections": args.connections, "warmup": args.warmup,
            "note": ("; " + args.note) if args.note else ""}
    print("count syscalls: %s, %d cores, load %s, bin %s" % (info["cpu"], info["nproc"],
                                                              info["load"], args.bin_dir), flush=True)
    runs = {}
    try:
        malloc_so = build_malloc_counter(args.work_dir)
        families = dict((d[0], d[1]) for d in rb.DIALECTS)
        for dialect in args.dialects.split(","):
            for workload in WORKLOADS:
                key = "%s (%s), %s" % (dialect, families[dialect], workload[0])
                runs[key] = measure(args, dialect, workload, malloc_so)
    except KeyboardInterrupt as e:
        print("count syscalls: interrupted (%s)" % e, file=sys.stderr)
        return 1
    except Exception as e:
        print("count syscalls: FAILED: %s: %s" % (type(e).__name__, e), file=sys.stderr)
        for child in rb._children:
            if child.proc.poll() is not None:
                print("%s exited with %d:\n%s" % (child.name, child.proc.returncode, child.log()),
                      file=sys.stderr)
        return 1
    finally:
        rb.stop_all()
    meta["load_after"] = " ".join(open("/proc/loadavg").read().split()[:3])
    data = {}
    if os.path.exists(args.data):
        with open(args.data) as f:
            data = json.load(f)
    data[args.column] = {"meta": meta, "runs": runs}
    with open(args.data, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.write("\n")
    print("wrote " + args.data)
    block = render(data)
    print(block)
    if args.results:
        write_block(args.results, block)
        print("wrote " + args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
