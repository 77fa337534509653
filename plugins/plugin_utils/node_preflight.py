# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a node holds and whether its upgrade may start: the decision of ``node_upgrade``'s preflight.

The ``gpufleet.nvidia.node_preflight`` action reads the node (GPU facts, its state files, the
lock holder's liveness, the driver it gets) and calls these functions; they only decide, on
what was read, and do no I/O. The rules themselves are :mod:`rollout_verdict`'s
(``preflight``, ``rollout_lock``, ``left_over``) and :mod:`scheduler_state`'s (who drained the
node, field case 36).
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_verdict as rv
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import scheduler_state

#: What a flag file that cannot be read asks of the operator.
FLAG_UNREADABLE_HINT = "; inspect and remove it, or set node_upgrade_lock_break=true to take the node over"


def _mapping(value: Any) -> Dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def parse_state_files(read: Mapping[str, Any]) -> Dict[str, Any]:
    """What the node holds, from ``gpufleet.nvidia.node_lock``'s ``files`` read.

    A file that cannot be parsed is never trusted: the flag counts as set (naming why), the lock
    as held by an unknown run (its reason string, refused by :func:`rollout_verdict.rollout_lock`
    unless the lock is broken), the snapshot, driver facts and drain record as absent (with a
    warning each).

    :param read: the module's result: ``{"files": {"flag", "lock", "snapshot", "driver",
        "drain", "os_reboot"}: {"exists", "content" (dict or None), "unreadable" (str or None),
        "identity"}}, "boot_id"}``.
    :returns: ``{"flag": dict, "lock_found": dict | str, "lock_identity": str, "saved_snapshot":
        dict, "driver_local": dict, "drain_record": dict, "os_reboot_requested": bool,
        "boot_id": str, "warnings": [str]}``.
    """
    files = _mapping(read.get("files"))

    def entry(name):
        return _mapping(files.get(name))

    flag_file = entry("flag")
    if isinstance(flag_file.get("content"), Mapping):
        flag = dict(flag_file["content"])
    elif flag_file.get("unreadable"):
        flag = {"flagged": True, "unreadable": flag_file["unreadable"],
                "reason": str(flag_file["unreadable"]) + FLAG_UNREADABLE_HINT}
    else:
        flag = {}
    lock_file = entry("lock")
    warnings = ["%s: ignored" % entry(name)["unreadable"] for name in ("snapshot", "driver", "drain")
                if entry(name).get("unreadable")]
    return {
        "flag": flag,
        "lock_found": lock_file.get("content") or lock_file.get("unreadable") or {},
        "lock_identity": lock_file.get("identity") or "",
        "saved_snapshot": _mapping(entry("snapshot").get("content")),
        "driver_local": _mapping(entry("driver").get("content")),
        "drain_record": _mapping(entry("drain").get("content")),
        "os_reboot_requested": bool(entry("os_reboot").get("exists")),
        "boot_id": read.get("boot_id") or "",
        "warnings": warnings,
    }


def scheduler(backend: str, output: Optional[str], drain_record: Mapping[str, Any],
              node: Optional[str] = None) -> Dict[str, Any]:
    """The node's state in its scheduler and whether a rollout of this collection drains it.

    :param backend: ``node_upgrade_drain``.
    :param output: what the backend's read command printed (``scontrol show node -o``, the
        cordon jsonpath), ``""`` for ``command`` and ``none``.
    :param drain_record: the node's ``drain.json`` (:func:`parse_state_files`).
    :param node: the Slurm node name asked for (an answer for another is refused), or ``None``.
    :returns: ``{"sched": scheduler_state.drain_state(...), "drain_owned": bool}``: owned unless
        the backend is ``none`` or someone else drained the node (no drain record of ours).
    :raises ValueError: an unknown backend, output Slurm does not write, or an answer for
        another node.
    """
    sched = scheduler_state.drain_state(backend, output or "", node)
    owned = backend != "none" and not scheduler_state.drained_by_others(sched, drain_record)
    return {"sched": sched, "drain_owned": owned}


def drain_record(previous: Optional[Mapping[str, Any]], backend: str, rollout_id: str, run_id: Optional[str],
                 reason: Optional[str], drained_at: str) -> Dict[str, Any]:
    """The drain record (``drain.json``) a rollout writes on a node before it drains it.

    The record makes the drain this collection's (:func:`scheduler`): this rollout, or a later run
    of it or a rollback, returns the node to service, and nothing returns a node someone else
    drained. It keeps who drained the node first across rollouts.

    :param previous: the record found on the node (``{}`` or ``None`` when none).
    :param backend: ``node_upgrade_drain``. :param reason: the Slurm drain reason (kept for the
        Slurm backends only). :param drained_at: ISO 8601 UTC time.
    :returns: ``{"backend", "rollout_id", "run_id", "reason", "drained_at", "first_drained_by"}``.
    """
    previous = previous if isinstance(previous, Mapping) else {}
    return {"backend": backend, "rollout_id": rollout_id, "run_id": run_id,
            "reason": reason if backend in ("slurm", "slurm_reboot") else None,
            "drained_at": drained_at,
            "first_drained_by": previous.get("first_drained_by") or previous.get("rollout_id") or rollout_id}


#: What a snapshot holds as evidence (docs/contract.md): the largest part of a preflight's result.
SNAPSHOT_EVIDENCE = ("facts", "local_facts", "trace", "benchmark")


