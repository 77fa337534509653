# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""How each change of a golden node's hardware contract is explained, and whether it stops the rollout.

A driver update changes a node's contract (``module_utils/contract_diff.contract_diff``). After
its class's golden node is upgraded, every change is one of (docs/contract.md):

* ``expected``: a version the driver itself ships (the driver's three versions, CUDA, the GSP
  firmware, the module flavour of the target branch, Fabric Manager, NSCQ, nvidia-peermem): the
  update is that change;
* ``held``: a value the class's declared GPU policy sets, re-applied and verified after the
  reboot (power limit, persistence, ECC, compute mode);
* ``now_known``: a value that could not be read before and can now (nothing to explain);
* ``accepted``: a field an operator approved (``rollout_contract_accept``: field names or
  ``fnmatch`` patterns such as ``app_clock_default_*``);
* ``unexplained``: anything else. With ``rollout_contract_changes: stop`` (the default) an
  unexplained change of a golden node stops the rollout before its class's canary stage; with
  ``warn`` the report shows it and the rollout goes on.

The first three are decided on the node's record (:func:`classify`); ``accepted`` against
``unexplained`` each time the controller decides (:func:`resolve`), so that accepting a change
and running the same rollout again continues it without upgrading the golden node again.
Pure functions; no I/O.
"""

from __future__ import annotations

import difflib
import fnmatch
import math
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from ansible_collections.gpufleet.nvidia.plugins.module_utils import contract_diff
from ansible_collections.gpufleet.nvidia.plugins.module_utils.contract import GPU_FIELDS, NODE_FIELDS

#: Contract fields that a driver update changes by being one: what the driver packages ship.
EXPECTED_FIELDS = ("driver_userspace_version", "driver_loaded_version", "driver_on_disk_version",
                   "cuda_driver_version", "gsp_firmware_version", "kernel_module_type", "fabricmanager_version",
                   "nscq_version", "peermem_version")

#: GPU policy variable (roles/gpu_policy) → the contract fields it sets.
POLICY_FIELDS = {
    # A limit in watts replaces the default: a moved default does not reach the GPUs.
    "gpu_policy_power_limit_w": ("power_enforced_limit_w", "power_default_limit_w"),
    "gpu_policy_power_limit_percent": ("power_enforced_limit_w",),
    "gpu_policy_persistence_mode": ("persistence_mode",),
    "gpu_policy_ecc_mode": ("ecc_current", "ecc_pending"),
    "gpu_policy_compute_mode": ("compute_mode",),
}

#: Every contract field some GPU policy variable holds: ``held`` is never believed for another.
POLICY_HELD = frozenset(field for fields in POLICY_FIELDS.values() for field in fields)

#: Every name a change can have: the contract's fields and the GPU count entries.
FIELD_NAMES = tuple(key for key, _unit, _label, _source in NODE_FIELDS + GPU_FIELDS) + (
    "gpu_count", "gpu_removed", "gpu_added")

MODES = ("stop", "warn")

_WHY = {
    "expected": "the driver's own",
    "held": "held by the declared GPU policy",
    "now_known": "now read",
    "accepted": "accepted in rollout_contract_accept",
    "unexplained": "unexplained",
}


def held_fields(policy: Optional[Mapping[str, Any]]) -> List[str]:
    """The contract fields a node's declared GPU policy holds.

    :param policy: the node's ``gpu_policy_*`` variables (a value of ``None`` or ``""`` declares
        nothing).
    :returns: sorted field names of :data:`POLICY_FIELDS` whose variable is declared.
    """
    fields = set()
    for name, keys in POLICY_FIELDS.items():
        value = (policy or {}).get(name)
        if value is not None and value != "":
            fields.update(keys)
    return sorted(fields)


def classify(entries: Sequence[Mapping[str, Any]], held: Iterable[str] = ()) -> List[Dict[str, Any]]:
    """Decide what the node itself can about each change of its contract.

    :param entries: ``contract_diff.contract_diff(before, after)``.
    :param held: the fields the declared policy holds (:func:`held_fields`), only when the policy
        was verified in effect after the update.
    :returns: ``[{"field", "scope", "text" (contract_diff.describe), "decision": "expected" |
        "held" | "now_known" | "open", "gpus"?: [index]}]`` in the entries' order; ``open``
        needs the controller's :func:`resolve`.
    """
    held = set(held) & POLICY_HELD
    out = []
    for entry in entries:
        field = entry.get("field")
        # A value's change (not a GPU gone or new): its sides say whether it was known.
        valued = entry.get("kind") in ("changed", "now_known", "no_longer_known")
        before_unknown = valued and _unknown(entry.get("before"))
        if before_unknown and _unknown(entry.get("after")):
            continue  # unknown before and after (a NaN is not equal to itself): nothing changed
        if field in EXPECTED_FIELDS:
            decision = "expected"
        elif field in held:
            decision = "held"
        elif before_unknown:
            decision = "now_known"
        else:
            decision = "open"
        change = {"field": field, "scope": entry.get("scope"), "text": contract_diff.describe(entry),
                  "decision": decision}
        if decision == "now_known":
            change["before"] = None  # the evidence checked_changes wants for it
        if "gpus" in entry:
            change["gpus"] = list(entry["gpus"])
        out.append(change)
    return out


def _unknown(value: Any) -> bool:
    """A contract value that says nothing: ``None``, or a float NaN (NaN is unknown, not a value)."""
    return value is None or (isinstance(value, float) and math.isnan(value))


def parse_accept(value: Any) -> List[str]:
    """Read ``rollout_contract_accept``: a list, or text with the patterns comma-separated (extra vars).

    :returns: the patterns, stripped, empty ones dropped.
    :raises ValueError: for a pattern that matches no contract field (a typo would accept
        nothing); the message names it and the closest field.
    """
    if value is None or value == "":
        return []
    items = value.split(",") if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if items is None:
        raise ValueError("rollout_contract_accept must be a list of contract fields or patterns, got %r" % (value,))
    patterns = []
    for item in items:
        if not isinstance(item, str):
            raise ValueError("rollout_contract_accept: %r is not a field name or pattern" % (item,))
        pattern = item.strip()
        if not pattern:
            continue
        if not fnmatch.filter(FIELD_NAMES, pattern):
            close = difflib.get_close_matches(pattern, FIELD_NAMES, n=1, cutoff=0.6)
            raise ValueError("rollout_contract_accept: %r matches no contract field%s (fields: docs/contract.md)"
                             % (pattern, (" (did you mean %s?)" % close[0]) if close else ""))
        patterns.append(pattern)
    return patterns


def parse_mode(value: Any) -> str:
    """Read ``rollout_contract_changes``: ``stop`` or ``warn``.

    :raises ValueError: for anything else, naming the value.
    """
    text = str(value if value not in (None, "") else "stop").strip().lower()
    if text not in MODES:
        raise ValueError("rollout_contract_changes must be stop or warn, got %r" % (value,))
    return text


#: The field of a change that stands for a record that cannot be read: no accept pattern matches
#: it, not even ``*`` or its own name, so corrupt evidence always stops the rollout before the
#: canary stage (the golden node is read again: rolled back and upgraded by the same rollout).
UNREADABLE = "unreadable_contract_record"


def unreadable(what: str) -> Dict[str, Any]:
    """The change that stands for contract evidence that cannot be read (``what`` says which and why)."""
    return {"field": UNREADABLE, "scope": "node", "text": "%s cannot be read" % what, "decision": "open"}


def checked_changes(changes: Any, held: Optional[Iterable[str]] = None) -> List[Dict[str, Any]]:
    """Recorded changes (a journal line, a record: untrusted), each checked; fail closed.

    A change that is not a mapping with a text ``field`` becomes :func:`unreadable`; a decision
    the record cannot prove is reopened: ``expected`` only for :data:`EXPECTED_FIELDS`; ``held``
    only for a field some GPU policy holds (:data:`POLICY_HELD`) and, given ``held``, one of the
    node's declared policy; ``now_known`` only when the change records the value as unknown before
    (``"before": null``, :func:`classify`); anything else is ``open``; ``text`` defaults to the
    field. A change that claims to be the unreadable stand-in keeps its field (never accepted).

    :param held: the fields the node's declared policy holds (:func:`held_fields`), when known.
    :returns: changes with ``field``, ``text`` (str), ``decision`` and, when given as a list,
        ``gpus``; a value that is not a list at all is one unreadable change.
    """
    if not isinstance(changes, list):
        return [unreadable("the record of the contract changes (%s, not a list)" % type(changes).__name__)]
    declared = POLICY_HELD if held is None else POLICY_HELD & set(held)
    out = []
    for number, change in enumerate(changes):
        if not isinstance(change, Mapping) or not isinstance(change.get("field"), str) or not change["field"]:
            out.append(unreadable("contract change %d of the record" % number))
            continue
        decision = change.get("decision") if isinstance(change.get("decision"), str) else "open"
        if decision == "expected" and change["field"] not in EXPECTED_FIELDS:
            decision = "open"
        elif decision == "held" and change["field"] not in declared:
            decision = "open"
        elif decision == "now_known" and not ("before" in change and _unknown(change.get("before"))):
            decision = "open"
        elif decision not in ("expected", "held", "now_known"):
            decision = "open"
        if change["field"] == UNREADABLE:
            decision = "open"
        text = change.get("text") if isinstance(change.get("text"), str) and change.get("text") else change["field"]
        clean = {"field": change["field"], "scope": change.get("scope"), "text": text, "decision": decision}
        if decision == "now_known":
            clean["before"] = None
        if isinstance(change.get("gpus"), list):
            clean["gpus"] = list(change["gpus"])
        out.append(clean)
    return out


def resolve(changes: Any, accept: Sequence[str]) -> List[Dict[str, Any]]:
    """Settle the ``open`` changes of :func:`classify`: ``accepted`` when a pattern matches the field,
    ``unexplained`` otherwise (always for :data:`UNREADABLE`: no pattern accepts unreadable
    evidence); the others keep their decision. The changes are read with :func:`checked_changes`
    first.

    :returns: the changes, each with ``decision`` final and ``why`` (a few words).
    """
    out = []
    for change in checked_changes(changes):
        decision = change["decision"]
        if decision == "open":
            decision = "accepted" if change["field"] != UNREADABLE and any(
                isinstance(p, str) and fnmatch.fnmatchcase(change["field"], p) for p in accept) else "unexplained"
        out.append(dict(change, decision=decision, why=_WHY[decision]))
    return out


def unexplained(changes: Sequence[Mapping[str, Any]], accept: Sequence[str]) -> List[Dict[str, Any]]:
    """The changes :func:`resolve` leaves unexplained."""
    return [c for c in resolve(changes, accept) if c["decision"] == "unexplained"]


def stop_reason(node: str, klass: str, changes: Sequence[Mapping[str, Any]]) -> str:
    """The sentence a stop gives: ``"contract change unexplained on golden node node01 (class gpu_h100):
    reserved memory 480 → 544 MiB on 8 GPUs; accept it with rollout_contract_accept=memory_reserved_mib"``."""
    fields = []
    for change in changes:
        if change.get("field") not in fields:
            fields.append(change.get("field"))
    acceptable = [f for f in fields if f != UNREADABLE]
    advice = ("accept with rollout_contract_accept=%s and run the same rollout again, or roll the golden node back"
              % ",".join(str(f) for f in acceptable)) if acceptable else ""
    if UNREADABLE in fields:
        corrupt = ("read the golden node's contract again (its record or journal line is corrupt): roll it back "
                   "and run the same rollout again")
        advice = "%s; %s" % (advice, corrupt) if advice else corrupt
    return "contract change%s unexplained on golden node %s (class %s): %s; %s" % (
        "s" if len(changes) > 1 else "", node, klass, "; ".join(str(c.get("text")) for c in changes), advice)


