"""Cost of ``gpu_facts`` per node on a simulated node, beside ``nvidia-smi -q -x`` + a plain parse.

Usage (from the repository root, with the project's virtualenv Python)::

    .venv/bin/python benchmarks/facts/bench.py [--runs 20] [--profile h100] [--out FILE]

The node is a simulated fleet node's root (tests/simfleet: its GPU state, its NVML, the real
nvidia-ml-py wrappers over the simulated library, its ``nvidia-smi`` and its kernel log), laid
out and booted in a temporary directory: no fleet has to run, and what is measured is this
collection's own work, not the simulated library's. Per run, in turns (A B C A B C ...):

* ``facts_nvml``: what ``gpu_facts`` does with the NVML backend: ``nvml_reader.read_nvml`` over
  the simulated NVML, then ``facts_assemble.assemble_facts`` (kernel log, driver verdict,
  health, contract, headline);
* ``facts_smi``: the nvidia-smi backend: the simulated ``nvidia-smi -q -x``, our parser, the
  same assembly;
* ``smi_plain``: what a user would use instead: the same ``nvidia-smi -q -x`` output parsed into
  a dictionary with ``xml.etree.ElementTree`` and nothing else (no verdict, no kernel log).

Each is timed in-process (wall: ``time.perf_counter``; CPU: ``time.process_time``); the figures
are medians. The real ``nvidia-smi`` costs more than the simulated one (it talks to the driver),
so the ratios against ``smi_plain`` are upper bounds of what the collection adds.

Size: the JSON size of the facts document of the node, and of the same node after a storm of
100,000 Xid 79 lines on all its GPUs, with the kernel log entries kept and the lines counted in
no entry (``xid_summary.dropped_lines``).

Writes the results as JSON (default ``benchmarks/facts/results.json``) and prints them.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests"))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "simfleet"))

# The tests' conftest makes this checkout importable as ansible_collections.gpufleet.nvidia.
import conftest  # noqa: E402,F401  pylint: disable=wrong-import-position,unused-import
from simfleet.gpu import load_pynvml, simgpu  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu import state as gpu_state  # noqa: E402  pylint: disable=wrong-import-position

# pylint: disable=wrong-import-position
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import read_nvml  # noqa: E402
# pylint: enable=wrong-import-position

KERNEL = "6.1.0-31-amd64"
STORM_LINES = 100000


def _etree_to_dict(element):
    """A plain recursive dictionary of an XML element: what a script parsing nvidia-smi does."""
    children = list(element)
    if not children:
        return (element.text or "").strip()
    out = {}
    for child in children:
        value = _etree_to_dict(child)
        if child.tag in out:
            if not isinstance(out[child.tag], list):
                out[child.tag] = [out[child.tag]]
            out[child.tag].append(value)
        else:
            out[child.tag] = value
    return out


class Node:
    """A booted simulated node root and its front ends (NVML, nvidia-smi, dmesg)."""

    def __init__(self, root, profile):
        os.environ["SIMGPU_KERNEL_RELEASE"] = KERNEL
        os.environ.pop("SIMGPU_FAKE_UID", None)
        state = gpu_state.initial_state(profile, "node-%s" % profile)
        gpu_state.write_node_root(root, state, loaded=False, userspace_version="580.126.20", kernel_release=KERNEL)
        os.environ["SIMGPU_ROOT"] = root
        gpu_state.boot_node_root(root, kernel_release=KERNEL, boot_id="bench-1", now=1767225600.0)
        self.root = root
        simgpu()
        from simgpu import cli as sim_cli  # pylint: disable=import-outside-toplevel
        from simgpu import smi as sim_smi  # pylint: disable=import-outside-toplevel
        self._cli, self._smi = sim_cli, sim_smi
        self.nvml = load_pynvml()

    def smi_xml(self):
        """``nvidia-smi -q -x`` of the node (text)."""
        out, err = io.StringIO(), io.StringIO()
        code = self._smi.main(["-q", "-x"], root=self.root, stdout=out, stderr=err)
        if code != 0:
            raise SystemExit("simulated nvidia-smi failed: %s" % err.getvalue())
        return out.getvalue()

    def dmesg(self):
        """The node's kernel log (text)."""
        out, err = io.StringIO(), io.StringIO()
        self._cli.dmesg_main([], root=self.root, stdout=out, stderr=err)
        return out.getvalue()


