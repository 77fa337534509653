"""The rollout simulation checked against a real run: the pass executor over a simulated fleet on real Slurm.

Usage (as root, from the repository root, with the project's virtualenv Python)::

    python benchmarks/rollout/scale.py [--nodes 64] [--forks 8] [--drain-median-s 20] [--seed 1]
                                       [--pass-s 10] [--ports 25000-25199] [--out FILE]

1. A simulated fleet of ``--nodes`` nodes in two GPU classes (h100, a100 in turn) with its Slurm
   cluster (``make_fleet(..., slurm=True)``), every node on the baseline driver 580.126.20; the first
   node of each class golden, the second canary, the rest waves.
2. Each node's drain from the simulation's own distribution (``simulate.Fleet``: 90 % log-normal,
   median 6 min; 10 % a long job, median 45 min), scaled so that the short median is
   ``--drain-median-s``: a real ``sbatch`` job on each node that sleeps that long, with a time
   limit drawn as the simulation draws the scheduler's estimate (the drain over 30 to 100 %), in
   whole minutes (Slurm's unit). Every job runs before the rollout starts.
3. ``playbooks/rollout.yml`` with ``rollout_executor=passes``, ``node_upgrade_drain=slurm``, budget
   10 % (the default), ``-f --forks``, ``rollout_pass_s=--pass-s``, no soak; run again (the next
   job) while the report is not complete, at most 4 runs. Measured: the time from the first run's
   start to the last one's end; the most nodes of a class out of service at once (``scontrol show
   node -o``: a DRAIN flag, DOWN or a reboot flag, read every 2 s) against the class's budget;
   the most ``ansible-playbook`` workers alive at once (its forked processes, read every 0.5 s);
   controller CPU per node (``os.wait4``) and peak memory (Pss and Rss, summed over the process tree).
4. The prediction: ``simulate.Run`` of the same fleet (the same nodes, classes, stages, drains and
   estimates, measured from the jobs' start times) under ``simulate.SlurmDrainPasses`` with the
   pass barrier, ``--forks`` workers and ``--pass-s`` between decisions, the work after the drain
   and its split (install, reboot, verify) from the 16-node benchmark's pass run
   (``benchmarks/rollout/results.json``, ``by_executor.passes.node_phase_median_s``), and no
   unrelated failures (the simulated fleet has none).

Writes ``{"nodes", "forks", "measured": {...}, "predicted": {...}, "measured_over_predicted": {...},
"inputs": {...}, "fleet": [...]}`` (default ``benchmarks/rollout/scale-results.json``) and prints it;
``--predict RESULTS`` computes the prediction again for a recorded run (no fleet). Not part of the
tests: it is a benchmark (a 64-node run takes about half an hour on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(REPO, "tests", "simfleet"))

import bench  # noqa: E402  pylint: disable=wrong-import-position
import simulate  # noqa: E402  pylint: disable=wrong-import-position

LAYOUT = "h100,a100"
FLEET = "bench-scale"
RUNS = 4
#: Slurm states that take a node out of service (a DRAIN flag is read apart).
OUT_BASES = ("DOWN", "FUTURE", "UNKNOWN")
OUT_FLAGS = ("REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERING_UP", "POWERED_DOWN", "MAINTENANCE")

INVENTORY_VARS = """\
    node_upgrade_drain: slurm
    node_upgrade_slurm_node_name: "{{ simfleet_slurm_node_name }}"
    node_upgrade_drain_poll_s: 2
    node_upgrade_drain_timeout_s: 7200
    node_upgrade_reboot_timeout_s: 300
