# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU model shared by the NVML stand-in and nvidia-smi: errors, rules, setters, MIG.

Every query and change goes through here, so NVML, nvidia-smi and the boot unit cannot
disagree. Errors are :class:`SimError` carrying NVML return codes (``nvmlReturn_t``).

Rules (as on real hardware, NVML API reference "Device Commands"):

- ECC mode changes (nvmlDeviceSetEccMode) are pending until the next boot or GPU reset;
- MIG mode changes (nvmlDeviceSetMigMode) are pending until the next boot or GPU reset and
  are refused with IN_USE while compute processes run on the GPU; MIG instances do not
  survive a boot or reset;
- power limit (nvmlDeviceSetPowerManagementLimit) must lie within the constraints
  (INVALID_ARGUMENT otherwise) and returns to the default at boot; persistence and compute
  mode return to Disabled / Default at boot;
- setters need root (NO_PERMISSION otherwise);
- a GPU that fell off the bus answers GPU_IS_LOST; after the next boot it is not on the bus.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from . import driver, is_root, klog, root_dir, state_path
from .state import read_state_cached, update_state

# nvmlReturn_t values (nvml.h; the same numbers as pynvml's NVML_ERROR_* constants)
SUCCESS = 0
UNINITIALIZED = 1
INVALID_ARGUMENT = 2
NOT_SUPPORTED = 3
NO_PERMISSION = 4
ALREADY_INITIALIZED = 5
NOT_FOUND = 6
INSUFFICIENT_SIZE = 7
DRIVER_NOT_LOADED = 9
LIBRARY_NOT_FOUND = 12
FUNCTION_NOT_FOUND = 13
GPU_IS_LOST = 15
RESET_REQUIRED = 16
LIB_RM_VERSION_MISMATCH = 18
IN_USE = 19
INSUFFICIENT_RESOURCES = 23
UNKNOWN = 999

#: What nvmlErrorString() answers for each code (the texts nvidia-smi prints).
ERROR_STRING = {
    SUCCESS: "Success",
    UNINITIALIZED: "Uninitialized",
    INVALID_ARGUMENT: "Invalid Argument",
    NOT_SUPPORTED: "Not Supported",
    NO_PERMISSION: "Insufficient Permissions",
    ALREADY_INITIALIZED: "Already Initialized",
    NOT_FOUND: "Not Found",
    INSUFFICIENT_SIZE: "Insufficient Size",
    DRIVER_NOT_LOADED: "Driver Not Loaded",
    LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    FUNCTION_NOT_FOUND: "Function Not Found",
    GPU_IS_LOST: "GPU is lost",
    RESET_REQUIRED: "GPU requires restart",
    LIB_RM_VERSION_MISMATCH: "Driver/library version mismatch",
    IN_USE: "In use by another client",
    INSUFFICIENT_RESOURCES: "Insufficient resources",
    UNKNOWN: "Unknown Error",
}

#: NVML_COMPUTE_INSTANCE_PROFILE_* enum -> compute slices.
CI_PROFILE_SLICES = {0: 1, 1: 2, 2: 3, 3: 4, 4: 7, 5: 8, 6: 6}

#: GPU instance ids the driver hands out per (compute slices, memory slices), in order.
_GI_ID_POOLS = {
    (7, 8): [0], (4, 4): [1], (3, 4): [1, 2], (2, 2): [3, 4, 5],
    (1, 2): [3, 4, 5, 6], (1, 1): [7, 8, 9, 10, 11, 12, 13],
}
TOTAL_COMPUTE_SLICES = 7
TOTAL_MEMORY_SLICES = 8


class SimError(Exception):
    """A simulated NVML failure; ``code`` is the nvmlReturn_t value."""

    def __init__(self, code: int, detail: str = "") -> None:
        super().__init__(detail or ERROR_STRING.get(code, "NVML error %d" % code))
        self.code = code
        self.detail = detail


# ---------------------------------------------------------------- predicates


def bus_state(gpu: Dict[str, Any]) -> str:
    """``ok``, ``lost`` (fell off the bus this boot) or ``absent`` (not enumerated)."""
    return gpu.get("bus_state") or "ok"


