# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The outcome words of a GPU setter, from its NVML error and from reading the value back.

A setter's own answer is never trusted on its own: ``nvidia-smi -pl`` prints "All done." after
"not supported ... Treating as warning and moving on." (field case 14), and an NVML setter that
returns success may leave the enforced value elsewhere (field case 15). So a result is built from
three facts: the value before, the value read back after, and the NVML error (if any). ``changed``
is true only when the read-back moved.

Outcomes (``status`` of a result):

``ok``             already as wanted, nothing was called.
``applied``        the setter ran and the read-back equals the wanted value.
``pending_reboot`` the read-back shows the wanted value as *pending* (ECC mode): in effect after a reboot.
``pending_reset``  the read-back shows the wanted value as *pending* until a GPU reset (MIG mode).
``not_in_effect``  the requested value reads back as wanted, but the enforced value differs (power limit).
``unsupported``    NVML ``NotSupported``/``FunctionNotFound``: not available on this GPU; skipped.
``no_permission``  NVML ``NoPermission`` ("Insufficient Permissions"): needs root / ``CAP_SYS_ADMIN``.
``in_use``         NVML ``InUse``: a process or another client holds the GPU.
``invalid_value``  NVML ``InvalidArgument``: the value is outside what the GPU accepts.
``reset_required`` NVML ``ResetRequired``: the GPU must be reset before it takes the setting.
``gpu_lost``       NVML ``GpuIsLost``.
``driver_error``   NVML ``DriverNotLoaded``/``LibRmVersionMismatch``/``Uninitialized``.
``failed``         any other error, or no error but the read-back did not reach the wanted value.

Error codes: nvml.h ``nvmlReturn_t`` (NVML API Reference Guide, "Error reporting"); message
texts: ``nvmlErrorString`` as printed by ``nvidia-smi`` (field cases 13, 14, 15).

Pure. Compatible with Python 3.7 (the managed nodes' floor, see README.md).
"""

from __future__ import annotations

from typing import Any, Dict, Optional


# NVML error name (as nvml_reader.error_name gives it) → outcome.
ERROR_OUTCOMES = {
    "NotSupported": "unsupported",
    "FunctionNotFound": "unsupported",
    "Deprecated": "unsupported",
    "NoPermission": "no_permission",
    "InUse": "in_use",
    "InvalidArgument": "invalid_value",
    "ResetRequired": "reset_required",
    "GpuIsLost": "gpu_lost",
    "DriverNotLoaded": "driver_error",
    "LibRmVersionMismatch": "driver_error",
    "Uninitialized": "driver_error",
    "LibraryNotFound": "driver_error",
}

# Outcomes after which the value on the GPU is as the policy wants it (now or once pending).
GOOD_OUTCOMES = ("ok", "applied", "pending_reboot", "pending_reset")

# Outcomes that stop a run: retrying another GPU cannot help until the cause is fixed.
FATAL_OUTCOMES = ("no_permission", "driver_error")


def outcome_of_error(name: Optional[str]) -> Optional[str]:
    """Map an NVML error name (``"NoPermission"``) to an outcome (``"no_permission"``).

    :param name: the name of the NVML return code as ``nvml_reader.error_name`` gives it, or
        ``None`` for success.
    :returns: the outcome, ``None`` for ``None``, ``"failed"`` for any name not in
        :data:`ERROR_OUTCOMES`.
    """
    if name is None:
        return None
    return ERROR_OUTCOMES.get(name, "failed")


def _same(left: Any, right: Any) -> bool:
    if isinstance(left, float) or isinstance(right, float):
        if left is None or right is None:
            return False
        return int(round(float(left) * 1000)) == int(round(float(right) * 1000))
    if isinstance(left, str) and isinstance(right, str):
        return left.lower() == right.lower()
    return left == right


def setter_result(
    setting: str,
    wanted: Any,
    before: Any,
    after: Any,
    error: Optional[str] = None,
    called: bool = True,
    current_after: Any = None,
    pending_requires: Optional[str] = None,
    enforced_after: Any = None,
) -> Dict[str, Any]:
    """Build the result of one setting on one GPU from before, read-back and error.

    :param setting: ``"power_limit_w"``, ``"persistence_mode"``, ``"ecc_mode"``,
        ``"compute_mode"`` or ``"mig_mode"``.
    :param wanted: the value the policy asks for (watts as ``float``, ``bool``, or a mode name).
    :param before: the value read before the setter (for ECC/MIG: the *pending* value).
    :param after: the value read back after the setter (same kind as ``before``); ``None`` when it
        could not be read.
    :param error: NVML error name raised by the setter, or ``None``.
    :param called: ``False`` when no setter was called (already as wanted).
    :param current_after: for settings with current/pending values, the *current* value read back;
        when ``after`` (pending) equals ``wanted`` but this differs, the result is pending.
    :param pending_requires: ``"reboot"`` (ECC) or ``"reset"`` (MIG) for the pending case.
    :param enforced_after: for the power limit, the enforced limit read back (watts); when it differs
        from ``wanted`` the result is ``not_in_effect`` (field case 15).
    :returns: ``{setting, wanted, before, after, status, changed, message}``. ``changed`` is true
        only when ``after`` differs from ``before`` (the read-back moved), whatever the setter said.
    """
    changed = called and after is not None and not _same(before, after)
    result = {
        "setting": setting,
        "wanted": wanted,
        "before": before,
        "after": after,
        "changed": bool(changed),
        "status": None,
        "message": "",
    }
    outcome = outcome_of_error(error)
    if outcome is not None:
        result["status"] = outcome
        result["message"] = "%s: NVML %s" % (setting, error)
        return result
    if after is None and called:
        result["status"] = "failed"
        result["message"] = "%s: the value could not be read back after setting it" % setting
        return result
    if not _same(after, wanted):
        result["status"] = "failed"
        result["message"] = "%s: the setter reported success but reads back %r, not %r" % (setting, after, wanted)
        return result
    if pending_requires is not None and current_after is not None and not _same(current_after, wanted):
        result["status"] = "pending_%s" % pending_requires
        result["message"] = "%s: %r is pending; in effect after a %s (current %r)" % (
            setting, wanted, "reboot" if pending_requires == "reboot" else "GPU reset", current_after)
        return result
    if enforced_after is not None and not _same(enforced_after, wanted):
        result["status"] = "not_in_effect"
        result["message"] = (
            "%s: requested %s W reads back, but the enforced limit is %s W; another limiter "
            "(out-of-band/BMC cap, module or board power limit) holds it lower" % (setting, wanted, enforced_after))
        return result
    result["status"] = "applied" if called else "ok"
    return result