"""


def drains(names, seed, median_s):
    """Each node's drain and the scheduler's estimate of it: ``{name: (drain_s, limit_min)}``.

    Drawn as ``simulate.Fleet`` draws them (``simulate.drain_draw``, scaled by ``median_s / 360``);
    the estimate is the job's time limit, in whole minutes.
    """
    rng = random.Random(seed)
    guess = random.Random(seed + 7919)
    out = {}
    for name in names:
        drain, estimate = simulate.drain_draw(rng, guess, median_s / 360.0)
        out[name] = (drain, max(1, int(math.ceil(estimate / 60.0))))
    return out


def out_of_service(fleet):
    """Nodes Slurm does not give work to now: ``set`` of names (``scontrol show node -o``)."""
    from simfleet import slurmconf  # pylint: disable=import-outside-toplevel

    out = set()
    for name, fields in fleet.slurm_nodes().items():
        state = slurmconf.node_state(fields)
        if state["drain"] or state["base"] in OUT_BASES or any(flag in OUT_FLAGS for flag in state["flags"]):
            out.add(name)
    return out


def workers(pid):
    """``ansible-playbook`` workers alive now: the processes it forked that still run it (their
    children, the SSH clients, are not counted)."""
    count = 0
    for child in bench._tree(pid)[1:]:
        try:
            with open("/proc/%d/stat" % child, "r", encoding="ascii", errors="replace") as handle:
                if int(handle.read().rsplit(")", 1)[1].split()[1]) != pid:
                    continue
            with open("/proc/%d/cmdline" % child, "rb") as handle:
                if b"ansible-playbook" in handle.read():
                    count += 1
        except (OSError, IndexError, ValueError):
            continue
    return count


class Watch(object):
    """What the run's sampling thread sees: workers at each call, Slurm every ``every_s``."""

    def __init__(self, fleet, classes, every_s=2.0):
        self.fleet = fleet
        self.classes = classes
        self.every_s = every_s
        self.last = 0.0
        self.worker_peak = 0
        self.oos_peak = {}
        self.errors = 0

    def __call__(self, pid):
        self.worker_peak = max(self.worker_peak, workers(pid))
        now = time.monotonic()
        if now - self.last < self.every_s:
            return
        self.last = now
        try:
            out = out_of_service(self.fleet)
        except Exception:  # pylint: disable=broad-except
            self.errors += 1
            return
        for klass in set(self.classes.values()):
            count = len([name for name in out if self.classes.get(name) == klass])
            self.oos_peak[klass] = max(self.oos_peak.get(klass, 0), count)


def phases_from(path):
    """The 16-node benchmark's pass run: seconds of the work after the drain, and its split."""
    with open(path) as handle:
        rollout = json.load(handle)["rollout"]
    phases = rollout["by_executor"]["passes"]["node_phase_median_s"]
    install = phases.get("snapshot_s", 0.0) + phases["install_s"]
    reboot = phases["reboot_s"]
    verify = phases["verify_s"] + phases.get("finish_s", 0.0)
    work = install + reboot + verify
    return {"work_s": work, "install_share": install / work, "reboot_share": reboot / work,
            "verify_share": verify / work, "act_s": phases.get("preflight_drain_s", 5.0)}


def predict(nodes, forks, pass_s, inputs, job_gap_s):
    """``simulate.Run`` of the fleet ``nodes`` under the pass executor as it runs: completion (s),
    worker peak, the most of a class out of service (nodes)."""
    executor = simulate.SlurmDrainPasses(
        forks, pass_barrier=True, pass_overhead_s=inputs["pass_overhead_s"], act_s=inputs["act_s"],
        install_share=inputs["install_share"], reboot_share=inputs["reboot_share"],
        verify_share=inputs["verify_share"], passes_per_job=60, job_gap_s=job_gap_s)
    policy = simulate.BudgetPolicy(executor=executor, poll_s=pass_s, soak_s=0.0)
    fleet = simulate.Fleet.described(nodes)
    done = simulate.Run(fleet, policy).go()
    sizes = fleet.class_sizes()
    by_class = dict((klass, int(round(pct * sizes[klass] / 100.0))) for klass, pct in done["max_oos_by_class"].items())
    return {"completion_s": round(done["completion_s"], 1) if done["completion_s"] is not None else None,
            "worker_peak": done["worker_peak"], "passes": done["passes"], "jobs": done["jobs"],
            "max_out_of_service": max(by_class.values() or [0]), "max_out_of_service_by_class": by_class}


