# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of gpufleet.nvidia.node_preflight: read a node and decide whether its upgrade may start.

One task of the node_upgrade role instead of a dozen: each of them cost the controller the same
(the play iterator, the variables of the host, a worker process), whatever it did. The modules
it runs on the node are the ones those tasks ran; the decision is ``plugin_utils.node_preflight``.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.module_utils import distributions
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import node_preflight, rollout_verdict, run_lease
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_action import ValidatedAction

ARGUMENT_SPEC = {
    "files": {"type": "dict", "required": True},
    "owner": {"type": "dict", "required": True},
    "rollout_id": {"type": "str", "required": True},
    "drain": {"type": "str", "required": True,
              "choices": ["none", "command", "slurm", "slurm_reboot", "kubernetes"]},
    "scheduler_output": {"type": "str", "default": ""},
    "lock_stale_s": {"type": "float", "default": 21600.0},
    "lock_break": {"type": "bool", "default": False},
    "resolve": {"type": "dict"},
    "ignore_xids": {"type": "list", "elements": "int", "default": []},
    "allow_flagged": {"type": "bool", "default": False},
    "allow_fatal_xids": {"type": "bool", "default": False},
    "allow_os_reboot_required": {"type": "bool", "default": False},
    "allow_drained": {"type": "bool", "default": False},
}

#: driver_resolve's options that mean "not given" when empty (the role passes them as "").
_EMPTY_MEANS_UNSET = ("version", "today")


class ActionModule(ValidatedAction):
    """Read the GPUs, the node's state files, its lock holder and (with ``resolve``) the driver it gets; decide."""

    NAME = "node_preflight"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def _module(self, name, args, task_vars, what, warnings):
        """Run one module on the node; its warnings join ``warnings``.

        :param what: what the run is for; a failure then fails the action naming it and the module.
            ``None``: a failure is returned (its ``failed`` and ``msg``), not raised.
        :returns: the module's result, without its ``warnings`` and Ansible's internal keys.
        """
        result = self._execute_module(module_name=name, module_args=args, task_vars=task_vars)
        warnings.extend(str(warning) for warning in result.get("warnings") or [])
        if result.get("failed") and what is not None:
            raise AnsibleActionFail("%s (%s): %s" % (what, name, result.get("msg") or "failed"))
        return dict((key, value) for key, value in result.items()
                    if not key.startswith("_ansible") and key != "warnings")

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
        try:
            known = dict(task_vars.get("ansible_facts") or {})
            new_facts = {}
            if "distribution" not in known or "kernel" not in known:
                gathered = self._module("ansible.builtin.setup", {"gather_subset": ["min"]}, task_vars,
                                        "gather the facts the driver resolution needs", warnings)
                new_facts.update(gathered.get("ansible_facts") or {})
                known.update((key[8:] if key.startswith("ansible_") else key, value)
                             for key, value in (gathered.get("ansible_facts") or {}).items())
            gpu = self._module("gpufleet.nvidia.gpu_facts", {}, task_vars, "read the driver and GPU state", warnings)
            facts = (gpu.get("ansible_facts") or {}).get("nvidia")
            new_facts["nvidia"] = facts
            read = self._module("gpufleet.nvidia.node_lock", {"files": args["files"]}, task_vars,
                                "read the node's state files", warnings)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        state = node_preflight.parse_state_files(read)
        warnings.extend(state["warnings"])
        try:
            drain = node_preflight.scheduler(args["drain"], args["scheduler_output"], state["drain_record"])
        except ValueError as exc:
            raise AnsibleActionFail("node_preflight: the node's state in %s: %s" % (args["drain"], exc))
        owner = args["owner"]
        found = state["lock_found"]
        probe = None
        if isinstance(found, dict) and found.get("run_id") and found.get("run_id") != owner.get("run_id"):
            pid = found.get("pid")
            probe = run_lease.probe_holder(found.get("controller"), int(pid) if str(pid or "").isdigit() else None,
                                           found.get("lease") or None)
        lock = rollout_verdict.rollout_lock(found, owner, time.time(), args["lock_stale_s"],
                                            probe["alive"] if probe else None, args["lock_break"])
        if lock.get("takeover"):
            warnings.append("lock taken over: %s%s" % ("; ".join(lock.get("notes") or []),
                                                       " (%s)" % probe["reason"] if probe else ""))
        result.update(changed=False, ansible_facts=new_facts, state=state, sched=drain["sched"],
                      drain_owned=drain["drain_owned"], lock=lock, probe=probe)
        if args["resolve"] is not None:
            result["resolve"] = self._resolve(args["resolve"], known, facts, task_vars, warnings)
            result["decision"] = node_preflight.decide(
                facts, result["resolve"], state, lock, drain["sched"], args)
        if warnings:
            host = task_vars.get("inventory_hostname") or "?"
            result["warnings"] = ["%s: %s" % (host, warning) for warning in warnings]
        return result

    def _resolve(self, request, known, facts, task_vars, warnings):
        """driver_resolve's result for this node; a failure is returned (the preflight refuses), not raised."""
        try:
            distribution = distributions.distribution_id(
                known.get("distribution"), known.get("distribution_major_version"), known.get("distribution_version"))
        except distributions.PlanError as exc:
            raise AnsibleActionFail("node_preflight: %s" % exc.message)
        module_args = dict((key, value) for key, value in request.items()
                           if not (key in _EMPTY_MEANS_UNSET and value in (None, "")))
        module_args.update(gpus=list((facts or {}).get("gpus") or []), distribution=distribution)
        try:
            return self._module("gpufleet.nvidia.driver_resolve", module_args, task_vars, None, warnings)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