def _inputs(kernel_log):
    return {"running_kernel": KERNEL, "kernel_log": kernel_log,
            "sys_module_version": "580.126.20\n", "peermem_version": None}


def facts_nvml(node, kernel_log):
    """gpu_facts' work with the NVML backend: read NVML, assemble the document."""
    raw = _inputs(kernel_log)
    raw["nvml"] = read_nvml(node.nvml)
    return assemble_facts(raw, capture=False)


def facts_smi(node, kernel_log):
    """gpu_facts' work with the nvidia-smi backend."""
    raw = _inputs(kernel_log)
    raw["smi_xml"] = node.smi_xml()
    return assemble_facts(raw, capture=False)


def smi_plain(node, _kernel_log):
    """The alternative: nvidia-smi -q -x parsed into a dictionary, nothing else."""
    text = node.smi_xml()
    return _etree_to_dict(ET.fromstring(text[text.index("<nvidia_smi_log"):]))


def measure(runs, node, kernel_log):
    """Median wall and CPU seconds of each way, measured in turns."""
    ways = (("facts_nvml", facts_nvml), ("facts_smi", facts_smi), ("smi_plain", smi_plain))
    samples = dict((name, {"wall": [], "cpu": []}) for name, _way in ways)
    for name, way in ways:  # one warm-up each (imports, caches)
        way(node, kernel_log)
    for _turn in range(runs):
        for name, way in ways:
            wall, cpu = time.perf_counter(), time.process_time()
            way(node, kernel_log)
            samples[name]["wall"].append(time.perf_counter() - wall)
            samples[name]["cpu"].append(time.process_time() - cpu)
    out = {}
    for name, got in samples.items():
        out[name] = {"wall_ms": round(1000 * statistics.median(got["wall"]), 2),
                     "cpu_ms": round(1000 * statistics.median(got["cpu"]), 2)}
    for name in ("facts_nvml", "facts_smi"):
        out[name]["wall_ratio_to_smi_plain"] = round(out[name]["wall_ms"] / out["smi_plain"]["wall_ms"], 2)
        out[name]["cpu_ratio_to_smi_plain"] = round(out[name]["cpu_ms"] / out["smi_plain"]["cpu_ms"], 2)
    return out


def storm_log(gpus, lines):
    """``lines`` Xid 79 lines spread over the node's GPUs, 100 s apart: each line is an incident of its own."""
    buses = [g["pci"]["bus_id"][4:].lower()[:-2] for g in gpus]
    return "".join("[%12.6f] NVRM: Xid (PCI:%s): 79, pid=0, GPU has fallen off the bus.\n"
                   % (100.0 + i * 100.0, buses[i % len(buses)]) for i in range(lines))


def sizes(node, kernel_log):
    """JSON size of the facts of the node, and after an Xid storm."""
    plain = facts_nvml(node, kernel_log)
    storm_text = storm_log(gpu_state.load_state(gpu_state.state_path(node.root))["gpus"], STORM_LINES)
    started = time.process_time()
    storm = facts_nvml(node, kernel_log + storm_text)
    storm_cpu = time.process_time() - started
    summary = storm["xid_summary"]
    return {
        "facts_bytes": len(json.dumps(plain)),
        "storm_lines": STORM_LINES,
        "storm_kernel_log_bytes": len(storm_text),
        "storm_facts_bytes": len(json.dumps(storm)),
        "storm_xid_events": len(storm["xid_events"]),
        "storm_elided_incidents": summary.get("elided_incidents"),
        "storm_dropped_lines": summary.get("dropped_lines"),
        "storm_lines_counted": summary.get("total"),
        "storm_facts_cpu_s": round(storm_cpu, 2),
    }


def main(argv=None):
    """Run the benchmark; print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--profile", default="h100")
    parser.add_argument("--out", default=os.path.join(HERE, "results.json"))
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="facts-bench-") as tmp:
        node = Node(os.path.join(tmp, "root"), args.profile)
        kernel_log = node.dmesg()
        facts = facts_nvml(node, kernel_log)
        results = {
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                        "load_avg_1m": round(os.getloadavg()[0], 2)},
            "profile": args.profile, "gpus": len(facts["gpus"]), "runs": args.runs,
            "per_node": measure(args.runs, node, kernel_log),
            "size": sizes(node, kernel_log),
        }
    results["machine"]["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    text = json.dumps(results, indent=2)
    print(text)
    with open(args.out, "w", encoding="utf-8") as handle:
        handle.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
