"""The drift report on a fleet-sized fact cache built from real module output, beside ansible-cmdb.

Usage (from the repository root, with the project's virtualenv, where ansible-core, orjson,
prometheus-client and ansible-cmdb are installed: ``pip install -r requirements-test.txt``)::

    .venv/bin/python benchmarks/drift/bench.py [--nodes 10000] [--runs 3] [--inventory yaml,ini] [--out FILE]

The cache (``fleet_cache.py``): ``setup`` and ``gpufleet.nvidia.gpu_facts`` run once against
localhost with ``fact_caching = jsonfile`` (ansible-core 2.19 writes ``s1_localhost``), gpu_facts
reading the H100 capture of ``tests/fixtures/smi``; that host is multiplied to ``--nodes`` hosts
with 8 GPUs each, 1 in 66 drifted (power limit, persistence, older driver, a lost GPU), 1 in 521
without a cache file, and 1 in 250 declaring its own power limit in host_vars. It is written in
the 2.19 form (``s1_<host>`` holding ``{"__payload__": ...}``) and in AWX's plain form
(``fact_cache/<host>``), with an inventory of one group per GPU class and per rack, as YAML and INI.

Measured, in turns (A B A B ...: a slower or faster moment of the machine falls on both), each a
whole process as a user starts it, wall and CPU seconds and peak RSS (``os.wait4``: the largest
process of the run):

* ``drift``: ``ansible-playbook playbooks/drift_report.yml -e drift_source=jsonfile -e
  drift_path=<2.19 cache>`` (the default declaration path: every host's own variables);
* ``drift_class``: the same with ``-e drift_declared_from=class``;
* ``drift_awx``: the default path on the AWX form;
* ``ansible_cmdb``: ``ansible-cmdb -f -t html_fancy_split <AWX form>`` (ansible-cmdb reads plain
  JSON fact caches only), the tool a user would reach for to see a fleet's facts.

Every drift run's report is checked against the cache's layout (in sync, drifted, without facts).
Prints and writes (default ``benchmarks/drift/results.json``) medians, minimum and maximum, the
median of the per-pair ratios ansible-cmdb / drift, the machine and its load average.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

import fleet_cache  # noqa: E402 pylint: disable=wrong-import-position


def measure(argv, env, cwd):
    """Run argv; return (wall s, CPU s of it and its descendants, peak RSS MiB of its largest process, output)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise RuntimeError("%s failed (%s):\n%s" % (" ".join(argv[:3]), code, out[-3000:].decode("utf-8", "replace")))
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, out


def spread(values):
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3), "max": round(max(values), 3)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=3, help="turns of each command (default 3)")
    parser.add_argument("--inventory", default="yaml,ini", help="inventory forms to measure: yaml, ini or both")
    parser.add_argument("--no-cmdb", action="store_true", help="leave ansible-cmdb out")
    parser.add_argument("--out", default=os.path.join(HERE, "results.json"))
    args = parser.parse_args()
    bindir = os.path.dirname(sys.executable)
    collections = os.path.join(REPO, ".build", "collections")
    link = os.path.join(collections, "ansible_collections", "gpufleet", "nvidia")
    if not os.path.exists(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(REPO, link)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections, ANSIBLE_NOCOLOR="1", ANSIBLE_LOCALHOST_WARNING="False",
               ANSIBLE_INVENTORY_UNPARSED_WARNING="False", ANSIBLE_PYTHON_INTERPRETER=sys.executable,
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    root = tempfile.mkdtemp(prefix="drift-bench-")
    results = {"nodes": args.nodes, "gpus_per_node": len(fleet_cache.BUS_IDS), "runs": args.runs,
               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform(),
                           "load_average_before": [round(x, 2) for x in os.getloadavg()]},
               "commands": {}, "measurements": {}}
    try:
        started = time.perf_counter()
        os.makedirs(os.path.join(root, "seed"))
        seed = fleet_cache.seed_cache(os.path.join(root, "seed"), sys.executable, collections)
        fleet = fleet_cache.write_fleet(os.path.join(root, "fleet"), seed, args.nodes)
        results["cache"] = {"build_s": round(time.perf_counter() - started, 1), "bytes_219": fleet["bytes_219"],
                            "expected": fleet_cache.expected_counts(fleet["layout"]),
                            "expected_class": fleet_cache.expected_counts(fleet["layout"], "class")}
        playbook = os.path.join(REPO, "playbooks", "drift_report.yml")
        out = os.path.join(root, "out")
        commands = {}
        for form in [f.strip() for f in args.inventory.split(",") if f.strip()]:
            inventory = fleet["inventory"] if form == "yaml" else fleet["inventory_ini"]
            base = [os.path.join(bindir, "ansible-playbook"), "-i", inventory, playbook, "-e", "drift_source=jsonfile",
                    "-e", "drift_output_dir=%s" % out, "-e", "drift_report_only=true"]
            commands["drift_%s" % form] = (base + ["-e", "drift_path=%s" % fleet["cache_219"]], "host")
            commands["drift_class_%s" % form] = (base + ["-e", "drift_path=%s" % fleet["cache_219"],
                                                         "-e", "drift_declared_from=class"], "class")
            commands["drift_awx_%s" % form] = (base + ["-e", "drift_path=%s" % fleet["cache_awx"]], "host")
        if not args.no_cmdb:
            commands["ansible_cmdb"] = ([os.path.join(bindir, "ansible-cmdb"), "-f", "-t", "html_fancy_split",
                                         fleet["cache_awx"]], None)
        results["commands"] = dict((name, " ".join(argv).replace(root, "$CACHE").replace(REPO, "$REPO"))
                                   for name, (argv, _d) in commands.items())
        raw = dict((name, []) for name in commands)
        for _turn in range(args.runs):
            for name, (argv, declared_from) in commands.items():
                cwd = os.path.join(root, "run-" + name)
                shutil.rmtree(cwd, ignore_errors=True)
                os.makedirs(cwd)
                wall, cpu, rss, _text = measure(argv, env, cwd)
                raw[name].append({"wall_s": wall, "cpu_s": cpu, "rss_mib": rss})
                if declared_from:
                    with open(os.path.join(out, "drift-report.json")) as handle:
                        summary = json.load(handle)["summary"]
                    got = dict((key, summary[key]) for key in ("nodes", "in_sync", "drifted", "missing"))
                    want = results["cache"]["expected" if declared_from == "host" else "expected_class"]
                    if got != want:
                        raise AssertionError("%s: the report says %s, the cache holds %s" % (name, got, want))
        for name, runs in raw.items():
            results["measurements"][name] = dict((key, spread([r[key] for r in runs])) for key in ("wall_s", "cpu_s", "rss_mib"))
        if "ansible_cmdb" in raw:
            for name in raw:
                if name == "ansible_cmdb":
                    continue
                results["measurements"][name]["cmdb_over_this"] = dict(
                    (key, round(statistics.median(c[key] / d[key] for c, d in zip(raw["ansible_cmdb"], raw[name])), 2))
                    for key in ("wall_s", "cpu_s", "rss_mib"))
        results["machine"]["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1, sort_keys=True)
        handle.write("\n")
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
