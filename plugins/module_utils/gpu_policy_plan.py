# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Plan a GPU policy (power limit, persistence, ECC, compute mode) against the GPUs of one node.

Pure functions: they take a policy and GPU records of the facts model
(:func:`facts_model.new_gpu`, as ``nvml_reader.read_gpu`` fills them) and return plans and
reports as plain dictionaries. Nothing here touches a GPU; the module and the boot-time
re-apply script do that with :mod:`gpu_policy_apply`.

What takes effect when (NVML API Reference Guide, "Device Commands"; nvidia-smi(1)):

- power limit (``nvmlDeviceSetPowerManagementLimit``): immediately; lost at reboot or driver unload;
  must lie within ``nvmlDeviceGetPowerManagementLimitConstraints`` [min, max];
- persistence mode (``nvmlDeviceSetPersistenceMode``): immediately; off again after a reboot;
- compute mode (``nvmlDeviceSetComputeMode``): immediately; back to Default after a reboot;
- ECC mode (``nvmlDeviceSetEccMode``): *pending* until the next reboot; survives reboots.

Power-limit facts: the *requested* limit is ``nvmlDeviceGetPowerManagementLimit`` (``limit_w``,
nvidia-smi "Requested Power Limit"); the limit *in effect* is ``nvmlDeviceGetEnforcedPowerLimit``
(``enforced_limit_w``, nvidia-smi "Current Power Limit"). They can differ: field case 15 shows
requested 700 W and enforced 500 W, so a 700 W policy is not in effect there.
"""

from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import (
    normalize_pci_bus_id,
    parse_enabled,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils import nvml_names

SETTINGS = ("power_limit_w", "persistence_mode", "ecc_mode", "compute_mode")

# Policy compute-mode names → (nvmlComputeMode_t value, the name NVML tools print), derived from
# nvml_names.COMPUTE_MODES: the lower-cased name. Exclusive_Thread (1) is no longer supported by
# NVML and is refused.
COMPUTE_MODES = dict(
    (name.lower(), (value, name)) for value, name in nvml_names.COMPUTE_MODES.items()
    if value != nvml_names.COMPUTEMODE_EXCLUSIVE_THREAD
)

# When a change takes effect.
EFFECTS = {
    "power_limit_w": "immediate",
    "persistence_mode": "immediate",
    "compute_mode": "immediate",
    "ecc_mode": "reboot_required",
}

# Settings that a reboot (or driver reload) resets: the boot unit re-applies them.
BOOT_REAPPLIED = ("power_limit_w", "persistence_mode", "compute_mode")

_POLICY_KEYS = ("gpus", "power_limit_w", "power_limit_percent", "persistence_mode", "ecc_mode", "compute_mode")


class PolicyError(ValueError):
    """A policy that cannot be applied as written; ``errors`` lists every reason found.

    Raised before any GPU is touched: planning is pure, and the caller applies nothing when
    planning fails.
    """

    def __init__(self, errors: List[str]) -> None:
        self.errors = list(errors)
        super(PolicyError, self).__init__("; ".join(self.errors))


def fmt_w(value: Optional[float]) -> str:
    """Format watts the way nvidia-smi's messages read best: ``700.0`` → ``"700"``, ``297.5`` → ``"297.5"``."""
    if value is None:
        return "unknown"
    return ("%.3f" % float(value)).rstrip("0").rstrip(".")


def describe_gpu(gpu: Dict[str, Any]) -> str:
    """Name a GPU for messages: ``"GPU 3 (0000:18:00.0, NVIDIA H100 80GB HBM3)"``.

    :param gpu: a facts-model GPU record (``index``, ``pci_bus_id``, ``name``).
    """
    details = [part for part in (gpu.get("pci_bus_id"), gpu.get("name")) if part]
    if details:
        return "GPU %s (%s)" % (gpu.get("index"), ", ".join(details))
    return "GPU %s" % gpu.get("index")


