"""What one task costs the controller, by kind: skipped, set_fact, and modules run on the node.

Usage (as root, from the repository root, with the project's virtualenv Python)::

    python benchmarks/rollout/task_cost.py [--nodes 2] [--tasks 40] [--runs 3] [--ports 24600-24619] [--out FILE]

Brings up ``--nodes`` simulated nodes (fleet ``bench-task-cost``), then for each kind runs a
playbook of ``--tasks`` tasks of that kind against them, ``--runs`` times, and an empty playbook
beside them. The controller's CPU time of a run (``ansible-playbook`` and every process it forked,
from ``os.wait4``) less the empty playbook's, divided by tasks × nodes, is that kind's cost per
task and host; the smallest of the runs is reported (the least disturbed). Kinds: a task whose
``when`` is false, a ``set_fact``, and the module runs ``ping``, ``slurp``,
``gpufleet.nvidia.gpu_facts`` and ``copy`` (a ``stat`` and a ``copy`` or ``file`` run, and a
transfer). This tells how much of a transaction's cost is its tasks and how much the module runs
on the node. The fleet is taken down afterwards.

Writes the results as JSON (default ``benchmarks/rollout/task_cost.json``) and prints them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

from bench import machine, write_results  # the rollout benchmark beside this file

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SIMFLEET = os.path.join(REPO, "tests", "simfleet")

#: Each kind's task body (YAML, indented for a task of a play's ``tasks`` list).
KINDS = {
    "skipped": "ansible.builtin.ping:\n      when: false",
    "set_fact": "ansible.builtin.set_fact:\n        bench_value: \"{{ 1 }}\"",
    "ping": "ansible.builtin.ping:",
    "slurp": "ansible.builtin.slurp:\n        src: /etc/hostname",
    "gpu_facts": "gpufleet.nvidia.gpu_facts:\n        kernel_log: false",
    "copy": "ansible.builtin.copy:\n        content: \"bench\\n\"\n        dest: /tmp/gpufleet-task-cost\n        mode: \"0644\"",
}


def playbook(body, count):
    """A play of ``count`` tasks with ``body`` (no fact gathering)."""
    tasks = "".join("    - name: task %d\n      %s\n" % (index, body) for index in range(count)) if body else ""
    return "- name: Tasks of one kind\n  hosts: all\n  gather_facts: false\n  tasks:\n%s" % (tasks or "    []\n")


def controller_cpu(argv, env):
    """CPU seconds (user + system) of ``argv`` and every process it waited for."""
    with open(os.devnull, "w") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        _pid, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError("%s failed" % " ".join(argv))
    return usage.ru_utime + usage.ru_stime


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--tasks", type=int, default=40)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ports", default="24600-24619")
    parser.add_argument("--out", default=os.path.join(HERE, "task_cost.json"))
    args = parser.parse_args()
    sys.path.insert(0, SIMFLEET)
    from simfleet.testing import SimFleet, ansible_env, make_fleet  # pylint: disable=import-outside-toplevel

    fleet = make_fleet("bench-task-cost", args.nodes, "h100", args.ports)
    workdir = tempfile.mkdtemp(prefix="task-cost-")
    try:
        inventory = SimFleet(fleet).inventory
        env = ansible_env()
        tool = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        runs = {}
        for kind, body in [("empty", None)] + list(KINDS.items()):
            path = os.path.join(workdir, kind + ".yml")
            with open(path, "w") as out:
                out.write(playbook(body, args.tasks))
            runs[kind] = [controller_cpu([tool, "-i", inventory, path], env) for _run in range(args.runs)]
        empty = min(runs["empty"])
        host_tasks = args.tasks * args.nodes
        per_task = dict((kind, round((min(values) - empty) / host_tasks, 4)) for kind, values in runs.items()
                        if kind != "empty")
        results = {
            "machine": machine(),
            "nodes": args.nodes, "tasks": args.tasks, "runs": args.runs,
            "empty_playbook_cpu_s": round(empty, 2),
            "cpu_s_per_task_and_host": per_task,
            "ratio_to_skipped": dict((kind, round(value / per_task["skipped"], 1)) for kind, value in per_task.items())
            if per_task["skipped"] > 0 else None,
            "cpu_s_per_run": dict((kind, [round(value, 2) for value in values]) for kind, values in runs.items()),
        }
    finally:
        fleet.down(purge=True)
    write_results(results, args.out)


if __name__ == "__main__":
    main()