def is_lost(gpu: Dict[str, Any]) -> bool:
    """True when the GPU fell off the bus in this boot (NVML answers GPU_IS_LOST)."""
    return bus_state(gpu) == "lost"


def mig_enabled(gpu: Dict[str, Any]) -> bool:
    """True when MIG mode is currently enabled."""
    mig = gpu.get("mig") or {}
    return bool(mig.get("capable")) and int(mig.get("current") or 0) == 1


def supported(gpu: Dict[str, Any], field: str) -> bool:
    """Whether the GPU answers ``field`` (see simgpu.faults.FIELDS) right now.

    False when a ``nvml_not_supported`` fault names the field, when the GPU lacks the feature
    (row remapping before Ampere, page retirement from Ampere on, MIG outside A100/H100/B200,
    fans on SXM boards), or while MIG is on (per-GPU utilization and row remapping counters).
    """
    if field in (gpu.get("not_supported") or []):
        return False
    if field == "remapped_rows":
        return gpu.get("remapped_rows") is not None and not mig_enabled(gpu)
    if field == "retired_pages":
        return gpu.get("retired_pages") is not None
    if field == "mig_mode":
        return bool((gpu.get("mig") or {}).get("capable"))
    if field == "utilization":
        return not mig_enabled(gpu)
    if field in ("ecc_mode", "ecc_errors"):
        return bool((gpu.get("ecc") or {}).get("supported", True))
    if field == "fan_speed":
        return gpu.get("fan_percent") is not None
    return True


def require(gpu: Dict[str, Any], field: str) -> None:
    """Raise GPU_IS_LOST / NOT_SUPPORTED unless ``field`` can be read on ``gpu``."""
    if is_lost(gpu):
        raise SimError(GPU_IS_LOST)
    if not supported(gpu, field):
        raise SimError(NOT_SUPPORTED)


# ---------------------------------------------------------------- node access


