# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side filters of the driver rollout: serial schedules and the node upgrade verdicts.

Thin wrappers over ``plugin_utils.schedule`` and ``plugin_utils.rollout_verdict``; each filter's
documentation is in the ``<filter>.yml`` file beside this one.
"""

from __future__ import annotations

from collections.abc import Mapping

from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_verdict as rv
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import schedule
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import contract_decision, node_preflight, rollout_report, scheduler_state
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_next_step


def _call(func, *args, **kwargs):
    try:
        return func(*args, **kwargs)
    except ValueError as exc:
        raise AnsibleFilterError("%s: %s" % (func.__name__, exc))


def _number(value, default=None):
    if value is None or value == "":
        return default
    return float(value)


def rollout_batches(serial, host_count):
    """Batch sizes ansible-core runs for ``host_count`` hosts with this ``serial``."""
    return _call(schedule.serial_batches, serial, int(host_count))


def rollout_batch_count(serial, host_count):
    """Number of sequential batches for ``host_count`` hosts."""
    return _call(schedule.batch_count, serial, int(host_count))


def rollout_plan(stages, node_minutes=None, gate_minutes=None):
    """Batches per stage, sequential batches in all, gates and an estimate of the duration."""
    return _call(schedule.plan_rollout, stages or [], _number(node_minutes), _number(gate_minutes))


def rollout_preflight(facts, target_version=None, flag=None, os_reboot_required=False, pinned=None, options=None):
    """May this node start its upgrade (or is it already done)?"""
    return _call(rv.preflight, facts, target_version or None, flag or None, bool(os_reboot_required),
                 None if pinned is None else bool(pinned), options or {})


def rollout_verify(after, before, target_version, policy_report=None, benchmark=None, options=None):
    """Verify a node after its upgrade and reboot; decide whether to roll back."""
    return _call(rv.verify_upgrade, after, before, target_version or None, policy_report, benchmark or None,
                 options or {})


def rollout_rollback_target(snapshot, local_facts=None, explicit_version=None, failed_version=None,
                            keep_snapshot_version=False):
    """The version to roll back to: explicit, else the snapshot's healthy version, else last known-good."""
    return _call(rv.rollback_target, snapshot, local_facts or None, explicit_version or None,
                 failed_version or None, bool(keep_snapshot_version))


def rollout_lock(lock, owner, now, stale_after_s=21600, holder_alive=None, break_lock=False):
    """May this run take the node's rollout lock?"""
    return _call(rv.rollout_lock, lock, owner or {}, float(now), float(stale_after_s or 0), holder_alive,
                 bool(break_lock))


def rollout_cut_off(hostvars, node, stage, rollout_id, run_id, answers):
    """The record of a node that lost its connection inside its transaction (no record of its own)."""
    return rollout_report.cut_off_record(node, stage, rollout_id, run_id, bool(answers), hostvars or {})


def rollout_replaced_gpus(values):
    """The GPUs declared replaced (an RMA) read once: normalised bus ids and the entries that are none."""
    return rv.read_replaced_gpus(values)


def rollout_drain_state(output, backend):
    """Whether the node is out of service in its scheduler (``scontrol show node -o`` / cordon jsonpath)."""
    return _call(scheduler_state.drain_state, str(backend), output)


def rollout_drained_by_others(state, record):
    """Whether someone other than this collection's rollouts drained the node (no drain record of ours)."""
    return scheduler_state.drained_by_others(state, record or {})


def rollout_drain_record(previous, backend, rollout_id, run_id, reason, drained_at):
    """The drain record a rollout writes on a node before it drains it (who drained it first kept)."""
    return node_preflight.drain_record(previous or None, str(backend), str(rollout_id), run_id, reason or None,
                                       str(drained_at))


def rollout_snapshot(saved, fresh, rollout_id):
    """Keep the snapshot of an interrupted attempt of the same rollout, else the fresh one."""
    return _call(rv.rollout_snapshot, saved or None, fresh, rollout_id)


def rollout_soak(current, baseline, options=None):
    """One node after the soak: still healthy, no new fatal Xid since its verification."""
    return _call(rv.soak_verdict, current, baseline, options or {})


def rollout_gate(per_node):
    """A stage's gate from the nodes' soak verdicts."""
    return _call(rv.gate_verdict, per_node or {})


def rollout_left_over(preflight, lock, lock_found, saved_snapshot, rollout_id, target_version=None):
    """What a run that is gone left on a node already on target: its lock, an upgrade it did not record."""
    return rv.left_over(preflight or {}, lock or None, lock_found or None, saved_snapshot or None, str(rollout_id),
                        target_version or None)


def rollout_versions(facts):
    """The driver's versions and state from ansible_facts.nvidia, for reports."""
    return rv.driver_versions(facts or {})


def rollout_resolution_note(resolved):
    """Why a branch class resolved to an older branch for this node's GPUs, or null."""
    return rollout_report.resolution_note(resolved or None)


def rollout_contract(after, before, policy=None, keep_after=False):
    """A node's contract diff for its rollout record, with what the node itself explains."""
    return _call(contract_decision.record_contract, after or None, before or None, policy or None, bool(keep_after))


def rollout_next_step_filter(record, inventory=None):
    """The next step of a node the rollout left out of service (rollout_next_step.next_step)."""
    return rollout_next_step.next_step(record if isinstance(record, Mapping) else {}, inventory)


def rollout_gpu_problems(facts, before=None):
    """The GPUs that are not usable, with serials from the snapshot (rollout_next_step.gpu_problems)."""
    return rollout_next_step.gpu_problems(facts, before)


class FilterModule(object):
    """Rollout filters."""

    def filters(self):
        return {
            "rollout_batches": rollout_batches,
            "rollout_batch_count": rollout_batch_count,
            "rollout_plan": rollout_plan,
            "rollout_preflight": rollout_preflight,
            "rollout_verify": rollout_verify,
            "rollout_rollback_target": rollout_rollback_target,
            "rollout_lock": rollout_lock,
            "rollout_snapshot": rollout_snapshot,
            "rollout_cut_off": rollout_cut_off,
            "rollout_drain_state": rollout_drain_state,
            "rollout_replaced_gpus": rollout_replaced_gpus,
            "rollout_drained_by_others": rollout_drained_by_others,
            "rollout_drain_record": rollout_drain_record,
            "rollout_soak": rollout_soak,
            "rollout_gate": rollout_gate,
            "rollout_versions": rollout_versions,
            "rollout_left_over": rollout_left_over,
            "rollout_resolution_note": rollout_resolution_note,
            "rollout_contract": rollout_contract,
            "rollout_next_step": rollout_next_step_filter,
            "rollout_gpu_problems": rollout_gpu_problems,
        }
