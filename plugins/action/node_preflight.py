# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of gpufleet.nvidia.node_preflight: read a node and decide whether its upgrade may start.

One task of the node_upgrade role instead of a dozen: each of them cost the controller the same
(the play iterator, the variables of the host, a worker process), whatever it did. The modules
it runs on the node are the ones those tasks ran; the decision is ``plugin_utils.node_preflight``.
"""

from __future__ import annotations

import os
import time

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.module_utils import distributions, state_file
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import node_preflight, rollout_verdict, run_lease
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_action import NodeAction, without_unset

ARGUMENT_SPEC = {
    "files": {"type": "dict", "required": True},
    "owner": {"type": "dict", "required": True},
    "rollout_id": {"type": "str", "required": True},
    "drain": {"type": "str", "required": True,
              "choices": ["none", "command", "slurm", "slurm_reboot", "kubernetes"]},
    "scheduler_output": {"type": "str", "default": ""},
    "scheduler_node": {"type": "str"},
    "lock_stale_s": {"type": "float", "default": 21600.0},
    "lock_break": {"type": "bool", "default": False},
    "resolve": {"type": "dict"},
    "ignore_xids": {"type": "list", "elements": "int", "default": []},
    "allow_flagged": {"type": "bool", "default": False},
    "allow_fatal_xids": {"type": "bool", "default": False},
    "allow_os_reboot_required": {"type": "bool", "default": False},
    "allow_drained": {"type": "bool", "default": False},
    "take_lock": {"type": "bool", "default": False},
    "drain_record": {"type": "dict", "options": {
        "path": {"type": "str", "required": True},
        "reason": {"type": "str"},
    }},
}

#: The facts the rollout reads besides ``nvidia`` (the distribution for the driver's packages, the
#: kernel and package manager for the kernel hold): every fact kept is copied for every task of
#: the host, so the rest of ``min`` is left out.
_FACTS_KEPT = ("ansible_distribution*", "ansible_kernel", "ansible_pkg_mgr", "ansible_os_family",
               "ansible_architecture", "ansible_nodename", "ansible_service_mgr")

#: What the result keeps of driver_resolve's (the decision used the rest).
_RESOLVE_KEPT = ("resolved", "failed", "msg", "fabric_manager")

#: driver_resolve's options that mean "not given" when empty (the role passes them as "").
_EMPTY_MEANS_UNSET = ("version", "today")


class ActionModule(NodeAction):
    """Read the GPUs, the node's state files, its lock holder and (with ``resolve``) the driver it gets; decide."""

    NAME = "node_preflight"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        """Read the node and decide (the options and the result are in ``plugins/modules/node_preflight.py``).

        :returns: ``{"ansible_facts": {"nvidia", [min facts]}, "state", "sched", "drain_owned", "lock",
            "probe", ["resolve", "decision"], ["warnings": ["<host>: <warning>"]]}``; the
            modules' own warnings are passed on.
        :raises AnsibleActionFail: bad arguments, a module that failed (named), an unknown
            scheduler output, or a distribution the collection does not support.
        """
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validated_args()
        warnings = []
        known = dict(task_vars.get("ansible_facts") or {})
        new_facts = {}
        if "distribution" not in known or "kernel" not in known:
            gathered = self._module("ansible.builtin.setup", {"gather_subset": ["min"], "filter": list(_FACTS_KEPT)},
                                    task_vars,
                                    "gather the facts the driver resolution needs", warnings)
            new_facts.update(gathered.get("ansible_facts") or {})
            known.update((key[8:] if key.startswith("ansible_") else key, value)
                         for key, value in (gathered.get("ansible_facts") or {}).items())
        gpu = self._module("gpufleet.nvidia.gpu_facts", {}, task_vars, "read the driver and GPU state", warnings)
        facts = (gpu.get("ansible_facts") or {}).get("nvidia")
        new_facts["nvidia"] = facts
        read = self._module("gpufleet.nvidia.node_lock", {"files": args["files"]}, task_vars,
                            "read the node's state files", warnings)
        state = node_preflight.parse_state_files(read)
        warnings.extend(state["warnings"])
        try:
            drain = node_preflight.scheduler(args["drain"], args["scheduler_output"], state["drain_record"],
                                             args["scheduler_node"] or None)
        except ValueError as exc:
            raise AnsibleActionFail("node_preflight: the node's state in %s: %s" % (args["drain"], exc))
        owner = args["owner"]
        found = state["lock_found"]
        probe = None
        if isinstance(found, dict) and found and (not found.get("run_id") or found.get("run_id") != owner.get("run_id")):
            # The lease is looked up by the lock's run id in the runs/ directory of the lock's rollout
            # beside this one's (<reports>/<rollout_id>/runs, the names through the one file-name rule),
            # else in this run's own: never at the path the node's lock names.
            own_lease = owner.get("lease")
            runs_dir = os.path.dirname(own_lease) if isinstance(own_lease, str) and own_lease else None
            holder = found.get("rollout_id")
            if runs_dir and isinstance(holder, str) and holder and holder != args["rollout_id"]:
                try:
                    runs_dir = os.path.join(os.path.dirname(os.path.dirname(runs_dir)), state_file.file_name(holder),
                                            "runs")
                except ValueError:
                    pass
            probe = run_lease.probe_holder(found, runs_dir)
        lock = rollout_verdict.rollout_lock(found, owner, time.time(), args["lock_stale_s"],
                                            probe["alive"] if probe else None, args["lock_break"],
                                            probe["reason"] if probe else None)
        if lock.get("takeover"):
            warnings.append("lock taken over: %s%s" % ("; ".join(lock.get("notes") or []),
                                                       " (%s)" % probe["reason"] if probe else ""))
        result.update(changed=False, ansible_facts=new_facts, state=state, sched=drain["sched"],
                      drain_owned=drain["drain_owned"], lock=lock, probe=probe)
        if args["resolve"] is not None:
            result["resolve"] = self._resolve(args["resolve"], known, facts, task_vars, warnings)
            result["decision"] = node_preflight.decide(
                facts, result["resolve"], state, lock, drain["sched"], args)
            # What the role reads of it: the plan and the repository's versions stay here (every
            # byte of a result is copied and walked by ansible-playbook's process).
            result["resolve"] = dict((key, value) for key, value in result["resolve"].items() if key in _RESOLVE_KEPT)
            result["state"] = dict(state, saved_snapshot=node_preflight.snapshot_for_upgrade(
                state.get("saved_snapshot"), str(args["rollout_id"]),
                bool((result["decision"].get("left") or {}).get("unrecorded"))))
        result["marks"] = {"started": time.time()}
        result["lock_taken"] = None
        result["drain_recorded"] = False
        if args["take_lock"] and args["resolve"] is not None and not self._task.check_mode:
            self._take(args, result, state, task_vars, warnings)
        if warnings:
            host = task_vars.get("inventory_hostname") or "?"
            result["warnings"] = ["%s: %s" % (host, warning) for warning in warnings]
        return result

    def _take(self, args, result, state, task_vars, warnings):
        """Take the lock of a node that is upgraded (or whose left-over lock is released), then record
        that this rollout drains it (before the drain: a node cut off meanwhile stays ours).

        The lock is taken by compare-and-swap: only if the lock file is still what was read. When
        another controller took it in between, the lock and an upgrade become refusals that name
        the holder, and nothing is written. The drain record keeps who drained the node first.
        """
        decision = result["decision"]
        preflight = decision["preflight"]
        if preflight["action"] != "upgrade" and not decision["left"].get("left_lock"):
            return
        taken = self._module("gpufleet.nvidia.node_lock", {
            "path": args["files"]["lock"], "state": "acquire", "lock": result["lock"]["lock"],
            "expect": state["lock_identity"]}, task_vars, "take the node's rollout lock", warnings)
        result["lock_taken"] = bool(taken.get("acquired"))
        result["changed"] = result["lock_taken"]
        if not result["lock_taken"]:
            refused = dict(result["lock"], ok=False, reasons=[taken.get("reason")], flags=["locked"])
            result["lock"] = refused
            if preflight["action"] == "upgrade":
                decision["preflight"] = dict(preflight, ok=False, action="refuse",
                                             reasons=refused["reasons"] + list(preflight["reasons"]),
                                             flags=refused["flags"] + list(preflight["flags"]))
            return
        if preflight["action"] != "upgrade" or decision["staged"]:
            return
        if args["drain"] == "none":
            # No scheduler: the node is out of service once it is this rollout's.
            result["marks"]["drained"] = time.time()
        record = args["drain_record"]
        if not result["drain_owned"] or record is None:
            return
        content = node_preflight.drain_record(
            state["drain_record"], args["drain"], args["rollout_id"], args["owner"].get("run_id"), record["reason"],
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self._module("gpufleet.nvidia.node_lock", {"state": "write", "path": record["path"], "content": content},
                     task_vars, "record on the node that this rollout drains it", warnings)
        result["drain_recorded"] = True

    def _resolve(self, request, known, facts, task_vars, warnings):
        """driver_resolve's result for this node; a failure is returned (the preflight refuses), not raised."""
        try:
            distribution = distributions.distribution_id(
                known.get("distribution"), known.get("distribution_major_version"), known.get("distribution_version"))
        except distributions.PlanError as exc:
            raise AnsibleActionFail("node_preflight: %s" % exc.message)
        module_args = without_unset(request, _EMPTY_MEANS_UNSET)
        module_args.update(gpus=list((facts or {}).get("gpus") or []), distribution=distribution)
        return self._module("gpufleet.nvidia.driver_resolve", module_args, task_vars, None, warnings)
