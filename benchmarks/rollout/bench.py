"""Benchmark of the driver rollout: controller cost per node, and batches against fleet size.

Usage (as root, from the repository root, with the project's virtualenv Python)::

    python benchmarks/rollout/bench.py [--nodes 16] [--ports 24500-24599] [--out FILE] [--schedule-only]
                                       [--poll-interval SECONDS] [--executor steps|passes|both]

1. Sequential batches of the default schedule for fleets of 16, 100, 1,000 and 10,000 nodes,
   computed by ``plugin_utils.schedule`` (which reproduces ansible-core's
   ``_get_serialized_batches``): the waves alone (``serial: [1, "5%", "25%", "100%"]``), and the whole
   rollout with one golden node per GPU class (5) and a canary pool of 1 % (at least 5, serial
   ``[1, "100%"]``).
2. A real rollout on the simulated fleet: ``--nodes`` nodes (classes h100, a100, l40s, v100 in
   turn) are brought up as fleet ``bench-rollout``, put on the baseline driver 580.126.20 by the
   driver role (timed apart: its wall time and controller CPU per node), then
   ``playbooks/rollout.yml -e driver_branch=ltsb`` runs with one golden node, two canaries, the
   default waves and no soak time. The controller's wall time and
   CPU time (``ansible-playbook`` and every process it forked, from ``os.wait4``) are divided by
   the number of nodes; the per-node phase durations come from the rollout report, the tasks per
   node from the run's log (:func:`tasks_per_node`), the controller's peak memory from the
   ``Pss`` of ``ansible-playbook`` and every process below it, summed every 0.5 s. With
   ``--executor both`` (the default) the rollout runs with ``rollout_executor`` steps, the fleet
   goes back to the baseline (``playbooks/rollback.yml``), and it runs again with passes
   (``rollout_pass_s=5``); ``by_executor`` has both. The fleet is taken down afterwards.

Writes the results as JSON (default ``benchmarks/rollout/results.json``) and prints them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
SIMFLEET = os.path.join(REPO, "tests", "simfleet")
DEFAULT_WAVES = [1, "5%", "25%", "100%"]

# Golden node01, canary pool node02 and node03, every other node in the waves.
GROUPS = """\
  children:
    gpufleet_golden:
      hosts:
        node01:
    gpufleet_canary:
      hosts:
        node02:
        node03:
"""
BASELINE_VERSION = "580.126.20"


def schedule_table():
    """Sequential batches per fleet size for the default schedule."""
    sys.path.insert(0, os.path.join(REPO, ".build", "collections"))
    from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import schedule  # pylint: disable=import-outside-toplevel

    rows = []
    for size in (16, 100, 1000, 10000):
        golden = 5
        canary = max(5, size // 100)
        waves = size - golden - canary
        plan = schedule.plan_rollout([
            {"name": "golden", "hosts": golden, "serial": 1},
            {"name": "canary", "hosts": canary, "serial": [1, "100%"]},
            {"name": "waves", "hosts": waves, "serial": DEFAULT_WAVES},
        ])
        rows.append({
            "fleet": size,
            "waves_only_batches": schedule.serial_batches(DEFAULT_WAVES, size),
            "waves_only_batch_count": schedule.batch_count(DEFAULT_WAVES, size),
            "staged": dict((s["name"], s["batches"]) for s in plan["stages"]),
            "staged_batch_count": plan["batch_count"],
            "gates": plan["gates"],
            "largest_batch": max(max(s["batches"] or [0]) for s in plan["stages"]),
        })
    return rows


#: A task's result line for one host in the default callback's output ("ok: [node01]",
#: "skipping: [node02]", "changed: [node03 -> localhost]"); a loop's item lines are not counted.
RESULT_LINE = re.compile(r"^(ok|changed|skipping|failed|fatal|included|unreachable): \[(node\d+)[\] ]")


def tasks_per_node(log):
    """Task results per node in an ``ansible-playbook`` log: ``{node: count}`` (I/O: reads the log).

    Counts the default callback's one result line per host and task (skipped and included tasks
    too, loop items not), the number Ansible's per-task cost multiplies.
    """
    counts = {}
    with open(log, "r", encoding="utf-8", errors="replace") as handle:
        for line in handle:
            match = RESULT_LINE.match(line)
            if match and "(item=" not in line:
                counts[match.group(2)] = counts.get(match.group(2), 0) + 1
    return counts


def machine():
    """The machine a benchmark ran on: Python version, CPUs, platform."""
    return {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}


def write_results(results, path):
    """Write ``results`` as JSON to ``path`` and print them."""
    with open(path, "w") as out:
        json.dump(results, out, indent=1, sort_keys=True)
        out.write("\n")
    print(json.dumps(results, indent=1, sort_keys=True))


def _own_cpu_s(pid):
    """CPU seconds the process itself used so far (utime + stime of /proc/PID/stat, not its children's)."""
    with open("/proc/%d/stat" % pid, "r", encoding="ascii") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree(pid):
    """``pid`` and every process below it now (I/O: reads ``/proc/*/stat``)."""
    parents = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "r", encoding="ascii", errors="replace") as handle:
                    parents[int(name)] = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, todo = [pid], [pid]
    while todo:
        parent = todo.pop()
        children = [child for child, ppid in parents.items() if ppid == parent]
        found.extend(children)
        todo.extend(children)
    return found


