# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What changed in a node's hardware contract, and how a node differs from its class's golden node.

Pure functions over contracts built by :func:`contract.contract_from_facts`:

- :func:`contract_diff`: before → after of one node (a driver update), field by field, the GPUs
  that share one change grouped into one entry ("reserved memory 545 → 612 MiB on 8 GPUs");
- :func:`markdown_lines`: those entries as Markdown list lines;
- :func:`compare_to_golden`: a node against the golden node of its class, contract values only,
  each difference named with its field.

Rules (docs/contract.md): GPUs are paired by UUID when both sides have UUIDs (by index
otherwise, and always for the golden comparison, where the GPUs are other units); only contract
values are compared, never per-unit values (serials, UUIDs, bus ids, counters); ``None``
(unknown) differs from every known value, and the entry says which side was unknown; a GPU
present on one side only is its own entry (``gpu_added`` / ``gpu_removed``). Entries come in the
order of contract.NODE_FIELDS, then contract.GPU_FIELDS, then the GPU count.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils.contract import GPU_FIELDS, NODE_FIELDS

_GPU_META = {key: (unit, label) for key, unit, label, _source in GPU_FIELDS}
_NODE_META = {key: (unit, label) for key, unit, label, _source in NODE_FIELDS}


def _check(contract: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(contract, Mapping) or not isinstance(contract.get("gpus"), list) \
            or not isinstance(contract.get("node"), Mapping):
        raise ValueError("%s is not a hardware contract (contract.contract_from_facts): expected a mapping with "
                         "'node' and 'gpus', got %r" % (what, type(contract).__name__))
    return contract


def _uuids(contract: Mapping[str, Any]) -> Optional[List[str]]:
    """The GPUs' UUIDs in ``gpus`` order when every GPU has a distinct one, else ``None``."""
    units = contract.get("units") or []
    uuids = [unit.get("uuid") for unit in units]
    if len(uuids) != len(contract["gpus"]) or not all(uuids) or len(set(uuids)) != len(uuids):
        return None
    return uuids


def _pairs(before: Mapping[str, Any], after: Mapping[str, Any], by_uuid: bool) -> Tuple[List[tuple], List[Any], List[Any]]:
    """(paired (after index, before gpu, after gpu), indexes only before, indexes only after)."""
    left_ids, right_ids = (_uuids(before), _uuids(after)) if by_uuid else (None, None)
    if left_ids is None or right_ids is None:
        left_ids = [gpu.get("index") for gpu in before["gpus"]]
        right_ids = [gpu.get("index") for gpu in after["gpus"]]
    left = dict(zip(left_ids, before["gpus"]))
    right = dict(zip(right_ids, after["gpus"]))
    pairs = [(right[key].get("index"), left[key], right[key]) for key in right_ids if key in left]
    gone = [left[key].get("index") for key in left_ids if key not in right]
    new = [right[key].get("index") for key in right_ids if key not in left]
    return pairs, gone, new


def _entry(scope: str, field: str, before: Any, after: Any, gpus: Optional[List[Any]] = None) -> Dict[str, Any]:
    unit, label = (_GPU_META if scope == "gpu" else _NODE_META).get(field, (None, field))
    entry = {"scope": scope, "field": field, "label": label, "unit": unit, "before": before, "after": after,
             "kind": "changed" if before is not None and after is not None else (
                 "now_known" if before is None else "no_longer_known")}
    if isinstance(before, list) and isinstance(after, list):
        entry["added"] = [item for item in after if item not in before]
        entry["removed"] = [item for item in before if item not in after]
    if gpus is not None:
        entry["gpus"] = sorted(gpus, key=lambda i: (i is None, i))
        entry["count"] = len(gpus)
    return entry


def _diff(before: Mapping[str, Any], after: Mapping[str, Any], by_uuid: bool) -> List[Dict[str, Any]]:
    entries = []
    for key, _unit, _label, _source in NODE_FIELDS:
        if before["node"].get(key) != after["node"].get(key):
            entries.append(_entry("node", key, before["node"].get(key), after["node"].get(key)))
    pairs, gone, new = _pairs(before, after, by_uuid)
    for key, _unit, _label, _source in GPU_FIELDS:
        groups = {}  # type: Dict[str, Tuple[Any, Any, List[Any]]]
        order = []  # type: List[str]
        for index, left, right in pairs:
            old, value = left.get(key), right.get(key)
            if old == value:
                continue
            group = repr((old, value))
            if group not in groups:
                groups[group] = (old, value, [])
                order.append(group)
            groups[group][2].append(index)
        for group in order:
            old, value, indexes = groups[group]
            entries.append(_entry("gpu", key, old, value, indexes))
    if len(before["gpus"]) != len(after["gpus"]):
        entries.append({"scope": "node", "field": "gpu_count", "label": "GPU count", "unit": None,
                        "before": len(before["gpus"]), "after": len(after["gpus"]), "kind": "changed"})
    for indexes, kind in ((gone, "gpu_removed"), (new, "gpu_added")):
        if indexes:
            entries.append({"scope": "gpu", "field": kind, "label": "GPU gone" if kind == "gpu_removed" else "GPU new",
                            "unit": None, "before": None, "after": None, "kind": kind,
                            "gpus": sorted(indexes, key=lambda i: (i is None, i)), "count": len(indexes)})
    return entries


def contract_diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """The changes of one node's contract, before → after (e.g. across a driver update).

    :param before: the contract read before (contract.contract_from_facts).
    :param after: the contract read after.
    :returns: ``[{"scope": "node" | "gpu", "field": key of contract.NODE_FIELDS / GPU_FIELDS (or
        ``gpu_count``, ``gpu_removed``, ``gpu_added``), "label": str, "unit": str | None,
        "before": value, "after": value, "kind": "changed" | "now_known" | "no_longer_known" |
        "gpu_removed" | "gpu_added", "gpus": [index, ...] and "count": int (GPU entries only),
        "added" / "removed": [...] (list values only)}]``; ``[]`` when nothing changed. GPUs with
        the same before → after of a field share one entry.
    :raises ValueError: when either side is not a contract.
    """
    return _diff(_check(before, "before"), _check(after, "after"), by_uuid=True)


def compare_to_golden(node: Mapping[str, Any], golden: Mapping[str, Any]) -> Dict[str, Any]:
    """Compare a node's contract with its class's golden node (contract values only).

    :param node: the node's contract (contract.contract_from_facts).
    :param golden: the golden node's contract, read after its update.
    :returns: ``{"matches": bool, "differences": [entry as in :func:`contract_diff`, with
        ``before`` the golden node's value and ``after`` this node's], "reasons": [str]}``, one
        reason per difference, naming the field: ``"reserved memory: golden 545 MiB, this node
        612 MiB on GPUs 0-7"``. GPUs are paired by index; per-unit values are never compared.
    :raises ValueError: when either side is not a contract.
    """
    differences = _diff(_check(golden, "golden"), _check(node, "node"), by_uuid=False)
    reasons = []
    for entry in differences:
        if entry["kind"] in ("gpu_removed", "gpu_added"):
            reasons.append("%s: GPU %s %s" % (entry["field"], _gpu_list(entry["gpus"]),
                                              "missing on this node" if entry["kind"] == "gpu_removed" else "only on this node"))
            continue
        where = (" on GPU%s %s" % ("s" if entry.get("count", 0) > 1 else "", _gpu_list(entry["gpus"]))) if "gpus" in entry else ""
        reasons.append("%s: golden %s, this node %s%s" % (
            entry["label"], _value(entry["before"], entry["unit"]), _value(entry["after"], entry["unit"]), where))
    return {"matches": not differences, "differences": differences, "reasons": reasons}


def _gpu_list(indexes: List[Any]) -> str:
    numbers = [i for i in indexes if isinstance(i, int)]
    if numbers and len(numbers) == len(indexes) and len(numbers) > 2 and numbers == list(range(numbers[0], numbers[-1] + 1)):
        return "%d-%d" % (numbers[0], numbers[-1])
    return ", ".join(str(i) for i in indexes)


def _value(value: Any, unit: Optional[str]) -> str:
    if value is None:
        return "unknown"
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, list):
        return ", ".join(str(v) for v in value) if value else "none"
    return "%s %s" % (value, unit) if unit else str(value)


