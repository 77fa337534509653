# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Decisions of one node's upgrade transaction: preflight, verify, rollback, lock, soak gate.

A rollout moves one node at a time through preflight → lock → drain → snapshot → install →
reboot → verify → undrain (the ``node_upgrade`` role). Every yes/no of that transaction is
decided here, from ``ansible_facts.nvidia`` documents (docs/facts.md) taken before and after,
so that the role only gathers and acts:

* :func:`preflight` — may this node be upgraded now, or is it already done (``skip``)?
* :func:`verify_upgrade` — after the reboot: is the node healthy on the target version, and if
  not, should it go back to its last known-good driver (``rollback``)?
* :func:`rollback_target` — which version is "last known-good" for this node.
* :func:`rollout_lock` — may this run take the node's rollout lock?
* :func:`soak_verdict` / :func:`gate_verdict` — the check between two stages: no new fatal Xid,
  driver still ``ok``, same GPUs, after the soak time.

Versions are compared for exact equality (``driver_versions.versions_match``): loaded, userspace and
on-disk must each be the target build. Xid events carry ``fatal`` from the Xid catalog
(``xid_catalog.classify``); a fatal Xid stops a rollout.

Every verdict is a dict ``{"ok": bool, "reasons": [str], "flags": [str], ...}``: ``reasons``
are sentences for people (they name versions, GPUs, Xids), ``flags`` are stable codes for
programs and reports (:data:`FLAGS`). Pure functions; Python 3.9 compatible.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version, versions_match
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import (
    describe_unusable,
    gpu_label,
    node_health,
    unlisted_gpus,
)
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import contract_decision

#: Stable codes of the verdicts' ``flags`` (a verdict's ``flags`` list uses only these).
FLAGS = {
    "facts_missing": "no facts could be read from the node",
    "transaction_failed": "a step of the transaction failed (drain, install, reboot, policy)",
    "driver_state": "driver.state is not ok",
    "version_not_loaded": "the target version is not what is loaded, installed and on disk",
    "gpu_count_changed": "the number of GPUs differs from the snapshot",
    "gpu_identity_changed": "GPU UUIDs differ from the snapshot",
    "gpu_unreadable": "a GPU could not be read (NVML GpuIsLost or similar)",
    "gpu_not_usable": "a GPU needs a reset (or more) or its driver reports it unusable: Xid, driver message or NVML field",
    "node_problem": "a problem of the node as a whole (a driver module refused, a GPU the driver will not drive, a "
                    "fatal NVSwitch SXid): see the remedy",
    "health_unknown": "a kernel-log line of the NVIDIA modules at error level that no rule reads: not verified",
    "gpu_degraded": "a GPU's clocks are held down by hardware (HW slowdown, power brake, thermal)",
    "no_gpus": "no GPU is visible",
    "new_fatal_xid": "a fatal Xid appeared since the snapshot",
    "fatal_xid": "a fatal Xid is in this boot's kernel log",
    "policy_not_in_effect": "the GPU policy is not in effect",
    "policy_pending": "a policy setting waits for a reset or reboot",
    "benchmark_regression": "the benchmark result fell below the threshold of the snapshot",
    "benchmark_missing": "a benchmark was required and gave no result",
    "no_known_good": "no last known-good version differs from the target: nothing to roll back to",
    "flagged": "the node is flagged by an earlier failed rollout",
    "reboot_pending": "the driver waits for a reboot",
    "os_reboot_required": "the operating system asks for a reboot",
    "repair": "the driver is not installed or not consistent; the upgrade installs it",
    "on_target": "the node already runs the target version, healthy",
    "resume": "an interrupted attempt of this rollout is finished, not skipped",
    "target_unknown": "the target version is not known yet",
    "locked": "another rollout holds the node's lock",
    "lock_taken_over": "a stale lock of an earlier run was taken over",
    "lock_unreadable": "the lock file could not be parsed",
    "rebooted": "the node rebooted during the soak",
    "xid_rate": "more Xid events during the soak than allowed",
    "gpu_replaced": "a GPU declared replaced (replaced_gpus): its UUID and serial are not compared with the snapshot",
    "gpu_count_unknown_before": "the snapshot saw no GPU (no driver then): the count is not compared",
    "contract_outlier": "the node's hardware contract differs from its class's golden node after the update",
}

_DEFAULT_OPTIONS = {
    "rebooted": None,
    "before_boot_id": None,
    "after_boot_id": None,
    "ignore_xids": (),
    "allow_gpu_count_change": False,
    "replaced_gpus": (),
    "require_policy": False,
    "benchmark_threshold": None,
    "benchmark_higher_is_better": True,
    "require_benchmark": False,
    "rollback_available": True,
    "golden": None,
    "golden_ignore": (),
}