def _memory_kb(pid):
    """The process's ``(Rss, Pss)`` in KiB from ``/proc/PID/smaps_rollup`` (Pss: memory shared by
    forked workers counted once across them; Rss counts it in each); ``(0, 0)`` once it is gone."""
    found = {}
    try:
        with open("/proc/%d/smaps_rollup" % pid, "r", encoding="ascii", errors="replace") as handle:
            for line in handle:
                if line.startswith(("Rss:", "Pss:")):
                    found[line[:3]] = int(line.split()[1])
    except (OSError, IndexError, ValueError):
        pass
    return found.get("Rss", 0), found.get("Pss", 0)


def run(argv, env, cwd=None, log=None, own=None, watch=None):
    """Run ``argv`` to its end: ``(wall s, CPU s of it and every process it waited for)``.

    :param own: a dict that gets ``"cpu_s"``: the CPU of the process itself (``ansible-playbook``'s
        main process, without its workers and SSH clients), ``"peak_pss_mb"``: the most memory
        the process and all below it (workers, SSH clients) held at once, as the sum of their
        ``Pss`` (MiB), and ``"peak_rss_mb"``, the same as the sum of their ``Rss`` (shared pages
        counted in each, an upper bound); read every 0.5 s while it runs.
    :param watch: with ``own``, called with the process id at each of those reads.
    :raises RuntimeError: a non-zero exit.
    """
    start = time.perf_counter()
    with open(log or os.devnull, "w") as out:
        proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
        if own is not None:
            def sample():
                while proc.returncode is None:
                    try:
                        own["cpu_s"] = _own_cpu_s(proc.pid)
                    except (OSError, IndexError, ValueError):
                        return
                    memory = [_memory_kb(pid) for pid in _tree(proc.pid)]
                    own["peak_rss_mb"] = max(own.get("peak_rss_mb", 0.0), sum(m[0] for m in memory) / 1024.0)
                    own["peak_pss_mb"] = max(own.get("peak_pss_mb", 0.0), sum(m[1] for m in memory) / 1024.0)
                    if watch is not None:
                        watch(proc.pid)
                    time.sleep(0.5)
            threading.Thread(target=sample, daemon=True).start()
        _pid, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = status
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        tail = ""
        if log:
            with open(log, "r", encoding="utf-8", errors="replace") as handle:
                tail = "".join(handle.readlines()[-40:])
        raise RuntimeError("%s exited %s; the end of its log:\n%s" % (" ".join(argv[:3]), code, tail))
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def ansible_cfg(workdir, poll_interval):
    """tests/ansible.cfg with ``internal_poll_interval`` set to ``poll_interval``, written in ``workdir``."""
    with open(os.path.join(REPO, "tests", "ansible.cfg"), "r", encoding="utf-8") as handle:
        lines = [line for line in handle.read().splitlines() if not line.startswith("internal_poll_interval")]
    lines.insert(lines.index("[defaults]") + 1, "internal_poll_interval = %s" % poll_interval)
    path = os.path.join(workdir, "ansible.cfg")
    with open(path, "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    return path


def configured_poll_interval():
    """tests/ansible.cfg's ``internal_poll_interval`` (seconds), or Ansible's default 0.001."""
    with open(os.path.join(REPO, "tests", "ansible.cfg"), "r", encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("internal_poll_interval"):
                return float(line.split("=", 1)[1])
    return 0.001


#: What each executor's run adds to the rollout's command line (``rollout_executor``; passes 5 s
#: apart, so that the pacing does not hide the controller's cost in the wall time).
EXECUTOR_ARGS = {"steps": [], "passes": ["-e", "rollout_executor=passes", "-e", "rollout_pass_s=5"]}


def one_rollout(tool, inventories, env, workdir, executor, nodes):
    """One ``playbooks/rollout.yml`` run over the fleet with ``executor``: its controller cost per
    node, memory, phases and tasks (I/O: runs ansible-playbook, reads its report and log)."""
    report_dir = os.path.join(workdir, "report-" + executor)
    log = os.path.join(workdir, "rollout-%s.log" % executor)
    own = {}
    argv = [tool] + inventories + [
        os.path.join(REPO, "playbooks", "rollout.yml"), "-f", "16", "-e", "driver_branch=ltsb",
        "-e", "rollout_soak_s=0", "-e", "rollout_wave_soak_s=0", "-e", "rollout_id=bench-" + executor,
        "-e", "rollout_report_dir=%s" % report_dir] + EXECUTOR_ARGS[executor]
    wall, cpu = run(argv, env, workdir, log, own)
    with open(os.path.join(report_dir, "rollout-report.json")) as handle_in:
        report = json.load(handle_in)
    totals = [n["durations"]["total_s"] for n in report["nodes"] if (n.get("durations") or {}).get("total_s")]
    phases = {}
    for phase in ("preflight_drain_s", "snapshot_s", "install_s", "reboot_s", "verify_s", "finish_s"):
        values = [n["durations"][phase] for n in report["nodes"] if (n.get("durations") or {}).get(phase)]
        if values:
            phases[phase] = round(statistics.median(values), 1)
    tasks = tasks_per_node(log)
    return {
        "executor": executor,
        "status": report["status"],
        "summary": report["summary"],
        "rollout_wall_s": round(wall, 1),
        "rollout_controller_cpu_s": round(cpu, 1),
        "wall_s_per_node": round(wall / nodes, 2),
        "controller_cpu_s_per_node": round(cpu / nodes, 2),
        # ansible-playbook's own process (its play loop), the rest being its workers and SSH clients.
        "main_process_cpu_s_per_node": round(own["cpu_s"] / nodes, 2) if "cpu_s" in own else None,
        "controller_peak_pss_mb": round(own["peak_pss_mb"], 1) if "peak_pss_mb" in own else None,
        "controller_peak_rss_mb": round(own["peak_rss_mb"], 1) if "peak_rss_mb" in own else None,
        "tasks_per_node_median": statistics.median(tasks.values()) if tasks else None,
        "tasks_per_node_max": max(tasks.values()) if tasks else None,
        "controller_cpu_s_per_task": round(cpu / sum(tasks.values()), 3) if tasks else None,
        "node_transaction_median_s": round(statistics.median(totals), 1) if totals else None,
        "node_phase_median_s": phases,
        "stage_hosts": [len(stage["hosts"]) for stage in report["stages"]],
    }


def real_rollout(nodes, ports, workdir, poll_interval=None, executors=("steps",)):
    sys.path.insert(0, SIMFLEET)
    from simfleet.testing import (  # pylint: disable=import-outside-toplevel
        FLEET_DRIVER_VARS,
        SimFleet,
        ansible_env,
        baseline_playbook,
        make_fleet,
    )

    fleet = make_fleet("bench-rollout", nodes, "h100,a100,l40s,v100", ports)
    try:
        handle = SimFleet(fleet)
        inventory = os.path.join(workdir, "inventory.yml")
        with open(inventory, "w") as out:
            out.write("all:\n  vars:\n" + FLEET_DRIVER_VARS + GROUPS)
        baseline = os.path.join(workdir, "baseline.yml")
        with open(baseline, "w") as out:
            out.write(baseline_playbook(BASELINE_VERSION))
        env = ansible_env({"ANSIBLE_CONFIG": ansible_cfg(workdir, poll_interval)} if poll_interval is not None else None)
        tool = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        base_wall, base_cpu = run([tool, "-i", handle.inventory, "-i", inventory, baseline, "-f", "16"], env,
                                  workdir, os.path.join(workdir, "baseline.log"))
        inventories = ["-i", handle.inventory, "-i", inventory]
        runs = {}
        for number, executor in enumerate(executors):
            if number:
                # Back on the baseline for the next executor (rollback.yml, as an operator would).
                back = [tool] + inventories + [
                    os.path.join(REPO, "playbooks", "rollback.yml"), "-f", "16",
                    "-e", "rollback_version=%s" % BASELINE_VERSION, "-e", "rollback_id=bench-back-" + executor,
                    "-e", "rollback_report_dir=%s" % os.path.join(workdir, "back-" + executor)]
                run(back, env, workdir, os.path.join(workdir, "rollback-%s.log" % executor))
            runs[executor] = one_rollout(tool, inventories, env, workdir, executor, nodes)
        results = dict(runs[executors[0]])
        results.update({
            "nodes": nodes,
            "baseline_wall_s": round(base_wall, 1),
            "baseline_controller_cpu_s_per_node": round(base_cpu / nodes, 2),
            "internal_poll_interval": poll_interval if poll_interval is not None else configured_poll_interval(),
        })
        if len(executors) > 1:
            results["by_executor"] = runs
        return results
    finally:
        fleet.down(purge=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=16)
    parser.add_argument("--ports", default="24500-24599")
    parser.add_argument("--out", default=os.path.join(HERE, "results.json"))
    parser.add_argument("--schedule-only", action="store_true")
    parser.add_argument("--executor", choices=["steps", "passes", "both"], default="both",
                        help="rollout_executor of the rollout (both: steps, then passes after a rollback)")
    parser.add_argument("--poll-interval", type=float, default=None,
                        help="internal_poll_interval for the rollout (default: tests/ansible.cfg's)")
    args = parser.parse_args()
    results = {"machine": machine(), "schedule": schedule_table()}
    if not args.schedule_only:
        workdir = tempfile.mkdtemp(prefix="rollout-bench-")
        try:
            executors = ("steps", "passes") if args.executor == "both" else (args.executor,)
            results["rollout"] = real_rollout(args.nodes, args.ports, workdir, args.poll_interval, executors)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    write_results(results, args.out)


if __name__ == "__main__":
    main()