def compute_mode_key(name: Optional[str]) -> Optional[str]:
    """Normalise a compute-mode name to the policy's form: ``"Exclusive_Process"`` → ``"exclusive_process"``.

    :param name: a name as NVML tools print it (``Default``, ``Exclusive_Process``, ``Prohibited``,
        ``Exclusive_Thread``), any case, with ``_``, ``-`` or space, or ``None``.
    :returns: lower-case with ``_``, or ``None``.
    """
    if name is None:
        return None
    return str(name).strip().lower().replace("-", "_").replace(" ", "_")


def _bool_or_none(value: Any, key: str, errors: List[str]) -> Optional[bool]:
    if value is None or isinstance(value, bool):
        return value
    parsed = parse_enabled(str(value))
    if parsed is None:
        errors.append("%s must be true or false, got %r" % (key, value))
    return parsed


def _number_or_none(value: Any, key: str, errors: List[str]) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool):
        errors.append("%s must be a number, got %r" % (key, value))
        return None
    text = str(value).strip()
    for suffix in ("%", "w", "W"):
        if text.endswith(suffix):
            text = text[:-1].strip()
    try:
        number = float(text)
    except ValueError:
        errors.append("%s must be a number, got %r" % (key, value))
        return None
    if math.isnan(number) or math.isinf(number):
        errors.append("%s must be a finite number, got %r" % (key, value))
        return None
    if number <= 0:
        errors.append("%s must be greater than 0, got %s" % (key, fmt_w(number)))
        return None
    return number


def normalize_selectors(value: Any) -> Any:
    """Normalise a GPU selection: ``"all"`` or a list of indices, UUIDs and PCI bus ids.

    :param value: ``None``/``"all"``/``["all"]`` (every GPU), an ``int``, a comma-separated
        string (``"0,1"``) or a list of ``int``/``str``.
    :returns: ``"all"`` or a list whose items are ``int`` (an NVML index), ``"GPU-..."`` (a UUID,
        as NVML prints it) or a normalised bus id (``"0000:18:00.0"``).
    :raises PolicyError: for an item that is none of these.
    """
    if value is None:
        return "all"
    if isinstance(value, (int, str)) and not isinstance(value, bool):
        value = [part.strip() for part in str(value).split(",") if part.strip()]
    if not isinstance(value, (list, tuple)):
        raise PolicyError(["gpus must be 'all' or a list of GPU indices, UUIDs or PCI bus ids, got %r" % (value,)])
    items = []  # type: List[Any]
    errors = []
    for item in value:
        text = str(item).strip()
        if text.lower() == "all":
            return "all"
        if isinstance(item, int) and not isinstance(item, bool):
            items.append(item)
        elif text.isdigit():
            items.append(int(text))
        elif text.upper().startswith("GPU-") or text.upper().startswith("MIG-"):
            items.append(text)
        elif normalize_pci_bus_id(text):
            items.append(normalize_pci_bus_id(text))
        else:
            errors.append("gpus: %r is neither an index, a UUID nor a PCI bus id" % (item,))
    if errors:
        raise PolicyError(errors)
    return items