def snapshot_for_upgrade(saved: Any, rollout_id: str, unrecorded: bool) -> Any:
    """The saved snapshot as an upgrade's preflight returns it to the controller.

    An upgrade reads a snapshot's evidence only when the snapshot is an open attempt of its own
    rollout (resumed: ``rollout_verdict.rollout_snapshot``) or the upgrade of a run that was killed
    before it recorded the node (``rollout_verdict.left_over``'s ``unrecorded``: the record's
    before-state). Any other snapshot keeps only what says whose it is and how it ended. A
    rollback (``rollback.yml``) reads the whole snapshot.

    :param saved: the snapshot file's content (:func:`read_state`'s ``saved_snapshot``), any type.
    :param rollout_id: this rollout's id.
    :param unrecorded: the decision's ``left.unrecorded``.
    :returns: ``saved`` itself when it is not a mapping, is an open attempt of ``rollout_id`` or
        ``unrecorded``; else a dict of it without :data:`SNAPSHOT_EVIDENCE`.
    """
    if not isinstance(saved, Mapping) or unrecorded or _open_attempt(saved, rollout_id):
        return saved
    return dict((key, value) for key, value in saved.items() if key not in SNAPSHOT_EVIDENCE)


def _open_attempt(saved: Mapping[str, Any], rollout_id: str) -> bool:
    return saved.get("rollout_id", "") == rollout_id and not saved.get("completed")


def decide(facts: Optional[Mapping[str, Any]], resolve: Mapping[str, Any], state: Mapping[str, Any],
           lock: Mapping[str, Any], sched: Mapping[str, Any], options: Mapping[str, Any]) -> Dict[str, Any]:
    """Whether the node may start its upgrade, is already done, or is refused.

    One decision in four parts, in this order: what the node's state allows
    (:func:`rollout_verdict.preflight`); an upgrade an earlier step staged for a reboot Slurm
    runs (``drain`` ``slurm_reboot``, the open snapshot holds ``staged``) goes on, whatever the
    node looks like meanwhile; a driver that cannot be resolved or a lock held by a live run
    refuses the node; so does a drain someone else made (field case 36), unless
    ``allow_drained``.

    :param facts: ``ansible_facts.nvidia``.
    :param resolve: ``gpufleet.nvidia.driver_resolve``'s result (``resolved``, ``plan``; ``msg``
        when it failed).
    :param state: :func:`parse_state_files`.
    :param lock: :func:`rollout_verdict.rollout_lock`'s decision.
    :param sched: :func:`scheduler`'s ``sched``.
    :param options: ``rollout_id``, ``drain`` (the backend), ``ignore_xids`` (list of ints),
        ``allow_flagged``, ``allow_fatal_xids``, ``allow_os_reboot_required``, ``allow_drained``,
        ``lock_break`` (bools).
    :returns: ``{"preflight": {"ok", "skip", "action": "upgrade" | "skip" | "refuse", "reasons",
        "flags", "notes"}, "staged": bool, "target": str ("" when unknown), "left":
        rollout_verdict.left_over(...)}``.
    """
    rollout_id = str(options["rollout_id"])
    saved = _mapping(state.get("saved_snapshot"))
    flag = _mapping(state.get("flag"))
    resolved = resolve.get("resolved") if isinstance(resolve.get("resolved"), Mapping) else None
    plan = resolve.get("plan") if isinstance(resolve.get("plan"), Mapping) else None
    interrupted = (saved.get("run_id") or "?") if _open_attempt(saved, rollout_id) else ""
    node = rv.preflight(
        facts, (resolved or {}).get("version") or None, flag or None, bool(state.get("os_reboot_requested")),
        (len(plan.get("steps") or []) == 0) if plan is not None else None,
        {"ignore_xids": list(options.get("ignore_xids") or []),
         "allow_flagged": bool(options.get("allow_flagged")) or (bool(options.get("lock_break")) and "unreadable" in flag),
         "allow_fatal_xids": bool(options.get("allow_fatal_xids")),
         "allow_os_reboot_required": bool(options.get("allow_os_reboot_required")),
         "interrupted": interrupted})
    staged = options.get("drain") == "slurm_reboot" and isinstance(saved.get("staged"), Mapping) \
        and _open_attempt(saved, rollout_id)
    decided = dict(node)
    if staged:
        decided.update({"ok": True, "skip": False, "action": "upgrade", "reasons": [], "flags": [],
                        "notes": ["staged %s for a reboot Slurm runs" % saved["staged"].get("target")]})
    if resolved is None or not lock.get("ok"):
        reasons: List[str] = ([str(resolve.get("msg") or "the driver could not be resolved")] if resolved is None else [])
        flags: List[str] = (["resolution"] if resolved is None else [])
        if not lock.get("ok"):
            reasons += list(lock.get("reasons") or [])
            flags += list(lock.get("flags") or [])
        decided.update({"ok": False, "skip": False, "action": "refuse",
                        "reasons": reasons + list(decided["reasons"]), "flags": flags + list(decided["flags"])})
    if decided["action"] == "upgrade" and not options.get("allow_drained") \
            and scheduler_state.drained_by_others(dict(sched), state.get("drain_record")):
        gpu_count = sched.get("drain_kind") == "gpu_count"
        decided.update({
            "ok": False, "action": "refuse",
            "reasons": list(decided["reasons"]) + [
                "drained in %s before the rollout (%s): %s, not touched;"
                " node_upgrade_allow_drained=true upgrades it and leaves it drained"
                % (options.get("drain"), scheduler_state.describe_drain(dict(sched)),
                   "a GPU or driver fault" if gpu_count else "its state is unknown")],
            "flags": list(decided["flags"]) + ["drained_by_others"] + (["gpu_count_drain"] if gpu_count else [])})
    target = str(saved["staged"].get("target") or "") if staged else str((resolved or {}).get("version") or "")
    left = rv.left_over(decided, dict(lock) or None, state.get("lock_found") or None, saved or None, rollout_id,
                        target or None)
    return {"preflight": decided, "staged": bool(staged), "target": target, "left": left}