class Node:
    """The GPUs and driver of one node root (``SIMGPU_ROOT``)."""

    def __init__(self, root: Optional[str] = None) -> None:
        self.root = root_dir(root)
        self.path = state_path(self.root)

    def driver_version(self) -> str:
        """Check the driver as nvmlInit does and return the (userspace == loaded) version.

        Raises SimError LIBRARY_NOT_FOUND (no libnvidia-ml.so.1), DRIVER_NOT_LOADED (no loaded
        module) or LIB_RM_VERSION_MISMATCH (loaded module != userspace library).
        """
        userspace = driver.userspace_version(self.root)
        if userspace is None:
            raise SimError(LIBRARY_NOT_FOUND)
        loaded = driver.loaded_module(self.root)
        if loaded is None:
            raise SimError(DRIVER_NOT_LOADED)
        if loaded["version"] != userspace:
            raise SimError(LIB_RM_VERSION_MISMATCH)
        return userspace

    def state(self) -> Dict[str, Any]:
        """The current state (shared cached dict: read only); no GPUs when there is no state file."""
        try:
            return read_state_cached(self.path)
        except FileNotFoundError:
            return {"gpus": [], "faults": {}}

    def enumerated(self, state: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
        """GPUs on the bus, in enumeration (PCI bus id) order; lost GPUs included."""
        state = state if state is not None else self.state()
        return [g for g in state["gpus"] if bus_state(g) != "absent"]

    def update_gpu(self, index: int, change: Callable[[Dict[str, Any], Dict[str, Any]], Any]) -> Any:
        """Run ``change(state, gpu)`` for physical GPU ``index`` under the state lock."""

        def mutate(state: Dict[str, Any]) -> Any:
            gpu = state["gpus"][index]
            if bus_state(gpu) == "absent":
                raise SimError(GPU_IS_LOST)
            if is_lost(gpu):
                raise SimError(GPU_IS_LOST)
            return change(state, gpu)

        return update_state(self.path, mutate)


def _need_root() -> None:
    if not is_root():
        raise SimError(NO_PERMISSION)


# ---------------------------------------------------------------- setters


def set_power_limit(node: Node, index: int, milliwatts: int) -> None:
    """nvmlDeviceSetPowerManagementLimit: in effect at once, bounded by the constraints."""

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> None:
        require(gpu, "power_limit")
        _need_root()
        power = gpu["power"]
        if not power["min_mw"] <= int(milliwatts) <= power["max_mw"]:
            raise SimError(INVALID_ARGUMENT)
        power["limit_mw"] = int(milliwatts)

    node.update_gpu(index, change)


def set_persistence_mode(node: Node, index: int, mode: int) -> None:
    """nvmlDeviceSetPersistenceMode (0 disabled, 1 enabled): in effect at once, reset at boot."""

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> None:
        require(gpu, "persistence_mode")
        _need_root()
        if int(mode) not in (0, 1):
            raise SimError(INVALID_ARGUMENT)
        gpu["persistence_mode"] = int(mode)

    node.update_gpu(index, change)


def set_compute_mode(node: Node, index: int, mode: int) -> None:
    """nvmlDeviceSetComputeMode (0 default, 2 prohibited, 3 exclusive process); reset at boot."""

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> None:
        require(gpu, "compute_mode")
        _need_root()
        if int(mode) == 1:
            raise SimError(NOT_SUPPORTED)
        if int(mode) not in (0, 2, 3):
            raise SimError(INVALID_ARGUMENT)
        gpu["compute_mode"] = int(mode)

    node.update_gpu(index, change)


def set_ecc_mode(node: Node, index: int, mode: int) -> None:
    """nvmlDeviceSetEccMode: sets the pending mode; current follows at the next boot or reset."""

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> None:
        require(gpu, "ecc_mode")
        _need_root()
        if int(mode) not in (0, 1):
            raise SimError(INVALID_ARGUMENT)
        gpu["ecc"]["pending"] = int(mode)

    node.update_gpu(index, change)


def set_mig_mode(node: Node, index: int, mode: int) -> int:
    """nvmlDeviceSetMigMode: sets the pending mode; returns the activation status.

    The status is SUCCESS when nothing is left pending, RESET_REQUIRED when a GPU reset or a
    reboot must follow. IN_USE (raised) while compute processes run on the GPU.
    """

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> int:
        require(gpu, "mig_mode")
        _need_root()
        if int(mode) not in (0, 1):
            raise SimError(INVALID_ARGUMENT)
        if gpu.get("processes"):
            raise SimError(IN_USE)
        mig = gpu["mig"]
        mig["pending"] = int(mode)
        return SUCCESS if mig["pending"] == mig["current"] else RESET_REQUIRED

    return node.update_gpu(index, change)


# ---------------------------------------------------------------- boot and reset


def apply_reset_rules(gpu: Dict[str, Any]) -> None:
    """What a GPU reset does: pending ECC and MIG become current, MIG instances and volatile ECC
    counters are cleared, pending row remaps and page retirements take effect."""
    ecc = gpu.get("ecc") or {}
    if "pending" in ecc:
        ecc["current"] = ecc["pending"]
    ecc["volatile"] = {"corrected": 0, "uncorrected": 0}
    mig = gpu.get("mig") or {}
    if mig.get("capable"):
        mig["current"] = mig.get("pending", 0)
    mig["instances"] = []
    rows = gpu.get("remapped_rows")
    if rows and rows.get("pending"):
        rows["pending"] = False
    pages = gpu.get("retired_pages")
    if pages and pages.get("pending"):
        pages["pending"] = False
    gpu["processes"] = []
    idle = (gpu.get("clocks") or {}).get("idle")
    if idle:
        gpu["clocks"].update(idle)
    gpu["clocks_event_reasons"] = 0x1


def apply_boot_rules(state: Dict[str, Any], boot_id: Optional[str], now: float, release: str) -> List[int]:
    """Apply everything a reboot does to ``state``; return the GPUs that fell off the bus now.

    New kernel log for ``boot_id``; GPUs lost in the previous boot are absent from now on;
    armed ``gpu_lost`` faults take effect; reset rules on every GPU; power limit back to
    default; persistence and compute mode back to Disabled / Default.
    """
    boot = state.setdefault("boot", {"count": 0})
    boot["count"] = int(boot.get("count") or 0) + 1
    boot["id"] = boot_id
    boot["time"] = now
    klog.start_boot(state, boot_id, now, release)
    faults = state.setdefault("faults", {})
    armed = [int(entry["gpu"]) for entry in faults.get("gpu_lost") or []]
    newly_lost = []
    for gpu in state["gpus"]:
        if bus_state(gpu) == "lost":
            gpu["bus_state"] = "absent"
        if gpu["index"] in armed and bus_state(gpu) == "ok":
            gpu["bus_state"] = "lost"
            newly_lost.append(gpu["index"])
        apply_reset_rules(gpu)
        power = gpu["power"]
        power["limit_mw"] = power["default_mw"]
        gpu["persistence_mode"] = 0
        gpu["compute_mode"] = 0
    faults["gpu_lost"] = []
    return newly_lost


def reset_gpu(node: Node, index: int) -> None:
    """GPU reset (``nvidia-smi -r``): root only; IN_USE while processes run on it."""
    _need_root()

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> None:
        if gpu.get("processes"):
            raise SimError(IN_USE)
        apply_reset_rules(gpu)

    node.update_gpu(index, change)


# ---------------------------------------------------------------- MIG


def gi_profile(gpu: Dict[str, Any], nvml_profile: int) -> Optional[Dict[str, Any]]:
    """The GPU instance profile for an NVML_GPU_INSTANCE_PROFILE_* value, or None."""
    for profile in (gpu.get("mig") or {}).get("profiles") or []:
        if int(profile["nvml_profile"]) == int(nvml_profile):
            return profile
    return None


def gi_profile_by_id(gpu: Dict[str, Any], profile_id: int) -> Optional[Dict[str, Any]]:
    """The GPU instance profile with nvidia-smi profile id ``profile_id`` (e.g. 19), or None."""
    for profile in (gpu.get("mig") or {}).get("profiles") or []:
        if int(profile["id"]) == int(profile_id):
            return profile
    return None


def _usage(gpu: Dict[str, Any]) -> Tuple[int, int]:
    compute = memory = 0
    for inst in gpu["mig"]["instances"]:
        profile = gi_profile(gpu, inst["profile"]) or {}
        compute += int(profile.get("slices", 0))
        memory += int(profile.get("memory_slices", 0))
    return compute, memory


def gi_remaining_capacity(gpu: Dict[str, Any], profile: Dict[str, Any]) -> int:
    """How many more instances of ``profile`` fit (nvmlDeviceGetGpuInstanceRemainingCapacity)."""
    if not mig_enabled(gpu):
        return 0
    used = sum(1 for inst in gpu["mig"]["instances"] if inst["profile"] == profile["nvml_profile"])
    compute, memory = _usage(gpu)
    fit = min((TOTAL_COMPUTE_SLICES - compute) // max(1, profile["slices"]),
              (TOTAL_MEMORY_SLICES - memory) // max(1, profile["memory_slices"]))
    free_ids = [i for i in _GI_ID_POOLS.get((profile["slices"], profile["memory_slices"]), [])
                if i not in [inst["id"] for inst in gpu["mig"]["instances"]]]
    return max(0, min(fit, profile["max_count"] - used, len(free_ids)))


def create_gpu_instance(node: Node, index: int, nvml_profile: int) -> int:
    """nvmlDeviceCreateGpuInstance: returns the new GPU instance id."""
    _need_root()

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> int:
        if not mig_enabled(gpu):
            raise SimError(NOT_SUPPORTED)
        profile = gi_profile(gpu, nvml_profile)
        if profile is None:
            raise SimError(NOT_SUPPORTED)
        if gi_remaining_capacity(gpu, profile) < 1:
            raise SimError(INSUFFICIENT_RESOURCES)
        taken = [inst["id"] for inst in gpu["mig"]["instances"]]
        pool = _GI_ID_POOLS.get((profile["slices"], profile["memory_slices"]), [])
        gi_id = [i for i in pool if i not in taken][0]
        start = pool.index(gi_id) * profile["memory_slices"]
        gpu["mig"]["instances"].append({
            "id": gi_id, "profile": profile["nvml_profile"], "profile_id": profile["id"],
            "placement": {"start": start, "size": profile["memory_slices"]}, "compute_instances": [],
        })
        gpu["mig"]["instances"].sort(key=lambda inst: inst["id"])
        return gi_id

    return node.update_gpu(index, change)


def find_gi(gpu: Dict[str, Any], gi_id: int) -> Dict[str, Any]:
    """The GPU instance ``gi_id`` of ``gpu``; NOT_FOUND when there is none."""
    for inst in (gpu.get("mig") or {}).get("instances") or []:
        if int(inst["id"]) == int(gi_id):
            return inst
    raise SimError(NOT_FOUND)


def destroy_gpu_instance(node: Node, index: int, gi_id: int) -> None:
    """nvmlGpuInstanceDestroy: IN_USE while it still has compute instances."""
    _need_root()

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> None:
        inst = find_gi(gpu, gi_id)
        if inst["compute_instances"]:
            raise SimError(IN_USE)
        gpu["mig"]["instances"].remove(inst)

    node.update_gpu(index, change)


def ci_slices_left(gpu: Dict[str, Any], inst: Dict[str, Any]) -> int:
    """Compute slices of GPU instance ``inst`` not used by its compute instances."""
    profile = gi_profile(gpu, inst["profile"]) or {"slices": 0}
    used = sum(int(ci["slices"]) for ci in inst["compute_instances"])
    return int(profile["slices"]) - used


def create_compute_instance(node: Node, index: int, gi_id: int, ci_profile: int) -> int:
    """nvmlGpuInstanceCreateComputeInstance: returns the new compute instance id."""
    _need_root()

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> int:
        inst = find_gi(gpu, gi_id)
        slices = CI_PROFILE_SLICES.get(int(ci_profile))
        gi_slices = (gi_profile(gpu, inst["profile"]) or {"slices": 0})["slices"]
        if slices is None or slices > gi_slices:
            raise SimError(NOT_SUPPORTED)
        if slices > ci_slices_left(gpu, inst):
            raise SimError(INSUFFICIENT_RESOURCES)
        taken = [ci["id"] for ci in inst["compute_instances"]]
        ci_id = min(i for i in range(8) if i not in taken)
        start = sum(int(ci["slices"]) for ci in inst["compute_instances"])
        inst["compute_instances"].append({"id": ci_id, "profile": int(ci_profile), "slices": slices,
                                          "placement": {"start": start, "size": slices}})
        inst["compute_instances"].sort(key=lambda ci: ci["id"])
        return ci_id

    return node.update_gpu(index, change)


def destroy_compute_instance(node: Node, index: int, gi_id: int, ci_id: int) -> None:
    """nvmlComputeInstanceDestroy."""
    _need_root()

    def change(_state: Dict[str, Any], gpu: Dict[str, Any]) -> None:
        inst = find_gi(gpu, gi_id)
        for ci in inst["compute_instances"]:
            if int(ci["id"]) == int(ci_id):
                inst["compute_instances"].remove(ci)
                return
        raise SimError(NOT_FOUND)

    node.update_gpu(index, change)


def mig_devices(gpu: Dict[str, Any]) -> List[Dict[str, Any]]:
    """MIG devices (one per compute instance), in (GPU instance id, compute instance id) order.

    Each: ``{"gi_id", "ci_id", "profile", "slices", "sm", "memory_mib", ...}``.
    """
    out = []
    if not mig_enabled(gpu):
        return out
    for inst in sorted(gpu["mig"]["instances"], key=lambda i: i["id"]):
        profile = gi_profile(gpu, inst["profile"]) or {}
        for ci in sorted(inst["compute_instances"], key=lambda c: c["id"]):
            share = float(ci["slices"]) / max(1, int(profile.get("slices", 1)))
            out.append({
                "gi_id": inst["id"], "ci_id": ci["id"], "profile": profile, "slices": ci["slices"],
                "sm": int(round(int(profile.get("sm", 0)) * share)),
                "memory_mib": int(profile.get("memory_mib", 0)),
                "ce": int(profile.get("ce", 0)), "dec": int(profile.get("dec", 0)),
                "enc": int(profile.get("enc", 0)), "jpeg": int(profile.get("jpeg", 0)),
                "ofa": int(profile.get("ofa", 0)),
            })
    return out
