"""The machine a benchmark ran on, for its results file: CPU model, cores, kernel, date, load."""
import datetime
import os
import platform


def machine():
    cpu = "unknown"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {"nproc": os.cpu_count(), "cpu": cpu,
            "kernel": "%s %s %s" % (platform.system(), platform.release(), platform.machine()),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "load": " ".join(open("/proc/loadavg").read().split()[:3])}
