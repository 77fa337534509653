# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of gpufleet.nvidia.node_transaction: phases of the node_upgrade transaction in one task.

Each phase was a handful of tasks of the node_upgrade role (tasks/snapshot.yml, tasks/verify.yml,
tasks/hold_kernel.yml, the driver role's mark_known_good); a task costs the controller the same
whatever it does, so the phases that follow one another run in one task. The modules they run on
the node are those the tasks ran; the decisions are ``plugin_utils.rollout_verdict``'s and
``plugin_utils.rollout_report``'s. The state of the transaction so far (``tx``) goes in and comes
out, so a later call, and the role's rescue, go on from it.
"""

from __future__ import annotations

import base64
import time

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_report, rollout_verdict
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_action import NodeAction, add_diff

#: The phases, in the order they run when several are asked for in one task.
PHASES = ("snapshot", "verify", "check", "hold_kernel", "known_good")

ARGUMENT_SPEC = {
    "phases": {"type": "list", "elements": "str", "required": True, "choices": list(PHASES)},
    "tx": {"type": "dict", "default": {}},
    "marks": {"type": "dict", "default": {}},
    "rollout_id": {"type": "str", "required": True},
    "run_id": {"type": "str", "required": True},
    "stage": {"type": "str", "required": True},
    "target": {"type": "str", "default": ""},
    "snapshot": {"type": "dict", "default": {}, "options": {
        "path": {"type": "str", "default": ""},
        "saved": {"type": "raw"},
        "boot_id": {"type": "str"},
        "local_facts": {"type": "dict", "default": {}},
    }},
    "trace": {"type": "dict", "default": {}, "options": {
        "enabled": {"type": "bool", "default": True},
        "duration_s": {"type": "float", "default": 3.0},
        "interval_s": {"type": "float", "default": 0.5},
    }},
    "benchmark": {"type": "dict", "default": {}, "options": {
        "command": {"type": "list", "elements": "str", "default": []},
        "baseline": {"type": "raw"},
        "threshold": {"type": "float"},
        "runs": {"type": "int", "default": 3},
        "higher_is_better": {"type": "bool", "default": True},
    }},
    "verify": {"type": "dict", "default": {}, "options": {
        "boot_id_file": {"type": "str", "default": "/proc/sys/kernel/random/boot_id"},
        "ignore_xids": {"type": "list", "elements": "int", "default": []},
        "allow_gpu_count_change": {"type": "bool", "default": False},
        "replaced_gpus": {"type": "list", "elements": "str", "default": []},
        "golden_report_dir": {"type": "str", "default": ""},
        "node_class": {"type": "str", "default": "unclassified"},
        "golden_ignore": {"type": "list", "elements": "str", "default": []},
        "rollback_version": {"type": "str", "default": ""},
    }},
    "policy": {"type": "dict", "default": {}, "options": {
        "mode": {"type": "str", "default": "none", "choices": ["none", "apply", "verify"]},
        "report": {"type": "raw"},
    }},
    "kernel_hold": {"type": "dict", "default": {}, "options": {
        "packages_extra": {"type": "list", "elements": "str", "default": []},
        "unattended_upgrades": {"type": "bool", "default": True},
        "blacklist_extra": {"type": "list", "elements": "str", "default": []},
    }},
    "known_good": {"type": "dict", "default": {}, "options": {
        "path": {"type": "str", "default": "/etc/ansible/facts.d/gpufleet_driver.fact"},
        "history_limit": {"type": "int", "default": 50},
    }},
}


class PhaseFailed(Exception):
    """A phase that failed: the transaction's rescue takes over (``msg`` says why)."""


class ActionModule(NodeAction):
    """Run the asked phases of one node's upgrade transaction, in order; stop at the first that fails."""

    NAME = "node_transaction"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        """Run ``phases`` (the options and the result are in ``plugins/modules/node_transaction.py``).

        :returns: ``{"changed", "tx": {"marks", ["snapshot": when the snapshot phase ran], "verdict", "verify_options",
            "after_boot_id", "trace_before", "trace_after", "policy_mode", "kernel_hold",
            "known_good", "phases_done"}, "ansible_facts": {"nvidia"}}``; ``failed`` and ``msg``
            when a phase failed, with ``tx`` as far as it got (the rescue needs it).
        :raises AnsibleActionFail: bad arguments (before anything runs).
        """
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validated_args()
        if self._task.check_mode:
            raise AnsibleActionFail("node_transaction: changes the node; the role runs it outside check mode only")
        try:
            rollout_verdict.replaced_buses(args["verify"]["replaced_gpus"])
        except ValueError as exc:
            raise AnsibleActionFail("node_transaction: verify.%s" % exc)
        tx = dict(args["tx"] or {})
        tx.setdefault("marks", dict(args["marks"] or {}))
        tx.setdefault("phases_done", [])
        tx["marks"] = dict(tx["marks"])
        tx["phases_done"] = list(tx["phases_done"])
        warnings = []
        state = {"facts": (task_vars.get("ansible_facts") or {}).get("nvidia"), "changed": False}
        wanted = set(args["phases"])
        try:
            for phase in PHASES:
                if phase in wanted:
                    getattr(self, "_" + phase)(args, tx, state, task_vars, warnings)
                    tx["phases_done"].append(phase)
        except (PhaseFailed, AnsibleActionFail) as exc:
            result.update(failed=True, msg=str(exc.args[0] if exc.args else exc))
        if "snapshot" not in wanted:
            # The caller gave it and keeps it: not echoed (the GPU facts and trace in it, about 25 KB
            # a node, would be copied and walked again by ansible-playbook's process).
            tx.pop("snapshot", None)
        result.update(changed=state["changed"], tx=tx)
        add_diff(result, state.get("diff"))
        if state.get("facts_read"):
            result["ansible_facts"] = {"nvidia": state["facts"]}
        if warnings:
            host = task_vars.get("inventory_hostname") or "?"
            result["warnings"] = ["%s: %s" % (host, warning) for warning in warnings]
        return result

    def _read_facts(self, state, task_vars, warnings, kernel_log=True):
        gpu = self._module("gpufleet.nvidia.gpu_facts", {} if kernel_log else {"kernel_log": False},
                           task_vars, "read the driver and GPU state", warnings)
        state["facts"] = (gpu.get("ansible_facts") or {}).get("nvidia")
        state["facts_read"] = True
        # The next module runs of this task see the facts just read.
        task_vars.setdefault("ansible_facts", {})
        task_vars["ansible_facts"] = dict(task_vars["ansible_facts"], nvidia=state["facts"])
        return state["facts"]

    def _trace(self, args, baseline, task_vars, warnings):
        """gpu_trace while the benchmark runs (when one is declared), else for a few seconds at idle.

        :returns: the module's result, or ``None`` when neither a trace nor a benchmark is wanted.
        :raises PhaseFailed: the benchmark failed (a trace that cannot be taken without one is
            left out: the node may have no driver yet).
        """
        command = args["benchmark"]["command"]
        if not (args["trace"]["enabled"] or command):
            return None
        module_args = {"duration_s": args["trace"]["duration_s"], "interval_s": args["trace"]["interval_s"]}
        if command:
            module_args["command"] = command
        if baseline:
            module_args["baseline"] = baseline
        traced = self._module("gpufleet.nvidia.gpu_trace", module_args, task_vars, None, warnings)
        if traced.get("failed"):
            if command:
                raise PhaseFailed("the benchmark failed (gpufleet.nvidia.gpu_trace): %s" % (traced.get("msg") or "failed"))
            return None
        return traced

    @staticmethod
    def _benchmark_result(traced):
        lines = ((traced or {}).get("command") or {}).get("stdout_lines") or []
        if not lines:
            return None
        try:
            return float(lines[-1])
        except ValueError:
            raise PhaseFailed("the benchmark's last line is not a number: %r" % lines[-1][:80])

    def _benchmark_runs(self, args, traced, task_vars, warnings):
        """The benchmark's results before the install: the traced run, then ``runs - 1`` more.

        :returns: ``[float]`` (``[]`` when no benchmark is declared).
        :raises PhaseFailed: a run failed or printed no number.
        """
        first = self._benchmark_result(traced)
        if first is None:
            return []
        runs = [first]
        command = args["benchmark"]["command"]
        for _run in range(max(1, int(args["benchmark"]["runs"])) - 1):
            ran = self._module("ansible.builtin.command", {"argv": command}, task_vars, None, warnings)
            if ran.get("failed") or ran.get("rc"):
                raise PhaseFailed("the benchmark failed on run %d: %s" % (len(runs) + 1, ran.get("msg") or ran.get("rc")))
            runs.append(self._benchmark_result({"command": ran}))
        return runs

    def _snapshot(self, args, tx, state, task_vars, warnings):
        """The evidence before the update, saved on the node (tasks/snapshot.yml before)."""
        snap = args["snapshot"]
        if not snap["path"]:
            raise AnsibleActionFail("node_transaction: the snapshot phase needs snapshot.path")
        saved = snap.get("saved") if isinstance(snap.get("saved"), dict) else None
        traced = None
        if (saved or {}).get("rollout_id") != args["rollout_id"]:
            traced = self._trace(args, None, task_vars, warnings)
        fresh = {
            "rollout_id": args["rollout_id"], "run_id": args["run_id"], "stage": args["stage"],
            "taken_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "boot_id": snap.get("boot_id"), "facts": state["facts"], "local_facts": snap.get("local_facts") or {},
            "target": args["target"], "benchmark": None,
            "benchmark_runs": self._benchmark_runs(args, traced, task_vars, warnings),
            "trace": {"csv": traced["csv"], "summary": traced.get("summary")} if traced and "csv" in traced else None,
        }
        if fresh["benchmark_runs"]:
            fresh["benchmark"] = sorted(fresh["benchmark_runs"])[len(fresh["benchmark_runs"]) // 2]
        snapshot = rollout_verdict.rollout_snapshot(saved, fresh, args["rollout_id"])
        if not snapshot.get("resumed"):
            saved_now = self._module("gpufleet.nvidia.node_lock", {"state": "write", "path": snap["path"],
                                                                   "content": snapshot},
                                     task_vars, "save the snapshot on the node", warnings)
            add_diff(state, saved_now.get("diff"))
            state["changed"] = True
        tx["snapshot"] = snapshot
        # After the save: a rescue rolls the driver back only once the snapshot is on the node.
        tx["marks"]["snapshot"] = time.time()

    def _verify(self, args, tx, state, task_vars, warnings):
        """The driver, the GPUs, the Xids and the golden node's contract after the reboot (tasks/verify.yml's
        first verdict); fails the phase when the node failed them."""
        snapshot = tx.get("snapshot") or {}
        opts = args["verify"]
        facts = self._read_facts(state, task_vars, warnings)
        boot = self._module("ansible.builtin.slurp", {"src": opts["boot_id_file"]}, task_vars,
                            "read the boot id after the reboot", warnings)
        after_boot_id = base64.b64decode(boot.get("content") or "").decode("utf-8", "replace").strip()
        golden = None
        if opts["golden_report_dir"] and args["stage"] != "golden":
            golden = rollout_report.golden_contract(opts["golden_report_dir"], opts["node_class"])
        rollback = rollout_verdict.rollback_target(snapshot.get("facts"), snapshot.get("local_facts") or None,
                                                   opts["rollback_version"] or None, args["target"] or None)
        options = {
            "before_boot_id": snapshot.get("boot_id"), "after_boot_id": after_boot_id,
            "ignore_xids": opts["ignore_xids"], "allow_gpu_count_change": opts["allow_gpu_count_change"],
            "replaced_gpus": opts["replaced_gpus"], "golden": golden, "golden_ignore": opts["golden_ignore"],
            "rollback_available": rollback.get("version") is not None,
        }
        tx["after_boot_id"] = after_boot_id
        tx["verify_options"] = options
        tx["policy_mode"] = args["policy"]["mode"]
        tx["verdict"] = rollout_verdict.verify_upgrade(facts, snapshot.get("facts"), args["target"] or None,
                                                       None, None, options)
        if not tx["verdict"]["ok"]:
            raise PhaseFailed("verification failed on %s: %s" % (args["target"], "; ".join(tx["verdict"]["reasons"])))

    def _check(self, args, tx, state, task_vars, warnings):
        """The trace after the update, then the verdict with the policy report and the benchmark
        (tasks/verify.yml's second verdict); fails the phase when the node failed it."""
        snapshot = tx.get("snapshot") or {}
        bench = args["benchmark"]
        traced = self._trace(args, (snapshot.get("trace") or {}).get("summary"), task_vars, warnings)
        tx["trace_after"] = ({"csv": traced["csv"], "changes": traced.get("changes")}
                             if traced and traced.get("csv") is not None else None)
        after = self._benchmark_result(traced)
        before = bench["baseline"] if bench["baseline"] not in (None, "") else (
            snapshot.get("benchmark_runs") or snapshot.get("benchmark"))
        benchmark = {"before": before, "after": after} if after is not None and before is not None else None
        mode = args["policy"]["mode"]
        options = dict(tx.get("verify_options") or {})
        options.update(require_policy=mode != "none", benchmark_threshold=bench["threshold"],
                       benchmark_higher_is_better=bench["higher_is_better"], require_benchmark=bool(bench["command"]))
        try:
            tx["verdict"] = rollout_verdict.verify_upgrade(
                state["facts"], snapshot.get("facts"), args["target"] or None,
                args["policy"]["report"] if mode != "none" else None, benchmark, options)
        except ValueError as exc:
            raise AnsibleActionFail("node_transaction: %s" % exc)
        tx["marks"]["verified"] = time.time()
        if not tx["verdict"]["ok"]:
            raise PhaseFailed("verification failed on %s: %s" % (args["target"], "; ".join(tx["verdict"]["reasons"])))

    def _hold_kernel(self, args, tx, state, task_vars, warnings):
        """Hold the running kernel (apt; the kernel_hold role's apt tasks before)."""
        hold = dict(args["kernel_hold"], state="present")
        held = self._module("gpufleet.nvidia.kernel_hold", hold, task_vars, "hold the kernel", warnings)
        add_diff(state, held.get("diff"))
        state["changed"] = state["changed"] or bool(held.get("changed"))
        tx["kernel_hold"] = dict((key, held.get(key)) for key in (
            "running_kernel", "running_kernel_package", "held", "held_by_role", "held_before_by_others",
            "unattended_upgrades_blacklist"))

    def _known_good(self, args, tx, state, task_vars, warnings):
        """Record the driver as last known-good (the driver role's mark_known_good): as this task's
        verification read it, else read again; driver_known_good fails, changing nothing, unless
        the loaded driver is the installed one and is healthy."""
        facts = state["facts"]
        if not state.get("facts_read"):
            facts = self._read_facts(state, task_vars, warnings, kernel_log=False)
        driver = (facts or {}).get("driver") or {}
        marked = self._module("gpufleet.nvidia.driver_known_good", {
            "path": args["known_good"]["path"], "loaded_version": driver.get("loaded_version") or "",
            "driver_state": driver.get("state") or "", "history_limit": args["known_good"]["history_limit"],
        }, task_vars, "record the driver as last known-good", warnings)
        state["changed"] = state["changed"] or bool(marked.get("changed"))
        add_diff(state, marked.pop("diff", None))
        tx["known_good"] = dict((key, value) for key, value in marked.items() if key not in ("changed", "failed"))