def real_run(args, workdir):
    from simfleet.testing import (  # pylint: disable=import-outside-toplevel
        FLEET_DRIVER_VARS,
        SimFleet,
        ansible_env,
        baseline_playbook,
        make_fleet,
    )

    fleet = make_fleet(FLEET, args.nodes, LAYOUT, args.ports, slurm=True)
    try:
        handle = SimFleet(fleet)
        classes = dict((name, "gpu_" + klass) for name, klass in handle.classes.items())
        names = sorted(classes)
        by_class = {}
        for name in names:
            by_class.setdefault(classes[name], []).append(name)
        golden = [members[0] for members in by_class.values()]
        canary = [members[1] for members in by_class.values()]
        inventory = os.path.join(workdir, "inventory.yml")
        with open(inventory, "w") as out:
            out.write("all:\n  vars:\n" + FLEET_DRIVER_VARS + INVENTORY_VARS + "  children:\n")
            for group, members in (("gpufleet_golden", golden), ("gpufleet_canary", canary)):
                out.write("    %s:\n      hosts:\n" % group + "".join("        %s:\n" % n for n in members))
        baseline = os.path.join(workdir, "baseline.yml")
        with open(baseline, "w") as out:
            out.write(baseline_playbook(bench.BASELINE_VERSION))
        env = ansible_env({"PATH": fleet.slurm().bin_dir + os.pathsep + ansible_env()["PATH"]})
        tool = os.path.join(os.path.dirname(sys.executable), "ansible-playbook")
        inventories = ["-i", handle.inventory, "-i", inventory]
        bench.run([tool] + inventories + [baseline, "-f", "16"], env, workdir, os.path.join(workdir, "baseline.log"))

        # One job per node, sleeping its drain, with its time limit.
        plan = drains(names, args.seed, args.drain_median_s)
        jobs = {}
        for name in names:
            drain, limit = plan[name]
            proc = handle.slurm(["sbatch", "--parsable", "--nodelist=" + name, "--partition=" + classes[name],
                                 "--chdir=/root", "--output=/dev/null", "--time=%d" % limit,
                                 "--wrap", "sleep %.1f" % drain], check=True)
            jobs[name] = proc.stdout.strip().split(";")[0]
        starts = {}
        deadline = time.time() + 300
        while len(starts) < len(jobs) and time.time() < deadline:
            listing = handle.slurm(["squeue", "--noheader", "--format", "%i %T %S"], check=True).stdout
            for line in listing.splitlines():
                job, state, start = line.split()
                if state == "RUNNING":
                    starts[job] = time.mktime(time.strptime(start, "%Y-%m-%dT%H:%M:%S"))
            time.sleep(1)
        if len(starts) < len(jobs):
            raise RuntimeError("jobs not running after 300 s: %s" % sorted(set(jobs.values()) - set(starts)))
        zero = time.time()
        nodes = []
        for name in names:
            drain, limit = plan[name]
            start = starts[jobs[name]]
            index = by_class[classes[name]].index(name)
            nodes.append({"name": name, "class": classes[name],
                          "stage": "golden" if index == 0 else "canary" if index == 1 else "waves",
                          "drain_s": max(0.0, start + drain - zero), "drain_until_s": max(0.0, start + drain - zero),
                          "drain_estimate_s": max(0.0, start + 60.0 * limit - zero)})

        watch = Watch(handle, classes)
        own_total = {"cpu_s": 0.0, "peak_pss_mb": 0.0, "peak_rss_mb": 0.0}
        cpu = 0.0
        gaps = []
        report = None
        started = time.perf_counter()
        for number in range(RUNS):
            if number:
                gaps.append(time.perf_counter())
            own = {}
            argv = [tool] + inventories + [
                os.path.join(REPO, "playbooks", "rollout.yml"), "-f", str(args.forks), "-e", "driver_branch=ltsb",
                "-e", "rollout_executor=passes", "-e", "rollout_pass_s=%s" % args.pass_s,
                "-e", "rollout_soak_s=0", "-e", "rollout_wave_soak_s=0", "-e", "rollout_id=scale",
                "-e", "rollout_report_dir=%s" % os.path.join(workdir, "report")]
            _wall, used = bench.run(argv, env, workdir, os.path.join(workdir, "rollout-%d.log" % number), own, watch)
            cpu += used
            own_total["cpu_s"] += own.get("cpu_s", 0.0)
            for key in ("peak_pss_mb", "peak_rss_mb"):
                own_total[key] = max(own_total[key], own.get(key, 0.0))
            with open(os.path.join(workdir, "report", "rollout-report.json")) as handle_in:
                report = json.load(handle_in)
            if report["status"] == "completed":
                break
        completion = time.perf_counter() - started
        with open(os.path.join(workdir, "report", "journal.jsonl")) as handle_in:
            passes = len([line for line in handle_in if json.loads(line).get("event") == "pass"])
        sizes = dict((klass, len(members)) for klass, members in by_class.items())
        budget = dict((klass, simulate.rollout_budget.amount_of(("percent", 10.0), size)) for klass, size in sizes.items())
        measured = {
            "completion_s": round(completion, 1),
            "runs": number + 1,
            "passes": passes,
            "status": report["status"],
            "summary": report["summary"],
            "max_out_of_service": max(watch.oos_peak.values() or [0]),
            "max_out_of_service_by_class": watch.oos_peak,
            "budget_by_class": budget,
            "worker_peak": watch.worker_peak,
            "cpu_s_per_node": round(cpu / args.nodes, 2),
            "main_process_cpu_s_per_node": round(own_total["cpu_s"] / args.nodes, 2),
            "controller_peak_rss_mb": round(own_total["peak_rss_mb"], 1),
            "controller_peak_pss_mb": round(own_total["peak_pss_mb"], 1),
            "slurm_read_errors": watch.errors,
        }
        return nodes, measured
    finally:
        fleet.down(purge=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--forks", type=int, default=8)
    parser.add_argument("--drain-median-s", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--pass-s", type=float, default=10.0)
    parser.add_argument("--pass-overhead-s", type=float, default=5.0,
                        help="the controller's own plays between two passes, for the prediction")
    parser.add_argument("--job-gap-s", type=float, default=15.0,
                        help="between two runs, for the prediction (the playbook's start)")
    parser.add_argument("--ports", default="25000-25199")
    parser.add_argument("--phases", default=os.path.join(HERE, "results.json"))
    parser.add_argument("--out", default=os.path.join(HERE, "scale-results.json"))
    parser.add_argument("--predict", metavar="RESULTS",
                        help="no fleet: predict again the run recorded in RESULTS (its nodes and measures)")
    args = parser.parse_args()
    inputs = dict(phases_from(args.phases), pass_overhead_s=args.pass_overhead_s)
    if args.predict:
        with open(args.predict) as handle:
            earlier = json.load(handle)
        nodes, measured = earlier["fleet"], earlier["measured"]
        args.nodes, args.forks = earlier["nodes"], earlier["forks"]
        for key in ("drain_median_s", "seed", "pass_s"):
            setattr(args, key, earlier["inputs"][key])
    else:
        workdir = tempfile.mkdtemp(prefix="rollout-scale-")
        try:
            nodes, measured = real_run(args, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    described = [dict(node, work_s=inputs["work_s"]) for node in nodes]
    predicted = predict(described, args.forks, args.pass_s, inputs, args.job_gap_s)
    ratio = {}
    for key in ("completion_s", "worker_peak", "max_out_of_service"):
        if predicted.get(key):
            ratio[key] = round(measured[key] / float(predicted[key]), 2)
    results = {"nodes": args.nodes, "forks": args.forks, "machine": bench.machine(), "measured": measured,
               "predicted": predicted, "measured_over_predicted": ratio,
               "inputs": dict(inputs, drain_median_s=args.drain_median_s, seed=args.seed, pass_s=args.pass_s,
                              job_gap_s=args.job_gap_s, layout=LAYOUT,
                              drain_s_median=round(sorted(n["drain_s"] for n in nodes)[len(nodes) // 2], 1),
                              drain_s_max=round(max(n["drain_s"] for n in nodes), 1)),
               # The fleet as the prediction read it: each node's class, stage, and when its job ends.
               "fleet": nodes}
    bench.write_results(results, args.out)


if __name__ == "__main__":
    main()