#: Fields not compared with the golden node: what a node's own state or site sets, not its driver
#: (the kernel is held per node; Secure Boot, the signer and DCGM are the site's), and the idle
#: readings, which depend on the moment they were read.
GOLDEN_IGNORED = ("kernel", "secure_boot", "module_signer", "module_signer_trusted", "dcgm_version",
                  "idle_performance_state", "idle_clocks_event_reasons")


def golden_match(contract: Optional[Mapping[str, Any]], golden: Optional[Mapping[str, Any]],
                 ignore: Sequence[str] = ()) -> Optional[Dict[str, Any]]:
    """Compare a node's contract after its update with its class's golden node's, read at the same point.

    :param contract: the node's ``ansible_facts.nvidia.contract`` after the reboot.
    :param golden: ``{"node": name, "contract": the golden node's contract after its reboot}``.
    :param ignore: more field patterns to leave out (``node_upgrade_golden_ignore``), beside
        :data:`GOLDEN_IGNORED`.
    :returns: ``None`` when either contract is missing (nothing to compare), else ``{"node",
        "matches": bool, "fields": [names], "reasons": [str]}``, each reason naming its field
        (``contract_diff.compare_to_golden``): ``"maximum SM clock: golden 1980 MHz, this node 1410
        MHz on GPUs 0-7"``.
    :raises ValueError: for a contract that is not one (``contract_diff``), or one with an entry
        that is not one.
    """
    if not isinstance(contract, Mapping) or not isinstance(golden, Mapping) \
            or not isinstance(golden.get("contract"), Mapping):
        return None
    try:
        compared = contract_diff.compare_to_golden(contract, golden["contract"])
    except (TypeError, AttributeError, KeyError) as exc:
        raise ValueError("cannot compare with golden node %s: a contract holds an entry that is not one (%s: %s)"
                         % (golden.get("node"), type(exc).__name__, exc))
    patterns = tuple(GOLDEN_IGNORED) + tuple(str(p) for p in ignore or () if isinstance(p, str))
    kept = [(entry, reason) for entry, reason in zip(compared["differences"], compared["reasons"])
            if not any(fnmatch.fnmatchcase(str(entry.get("field")), p) for p in patterns)]
    fields = []
    for entry, _reason in kept:
        if entry["field"] not in fields:
            fields.append(entry["field"])
    return {"node": golden.get("node"), "matches": not kept, "fields": fields, "reasons": [r for _e, r in kept]}