def normalize_policy(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Check and normalise a policy.

    :param spec: ``{gpus, power_limit_w, power_limit_percent, persistence_mode, ecc_mode,
        compute_mode}``; every key optional, ``None`` meaning "not managed". ``power_limit_w`` is
        watts, ``power_limit_percent`` is percent of each GPU's default limit
        (``nvmlDeviceGetPowerManagementDefaultLimit``); at most one of the two. ``compute_mode`` is
        one of :data:`COMPUTE_MODES` (``default``, ``exclusive_process``, ``prohibited``).
    :returns: a dict with every key of ``spec`` normalised (``gpus`` as :func:`normalize_selectors`
        gives it, numbers as ``float``, modes as ``bool``, compute mode lower case).
    :raises PolicyError: with every problem found (unknown key, both power options, a value of the
        wrong kind, a percent above 100 % of default beyond what any GPU allows is checked per GPU
        later, not here).
    """
    errors = []  # type: List[str]
    unknown = sorted(set(spec) - set(_POLICY_KEYS))
    if unknown:
        errors.append("unknown policy keys: %s (known: %s)" % (", ".join(unknown), ", ".join(_POLICY_KEYS)))
    policy = {
        "gpus": "all",
        "power_limit_w": _number_or_none(spec.get("power_limit_w"), "power_limit_w", errors),
        "power_limit_percent": _number_or_none(spec.get("power_limit_percent"), "power_limit_percent", errors),
        "persistence_mode": _bool_or_none(spec.get("persistence_mode"), "persistence_mode", errors),
        "ecc_mode": _bool_or_none(spec.get("ecc_mode"), "ecc_mode", errors),
        "compute_mode": None,
    }  # type: Dict[str, Any]
    try:
        policy["gpus"] = normalize_selectors(spec.get("gpus"))
    except PolicyError as err:
        errors.extend(err.errors)
    if policy["power_limit_w"] is not None and policy["power_limit_percent"] is not None:
        errors.append("give power_limit_w or power_limit_percent, not both")
    mode = compute_mode_key(spec.get("compute_mode"))
    if mode is not None:
        if mode not in COMPUTE_MODES:
            errors.append("compute_mode must be one of %s, got %r" % (
                ", ".join(sorted(COMPUTE_MODES)), spec.get("compute_mode")))
        else:
            policy["compute_mode"] = mode
    if errors:
        raise PolicyError(errors)
    return policy


def select_gpus(selectors: Any, gpus: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Pick the GPU records a selection names, in index order.

    :param selectors: ``"all"`` or the list of :func:`normalize_selectors`.
    :param gpus: facts-model GPU records of the node.
    :returns: the selected records (each once).
    :raises PolicyError: naming each selector that matches no GPU, with the indices present.
    """
    if selectors == "all":
        return sorted(gpus, key=lambda gpu: gpu.get("index", 0))
    chosen = {}  # type: Dict[int, Dict[str, Any]]
    errors = []
    for selector in selectors:
        match = None
        for gpu in gpus:
            if isinstance(selector, int):
                hit = gpu.get("index") == selector
            else:
                hit = selector in (gpu.get("uuid"), gpu.get("pci_bus_id"))
            if hit:
                match = gpu
                break
        if match is None:
            errors.append("no GPU %r on this node (GPU indices present: %s)" % (
                selector, ", ".join(str(gpu.get("index")) for gpu in gpus) or "none"))
        else:
            chosen[match["index"]] = match
    if errors:
        raise PolicyError(errors)
    return [chosen[index] for index in sorted(chosen)]


def wanted_power_limit_w(policy: Dict[str, Any], gpu: Dict[str, Any]) -> Optional[float]:
    """The power limit a policy wants on one GPU, in watts (milliwatt precision).

    :param policy: a normalised policy.
    :param gpu: a facts-model GPU record (``power.default_limit_w`` is needed for a percent).
    :returns: ``power_limit_w``, or ``power_limit_percent`` × ``power.default_limit_w`` / 100
        rounded to 1 mW; ``None`` when the policy sets no limit or the default is unknown.
    """
    if policy.get("power_limit_w") is not None:
        return round(float(policy["power_limit_w"]), 3)
    if policy.get("power_limit_percent") is not None:
        default = gpu["power"].get("default_limit_w")
        if default is None:
            return None
        return round(float(default) * float(policy["power_limit_percent"]) / 100.0, 3)
    return None


def power_limit_errors(policy: Dict[str, Any], gpus: List[Dict[str, Any]]) -> List[str]:
    """Check the wanted power limit of every GPU against that GPU's [min, max].

    Source of the range: ``nvmlDeviceGetPowerManagementLimitConstraints`` (``power.min_limit_w``,
    ``power.max_limit_w``); nvidia-smi refuses out-of-range values with "not a valid power limit which
    should be between 200.00 W and 700.00 W" (field case 15). Checked here, before any setter.

    :param policy: a normalised policy.
    :param gpus: the selected GPU records.
    :returns: one message per GPU whose wanted limit lies outside its range, naming the GPU, the
        wanted watts and the range, e.g. ``"GPU 0 (0000:06:00.0, NVIDIA H100 80GB HBM3): power
        limit 50 W is outside its range [200, 700] W"``. GPUs whose range is unknown are not errors
        here (they are ``unsupported`` in the plan).
    """
    errors = []
    for gpu in gpus:
        wanted = wanted_power_limit_w(policy, gpu)
        low, high = gpu["power"].get("min_limit_w"), gpu["power"].get("max_limit_w")
        if wanted is None or low is None or high is None:
            continue
        if wanted < float(low) - 0.0005 or wanted > float(high) + 0.0005:
            how = ""
            if policy.get("power_limit_percent") is not None:
                how = " (%s%% of the default %s W)" % (
                    fmt_w(policy["power_limit_percent"]), fmt_w(gpu["power"].get("default_limit_w")))
            errors.append("%s: power limit %s W%s is outside its range [%s, %s] W" % (
                describe_gpu(gpu), fmt_w(wanted), how, fmt_w(low), fmt_w(high)))
    return errors


def gpu_pending(gpu: Dict[str, Any]) -> Dict[str, List[str]]:
    """What on this GPU waits for a GPU reset or a reboot, whatever the policy.

    :param gpu: a facts-model GPU record.
    :returns: ``{"reset_required": [reasons], "reboot_required": [reasons]}``:

        - remapped rows pending (``nvmlDeviceGetRemappedRows`` pending, nvidia-smi "Remapped Rows →
          Pending: Yes") → reset required, even when nvidia-smi's "Reset Required" says No (field
          case 04);
        - retired pages pending (``nvmlDeviceGetRetiredPagesPendingStatus``) → reset required;
        - MIG mode current ≠ pending (``nvmlDeviceGetMigMode``) → reset required;
        - ECC mode current ≠ pending (``nvmlDeviceGetEccMode``) → reboot required.
    """
    reset = []
    reboot = []
    rows = gpu.get("remapped_rows") or {}
    if rows.get("pending"):
        reset.append("row remapping pending (%s uncorrectable, %s correctable rows): reset the GPU or reboot "
                     "for the remap to take effect, then check again" % (
                         rows.get("uncorrectable"), rows.get("correctable")))
    pages = gpu.get("retired_pages") or {}
    if pages.get("pending"):
        reset.append("page retirement pending: reset the GPU or reboot for it to take effect")
    mig = gpu.get("mig") or {}
    if mig.get("mode_current") is not None and mig.get("mode_pending") is not None \
            and bool(mig["mode_current"]) != bool(mig["mode_pending"]):
        reset.append("MIG mode pending: %s now, %s after a GPU reset or reboot" % (
            _on_off(mig["mode_current"]), _on_off(mig["mode_pending"])))
    ecc = gpu.get("ecc") or {}
    if ecc.get("mode_current") is not None and ecc.get("mode_pending") is not None \
            and bool(ecc["mode_current"]) != bool(ecc["mode_pending"]):
        reboot.append("ECC mode pending: %s now, %s after the next reboot" % (
            _on_off(ecc["mode_current"]), _on_off(ecc["mode_pending"])))
    return {"reset_required": reset, "reboot_required": reboot}


def _on_off(value: Any) -> str:
    return "enabled" if value else "disabled"


def observed(gpu: Dict[str, Any]) -> Dict[str, Any]:
    """The policy settings of one GPU as read, in the policy's terms.

    :param gpu: a facts-model GPU record.
    :returns: ``{power_limit_w (the requested limit: ``power.requested_limit_w``, else
        ``power.limit_w`` as nvml_reader fills it from nvmlDeviceGetPowerManagementLimit),
        enforced_power_limit_w (``power.enforced_limit_w``, nvmlDeviceGetEnforcedPowerLimit or
        nvidia-smi "Current Power Limit", else ``power.limit_w``), persistence_mode,
        ecc_mode (current), ecc_mode_pending, compute_mode (policy name)}``; ``None`` for what could
        not be read.
    """
    power = gpu.get("power") or {}
    ecc = gpu.get("ecc") or {}
    requested = power.get("requested_limit_w")
    enforced = power.get("enforced_limit_w")
    return {
        "power_limit_w": requested if requested is not None else power.get("limit_w"),
        "enforced_power_limit_w": enforced if enforced is not None else power.get("limit_w"),
        "persistence_mode": gpu.get("persistence_mode"),
        "ecc_mode": ecc.get("mode_current"),
        "ecc_mode_pending": ecc.get("mode_pending"),
        "compute_mode": compute_mode_key(gpu.get("compute_mode")),
    }


def _same_w(left: Optional[float], right: Optional[float]) -> bool:
    if left is None or right is None:
        return False
    return int(round(float(left) * 1000)) == int(round(float(right) * 1000))


def wanted_settings(policy: Dict[str, Any], gpu: Dict[str, Any]) -> Dict[str, Any]:
    """The settings a policy asks of one GPU, in the policy's terms (only those it manages).

    :returns: ``{setting: value}`` for the managed settings of :data:`SETTINGS`; the power limit
        in watts (a percent resolved against this GPU's default).
    """
    wanted = {}  # type: Dict[str, Any]
    if policy.get("power_limit_w") is not None or policy.get("power_limit_percent") is not None:
        wanted["power_limit_w"] = wanted_power_limit_w(policy, gpu)
    for key in ("persistence_mode", "ecc_mode", "compute_mode"):
        if policy.get(key) is not None:
            wanted[key] = policy[key]
    return wanted


def _plan_gpu(policy: Dict[str, Any], gpu: Dict[str, Any]) -> Dict[str, Any]:
    seen = observed(gpu)
    wanted = wanted_settings(policy, gpu)
    pending = gpu_pending(gpu)
    plan = {
        "index": gpu.get("index"),
        "uuid": gpu.get("uuid"),
        "pci_bus_id": gpu.get("pci_bus_id"),
        "name": gpu.get("name"),
        "wanted": wanted,
        "before": seen,
        "prior": {key: seen[key] for key in ("power_limit_w", "enforced_power_limit_w", "persistence_mode",
                                             "ecc_mode", "compute_mode")},
        "changes": [],
        "not_in_effect": [],
        "pending": [],
        "unsupported": [],
        "reset_required": list(pending["reset_required"]),
        "reboot_required": list(pending["reboot_required"]),
    }  # type: Dict[str, Any]
    power = gpu.get("power") or {}
    if "power_limit_w" in wanted:
        target = wanted["power_limit_w"]
        if target is None or seen["power_limit_w"] is None or power.get("min_limit_w") is None \
                or power.get("max_limit_w") is None:
            plan["unsupported"].append("power_limit_w")
        elif not _same_w(seen["power_limit_w"], target):
            plan["changes"].append(_change("power_limit_w", seen["power_limit_w"], target))
        elif seen["enforced_power_limit_w"] is not None and not _same_w(seen["enforced_power_limit_w"], target):
            plan["not_in_effect"].append({
                "setting": "power_limit_w",
                "wanted": target,
                "requested": seen["power_limit_w"],
                "enforced": seen["enforced_power_limit_w"],
                "reason": "requested limit is %s W but the enforced limit is %s W: another limiter "
                          "(out-of-band/BMC cap, module or board power limit) holds it lower; setting "
                          "the same request again does not change it" % (
                              fmt_w(seen["power_limit_w"]), fmt_w(seen["enforced_power_limit_w"])),
            })
    for key in ("persistence_mode", "compute_mode"):
        if key not in wanted:
            continue
        if seen[key] is None:
            plan["unsupported"].append(key)
        elif seen[key] != wanted[key]:
            plan["changes"].append(_change(key, seen[key], wanted[key]))
    if "ecc_mode" in wanted:
        current, pending_mode = seen["ecc_mode"], seen["ecc_mode_pending"]
        if current is None:
            plan["unsupported"].append("ecc_mode")
        elif pending_mode is not None and pending_mode != current and pending_mode == wanted["ecc_mode"]:
            plan["pending"].append({"setting": "ecc_mode", "value": pending_mode, "current": current,
                                    "requires": "reboot"})
        elif (pending_mode if pending_mode is not None else current) != wanted["ecc_mode"]:
            before = pending_mode if pending_mode is not None else current
            change = _change("ecc_mode", before, wanted["ecc_mode"])
            if current == wanted["ecc_mode"]:
                # pending the other way: setting it back cancels the pending change, nothing to reboot for
                change["effect"] = "immediate"
            plan["changes"].append(change)
    for change in plan["changes"]:
        if change["effect"] == "reboot_required":
            plan["reboot_required"].append("ECC mode %s after the next reboot" % _on_off(change["after"]))
    return plan


def _change(setting: str, before: Any, after: Any) -> Dict[str, Any]:
    return {"setting": setting, "before": before, "after": after, "effect": EFFECTS[setting]}


def plan_policy(spec: Dict[str, Any], gpus: List[Dict[str, Any]], strict: bool = False) -> Dict[str, Any]:
    """Plan a policy on a node: what changes on which GPU, and what waits for a reset or reboot.

    Everything that makes the policy inapplicable is found here, before any GPU is touched: a
    selector matching no GPU, a GPU that cannot be read, a power limit outside a GPU's [min, max]
    (each offending GPU named with its range), and under ``strict`` a setting the GPU does not
    support.

    :param spec: the policy (see :func:`normalize_policy`); may already be normalised.
    :param gpus: every GPU record of the node (facts model).
    :param strict: refuse settings a GPU does not support instead of skipping them.
    :returns: ``{"policy": normalised policy, "gpus": [per-GPU plan], "changes": int,
        "unsupported": [{index, setting}], "reset_required": bool, "reboot_required": bool}``.
        A per-GPU plan is ``{index, uuid, pci_bus_id, name, wanted, before, prior, changes:
        [{setting, before, after, effect}], not_in_effect: [{setting, wanted, requested, enforced,
        reason}], pending: [{setting, value, current, requires}], unsupported: [setting],
        reset_required: [reason], reboot_required: [reason]}``. ``effect`` is ``immediate`` or
        ``reboot_required`` (ECC). ``prior`` keeps the values before any change so that they can
        be restored (there is no "reset to the platform default" for a power limit: field case 15).
    :raises PolicyError: listing every problem found.
    """
    policy = normalize_policy(spec)
    selected = select_gpus(policy["gpus"], gpus)
    errors = []
    for gpu in selected:
        if gpu.get("readable") is False:
            errors.append("%s cannot be read (%s): no policy can be applied to it" % (
                describe_gpu(gpu), ", ".join(gpu.get("errors") or []) or "unknown error"))
    readable = [gpu for gpu in selected if gpu.get("readable") is not False]
    errors.extend(power_limit_errors(policy, readable))
    plans = [_plan_gpu(policy, gpu) for gpu in readable]
    unsupported = [{"index": plan["index"], "setting": setting} for plan in plans for setting in plan["unsupported"]]
    if strict:
        for plan in plans:
            for setting in plan["unsupported"]:
                errors.append("%s: %s is not supported on this GPU (strict)" % (
                    describe_gpu(plan), setting))
    if errors:
        raise PolicyError(errors)
    return {
        "policy": policy,
        "gpus": plans,
        "changes": sum(len(plan["changes"]) for plan in plans),
        "unsupported": unsupported,
        "reset_required": any(plan["reset_required"] for plan in plans),
        "reboot_required": any(plan["reboot_required"] for plan in plans),
    }


def policy_report(policy: Dict[str, Any], gpu: Dict[str, Any]) -> Dict[str, Any]:
    """Wanted / in effect / pending for one GPU: the per-GPU report the role returns.

    :param policy: a normalised policy (see :func:`normalize_policy`).
    :param gpu: a facts-model GPU record, read after applying.
    :returns: ``{index, uuid, pci_bus_id, name, wanted, in_effect, requested, pending, drift,
        reset_required, reboot_required}``. ``in_effect`` holds the values active now: the
        *enforced* power limit (falling back to the requested one when the enforced limit cannot be
        read), persistence, the *current* ECC mode, the compute mode. ``requested`` holds the
        requested power limit. ``pending`` holds values waiting for a reboot or reset (ECC mode).
        ``drift`` lists the managed settings neither in effect nor pending as wanted.
    """
    seen = observed(gpu)
    wanted = wanted_settings(policy, gpu)
    in_effect = {
        "power_limit_w": seen["enforced_power_limit_w"] if seen["enforced_power_limit_w"] is not None
        else seen["power_limit_w"],
        "persistence_mode": seen["persistence_mode"],
        "ecc_mode": seen["ecc_mode"],
        "compute_mode": seen["compute_mode"],
    }
    pending = {}  # type: Dict[str, Any]
    if seen["ecc_mode_pending"] is not None and seen["ecc_mode"] is not None \
            and seen["ecc_mode_pending"] != seen["ecc_mode"]:
        pending["ecc_mode"] = seen["ecc_mode_pending"]
    drift = []
    for key, value in wanted.items():
        if key == "power_limit_w":
            matches = _same_w(in_effect[key], value)
        else:
            matches = in_effect[key] == value
        if not matches and pending.get(key, object()) != value:
            drift.append(key)
    extra = gpu_pending(gpu)
    return {
        "index": gpu.get("index"),
        "uuid": gpu.get("uuid"),
        "pci_bus_id": gpu.get("pci_bus_id"),
        "name": gpu.get("name"),
        "wanted": wanted,
        "in_effect": in_effect,
        "requested": {"power_limit_w": seen["power_limit_w"]},
        "pending": pending,
        "drift": sorted(drift),
        "reset_required": extra["reset_required"],
        "reboot_required": extra["reboot_required"],
    }


def diff_view(plan: Dict[str, Any], after_gpus: Optional[List[Dict[str, Any]]] = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """Before/after dictionaries for Ansible's ``--diff``, keyed ``"gpu<index>"``.

    :param plan: the result of :func:`plan_policy`.
    :param after_gpus: GPU records read back after applying; when ``None`` (check mode) the
        "after" side is what the plan would set.
    :returns: ``(before, after)``; each ``{"gpu0": {setting: value}}`` holding only the managed
        settings (ECC as its pending value, what the GPU will run after the next reboot).
    """
    before = {}  # type: Dict[str, Any]
    after = {}  # type: Dict[str, Any]
    by_index = {gpu.get("index"): gpu for gpu in (after_gpus or [])}
    for gpu_plan in plan["gpus"]:
        key = "gpu%s" % gpu_plan["index"]
        seen = gpu_plan["before"]
        managed = [setting for setting in SETTINGS if setting in gpu_plan["wanted"]]
        before[key] = {setting: diff_value(seen, setting) for setting in managed}
        if after_gpus is None:
            projected = dict(before[key])
            for change in gpu_plan["changes"]:
                projected[change["setting"]] = change["after"]
            after[key] = projected
        else:
            read_back = observed(by_index.get(gpu_plan["index"], {"power": {}, "ecc": {}}))
            after[key] = {setting: diff_value(read_back, setting) for setting in managed}
    return before, after


def diff_value(seen: Dict[str, Any], setting: str) -> Any:
    """The value of a setting as the diff and results show it: ECC as its pending value when known.

    :param seen: the result of :func:`observed`.
    :param setting: one of :data:`SETTINGS`.
    """
    if setting == "ecc_mode" and seen.get("ecc_mode_pending") is not None:
        return seen["ecc_mode_pending"]
    return seen.get(setting)
