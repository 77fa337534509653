"""Benchmark of the drift report at fleet scale, beside what a user would write instead.

Usage (from the repository root, with the project's virtualenv Python)::

    python benchmarks/drift/bench.py [--nodes 10000] [--loop-nodes 1000] [--out FILE]

Generates ``--nodes`` synthetic nodes (classes h100, a100, l40s, v100, b200 in turn; 8 GPUs, 4 on
L40S; about 3 % drifted: a power limit off, an old driver branch, persistence off, a missing fact
file) as a directory of ``<host>.json`` facts documents, the layout ``playbooks/facts.yml`` writes,
and an inventory with a group per class whose group_vars declare the driver and the policy. Then,
each in its own process so its peak memory is its own (``os.wait4`` ``ru_maxrss``):

* ``engine``: the collection's drift engine as a library: stream the directory
  (``plugin_utils.fact_sources``: one file in memory at a time), judge
  (``module_utils.drift.build_report``), render JSON, Markdown and the Prometheus textfile;
* ``playbook``: ``ansible-playbook playbooks/drift_report.yml -e drift_source=dir`` against the
  inventory (``drift_declared_from=class``), as an operator runs it: includes loading the
  inventory and the controller's start-up;
* ``jq``: a jq program a user might write for the same core checks (driver branch per class,
  power limit and persistence per GPU, missing files), over the same files;
* ``ansible_loop``: a plain Ansible loop over the hosts reading each file with ``lookup('file')``
  and accumulating drifted hosts with ``set_fact`` — run on ``--loop-nodes`` hosts only (it grows
  faster than linearly), its per-node cost compared with the others'.

Prints and writes (default ``benchmarks/drift/results.json``) wall seconds, CPU seconds and peak
RSS per method, per-node microseconds, and the ratios against the engine. The findings of the
engine and of jq are cross-checked: both must name the same drifted nodes for the checks they
share.
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
REPO = os.path.dirname(os.path.dirname(HERE))

CLASSES = {
    # class: (GPU name, architecture, GPUs, default W, declared W, declared branch, loaded version)
    "h100": ("NVIDIA H100 80GB HBM3", "Hopper", 8, 700.0, 650.0, "620", "620.82.01"),
    "a100": ("NVIDIA A100-SXM4-40GB", "Ampere", 8, 400.0, 350.0, "620", "620.82.01"),
    "l40s": ("NVIDIA L40S", "Ada Lovelace", 4, 350.0, 315.0, "620", "620.82.01"),
    "v100": ("Tesla V100-SXM2-32GB", "Volta", 8, 300.0, 300.0, "580", "580.178.04"),
    "b200": ("NVIDIA B200", "Blackwell", 8, 1000.0, 900.0, "620", "620.82.01"),
}

JQ_PROGRAM = r"""
# $decl: {class: {branch, power_w}}; $classes: {host: class}
[inputs
 | (input_filename | split("/") | last | rtrimstr(".json")) as $host
 | ($classes[0][$host]) as $class
 | ($decl[0][$class]) as $want
 | {host: $host,
    problems: (
      (if ((.driver.loaded_version // "") | split(".")[0]) != $want.branch then ["driver_branch"] else [] end)
      + [.gpus[] | select(((.power.enforced_limit_w // .power.limit_w) * 1000 | round) != ($want.power_w * 1000 | round))
         | "power_limit_w"]
      + [.gpus[] | select(.persistence_mode != true) | "persistence_mode"]
    )}
 | select(.problems | length > 0)]
| {drifted: [.[].host], findings: ([.[].problems | length] | add)}
"""

LOOP_PLAYBOOK = """\
- name: Find drifted nodes the plain way
  hosts: localhost
  gather_facts: false
  vars:
    decl: %(decl)s
  tasks:
    - name: Compare each node
      ansible.builtin.set_fact:
        drifted: >-
          {{ drifted | default([]) + [item]
             if ((node.driver.loaded_version | default('')).split('.')[0] != decl[hostvars[item].cls].branch
                 or node.gpus | rejectattr('persistence_mode') | list | length > 0
                 or node.gpus | map(attribute='power') | map(attribute='enforced_limit_w')
                    | reject('equalto', decl[hostvars[item].cls].power_w) | list | length > 0)
             else drifted | default([]) }}
      vars:
        node: "{{ lookup('ansible.builtin.file', factdir ~ '/' ~ item ~ '.json', errors='ignore') | default('{}', true) | from_json }}"
      loop: "{{ groups['all'] }}"
      loop_control:
        label: "{{ item }}"

    - name: Write the result
      ansible.builtin.copy:
        content: "{{ {'drifted': drifted | default([])} | to_json }}"
        dest: "{{ outfile }}"
        mode: "0644"
"""


def gpu(index, klass, power_w, persistence):
    name, arch, _count, default_w, _want, _branch, _version = CLASSES[klass]
    return {
        "index": index, "uuid": "GPU-%s-%d" % (klass, index), "name": name, "architecture": arch,
        "pci_bus_id": "0000:%02x:00.0" % (0x18 + 0x10 * index), "readable": True, "errors": [],
        "persistence_mode": persistence, "compute_mode": "Default",
        "power": {"limit_w": power_w, "default_limit_w": default_w, "enforced_limit_w": power_w,
                  "requested_limit_w": power_w, "min_limit_w": 100.0, "max_limit_w": default_w, "draw_w": 80.0},
        "ecc": {"mode_current": True, "mode_pending": True, "volatile": {"corrected": 0, "uncorrected": 0},
                "aggregate": {"corrected": 0, "uncorrected": 0}},
        "remapped_rows": {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False},
        "retired_pages": {"single_bit_ecc": None, "double_bit_ecc": None, "pending": None},
        "mig": {"mode_current": False, "mode_pending": False, "devices": []},
        "clocks": {"sm_mhz": 1980, "mem_mhz": 2619, "sm_max_mhz": 1980, "mem_max_mhz": 2619},
        "clocks_event_reasons": ["gpu_idle"], "temperature_c": 31,
        "memory": {"total_mib": 81559, "used_mib": 0, "free_mib": 81079, "reserved_mib": 480},
        "pcie": {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16},
        "utilization_gpu_pct": 0, "processes": [],
    }


def node_facts(klass, drift):
    """A facts document; ``drift`` is None or one of power, branch, persistence."""
    _name, _arch, count, _default_w, want_w, _branch, version = CLASSES[klass]
    if drift == "branch":
        version = "580.126.20" if not version.startswith("580") else "535.129.03"
    gpus = [gpu(i, klass, want_w + (50.0 if drift == "power" and i == 3 else 0.0),
                not (drift == "persistence" and i == 0)) for i in range(count)]
    return {
        "schema_version": 1, "source": "nvml",
        "driver": {"userspace_version": version, "loaded_version": version, "on_disk_version": version,
                   "branch": version.split(".")[0], "kernel_module_type": "open", "cuda_driver_version": "13.0",
                   "nvml_version": "13." + version, "running_kernel": "6.1.0-28-amd64", "state": "ok",
                   "state_reasons": [], "package_manager": "dpkg",
                   "packages": [{"name": "libnvidia-ml1", "version": version + "-1", "status": "ii", "held": True,
                                 "half_configured": False}]},
        "gpus": gpus, "gpu_count": count, "attached_gpus": count, "xid_events": [],
        "xid_summary": {"total": 0, "incidents": 0, "by_xid": {}, "by_device": {}, "worst_severity": None,
                        "worst_action": None, "any_fatal": False, "fatal_xids": [], "rate_limited": False},
        "unsupported": [], "warnings": [],
    }


def make_fleet(root, count):
    """Write the fact directory and the inventory; return (factdir, inventory, hosts by class, expected drift)."""
    factdir = os.path.join(root, "facts")
    os.makedirs(factdir)
    names = list(CLASSES)
    groups = dict((klass, []) for klass in names)
    expected = set()
    kinds = ("power", "branch", "persistence", "missing")
    for number in range(count):
        klass = names[number % len(names)]
        host = "gpu-%s-%05d" % (klass, number)
        groups[klass].append(host)
        drift = kinds[(number // 7) % 4] if number % 33 == 0 else None
        if drift:
            expected.add(host)
        if drift == "missing":
            continue
        with open(os.path.join(factdir, host + ".json"), "w") as handle:
            json.dump(node_facts(klass, drift), handle)
    inventory = os.path.join(root, "inventory")
    os.makedirs(os.path.join(inventory, "group_vars"))
    with open(os.path.join(inventory, "hosts.yml"), "w") as handle:
        handle.write("all:\n  children:\n")
        for klass in names:
            handle.write("    gpu_%s:\n      hosts:\n" % klass)
            for host in groups[klass]:
                handle.write("        %s:\n" % host)
    for klass, (_n, arch, count_gpus, _d, want_w, branch, _v) in CLASSES.items():
        with open(os.path.join(inventory, "group_vars", "gpu_%s.yml" % klass), "w") as handle:
            handle.write("driver_branch: \"%s\"\ngpu_policy_power_limit_w: %s\ngpu_policy_persistence_mode: true\n"
                         "gpufleet_gpu_count: %d\ndriver_gpu_architectures: [%s]\ncls: %s\n"
                         % (branch, want_w, count_gpus, arch, klass))
    return factdir, inventory, groups, expected


def measure(argv, env=None, cwd=None):
    """Run argv; return (wall s, cpu s of it and its children, peak RSS MiB, stdout)."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read()
    _pid, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError("%s failed (%s):\n%s" % (argv[0], proc.returncode, out[-3000:]))
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0, out


ENGINE = r"""
import json, sys, time
sys.path.insert(0, sys.argv[1])
from ansible_collections.gpufleet.nvidia.plugins.module_utils import drift
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_output, fact_sources
factdir, groups_file, out = sys.argv[2], sys.argv[3], sys.argv[4]
groups = json.load(open(groups_file))
decl = dict((k, drift.declared_state(v)) for k, v in json.load(open(sys.argv[5])).items())
hosts = [(h, k) for k, hs in groups.items() for h in hs]
files = fact_sources.locate_fact_files(factdir, "dir", "", [h for h, _k in hosts])
nodes = ({"node": h, "class": "gpu_" + k, "declared": decl[k],
          "facts": fact_sources.load_fact_file(files[h])["facts"] if h in files else None} for h, k in hosts)
report = drift.build_report(nodes, generated_at="now", source="dir:" + factdir)
drift_output.write_atomic(out + "/drift-report.json", drift_output.render_json(report))
drift_output.write_atomic(out + "/drift-report.md", drift_output.render_markdown(report))
drift_output.write_atomic(out + "/gpufleet_drift.prom", drift_output.render_prometheus(report, time.time()))
print(json.dumps(sorted(n for n, v in report["nodes"].items() if not v["in_sync"])))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--loop-nodes", type=int, default=1000)
    parser.add_argument("--out", default=os.path.join(HERE, "results.json"))
    args = parser.parse_args()
    bindir = os.path.dirname(sys.executable)
    collections = os.path.join(REPO, ".build", "collections")
    link = os.path.join(collections, "ansible_collections", "gpufleet", "nvidia")
    if not os.path.islink(link):
        os.makedirs(os.path.dirname(link), exist_ok=True)
        os.symlink(REPO, link)
    env = dict(os.environ, ANSIBLE_COLLECTIONS_PATH=collections, ANSIBLE_NOCOLOR="1",
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_INVENTORY_UNPARSED_WARNING="False",
               ANSIBLE_PYTHON_INTERPRETER=sys.executable, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default")
    root = tempfile.mkdtemp(prefix="drift-bench-")
    results = {"nodes": args.nodes, "loop_nodes": args.loop_nodes,
               "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()},
               "methods": {}}
    try:
        started = time.perf_counter()
        factdir, inventory, groups, expected = make_fleet(root, args.nodes)
        results["generate_s"] = round(time.perf_counter() - started, 2)
        groups_file = os.path.join(root, "groups.json")
        decl_file = os.path.join(root, "declared.json")
        with open(groups_file, "w") as handle:
            json.dump(groups, handle)
        declared = dict((k, {"driver_branch": v[5], "gpu_policy_power_limit_w": v[4],
                             "gpu_policy_persistence_mode": True, "gpufleet_gpu_count": v[2]})
                        for k, v in CLASSES.items())
        with open(decl_file, "w") as handle:
            json.dump(declared, handle)
        out = os.path.join(root, "out")
        os.makedirs(out)

        wall, cpu, rss, text = measure([sys.executable, "-c", ENGINE, collections, factdir, groups_file, out,
                                        decl_file], env=env)
        engine_drifted = set(json.loads(text.strip().splitlines()[-1]))
        assert engine_drifted == expected, "engine found %d drifted, expected %d" % (
            len(engine_drifted), len(expected))
        results["methods"]["engine"] = {"nodes": args.nodes, "wall_s": wall, "cpu_s": cpu, "rss_mib": rss}

        wall, cpu, rss, text = measure(
            [os.path.join(bindir, "ansible-playbook"), "-i", inventory, os.path.join(REPO, "playbooks", "drift_report.yml"),
             "-e", "drift_source=dir", "-e", "drift_path=%s" % factdir, "-e", "drift_output_dir=%s" % out,
             "-e", "drift_declared_from=class", "-e", "drift_report_only=true"], env=env, cwd=root)
        results["methods"]["playbook"] = {"nodes": args.nodes, "wall_s": wall, "cpu_s": cpu, "rss_mib": rss}

        classes_file = os.path.join(root, "classes.json")
        with open(classes_file, "w") as handle:
            json.dump(dict((h, k) for k, hs in groups.items() for h in hs), handle)
        jq_decl = os.path.join(root, "jq-declared.json")
        with open(jq_decl, "w") as handle:
            json.dump(dict((k, {"branch": v[5], "power_w": v[4]}) for k, v in CLASSES.items()), handle)
        files = sorted(os.path.join(factdir, name) for name in os.listdir(factdir))
        wall, cpu, rss, text = measure(["jq", "-n", "-c", "--slurpfile", "decl", jq_decl, "--slurpfile", "classes",
                                        classes_file, JQ_PROGRAM] + files)
        jq_result = json.loads(text)
        present = expected - set(h for k, hs in groups.items() for h in hs
                                 if not os.path.exists(os.path.join(factdir, h + ".json")))
        assert set(jq_result["drifted"]) == present, "jq and the engine disagree"
        results["methods"]["jq"] = {"nodes": args.nodes, "wall_s": wall, "cpu_s": cpu, "rss_mib": rss,
                                    "note": "core checks only; a missing fact file is not noticed"}

        loop_hosts = os.path.join(root, "loop-inventory.yml")
        chosen = []
        per_class = max(1, args.loop_nodes // len(groups))
        with open(loop_hosts, "w") as handle:
            handle.write("all:\n  children:\n")
            for klass, hosts in groups.items():
                handle.write("    gpu_%s:\n      vars:\n        cls: %s\n      hosts:\n" % (klass, klass))
                for host in hosts[:per_class]:
                    handle.write("        %s:\n" % host)
                    chosen.append(host)
        playbook = os.path.join(root, "loop.yml")
        with open(playbook, "w") as handle:
            handle.write(LOOP_PLAYBOOK % {"decl": json.dumps(dict((k, {"branch": v[5], "power_w": v[4]})
                                                                  for k, v in CLASSES.items()))})
        wall, cpu, rss, text = measure(
            [os.path.join(bindir, "ansible-playbook"), "-i", loop_hosts, playbook, "-e", "factdir=%s" % factdir,
             "-e", "outfile=%s" % os.path.join(root, "loop-out.json")], env=env, cwd=root)
        results["methods"]["ansible_loop"] = {"nodes": len(chosen), "wall_s": wall, "cpu_s": cpu, "rss_mib": rss,
                                              "note": "measured on fewer nodes; compare per node"}

        base = results["methods"]["engine"]
        base_per_node = base["wall_s"] / base["nodes"]
        for name, method in results["methods"].items():
            method["wall_s"] = round(method["wall_s"], 3)
            method["cpu_s"] = round(method["cpu_s"], 3)
            method["rss_mib"] = round(method["rss_mib"], 1)
            method["us_per_node"] = round(1e6 * method["wall_s"] / method["nodes"], 1)
            method["wall_ratio_per_node"] = round((method["wall_s"] / method["nodes"]) / base_per_node, 2)
            method["rss_ratio"] = round(method["rss_mib"] / base["rss_mib"], 2)
        results["drifted_nodes"] = len(expected)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    with open(args.out, "w") as handle:
        json.dump(results, handle, indent=1, sort_keys=True)
        handle.write("\n")
    print(json.dumps(results, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
