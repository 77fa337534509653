"""Benchmark of the simulated fleet: base build, ``up 8`` from the cache, memory of 32 nodes.

Usage (as root, from the repository root, with the project's virtualenv Python)::

    python benchmarks/simfleet/bench.py [--fresh] [--small 8] [--large 32] [--out FILE]

Measures, through the ``simfleet`` command line as a user runs it:

* ``--fresh``: ``up <small>`` on an empty cache (debootstrap, node layer, packages, boot), the
  "fresh machine" figure; the cache used is a temporary directory removed afterwards. Without
  ``--fresh`` the base is only timed when the normal cache has none.
* ``up <small>`` from the cached base, and a second ``up`` on the running fleet;
* ``up <large>`` from the cached base and, once up, the memory its nodes use: the sum of VmRSS
  and of Pss (/proc/<pid>/status, /proc/<pid>/smaps_rollup) over each node's supervisor, nspawn,
  init and every process below init, plus the drop of MemAvailable (/proc/meminfo);
* ``down --purge`` of each fleet.

Writes the results as JSON (default ``benchmarks/simfleet/results.json``) and prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
SIMFLEET_DIR = os.path.join(REPO_ROOT, "tests", "simfleet")
TARGETS = {"up_small_fresh_s": 180, "up_small_cached_s": 30, "large_rss_mib": 2048}


def simfleet(env: dict, *args: str, capture: bool = False) -> subprocess.CompletedProcess:
    """Run ``python -m simfleet ARGS`` (tests/simfleet appended to PYTHONPATH); raise on failure."""
    proc = subprocess.run([sys.executable, "-m", "simfleet"] + list(args), env=env, text=True,
                          stdout=subprocess.PIPE if capture else None, check=False)
    if proc.returncode != 0:
        raise SystemExit("simfleet %s failed with status %d" % (" ".join(args), proc.returncode))
    return proc


def timed(env: dict, *args: str) -> float:
    started = time.monotonic()
    simfleet(env, *args)
    return round(time.monotonic() - started, 2)


def mem_available_kib() -> int:
    with open("/proc/meminfo", encoding="ascii") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    raise RuntimeError("no MemAvailable in /proc/meminfo")


def _field_kib(path: str, name: str) -> int:
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(name + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        nxt = []
        for p in todo:
            try:
                tasks = os.listdir("/proc/%d/task" % p)
            except OSError:
                continue
            for t in tasks:
                try:
                    with open("/proc/%d/task/%s/children" % (p, t), encoding="ascii") as f:
                        kids = [int(x) for x in f.read().split()]
                except OSError:
                    kids = []
                out += kids
                nxt += kids
        todo = nxt
    return out


def node_memory(status: dict) -> dict:
    """Sum of VmRSS and Pss (KiB) over every node's processes, per node and in total."""
    per_node = {}
    for n in status["nodes"]:
        pids = [p for p in (n["supervisor_pid"], n["nspawn_pid"], n["init_pid"]) if p]
        if n["init_pid"]:
            pids += _descendants(n["init_pid"])
        pids = sorted(set(pids))
        per_node[n["name"]] = {
            "processes": len(pids),
            "rss_kib": sum(_field_kib("/proc/%d/status" % p, "VmRSS") for p in pids),
            "pss_kib": sum(_field_kib("/proc/%d/smaps_rollup" % p, "Pss") for p in pids),
        }
    repo = status["repo"]["pid"]
    return {
        "nodes": len(per_node),
        "rss_sum_mib": round(sum(v["rss_kib"] for v in per_node.values()) / 1024, 1),
        "pss_sum_mib": round(sum(v["pss_kib"] for v in per_node.values()) / 1024, 1),
        "rss_per_node_mib": round(sum(v["rss_kib"] for v in per_node.values()) / 1024 / max(1, len(per_node)), 1),
        "processes_per_node": round(sum(v["processes"] for v in per_node.values()) / max(1, len(per_node)), 1),
        "repo_server_rss_mib": round(_field_kib("/proc/%d/status" % repo, "VmRSS") / 1024, 1) if repo else None,
    }


def machine() -> dict:
    mem = _field_kib("/proc/meminfo", "MemTotal")
    nspawn = subprocess.run(["systemd-nspawn", "--version"], stdout=subprocess.PIPE, text=True, check=False).stdout
    return {
        "cpus": os.cpu_count(),
        "mem_total_mib": mem // 1024,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "systemd_nspawn": (nspawn.splitlines() or [""])[0],
        # other work on the machine slows every figure; the 1/5/15-minute load averages at the end
        "loadavg": os.getloadavg(),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    ap.add_argument("--fresh", action="store_true", help="also time `up` on an empty cache (downloads the base)")
    ap.add_argument("--small", type=int, default=8)
    ap.add_argument("--large", type=int, default=32)
    ap.add_argument("--ports", default="24000-24999", help="port range for the benchmark fleets")
    ap.add_argument("--out", default=os.path.join(HERE, "results.json"))
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("the simulated fleet needs root", file=sys.stderr)
        return 2

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), SIMFLEET_DIR) if p)
    env["SIMFLEET_NAME"] = "bench"
    env["SIMFLEET_PORTS"] = args.ports
    env.pop("SIMFLEET_STATE_DIR", None)
    results: dict = {}

    if args.fresh:
        os.makedirs(os.path.join(REPO_ROOT, ".cache"), exist_ok=True)
        fresh_cache = tempfile.mkdtemp(prefix="simfleet-bench-", dir=os.path.join(REPO_ROOT, ".cache"))
        fenv = dict(env, SIMFLEET_CACHE=fresh_cache)
        try:
            results["up_small_fresh_s"] = timed(fenv, "up", str(args.small))
            for part in ("debootstrap", "layer", "packages"):
                for d in os.listdir(fresh_cache):
                    if d.startswith(part + "-"):
                        with open(os.path.join(fresh_cache, d, "complete"), encoding="utf-8") as f:
                            results["fresh_%s_s" % part] = json.load(f).get("seconds")
            simfleet(fenv, "down", "--purge")
        finally:
            shutil.rmtree(fresh_cache, ignore_errors=True)

    results["base_build_s"] = timed(env, "base")  # ~0 when the cache already has the base

    results["up_small_cached_s"] = timed(env, "up", str(args.small))
    results["up_again_s"] = timed(env, "up")
    results["down_small_s"] = timed(env, "down", "--purge")

    before = mem_available_kib()
    results["up_large_cached_s"] = timed(env, "up", str(args.large))
    time.sleep(10)  # let the nodes settle (units started after sshd)
    status = json.loads(simfleet(env, "status", "--json", capture=True).stdout)
    results["large_states"] = status["counts"]
    mem = node_memory(status)
    mem["mem_available_drop_mib"] = round((before - mem_available_kib()) / 1024, 1)
    results["large_memory"] = mem
    results["large_rss_mib"] = mem["rss_sum_mib"]
    results["down_large_s"] = timed(env, "down", "--purge")

    report = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "small": args.small,
        "large": args.large,
        "results": results,
        "targets": TARGETS,
        "within_target": {k: results[k] <= v for k, v in TARGETS.items() if k in results},
    }
    text = json.dumps(report, indent=2) + "\n"
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    sys.stdout.write(text)
    return 0 if all(report["within_target"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
