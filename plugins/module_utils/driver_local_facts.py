# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver's local facts: current version, last known-good and history.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

from typing import Any, Dict, Optional


def update_local_facts(previous: Optional[Dict[str, Any]], version: str, branch: str, when: str,
                       action: str, verified_good: Optional[str] = None, history_limit: int = 50,
                       kernel_module_type: Optional[str] = None) -> Dict[str, Any]:
    """The next content of the driver's local facts (``/etc/ansible/facts.d/gpufleet_driver.fact``).

    :param previous: the current content (``{}``/``None`` on a fresh node).
    :param version: the version now installed and pinned; :param branch: its branch.
    :param when: an ISO 8601 timestamp.
    :param action: ``install``, ``upgrade``, ``downgrade``, ``branch_change``, ``repin`` or
        ``known_good``.
    :param verified_good: a version seen running healthy (loaded == installed, state ``ok``) in
        this run; it becomes ``last_known_good``.
    :returns: ``{"schema_version": 1, "current": {"version", "branch", "kernel_module_type",
        "since"}, "previous": {...}|None, "last_known_good": {"version", "branch", "since"}|None,
        "history": [{"time", "action", "from", "to"}] newest last, at most ``history_limit``}``.
    """
    prev = dict(previous or {})
    current = prev.get("current") or None
    history = list(prev.get("history") or [])
    result = {
        "schema_version": 1,
        "current": current,
        "previous": prev.get("previous"),
        "last_known_good": prev.get("last_known_good"),
        "history": history,
    }
    if verified_good:
        lkg = result["last_known_good"] or {}
        if lkg.get("version") != verified_good:
            result["last_known_good"] = {"version": verified_good, "branch": verified_good.split(".")[0],
                                         "since": when}
    from_version = current.get("version") if current else None
    if from_version != version:
        result["previous"] = current
        result["current"] = {"version": version, "branch": str(branch), "kernel_module_type": kernel_module_type,
                             "since": when}
        history.append({"time": when, "action": action, "from": from_version, "to": version})
    elif action == "repin":
        history.append({"time": when, "action": action, "from": from_version, "to": version})
    elif verified_good and verified_good != (prev.get("last_known_good") or {}).get("version"):
        history.append({"time": when, "action": "known_good", "from": from_version, "to": version})
    result["history"] = history[-history_limit:]
    return result


def next_local_facts(previous: Optional[Dict[str, Any]], target: str, branch: str, kernel_module_type: Optional[str],
                     action: str, loaded: Optional[str], state: Optional[str], mark_known_good: bool, when: str,
                     history_limit: int = 50) -> Dict[str, Any]:
    """What the driver role records after a transaction: ``previous`` itself when there is nothing new.

    A version becomes last known-good when ``mark_known_good`` is set and, at the start of the run,
    it was loaded (``loaded``, from ``gpu_facts``), healthy (``state`` ``ok``) and the recorded current
    version. Something is recorded when the transaction did something (``action`` other than
    ``none``), when the recorded current version is not ``target``, or when a new known-good version
    was seen.

    :param previous: the local facts now (``ansible_local.gpufleet_driver``; ``{}`` on a fresh node).
    :param target: the version the transaction installed and pinned; :param branch: its branch.
    :param action: ``install``, ``upgrade``, ``downgrade``, ``branch_change``, ``repin`` or ``none``.
    :param when: an ISO 8601 timestamp.
    :returns: the content :func:`update_local_facts` gives, or ``previous`` unchanged (``{}`` for ``None``).
    """
    prev = dict(previous or {})
    recorded = (prev.get("current") or {}).get("version") or ""
    known_good = (prev.get("last_known_good") or {}).get("version") or ""
    verified = loaded if (mark_known_good and state == "ok" and loaded and loaded == recorded) else ""
    if action == "none" and recorded == target and not (verified and verified != known_good):
        return prev
    if action == "none":
        action = "install" if recorded != target else "known_good"
    return update_local_facts(prev, target, branch, when, action, verified_good=verified or None,
                              history_limit=int(history_limit), kernel_module_type=kernel_module_type)


#: The local facts' name for what a transaction did, in this order of precedence
#: (``package_transaction.plan_transaction``'s ``changes``).
ACTIONS = ("downgrade", "branch_change", "upgrade", "install", "repin")


def transaction_action(changes: Optional[Dict[str, Any]]) -> str:
    """``downgrade``, ``branch_change``, ``upgrade``, ``install``, ``repin`` or ``none``: the first that ``changes`` holds.

    :param changes: the plan's ``changes`` (``{"install", "upgrade", "downgrade", "branch_change", "repin", ...}``
        booleans).
    """
    for action in ACTIONS:
        if (changes or {}).get(action):
            return action
    return "none"