def record_contract(after: Optional[Mapping[str, Any]], before: Optional[Mapping[str, Any]],
                    policy: Optional[Mapping[str, Any]] = None, keep_after: bool = False) -> Optional[Dict[str, Any]]:
    """The ``contract`` of a node's rollout record: its contract diff, what the node can explain, and,
    for a golden node, the contract the rest of its class is compared with.

    :param after: ``ansible_facts.nvidia`` after the update (its ``contract``).
    :param before: ``ansible_facts.nvidia`` of the snapshot before the update.
    :param policy: the node's ``gpu_policy_*`` variables (:func:`held_fields`), given only when the
        policy was verified in effect after the reboot.
    :param keep_after: keep the contract after the update (``after``): a golden node's record.
    :returns: ``None`` when either side has no contract (no driver before, say), else ``{"diff":
        contract_diff entries, "changes": :func:`classify`, "lines": [contract_diff.describe],
        "after"?: contract}``. A contract that is there but cannot be read (not a contract, a GPU
        entry that is not one) gives one :func:`unreadable` change and no ``after``: a golden
        node with it stops the rollout rather than opening its class's canary stage.
    """
    after_contract = after.get("contract") if isinstance(after, Mapping) else None
    before_contract = before.get("contract") if isinstance(before, Mapping) else None
    if after_contract is None or before_contract is None:
        return None
    try:
        entries = contract_diff.contract_diff(before_contract, after_contract)
        changes = classify(entries, held_fields(policy if isinstance(policy, Mapping) else None))
        lines = [contract_diff.describe(e) for e in entries]
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        change = unreadable("the contract before or after the update (%s)" % exc)
        return {"diff": [], "changes": [change], "lines": [change["text"]]}
    out = {"diff": entries, "changes": changes, "lines": lines}  # type: Dict[str, Any]
    if keep_after and isinstance(after_contract, Mapping):
        out["after"] = dict(after_contract)
    return out