def describe(entry: Mapping[str, Any]) -> str:
    """One change as a sentence: ``"reserved memory 545 → 612 MiB on 8 GPUs"``, ``"CUDA 13.0 → 13.1"``.

    :param entry: an entry of :func:`contract_diff`.
    :returns: the text (no Markdown markup).
    :raises KeyError: for a mapping that is no diff entry.
    """
    label, unit = entry["label"], entry.get("unit")
    if entry["kind"] in ("gpu_removed", "gpu_added"):
        text = "%s: GPU %s" % (label, _gpu_list(entry["gpus"]))
        return text
    before, after = entry["before"], entry["after"]
    if "added" in entry and (entry["added"] or entry["removed"]):
        parts = ["+ " + ", ".join(entry["added"])] if entry["added"] else []
        parts += ["- " + ", ".join(entry["removed"])] if entry["removed"] else []
        text = "%s changed: %s" % (label, "; ".join(parts))
    elif unit and isinstance(before, (int, float)) and isinstance(after, (int, float)) \
            and not isinstance(before, bool) and not isinstance(after, bool):
        text = "%s %s → %s" % (label, _value(before, None), _value(after, unit))
    else:
        text = "%s %s → %s" % (label, _value(before, unit), _value(after, unit))
    if "count" in entry:
        text += " on %d GPU%s" % (entry["count"], "s" if entry["count"] != 1 else "")
    return text


def markdown_lines(entries: List[Mapping[str, Any]]) -> List[str]:
    """The entries of :func:`contract_diff` as Markdown list lines, ``"- reserved memory 545 → 612 MiB on 8 GPUs"``.

    :returns: one line per entry, in the entries' order; ``["- no contract change"]`` for ``[]``.
    """
    if not entries:
        return ["- no contract change"]
    return ["- " + describe(entry).replace("*", "\\*").replace("_", "\\_") for entry in entries]
