"""The main job on the simulated fleet: a canary driver rollout that meets a failing node.

1. Bring up 8 simulated nodes (H100, A100, L40S and one V100), fresh.
2. Install the baseline driver on every node: R580 (LTSB) at one exact version, pinned, rebooted
   into, marked known-good, with the class's GPU policy in effect.
3. Make one wave node (node06) lose a GPU at its next boot.
4. Roll out ``driver_branch: ltsb`` golden (node01) → canary (node02, node04) → waves, within
   each GPU class's budget: R620 where the GPUs allow it, R580 on the V100 (the last branch for
   Volta), as the report says. node06 fails verification after its reboot, goes back to its last
   known-good driver and is quarantined (drained and flagged); one failure in its class is within
   the failure budget and implicates nothing, so the rollout goes on and completes.
5. Print the rollout report and the drift report, and where their HTML pages are.

Exits 0 when all of that happened as described, 1 otherwise. Run by ``make demo`` (root,
Debian 12); the fleet stays up afterwards (``tests/simfleet/bin/simfleet --name demo down``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SIMFLEET = [os.path.join(REPO, "tests", "simfleet", "bin", "simfleet"), "--name", "demo"]
BIN = os.path.dirname(sys.executable)
LAYOUT = "h100,a100,l40s,v100,h100,a100,l40s,h100"
BASELINE = "580.126.20"
FAILING_NODE = "node06"
ROLLOUT_ID = "demo-ltsb"
REPORTS = os.path.join(REPO, ".build", "demo-reports")
DRAIN_MARK = "/var/lib/gpufleet/drained"


def say(text: str) -> None:
    print("\n== %s" % text, flush=True)


def run(argv, check=True, **kwargs) -> subprocess.CompletedProcess:
    print("$ %s" % " ".join(argv), flush=True)
    return subprocess.run(argv, check=check, **kwargs)


def playbook(inventory: str, path: str, *args: str, check: bool = True) -> int:
    argv = [os.path.join(BIN, "ansible-playbook"), "-i", inventory, "-i",
            os.path.join(REPO, "inventories", "simfleet"), path] + list(args)
    return run(argv, check=check).returncode


def main() -> int:
    if os.geteuid() != 0:
        print("the simulated fleet needs root", file=sys.stderr)
        return 1
    started = time.time()

    say("Bring up the simulated fleet (8 nodes)")
    run(SIMFLEET + ["up", "8", "--layout", LAYOUT])
    run(SIMFLEET + ["reset"])
    shutil.rmtree(REPORTS, ignore_errors=True)
    inventory = run(SIMFLEET + ["inventory", "--path"], capture_output=True, text=True).stdout.strip()

    say("Install the baseline driver %s (R580 LTSB) everywhere" % BASELINE)
    playbook(inventory, os.path.join(REPO, "tools", "demo", "baseline.yml"), "-e", "demo_baseline_version=%s" % BASELINE)

    say("Make %s lose GPU 3 at its next boot" % FAILING_NODE)
    run(SIMFLEET + ["fault", FAILING_NODE, "gpu_lost", "gpu=3"])

    say("Roll out driver_branch=ltsb: golden -> canary -> waves")
    rollout_dir = os.path.join(REPORTS, "rollout")
    rc = playbook(inventory, os.path.join(REPO, "playbooks", "rollout.yml"),
                  "-e", "driver_branch=ltsb", "-e", "rollout_id=%s" % ROLLOUT_ID,
                  "-e", "rollout_report_dir=%s" % rollout_dir,
                  "-e", "rollout_soak_s=5", check=False)
    print("rollout playbook exit code: %d (a quarantined node fails its host)" % rc)

    say("Rollout report")
    report_md = os.path.join(rollout_dir, "rollout-report.md")
    report_json = os.path.join(rollout_dir, "rollout-report.json")
    with open(report_md) as handle:
        print(handle.read())

    say("Drift report")
    playbook(inventory, os.path.join(REPO, "playbooks", "drift_report.yml"),
             "-e", "drift_report_only=true", "-e", "drift_output_dir=%s" % os.path.join(REPORTS, "drift"))

    say("HTML reports (open in a browser)")
    for page in (os.path.join(rollout_dir, "rollout-report.html"), os.path.join(REPORTS, "drift", "drift-report.html")):
        print("file://%s%s" % (page, "" if os.path.exists(page) else " (missing)"))

    with open(report_json) as handle:
        report = json.load(handle)
    drained = dict((node["node"], is_drained(node["node"])) for node in report.get("nodes", []))
    print("drained (%s on the node): %s" % (DRAIN_MARK, ", ".join(n for n, d in sorted(drained.items()) if d) or "none"))
    problems = check_story(report, rc, drained)
    say("Done in %.0f s" % (time.time() - started))
    if problems:
        print("The demo did not go as described:\n- " + "\n- ".join(problems))
        return 1
    print("As described: %s went back to %s and was quarantined, the rollout went on and completed, "
          "the V100 stayed on R580 (the last branch for Volta)." % (FAILING_NODE, BASELINE))
    print("Reports: %s\nTake the fleet down with: %s down" % (REPORTS, " ".join(SIMFLEET)))
    return 0


def is_drained(node: str) -> bool:
    """Whether the node carries the drain mark (inventories/simfleet: the drain command's file)."""
    probe = run(SIMFLEET + ["ssh", node, "test", "-e", DRAIN_MARK], check=False, capture_output=True)
    return probe.returncode == 0


def check_story(report: dict, rc: int, drained: dict) -> list:
    """Compare the rollout report and the nodes' drain marks with the story the demo tells.

    :param report: the rollout report (rollout-report.json).
    :param rc: the rollout playbook's exit status.
    :param drained: node name -> whether it is drained now.
    :returns: the differences, as sentences (empty when the story held).
    """
    nodes = dict((entry["node"], entry) for entry in report.get("nodes", []))
    problems = []
    if not drained.get(FAILING_NODE):
        problems.append("%s is not drained after its failure" % FAILING_NODE)
    back_in_service = sorted(n for n, d in drained.items() if d and n != FAILING_NODE)
    if back_in_service:
        problems.append("nodes other than %s are still drained: %s" % (FAILING_NODE, ", ".join(back_in_service)))
    if rc == 0:
        problems.append("the rollout playbook succeeded although %s lost a GPU" % FAILING_NODE)
    if report.get("status") != "completed" or [q["node"] for q in report.get("quarantined", [])] != [FAILING_NODE]:
        problems.append("the rollout did not complete with %s quarantined: %r, %r, %r"
                        % (FAILING_NODE, report.get("status"), report.get("stop_reason"), report.get("quarantined")))
    failing = nodes.get(FAILING_NODE, {})
    if failing.get("result") not in ("rolled_back", "flagged") or \
            (failing.get("after") or {}).get("loaded") != BASELINE:
        problems.append("%s did not end on %s, rolled back: %r" % (FAILING_NODE, BASELINE, failing))
    not_started = sorted(n for n, e in nodes.items() if e.get("result") == "not_started")
    if not_started:
        problems.append("nodes were left out of the rollout: %s" % ", ".join(not_started))
    v100 = nodes.get("node04", {})
    if not str((v100.get("after") or {}).get("loaded") or "").startswith("580."):
        problems.append("the V100 node04 is not on R580 after the rollout: %r" % v100)
    upgraded = [n for n, e in nodes.items() if e.get("result") == "upgraded"]
    for node in upgraded:
        if node != "node04" and not str((nodes[node].get("after") or {}).get("loaded") or "").startswith("620."):
            problems.append("%s was upgraded but is not on R620: %r" % (node, nodes[node]))
    if "node01" not in upgraded:
        problems.append("the golden node01 was not upgraded: %r" % nodes.get("node01"))
    return problems


if __name__ == "__main__":
    sys.exit(main())