def _options(options: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    merged = dict(_DEFAULT_OPTIONS)
    for key, value in (options or {}).items():
        if value is not None or key in ("rebooted",):
            merged[key] = value
    return merged


def _result(**extra: Any) -> Dict[str, Any]:
    result = {"ok": True, "reasons": [], "flags": [], "details": {}}  # type: Dict[str, Any]
    result.update(extra)
    return result


def _fail(result: Dict[str, Any], flag: str, reason: str) -> None:
    result["ok"] = False
    if flag not in result["flags"]:
        result["flags"].append(flag)
    result["reasons"].append(reason)
    result.setdefault("details", {})[flag] = reason


def _note(result: Dict[str, Any], flag: str, reason: Optional[str] = None) -> None:
    if flag not in result["flags"]:
        result["flags"].append(flag)
    if reason:
        result.setdefault("notes", []).append(reason)


def _is_facts(facts: Any) -> bool:
    return isinstance(facts, Mapping) and isinstance(facts.get("driver"), Mapping)


# ---------------------------------------------------------------------------------------------
# Reading the facts
# ---------------------------------------------------------------------------------------------


def driver_versions(facts: Optional[Mapping[str, Any]]) -> Dict[str, Optional[str]]:
    """The driver's versions and verdict from ``ansible_facts.nvidia``.

    :param facts: an ``ansible_facts.nvidia`` document (docs/facts.md) or ``None``.
    :returns: ``{"userspace", "loaded", "on_disk", "state", "branch", "kernel_module_type"}``;
        ``None`` for what is unknown. Sources: ``driver.userspace_version`` (NVML
        ``nvmlSystemGetDriverVersion``), ``driver.loaded_version`` (``/sys/module/nvidia/version``),
        ``driver.on_disk_version`` (``modinfo``), ``driver.state``.
    """
    driver = (facts or {}).get("driver") or {}
    return {
        "userspace": driver.get("userspace_version"),
        "loaded": driver.get("loaded_version"),
        "on_disk": driver.get("on_disk_version"),
        "state": driver.get("state"),
        "branch": driver.get("branch"),
        "kernel_module_type": driver.get("kernel_module_type"),
    }


def on_target(facts: Optional[Mapping[str, Any]], target_version: Optional[str]) -> bool:
    """Whether loaded, userspace and on-disk versions all exactly equal ``target_version``.

    :returns: ``False`` when the target or any of the three versions is unknown.
    """
    if not target_version:
        return False
    versions = driver_versions(facts)
    return all(versions_match(versions[key], target_version) for key in ("loaded", "userspace", "on_disk"))


def fatal_xid_counts(facts: Optional[Mapping[str, Any]], ignore_xids: Iterable[Any] = ()) -> Dict[str, int]:
    """Count the fatal Xid events of a facts document, per Xid number.

    :param facts: ``ansible_facts.nvidia``; ``xid_events[]`` (each with ``xid``, ``count``,
        ``fatal`` from the Xid catalog) is used when present, else ``xid_summary``
        (``fatal_xids`` with their ``by_xid`` counts).
    :param ignore_xids: Xid numbers the operator chose not to count.
    :returns: ``{"<xid>": count}`` of fatal events (strings as keys, as in ``xid_summary``).
    Source: the kernel log as parsed by ``kernel_log.parse_kernel_log`` (``dmesg``).
    """
    ignored = set(str(int(x)) for x in ignore_xids or ())
    counts = {}  # type: Dict[str, int]
    facts = facts or {}
    events = facts.get("xid_events")
    summary = facts.get("xid_summary") or {}
    if isinstance(events, list) and (events or not summary):
        for event in events:
            if not event.get("fatal") or event.get("xid") is None:
                continue
            key = str(int(event["xid"]))
            if key in ignored:
                continue
            counts[key] = counts.get(key, 0) + int(event.get("count") or 1)
        return counts
    by_xid = summary.get("by_xid") or {}
    for xid in summary.get("fatal_xids") or []:
        key = str(int(xid))
        if key in ignored:
            continue
        counts[key] = int(by_xid.get(key) or by_xid.get(int(xid)) or 1)
    return counts


def new_fatal_xids(before: Optional[Mapping[str, Any]], after: Optional[Mapping[str, Any]],
                   rebooted: bool, ignore_xids: Iterable[Any] = ()) -> Dict[str, int]:
    """Fatal Xid events in ``after`` that were not in ``before``.

    After a reboot the kernel log starts again, so every fatal Xid of ``after`` is new. Within one
    boot the counts are compared per Xid number: only an increase is new.

    :param rebooted: the node booted between the two readings (boot ids differ).
    :returns: ``{"<xid>": number of new events}``, only positive entries.
    """
    after_counts = fatal_xid_counts(after, ignore_xids)
    if rebooted:
        return dict((key, value) for key, value in after_counts.items() if value > 0)
    before_counts = fatal_xid_counts(before, ignore_xids)
    delta = {}
    for key, value in after_counts.items():
        grew = value - before_counts.get(key, 0)
        if grew > 0:
            delta[key] = grew
    return delta


def _fatal_devices(facts: Optional[Mapping[str, Any]], xids: Iterable[str]) -> List[str]:
    wanted = set(xids)
    devices = []
    for event in (facts or {}).get("xid_events") or []:
        if event.get("fatal") and str(event.get("xid")) in wanted:
            device = event.get("pci_bus_id") or "unknown"
            if device not in devices:
                devices.append(device)
    return devices


def _describe_xids(counts: Mapping[str, int]) -> str:
    return ", ".join("Xid %s ×%d" % (key, counts[key]) for key in sorted(counts, key=int))


def _gpu_count(facts: Optional[Mapping[str, Any]]) -> int:
    facts = facts or {}
    count = facts.get("gpu_count")
    if count is None:
        count = len(facts.get("gpus") or [])
    return int(count)


def _lost_candidates(facts: Mapping[str, Any], before: Optional[Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """GPUs that may be the one NVML lost: gone from the readable GPUs since ``before``, or named by the kernel log only."""
    readable = [gpu for gpu in facts.get("gpus") or [] if gpu.get("readable") is not False]
    buses = set(gpu.get("pci_bus_id") for gpu in readable if gpu.get("pci_bus_id"))
    uuids = set(gpu.get("uuid") for gpu in readable if gpu.get("uuid"))
    out = []  # type: List[Dict[str, Any]]
    before_gpus = (before or {}).get("gpus") or [] if _is_facts(before) else []
    for gpu in before_gpus:
        if gpu.get("pci_bus_id") and gpu["pci_bus_id"] not in buses and gpu.get("uuid") not in uuids:
            out.append(gpu)
    named = set(gpu.get("pci_bus_id") for gpu in out)
    for gpu in unlisted_gpus(facts):
        if gpu["pci_bus_id"] not in named:
            out.append(gpu)
    return out


def _unreadable(facts: Optional[Mapping[str, Any]], before: Optional[Mapping[str, Any]] = None) -> List[str]:
    """Each unreadable GPU, named by bus id, serial and UUID (gpu_health.gpu_label), never by its index alone.

    A GPU that NVML reports lost may be read without its bus id; it is then named after the GPU
    that is gone since ``before`` or that only the kernel log names (the card to pull), when there
    is exactly one such GPU, else after all of them.
    """
    facts = facts or {}
    out = []
    for gpu in facts.get("gpus") or []:
        if gpu.get("readable") is False:
            if gpu.get("pci_bus_id") or gpu.get("uuid") or gpu.get("serial"):
                label = gpu_label(gpu)
            else:
                candidates = _lost_candidates(facts, before)
                label = "GPU of NVML index %s" % gpu.get("index")
                if len(candidates) == 1:
                    label = "%s (NVML index %s at this boot)" % (gpu_label(candidates[0]), gpu.get("index"))
                elif candidates:
                    label += ", one of %s" % ", ".join(gpu_label(c) for c in candidates)
            errors = gpu.get("errors") or []
            if errors:
                label += ": %s" % ", ".join(str(error) for error in errors)
            out.append(label)
    return out


def _uuids(facts: Optional[Mapping[str, Any]], replaced: Iterable[str] = ()) -> List[str]:
    """The UUIDs of the GPUs, sorted, leaving out the GPUs at the ``replaced`` bus ids (normalised)."""
    skip = set(replaced)
    return sorted(gpu["uuid"] for gpu in (facts or {}).get("gpus") or [] if gpu.get("uuid")
                  and normalize_pci_bus_id(gpu.get("pci_bus_id")) not in skip)


def read_replaced_gpus(values: Any) -> Dict[str, List[str]]:
    """The ``replaced_gpus`` option (``rollback_replaced_gpus`` / ``node_upgrade_replaced_gpus``) read
    once, for the role's check before the node is touched and for the verification alike.

    :param values: a list of PCI bus ids, or one comma-separated string (an extra var arrives as a
        string); None or empty: no GPU replaced.
    :returns: ``{"buses": [normalised bus ids, "0000:3b:00.0" (facts_model.normalize_pci_bus_id)],
        "invalid": [the entries, stripped, that are no PCI bus id]}``.
    """
    if isinstance(values, str):
        values = values.split(",")
    elif values is None:
        values = []
    elif not isinstance(values, (list, tuple)):
        values = [values]
    buses, invalid = [], []  # type: List[str], List[str]
    for value in values:
        text = str(value).strip()
        if not text:
            continue
        bus = normalize_pci_bus_id(text)
        if bus is None:
            invalid.append(text)
        elif bus not in buses:
            buses.append(bus)
    return {"buses": buses, "invalid": invalid}


def replaced_buses(values: Any) -> List[str]:
    """The ``replaced_gpus`` option as normalised PCI bus ids (:func:`read_replaced_gpus`).

    :raises ValueError: for a value that is no PCI bus id (named).
    """
    read = read_replaced_gpus(values)
    if read["invalid"]:
        raise ValueError("replaced_gpus: %s is not a PCI bus id (e.g. 0000:3b:00.0)" % ", ".join(repr(v) for v in read["invalid"]))
    return read["buses"]


def _note_replaced(result: Dict[str, Any], before: Optional[Mapping[str, Any]], after: Mapping[str, Any],
                   replaced: Iterable[str]) -> None:
    """A note per GPU declared replaced: its identity before and now, by bus id."""
    def at(facts: Optional[Mapping[str, Any]], bus: str) -> Optional[Mapping[str, Any]]:
        for gpu in (facts or {}).get("gpus") or []:
            if normalize_pci_bus_id(gpu.get("pci_bus_id")) == bus:
                return gpu
        return None
    for bus in replaced:
        old, new = at(before, bus), at(after, bus)
        if new is None:
            text = "no GPU at %s now" % bus
        elif old is not None and old.get("uuid") == new.get("uuid"):
            text = "the GPU at %s is the same as in the snapshot (%s)" % (bus, gpu_label(new))
        else:
            text = "%s → %s" % (gpu_label(old) if old is not None else "no GPU in the snapshot", gpu_label(new))
        _note(result, "gpu_replaced", text)


# ---------------------------------------------------------------------------------------------
# Policy and benchmark
# ---------------------------------------------------------------------------------------------

_MIG_BAD = ("failed", "reboot_required", "would_change")


def policy_problems(policy_report: Any) -> Dict[str, List[str]]:
    """What in a ``gpu_policy`` report is not in effect.

    :param policy_report: the ``gpu_policy`` role's ``gpu_policy_report`` (a list of per-GPU
        entries ``{index, wanted, in_effect, pending, drift: [setting], mig: {status, message}}``),
        a dict with that list under ``gpus``, or ``{"ok": bool, "reasons": [str]}``.
    :returns: ``{"not_in_effect": [str], "pending": [str]}``: one sentence per GPU and setting.
    """
    problems = {"not_in_effect": [], "pending": []}  # type: Dict[str, List[str]]
    if policy_report is None:
        return problems
    if isinstance(policy_report, Mapping) and "gpus" not in policy_report and "ok" in policy_report:
        if not policy_report.get("ok"):
            problems["not_in_effect"].extend(policy_report.get("reasons") or ["policy report says not ok"])
        return problems
    entries = policy_report.get("gpus") if isinstance(policy_report, Mapping) else policy_report
    for entry in entries or []:
        index = entry.get("index")
        wanted = entry.get("wanted") or {}
        in_effect = entry.get("in_effect") or {}
        for setting in entry.get("drift") or []:
            problems["not_in_effect"].append("GPU %s: %s is %r, wanted %r" % (
                index, setting, in_effect.get(setting), wanted.get(setting)))
        for setting, value in (entry.get("pending") or {}).items():
            problems["pending"].append("GPU %s: %s %r waits for a reboot" % (index, setting, value))
        mig = entry.get("mig") or {}
        if mig.get("status") in _MIG_BAD:
            text = "GPU %s: MIG layout %s" % (index, mig.get("status"))
            if mig.get("message"):
                text += " (%s)" % mig["message"]
            problems["not_in_effect"].append(text)
    return problems


#: The smallest drop of a benchmark the default gate calls a regression (2 %), and how many
#: run-to-run spreads a drop must exceed besides (3): a drop beyond max(2 %, 3 spreads) fails.
BENCHMARK_MIN_DROP = 0.02
BENCHMARK_SPREADS = 3.0


def benchmark_runs(value: Any) -> List[float]:
    """The benchmark results a value holds: a number, a list of numbers (several runs), or their text
    (extra vars arrive as strings: ``"362.2"``, ``"362.2, 361.0, 363.1"``, ``"[362.2, 361.0]"``).

    :returns: the finite numbers, in order; ``[]`` for ``None`` or an empty list.
    :raises ValueError: for anything else (a word, a non-finite number, a nested list).
    """
    if value is None:
        return []
    items = value
    if isinstance(value, str):
        items = [part for part in value.strip().strip("[]").replace(",", " ").split() if part]
    elif not isinstance(value, (list, tuple)):
        items = [value]
    runs = []
    for item in items:
        if isinstance(item, bool) or isinstance(item, (list, tuple, dict)):
            raise ValueError("a benchmark result must be a number, got %r" % (item,))
        number = float(item)
        if math.isnan(number) or math.isinf(number):
            raise ValueError("a benchmark result must be finite, got %r" % (item,))
        runs.append(number)
    return runs


def _median(values: List[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2.0


def _spread(values: List[float]) -> Optional[float]:
    """Run-to-run spread: the sample standard deviation over the median (``None`` for one run)."""
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return (variance ** 0.5) / _median(values)


def benchmark_verdict(before: Any, after: Any, threshold: Optional[float] = None,
                      higher_is_better: bool = True) -> Dict[str, Any]:
    """Compare a benchmark result after the upgrade with the result before it (or the class's baseline).

    The default gate (``threshold`` ``None``) fails a drop beyond max(:data:`BENCHMARK_MIN_DROP`,
    :data:`BENCHMARK_SPREADS` × the baseline's run-to-run spread): the spread of several runs on
    the golden node before the update (``node_upgrade_benchmark_runs``, or a class baseline given as a
    list of runs), the median of those runs the reference. A 9.4 % all-reduce drop (field case 42:
    362.198 → 327.981 GB/s) fails it; a fixed 0.9 threshold did not. An explicit ``threshold`` keeps the
    fixed rule: at least ``threshold`` × the reference.

    :param before: the reference: one result, a list of runs, or their text (:func:`benchmark_runs`),
        in any unit (GB/s, TFLOP/s, seconds); ``None``: nothing to compare.
    :param after: the result after the reboot (one number, or runs: their median).
    :param threshold: ``None`` for the spread rule, else the fraction in (0, 1] of the reference that
        must be reached. For lower-is-better results (seconds) the ratio is before/after.
    :param higher_is_better: ``False`` for times.
    :returns: ``{"ok": bool | None (None: nothing to compare), "ratio": after/before (or before/after)
        | None, "drop": 1 - ratio | None, "tolerance": the largest drop that passes | None,
        "spread": the reference's relative spread | None, "runs": int (reference runs), "reference":
        the median compared with | None, "reason": str}``.
    :raises ValueError: when ``threshold`` is not in (0, 1], or a result is not a finite number.
    """
    if threshold is not None and not 0 < float(threshold) <= 1:
        raise ValueError("benchmark threshold must be in (0, 1], got %r" % (threshold,))
    before_runs, after_runs = benchmark_runs(before), benchmark_runs(after)
    empty = {"ok": None, "ratio": None, "drop": None, "tolerance": None, "spread": None,
             "runs": len(before_runs), "reference": None}
    if not before_runs or not after_runs:
        return dict(empty, reason="no benchmark to compare")
    if min(before_runs + after_runs) <= 0:
        return dict(empty, reason="benchmark results must be positive (%r, %r)" % (before, after))
    reference, result = _median(before_runs), _median(after_runs)
    ratio = round(result / reference if higher_is_better else reference / result, 4)
    spread = _spread(before_runs)
    if threshold is None:
        tolerance = max(BENCHMARK_MIN_DROP, BENCHMARK_SPREADS * (spread or 0.0))
        spread_text = "%.2f %%" % (spread * 100) if spread is not None else "unknown"
        rule = "max(%.0f %%, %.0f x spread %s)" % (BENCHMARK_MIN_DROP * 100, BENCHMARK_SPREADS, spread_text)
    else:
        tolerance = 1 - float(threshold)
        rule = "threshold %.1f %%" % (float(threshold) * 100)
    drop = round(1 - ratio, 4)
    ok = drop <= round(tolerance, 6)
    reason = "benchmark %s → %s (%.1f %% of the %s, a drop of %.1f %%; tolerated %.1f %%: %s)" % (
        _fmt(reference), _fmt(result), ratio * 100, "median of %d runs" % len(before_runs)
        if len(before_runs) > 1 else "snapshot", drop * 100, tolerance * 100, rule)
    return {"ok": ok, "ratio": ratio, "drop": drop, "tolerance": round(tolerance, 6),
            "spread": round(spread, 6) if spread is not None else None, "runs": len(before_runs),
            "reference": reference, "reason": reason}


def _fmt(value: float) -> str:
    return ("%.6g" % value) if value != int(value) else str(int(value))


# ---------------------------------------------------------------------------------------------
# Verify after the reboot
# ---------------------------------------------------------------------------------------------


def _rebooted(opts: Mapping[str, Any]) -> bool:
    if opts.get("rebooted") is not None:
        return bool(opts["rebooted"])
    before_id, after_id = opts.get("before_boot_id"), opts.get("after_boot_id")
    if before_id and after_id:
        return before_id != after_id
    return True


def verify_upgrade(after: Optional[Mapping[str, Any]], before: Optional[Mapping[str, Any]],
                   target_version: Optional[str], policy_report: Any = None,
                   benchmark: Optional[Mapping[str, Any]] = None,
                   options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Verify a node after its upgrade and reboot; decide whether it must be rolled back.

    Checks, each a reason when it fails:

    * ``driver.state`` is ``ok`` (facts: loaded == on disk == userspace);
    * the target version is what is loaded, installed (userspace) and on disk, exactly;
    * the GPUs: as many as in the snapshot (unless ``allow_gpu_count_change``), the same UUIDs
      (but at the bus ids of ``replaced_gpus``: GPUs replaced since the snapshot, each noted with its
      identity before and now), every one readable; when the snapshot saw no GPU (no driver then), at least one;
    * no new fatal Xid since the snapshot (every fatal Xid after a reboot is new);
    * no GPU that needs a reset or that the driver reports unusable, and no driver module the kernel
      refused (gpu_health.node_health: Xid, driver message, NVML or nvidia-smi field);
    * the policy report (when given) shows every managed setting in effect;
    * the benchmark (when given) dropped no more than max(2 %, 3 run-to-run spreads) below the
      reference (:func:`benchmark_verdict`; a fixed ``benchmark_threshold`` when given);
    * the hardware contract matches the class's golden node's (when ``golden`` is given).

    :param after: ``ansible_facts.nvidia`` read after the reboot (first, as the ``rollout_verify``
        filter takes it).
    :param before: ``ansible_facts.nvidia`` of the snapshot (after drain, before install).
    :param target_version: the exact version the upgrade installed (``"620.70.06"``).
    :param policy_report: see :func:`policy_problems`; ``None`` skips the check (it fails when
        ``require_policy`` is set).
    :param benchmark: ``{"before": number, "after": number}`` or ``None``.
    :param options: ``rebooted`` (bool; else inferred from ``before_boot_id`` /
        ``after_boot_id``, else True), ``ignore_xids`` (list of int), ``allow_gpu_count_change``,
        ``replaced_gpus`` (PCI bus ids, a list or a comma-separated string), ``require_policy``,
        ``benchmark_threshold`` (``None``: the spread rule), ``benchmark_higher_is_better`` (True),
        ``require_benchmark``, ``rollback_available`` (False when no last known-good version
        differs from the target), ``golden`` (``{"node", "contract"}``: the class's golden node
        after its update; the node's contract must match it, ``contract_decision.golden_match``)
        and ``golden_ignore`` (field patterns left out of that comparison).
    :returns: ``{"ok", "reasons", "flags", "rollback": bool (not ok and a rollback is possible),
        "notes": [str], "versions": {"before", "after"}, "gpu_count": {"before", "after"},
        "new_fatal_xids": {"<xid>": n}, "benchmark": {...} | None, "golden":
        contract_decision.golden_match | None}``.
    :raises ValueError: for a benchmark threshold outside (0, 1], or a ``replaced_gpus`` entry that is
        no PCI bus id.
    """
    opts = _options(options)
    result = _result(rollback=False, notes=[], new_fatal_xids={}, benchmark=None,
                     versions={"before": driver_versions(before), "after": driver_versions(after)},
                     gpu_count={"before": _gpu_count(before) if _is_facts(before) else None,
                                "after": _gpu_count(after) if _is_facts(after) else None})
    if not _is_facts(after):
        _fail(result, "facts_missing", "no GPU facts after the reboot: the node could not be read")
        result["rollback"] = bool(opts["rollback_available"])
        if not opts["rollback_available"]:
            _note(result, "no_known_good")
        return result
    versions = driver_versions(after)
    if versions["state"] != "ok":
        reasons = (after.get("driver") or {}).get("state_reasons") or []
        _fail(result, "driver_state", "driver state is %s, not ok%s" % (
            versions["state"], (": " + "; ".join(reasons)) if reasons else ""))
    if not target_version:
        _fail(result, "target_unknown", "no target version to verify against")
    elif not on_target(after, target_version):
        _fail(result, "version_not_loaded", "target %s is not running: loaded %s, userspace %s, on disk %s" % (
            target_version, versions["loaded"], versions["userspace"], versions["on_disk"]))
    _verify_gpus(result, before, after, opts)
    rebooted = _rebooted(opts)
    new = new_fatal_xids(before, after, rebooted, opts["ignore_xids"])
    result["new_fatal_xids"] = new
    if new:
        devices = _fatal_devices(after, new.keys())
        _fail(result, "new_fatal_xid", "new fatal Xid since the snapshot: %s%s" % (
            _describe_xids(new), (" on " + ", ".join(devices)) if devices else ""))
    _verify_usable(result, after, opts["ignore_xids"])
    _verify_golden(result, after, opts)
    _verify_policy(result, policy_report, opts)
    _verify_benchmark(result, benchmark, opts)
    if not result["ok"]:
        if opts["rollback_available"]:
            result["rollback"] = True
        else:
            _note(result, "no_known_good", FLAGS["no_known_good"])
    return result


def _verify_golden(result: Dict[str, Any], after: Mapping[str, Any], opts: Mapping[str, Any]) -> None:
    try:
        match = contract_decision.golden_match(after.get("contract"), opts.get("golden"),
                                               opts.get("golden_ignore") or ())
    except ValueError as exc:
        match = {"node": (opts.get("golden") or {}).get("node"), "matches": False, "fields": [], "reasons": [str(exc)]}
    result["golden"] = match
    if match is not None and not match["matches"]:
        _fail(result, "contract_outlier", "hardware contract differs from golden node %s: %s"
              % (match["node"], "; ".join(match["reasons"])))


def _verify_gpus(result: Dict[str, Any], before: Optional[Mapping[str, Any]], after: Mapping[str, Any],
                 opts: Mapping[str, Any]) -> None:
    after_count = _gpu_count(after)
    before_count = _gpu_count(before) if _is_facts(before) else 0
    if before_count:
        if after_count != before_count and not opts["allow_gpu_count_change"]:
            gone = _lost_candidates(after, before) if after_count < before_count else []
            _fail(result, "gpu_count_changed", "GPU count changed: %d before, %d after%s" % (
                before_count, after_count,
                " (gone: %s)" % "; ".join(gpu_label(gpu) for gpu in gone) if gone else ""))
        replaced = replaced_buses(opts["replaced_gpus"])
        if replaced:
            _note_replaced(result, before, after, replaced)
        before_uuids = _uuids(before, replaced)
        after_uuids = _uuids(after, replaced)
        if before_uuids and after_uuids and before_uuids != after_uuids and after_count == before_count \
                and not _unreadable(after):
            _fail(result, "gpu_identity_changed", "GPU UUIDs changed: gone %s, new %s" % (
                ", ".join(sorted(set(before_uuids) - set(after_uuids))),
                ", ".join(sorted(set(after_uuids) - set(before_uuids)))))
    elif after_count == 0:
        _fail(result, "no_gpus", "no GPU is visible after the upgrade")
    else:
        _note(result, "gpu_count_unknown_before", "the snapshot saw no GPU (no driver then); %d now" % after_count)
    lost = _unreadable(after, before)
    if lost:
        _fail(result, "gpu_unreadable", "GPU unreadable: %s" % "; ".join(lost))
    attached = after.get("attached_gpus")
    if attached is not None and int(attached) != after_count and "gpu_count_changed" not in result["flags"]:
        _fail(result, "gpu_count_changed", "%d GPU(s) attached but %d listed" % (int(attached), after_count))


def _not_usable(facts: Mapping[str, Any], ignore_xids: Iterable[Any]) -> Dict[str, Any]:
    """gpu_health.node_health, less the signals other flags already carry (an unreadable GPU, a fatal Xid)."""
    health = node_health(facts, ignore_xids, include_unlisted=False)
    gpus = []
    for gpu in health["gpus"]:
        signals = [signal for signal in gpu["signals"]
                   if not signal.get("fatal") and not signal["reason"].startswith("GPU unreadable")]
        if signals:
            gpus.append(dict(gpu, signals=signals))
    return dict(health, gpus=gpus)


def _verify_usable(result: Dict[str, Any], facts: Mapping[str, Any], ignore_xids: Iterable[Any]) -> None:
    """A verified (or healthy) node carries no GPU that needs a reset, no driver module the kernel
    refused, no NVIDIA log line at error level that no rule reads, and no GPU held down by hardware."""
    health = _not_usable(facts, ignore_xids)
    if health["gpus"]:
        _fail(result, "gpu_not_usable", "GPU not usable: %s" % describe_unusable(health))
    for problem in health["problems"]:
        _fail(result, "node_problem", "%s; remedy: %s" % (problem["reason"], problem["remedy"]))
    for reason in health.get("unknown") or []:
        _fail(result, "health_unknown", "health unknown: %s" % reason)
    for gpu in health.get("degraded") or []:
        _fail(result, "gpu_degraded", "%s: clocks held down by hardware (%s)" % (
            gpu_label(gpu), ", ".join(gpu["reasons"])))


def _verify_policy(result: Dict[str, Any], policy_report: Any, opts: Mapping[str, Any]) -> None:
    if policy_report is None:
        if opts["require_policy"]:
            _fail(result, "policy_not_in_effect", "no policy report after the reboot, and the policy is required")
        return
    problems = policy_problems(policy_report)
    if problems["not_in_effect"]:
        _fail(result, "policy_not_in_effect", "policy not in effect: %s" % "; ".join(problems["not_in_effect"]))
    if problems["pending"]:
        _note(result, "policy_pending", "policy pending: %s" % "; ".join(problems["pending"]))


def _verify_benchmark(result: Dict[str, Any], benchmark: Optional[Mapping[str, Any]],
                      opts: Mapping[str, Any]) -> None:
    if not benchmark:
        if opts["require_benchmark"]:
            _fail(result, "benchmark_missing", "a benchmark is required and none ran")
        return
    verdict = benchmark_verdict(benchmark.get("before"), benchmark.get("after"), opts["benchmark_threshold"],
                                opts["benchmark_higher_is_better"])
    result["benchmark"] = verdict
    if verdict["ok"] is False:
        _fail(result, "benchmark_regression", verdict["reason"])
    elif verdict["ok"] is None and opts["require_benchmark"]:
        _fail(result, "benchmark_missing", verdict["reason"])


# ---------------------------------------------------------------------------------------------
# Preflight
# ---------------------------------------------------------------------------------------------


def healthy(facts: Optional[Mapping[str, Any]], ignore_xids: Iterable[Any] = ()) -> Dict[str, Any]:
    """Whether a node is healthy as it is: driver ``ok``, GPUs visible and readable, no fatal Xid.

    :param facts: ``ansible_facts.nvidia``.
    :returns: a verdict ``{"ok", "reasons", "flags", "details": {flag: reason}}`` (flags
        ``facts_missing``, ``driver_state``, ``no_gpus``, ``gpu_unreadable``, ``fatal_xid``,
        ``gpu_not_usable``, ``node_problem``: gpu_health.node_health, whatever form the signal took;
        ``health_unknown``: an NVIDIA kernel-log line at error level that no rule reads;
        ``gpu_degraded``: clocks held down by hardware).
    """
    result = _result()
    if not _is_facts(facts):
        _fail(result, "facts_missing", "no GPU facts")
        return result
    state = driver_versions(facts)["state"]
    if state != "ok":
        _fail(result, "driver_state", "driver state is %s" % state)
    if state == "ok" and _gpu_count(facts) == 0:
        _fail(result, "no_gpus", "no GPU is visible")
    lost = _unreadable(facts)
    if lost:
        _fail(result, "gpu_unreadable", "GPU unreadable: %s" % "; ".join(lost))
    fatal = fatal_xid_counts(facts, ignore_xids)
    if fatal:
        _fail(result, "fatal_xid", "fatal Xid in this boot's kernel log: %s" % _describe_xids(fatal))
    _verify_usable(result, facts, ignore_xids)
    return result


def left_over(preflight_verdict: Mapping[str, Any], lock_verdict: Optional[Mapping[str, Any]],
              lock_found: Optional[Mapping[str, Any]], saved_snapshot: Optional[Mapping[str, Any]],
              rollout_id: str, target_version: Optional[str] = None) -> Dict[str, Any]:
    """What a run that is gone left on a node already on target (the preflight skips it).

    * ``left_lock``: the node's lock was left by a run that is gone (the lock verdict takes it
      over): this run takes and releases it, so that the node is free again;
    * ``unrecorded``: that run was of this rollout and closed the node's transaction with the
      result ``upgraded`` (its snapshot says so) but died before it recorded the node: the
      upgrade is that run's, and the node is recorded ``upgraded``, with its before from the
      snapshot, not ``skipped``.

    :param preflight_verdict: :func:`preflight`. :param lock_verdict: :func:`rollout_lock` (or ``None``).
    :param lock_found: the lock file as read (``node_lock``), or ``None``.
    :param saved_snapshot: the node's saved snapshot (``node_lock``), or ``None``.
    :param rollout_id: this rollout. :param target_version: for the reason's text.
    :returns: ``{"left_lock": bool, "unrecorded": bool, "reason": str | None}`` (``reason``: the
        record's reason when ``unrecorded``).
    """
    skip = (preflight_verdict or {}).get("action") == "skip"
    takeover = bool((lock_verdict or {}).get("takeover"))
    snapshot = saved_snapshot if isinstance(saved_snapshot, Mapping) else {}
    found = lock_found if isinstance(lock_found, Mapping) else {}
    unrecorded = skip and takeover and found.get("rollout_id") == rollout_id \
        and snapshot.get("rollout_id") == rollout_id and snapshot.get("result") == "upgraded"
    reason = ("upgraded and verified on %s by run %s, which stopped before it recorded the node"
              % (target_version, snapshot.get("run_id"))) if unrecorded else None
    return {"left_lock": skip and takeover, "unrecorded": unrecorded, "reason": reason}


def preflight(facts: Optional[Mapping[str, Any]], target_version: Optional[str] = None,
              flag: Optional[Mapping[str, Any]] = None, os_reboot_required: bool = False,
              pinned: Optional[bool] = None, options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Decide whether a node may start its upgrade now, or is already done.

    Order of the rules:

    1. a node flagged by an earlier failed rollout is refused (``allow_flagged`` overrides);
    2. a node already on the target (loaded == userspace == on disk == target, state ``ok``),
       healthy (:func:`healthy`) and pinned (when ``pinned`` is known) is skipped: ``skip`` true
       (this is how a re-run resumes), unless an attempt of this rollout was interrupted on it
       (``options["interrupted"]``: its snapshot is open). A controller killed after the
       node's reboot left it on target but drained, unverified, its kernel not held and its
       known-good version not marked: the transaction goes on (flag ``resume``) and finishes that;
    3. a fatal Xid in this boot, or an unreadable GPU, refuses the node: the hardware comes
       first, and a verification after the upgrade would blame the driver;
    4. a pending driver reboot is refused, unless the upgrade is the fix: userspace and on-disk
       already are the target and only the reboot is missing (a resumed run);
    5. an operating-system reboot request (``/var/run/reboot-required``, e.g. a new kernel) is
       refused unless the pending driver reboot is the upgrade's own (rule 4) or
       ``allow_os_reboot_required``: a reboot would also boot whatever else waits;
    6. ``not_installed``, ``not_loaded`` and ``broken`` drivers proceed (flag ``repair``): the
       upgrade installs a consistent driver.

    :param facts: ``ansible_facts.nvidia`` read at preflight.
    :param target_version: the exact version this node will get (``driver_resolve``), or
        ``None`` when not resolved yet (then no skip).
    :param flag: the node's rollout flag (``/etc/ansible/facts.d/gpufleet_rollout.fact``) or
        ``None``/``{}``; flagged when ``flag["flagged"]`` is true.
    :param os_reboot_required: ``/var/run/reboot-required`` exists.
    :param pinned: the driver package set is pinned at the target (the driver plan has no step),
        ``None`` when unknown.
    :param options: ``ignore_xids``, ``allow_flagged``, ``allow_fatal_xids``,
        ``allow_os_reboot_required``, ``allow_reboot_pending``, ``interrupted`` (the run id of
        an interrupted attempt of this rollout, from the node's open snapshot; empty when none).
    :returns: ``{"ok": bool (may proceed or skip), "skip": bool, "action": "skip" | "upgrade" |
        "refuse", "reasons", "flags", "notes"}``.
    """
    opts = dict(options or {})
    ignore = opts.get("ignore_xids") or ()
    result = _result(skip=False, action="upgrade", notes=[])
    if flag and flag.get("flagged") and not opts.get("allow_flagged"):
        _fail(result, "flagged", "node is flagged by rollout %s: %s (clear the flag to retry)" % (
            flag.get("rollout_id") or "?", flag.get("reason") or "no reason recorded"))
    if not _is_facts(facts):
        _fail(result, "facts_missing", "no GPU facts at preflight")
        result["action"] = "refuse"
        return result
    health = healthy(facts, ignore)
    versions = driver_versions(facts)
    if not target_version:
        _note(result, "target_unknown")
    if result["ok"] and health["ok"] and on_target(facts, target_version) and pinned is not False \
            and opts.get("interrupted"):
        _note(result, "resume", "already on %s; the attempt of run %s was interrupted before it verified the "
                                "node and returned it to service: finishing it" % (target_version, opts["interrupted"]))
        return result
    if result["ok"] and health["ok"] and on_target(facts, target_version) and pinned is not False:
        result["skip"] = True
        result["action"] = "skip"
        _note(result, "on_target", "already on %s and healthy" % target_version)
        return result
    if "fatal_xid" in health["flags"] and not opts.get("allow_fatal_xids"):
        _fail(result, "fatal_xid", health["details"]["fatal_xid"] + "; reboot or inspect the node before upgrading it")
    if "gpu_unreadable" in health["flags"]:
        _fail(result, "gpu_unreadable", health["details"]["gpu_unreadable"])
    upgrade_is_fix = False
    if versions["state"] == "reboot_pending":
        upgrade_is_fix = bool(target_version) and versions_match(versions["userspace"], target_version) \
            and versions_match(versions["on_disk"], target_version)
        if upgrade_is_fix:
            _note(result, "reboot_pending", "a reboot into %s is pending: the upgrade's reboot completes it"
                  % target_version)
        elif not opts.get("allow_reboot_pending"):
            _fail(result, "reboot_pending", "driver waits for a reboot (loaded %s, installed %s), unrelated to "
                  "target %s: reboot the node first" % (versions["loaded"], versions["userspace"], target_version))
    if os_reboot_required and not upgrade_is_fix and not opts.get("allow_os_reboot_required"):
        _fail(result, "os_reboot_required", "the system asks for a reboot (/var/run/reboot-required): reboot "
              "it first so that the upgrade's reboot changes nothing else")
    if versions["state"] in ("not_installed", "not_loaded", "broken"):
        _note(result, "repair", "driver state %s: the upgrade installs a consistent driver" % versions["state"])
    if not result["ok"]:
        result["action"] = "refuse"
    return result


# ---------------------------------------------------------------------------------------------
# Rollback target, snapshot, lock
# ---------------------------------------------------------------------------------------------


def rollback_target(snapshot: Optional[Mapping[str, Any]], local_facts: Optional[Mapping[str, Any]] = None,
                    explicit_version: Optional[str] = None, failed_version: Optional[str] = None,
                    keep_snapshot_version: bool = False) -> Dict[str, Any]:
    """Which driver version to go back to.

    In order: ``explicit_version`` (``rollback.yml -e rollback_version=...``); the version the
    snapshot saw running healthy (state ``ok``, no fatal Xid: it ran on this node before the
    upgrade); the ``last_known_good`` of the driver role's local facts; the ``previous`` version
    of those local facts. A candidate equal to ``failed_version`` is passed over: going back to
    the version that failed (or runs now) is no rollback.

    :param snapshot: ``ansible_facts.nvidia`` taken before the install, or ``None``.
    :param local_facts: the driver role's local facts (``ansible_local.gpufleet_driver``:
        ``current``, ``last_known_good``, ``history``), or ``None``.
    :param explicit_version: an operator's exact version.
    :param failed_version: the version that failed verification (or, for ``rollback.yml``, the
        version running now).
    :param keep_snapshot_version: do not pass over the snapshot's version even when it equals
        ``failed_version`` (``rollback.yml``: a node already back on the version that ran before
        the rollout stays there and is verified again).
    :returns: ``{"version": str | None, "branch": str | None, "kernel_module_type": str | None,
        "source": "explicit" | "snapshot" | "local_facts" | "local_facts_previous" | None,
        "reason": str}``.
    """
    def _branch(version: str) -> str:
        return version.split(".", 1)[0]

    if explicit_version:
        return {"version": explicit_version, "branch": _branch(explicit_version), "kernel_module_type": None,
                "source": "explicit", "reason": "version given by the operator"}
    candidates = []
    if _is_facts(snapshot):
        versions = driver_versions(snapshot)
        if versions["state"] == "ok" and versions["loaded"] and not fatal_xid_counts(snapshot):
            candidates.append((versions["loaded"], versions["kernel_module_type"], "snapshot",
                               "ran healthy on this node before the upgrade"))
    keep = candidates[0][0] if (candidates and keep_snapshot_version) else None
    local = local_facts or {}
    lkg = local.get("last_known_good") or {}
    if lkg.get("version"):
        module_type = None
        for entry in (local.get("current") or {}, local.get("previous") or {}):
            if entry.get("version") == lkg["version"]:
                module_type = entry.get("kernel_module_type")
        candidates.append((lkg["version"], module_type, "local_facts",
                           "last known-good in the driver's local facts (since %s)" % lkg.get("since")))
    previous = local.get("previous") or {}
    if previous.get("version"):
        candidates.append((previous["version"], previous.get("kernel_module_type"), "local_facts_previous",
                           "the version installed before the current one (driver's local facts)"))
    for version, module_type, source, reason in candidates:
        if failed_version and versions_match(version, failed_version) and not (source == "snapshot" and keep):
            continue
        version = upstream_version(version)
        return {"version": version, "branch": _branch(version), "kernel_module_type": module_type,
                "source": source, "reason": reason}
    return {"version": None, "branch": None, "kernel_module_type": None, "source": None,
            "reason": "no known-good version other than %s" % (failed_version or "the target")}


def rollout_snapshot(saved: Optional[Mapping[str, Any]], fresh: Mapping[str, Any], rollout_id: str) -> Dict[str, Any]:
    """Keep the snapshot of an interrupted attempt of the same rollout, else take the fresh one.

    A resumed run finds the node mid-transaction (installed, not rebooted): its facts then show
    the new userspace, not what ran before. The snapshot saved on the node at the first attempt
    keeps the versions, GPU count and Xid counts of before.

    :param saved: the snapshot file's content (``{"rollout_id", "taken_at", "facts", ...}``) or
        ``None``.
    :param fresh: a snapshot built now (same shape).
    :param rollout_id: the running rollout's id.
    :returns: ``saved`` (with ``"resumed": True``) when it belongs to ``rollout_id``, holds facts
        and its transaction did not end (no ``"completed": true``); else ``fresh`` (with
        ``"resumed": False``).
    """
    if saved and saved.get("rollout_id") == rollout_id and not saved.get("completed") \
            and _is_facts(saved.get("facts")):
        out = dict(saved)
        out["resumed"] = True
        return out
    out = dict(fresh)
    out["resumed"] = False
    return out


def rollout_lock(lock: Any, owner: Mapping[str, Any], now: float, stale_after_s: float = 21600,
                 holder_alive: Optional[bool] = None, break_lock: bool = False,
                 liveness: Optional[str] = None) -> Dict[str, Any]:
    """May this run take the node's rollout lock?

    The lock file (``<node_upgrade_state_dir>/lock.json``, ``/var/lib/gpufleet/rollout/lock.json``
    by default) holds ``{"rollout_id", "run_id", "controller", "pid", "acquired_at" (epoch
    seconds)}``, and ``"lease"`` (the run's lease file on its controller) and ``"awx_job_id"``
    when the owner has them.

    * no lock, or a lock of this very run (same ``run_id``) → take it;
    * a lock whose holder is known dead (``holder_alive`` false: on the same controller its
      ``ansible-playbook`` process is gone — a killed run; elsewhere its lease,
      ``run_lease``, is no longer renewed — a cancelled AWX job) → take it over;
    * a lock whose holder's liveness is unknown (``None``) and older than ``stale_after_s``
      (0 disables), or ``break_lock`` → take it over; a holder known to run is never timed out;
    * otherwise → refuse, naming the holder: a second concurrent rollout must not touch the node.

    :param lock: the parsed lock file, ``None``/``{}`` when absent, or, when it could not be
        parsed, why (a string, ``node_lock.read_state``'s ``unreadable``): refused, naming the
        reason, unless ``break_lock``.
    :param owner: this run: ``{"rollout_id", "run_id", "controller", "pid"}``.
    :param now: epoch seconds now.
    :param holder_alive: the holder's liveness when it could be checked (its process on this
        controller, or its lease: ``run_lease.probe_holder``), else ``None``: unknown (no pid, a pid
        that is not one, no controller, no lease here, a lease of another run or from the future)
        waits for ``stale_after_s`` like any unknown holder, never "gone".
    :param liveness: how the holder's liveness was told (``probe_holder``'s reason), named in the
        refusal or the takeover.
    :returns: ``{"ok": bool, "takeover": bool, "reasons", "flags", "lock": the content to write}``.
        A lock's age is unknown when ``acquired_at`` is not a finite number or lies in the future
        (the reason says so): such a lock is never stale, only broken.
    """
    new_lock = {
        "rollout_id": owner.get("rollout_id"),
        "run_id": owner.get("run_id"),
        "controller": owner.get("controller"),
        "pid": owner.get("pid"),
        "acquired_at": now,
    }
    for key in ("lease", "awx_job_id"):
        if owner.get(key):
            new_lock[key] = owner[key]
    result = _result(takeover=False, lock=new_lock)
    if not lock:
        return result
    if not isinstance(lock, Mapping):
        if break_lock:
            result["takeover"] = True
            _note(result, "lock_taken_over")
            return result
        _fail(result, "lock_unreadable", "%s: inspect and remove it, or set node_upgrade_lock_break=true to take the "
                                         "node over" % (lock if isinstance(lock, str) and lock else
                                                        "the rollout lock exists but cannot be read"))
        return result
    if lock.get("run_id") and lock.get("run_id") == owner.get("run_id"):
        new_lock["acquired_at"] = lock.get("acquired_at", now)
        return result
    age, age_note = _lock_age(lock.get("acquired_at"), now)
    holder = "rollout %s (run %s, controller %s, pid %s)" % (
        lock.get("rollout_id"), lock.get("run_id"), lock.get("controller"), lock.get("pid"))
    if lock.get("awx_job_id"):
        holder += " (AWX job %s)" % lock.get("awx_job_id")
    told = " (%s)" % liveness if liveness else ""
    if holder_alive is False:
        result["takeover"] = True
        _note(result, "lock_taken_over", "took over the lock of %s: that run is gone%s" % (holder, told))
        return result
    # A holder known to run keeps its node however long it has held it (a drain that waits for
    # a job of days); the age only decides for a holder whose liveness cannot be seen.
    if break_lock or (holder_alive is None and stale_after_s and age is not None and age > float(stale_after_s)):
        result["takeover"] = True
        _note(result, "lock_taken_over", "took over the lock of %s, %s%s" % (
            holder, "broken on request" if break_lock else "stale after %d s" % int(age or 0), told))
        return result
    if holder_alive is None:
        _fail(result, "locked", "node is locked by %s since %s: the holder's liveness is unknown%s; it waits until "
                                "the lock is %d s old (node_upgrade_lock_stale_s), or set node_upgrade_lock_break=true "
                                "once you know that run is gone" % (
                                    holder, "%d s" % int(age) if age is not None else age_note, told,
                                    int(stale_after_s or 0)))
        return result
    _fail(result, "locked", "node is locked by %s since %s: another rollout is running on it%s" % (
        holder, "%d s" % int(age) if age is not None else age_note, told))
    return result


def _lock_age(acquired_at: Any, now: float) -> Any:
    """``(age in seconds, None)``, or ``(None, why it is unknown)`` for a lock's ``acquired_at``."""
    if isinstance(acquired_at, bool) or not isinstance(acquired_at, (int, float)):
        return None, "an unknown time (acquired_at %r is not a number)" % (acquired_at,)
    if not math.isfinite(float(acquired_at)):
        return None, "an unknown time (acquired_at %r)" % (acquired_at,)
    age = float(now) - float(acquired_at)
    if age < -60:
        return None, "an unknown time (acquired_at lies %d s in the future: clock skew?)" % int(-age)
    return max(0.0, age), None


# ---------------------------------------------------------------------------------------------
# Soak gate between stages
# ---------------------------------------------------------------------------------------------


def soak_verdict(current: Optional[Mapping[str, Any]], baseline: Optional[Mapping[str, Any]],
                 options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """One node after the soak time: still healthy, and no new fatal Xid since its verification.

    :param current: ``ansible_facts.nvidia`` read after the soak (first, as the ``rollout_soak``
        filter takes it).
    :param baseline: ``ansible_facts.nvidia`` read when the node was verified (or skipped).
    :param options: ``before_boot_id`` / ``after_boot_id`` (a reboot during the soak counts every
        fatal Xid as new and is itself flagged), ``ignore_xids``, ``max_new_xids`` (all Xid
        events, fatal or not, allowed during the soak; ``None`` for no limit).
    :returns: ``{"ok", "reasons", "flags", "new_fatal_xids", "new_xids": total new events}``.
    """
    opts = dict(options or {})
    result = _result(new_fatal_xids={}, new_xids=0)
    if not _is_facts(current):
        _fail(result, "facts_missing", "no GPU facts after the soak")
        return result
    before_id, after_id = opts.get("before_boot_id"), opts.get("after_boot_id")
    rebooted = bool(before_id and after_id and before_id != after_id)
    if rebooted:
        _fail(result, "rebooted", "the node rebooted during the soak (boot %s → %s)" % (before_id, after_id))
    health = healthy(current, opts.get("ignore_xids") or ())
    for flag in ("driver_state", "no_gpus", "gpu_unreadable"):
        if flag in health["flags"]:
            _fail(result, flag, health["details"][flag])
    if _is_facts(baseline) and _gpu_count(baseline) != _gpu_count(current):
        _fail(result, "gpu_count_changed", "GPU count changed during the soak: %d → %d" % (
            _gpu_count(baseline), _gpu_count(current)))
    new = new_fatal_xids(baseline, current, rebooted, opts.get("ignore_xids") or ())
    result["new_fatal_xids"] = new
    if new:
        _fail(result, "new_fatal_xid", "new fatal Xid during the soak: %s" % _describe_xids(new))
    before_total = int(((baseline or {}).get("xid_summary") or {}).get("total") or 0) if not rebooted else 0
    after_total = int((current.get("xid_summary") or {}).get("total") or 0)
    result["new_xids"] = max(0, after_total - before_total)
    limit = opts.get("max_new_xids")
    if limit is not None and result["new_xids"] > int(limit):
        _fail(result, "xid_rate", "%d new Xid events during the soak, more than the %d allowed" % (result["new_xids"], int(limit)))
    return result


def gate_verdict(per_node: Mapping[str, Mapping[str, Any]]) -> Dict[str, Any]:
    """A stage's gate from the nodes' :func:`soak_verdict` results.

    :param per_node: ``{node: soak verdict}``.
    :returns: ``{"ok": every node ok, "failed": [node], "reasons": ["node: reason"], "flags"}``.
    """
    result = _result(failed=[])
    for node in sorted(per_node):
        verdict = per_node[node]
        if not verdict.get("ok"):
            result["ok"] = False
            result["failed"].append(node)
            for reason in verdict.get("reasons") or []:
                result["reasons"].append("%s: %s" % (node, reason))
            for flag in verdict.get("flags") or []:
                if flag not in result["flags"]:
                    result["flags"].append(flag)
    return result
