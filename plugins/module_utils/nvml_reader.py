# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read a node's driver and GPU state through NVML (the ``pynvml`` module of nvidia-ml-py).

The reader takes the ``pynvml`` module as an argument, so it runs unchanged against the real
package, the simulated fleet's drop-in, or any object with the same functions. Each field is
read on its own: an NVML error on one field (NotSupported, NoPermission, FunctionNotFound, a
function missing from an old pynvml) gives ``None`` for that field and one entry in
``unsupported``, never a failure. GpuIsLost marks that GPU, not the node, as unreadable.
An error of ``nvmlInit`` itself is returned by name (``LibRmVersionMismatch``,
``DriverNotLoaded``, ``LibraryNotFound``, ...) so the caller can turn it into evidence for the
driver state instead of a crash.

NVML calls and units: NVML API Reference Guide (docs.nvidia.com/deploy/nvml-api/), "Device
Queries"; power values are milliwatts, memory values bytes, clocks MHz, temperatures °C.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import (
    clocks_event_reason_names,
    mib_from_bytes,
    new_gpu,
    GPU_RECOVERY_ACTIONS,
    new_mig_device,
    normalize_pci_bus_id,
    performance_state_name,
    watts_from_milliwatts,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_names import (
    architecture_display_name,
    compute_mode_name,
    return_code_name,
)

_MIG_PROFILE = re.compile(r"\bMIG\s+(\d+g\.\d+gb(?:\+\w+)?)\s*$")


class _GpuLost(Exception):
    """Raised inside the per-GPU reader when NVML says GpuIsLost."""


def error_name(nvml: Any, err: BaseException) -> str:
    """Name an NVML error the way nvml.h names its return code, ``"LibRmVersionMismatch"``.

    :param nvml: the pynvml module whose ``NVMLError`` raised ``err``.
    :param err: the exception; ``AttributeError`` (a function missing from this pynvml)
        counts as ``FunctionNotFound``.
    :returns: the name (:func:`nvml_names.return_code_name`: ``"Error<code>"`` for a code
        nvml.h did not hold), or the exception's class name when it is no NVML error.
    """
    if isinstance(err, AttributeError):
        return "FunctionNotFound"
    value = getattr(err, "value", None)
    if isinstance(value, int):
        return return_code_name(value)
    return type(err).__name__


def is_nvml_error(nvml: Any, err: BaseException) -> bool:
    """Whether an exception raised around a pynvml call is an NVML error, to be named, not raised.

    :param nvml: the pynvml module. :param err: the exception caught around the call.
    :returns: ``True`` for an instance of the module's ``NVMLError`` (any return code) and for an
        ``AttributeError`` (a function this pynvml lacks: ``FunctionNotFound``); ``False`` for any
        other exception, which the caller re-raises.
    """
    base = getattr(nvml, "NVMLError", None)
    return isinstance(err, AttributeError) or (base is not None and isinstance(err, base))


def _text(value: Any) -> Optional[str]:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    text = str(value).strip()
    return text or None


class _FieldReader(object):
    """Call NVML getters for one GPU, turning per-field errors into ``None`` plus a note."""

    def __init__(self, nvml: Any, index: int, unsupported: List[Dict[str, Any]]) -> None:
        self.nvml = nvml
        self.index = index
        self.unsupported = unsupported

    def get(self, field: str, func_name: str, *args: Any) -> Any:
        try:
            func = getattr(self.nvml, func_name)
            return func(*args)
        except Exception as err:  # pylint: disable=broad-except
            if not is_nvml_error(self.nvml, err):
                raise
            name = error_name(self.nvml, err)
            if name == "GpuIsLost":
                raise _GpuLost()
            self.unsupported.append({"gpu": self.index, "field": field, "call": func_name, "error": name})
            return None


def _first(reader: _FieldReader, field: str, calls: List[tuple]) -> Any:
    """Try ``(func_name, args)`` in turn until one answers; note only the last failure."""
    notes_before = len(reader.unsupported)
    for func_name, args in calls:
        value = reader.get(field, func_name, *args)
        if value is not None:
            del reader.unsupported[notes_before:]
            return value
    if len(reader.unsupported) > notes_before + 1:
        del reader.unsupported[notes_before:-1]
    return None


def _read_mig_devices(nvml: Any, reader: _FieldReader, handle: Any) -> List[Dict[str, Any]]:
    devices = []
    count = reader.get("mig.devices", "nvmlDeviceGetMaxMigDeviceCount", handle)
    for slot in range(count or 0):
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except Exception as err:  # pylint: disable=broad-except
            if not is_nvml_error(nvml, err):
                raise
            if error_name(nvml, err) == "GpuIsLost":
                raise _GpuLost()
            continue  # NotFound: this slot holds no MIG device
        device = new_mig_device()
        device["gpu_instance_id"] = reader.get("mig.devices.gpu_instance_id", "nvmlDeviceGetGpuInstanceId", mig)
        device["compute_instance_id"] = reader.get(
            "mig.devices.compute_instance_id", "nvmlDeviceGetComputeInstanceId", mig)
        device["uuid"] = _text(reader.get("mig.devices.uuid", "nvmlDeviceGetUUID", mig))
        name = _text(reader.get("mig.devices.name", "nvmlDeviceGetName", mig))
        match = _MIG_PROFILE.search(name or "")
        device["profile"] = match.group(1) if match else None
        memory = reader.get("mig.devices.memory", "nvmlDeviceGetMemoryInfo", mig)
        device["memory_total_mib"] = mib_from_bytes(getattr(memory, "total", None))
        devices.append(device)
    return devices


def _pair(value: Any) -> tuple:
    if isinstance(value, (list, tuple)) and len(value) == 2:
        return value[0], value[1]
    return None, None


def _bool(value: Any) -> Optional[bool]:
    return None if value is None else bool(value)


def read_gpu(nvml: Any, index: int, unsupported: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Read one GPU through NVML into a facts_model GPU record.

    :param nvml: the pynvml module (already initialised).
    :param index: NVML device index (``nvmlDeviceGetHandleByIndex``).
    :param unsupported: list that receives ``{gpu, field, call, error}`` for each field NVML
        would not give.
    :returns: the GPU record of :func:`facts_model.new_gpu`; ``readable`` is ``False`` and
        ``errors`` holds ``"GpuIsLost"`` when NVML reports the GPU lost (the record then keeps
        what was read before that).
    :raises: nothing for NVML errors; other exceptions propagate.

    Sources (NVML API reference): nvmlDeviceGetUUID/Name/Serial/PciInfo_v3 (busId)/
    Architecture/VbiosVersion, nvmlDeviceGetPersistenceMode, nvmlDeviceGetComputeMode,
    nvmlDeviceGetPowerManagementLimit (requested_limit_w), ...DefaultLimit,
    nvmlDeviceGetEnforcedPowerLimit (enforced_limit_w and limit_w, the limit in effect),
    ...LimitConstraints (min/max), nvmlDeviceGetPowerUsage (draw_w), nvmlDeviceGetEccMode
    (current, pending), nvmlDeviceGetTotalEccErrors, nvmlDeviceGetRemappedRows,
    nvmlDeviceGetRetiredPages(+PendingStatus), nvmlDeviceGetMigMode (current, pending) and the
    MIG device handles, nvmlDeviceGetClockInfo/MaxClockInfo, nvmlDeviceGetCurrentClocksEventReasons,
    nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU), nvmlDeviceGetMemoryInfo, PCIe link
    generation/width getters, nvmlDeviceGetUtilizationRates, nvmlDeviceGetComputeRunningProcesses.
    """
    gpu = new_gpu(index)
    reader = _FieldReader(nvml, index, unsupported)
    try:
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as err:  # pylint: disable=broad-except
            if not is_nvml_error(nvml, err):
                raise
            name = error_name(nvml, err)
            if name == "GpuIsLost":
                raise _GpuLost()
            gpu["readable"] = False
            gpu["errors"].append(name)
            return gpu
        _read_identity(nvml, reader, handle, gpu)
        _read_modes_and_power(nvml, reader, handle, gpu)
        _read_memory_health(nvml, reader, handle, gpu)
        _read_mig(nvml, reader, handle, gpu)
        _read_clocks_and_links(nvml, reader, handle, gpu)
        _read_processes(reader, handle, gpu)
        read_extended(nvml, reader, handle, gpu)
    except _GpuLost:
        gpu["readable"] = False
        gpu["errors"].append("GpuIsLost")
    return gpu


def _read_identity(nvml: Any, reader: _FieldReader, handle: Any, gpu: Dict[str, Any]) -> None:
    gpu["uuid"] = _text(reader.get("uuid", "nvmlDeviceGetUUID", handle))
    gpu["name"] = _text(reader.get("name", "nvmlDeviceGetName", handle))
    gpu["serial"] = _text(reader.get("serial", "nvmlDeviceGetSerial", handle))
    pci = reader.get("pci_bus_id", "nvmlDeviceGetPciInfo", handle)
    if pci is not None:
        gpu["pci_bus_id"] = normalize_pci_bus_id(_text(getattr(pci, "busId", None)))
        device_id = getattr(pci, "pciDeviceId", None)
        gpu["pci_device_id"] = None if device_id is None else "0x%08x" % device_id
    arch = reader.get("architecture", "nvmlDeviceGetArchitecture", handle)
    gpu["architecture"] = architecture_display_name(arch)
    gpu["vbios_version"] = _text(reader.get("vbios_version", "nvmlDeviceGetVbiosVersion", handle))


def _read_modes_and_power(nvml: Any, reader: _FieldReader, handle: Any, gpu: Dict[str, Any]) -> None:
    gpu["persistence_mode"] = _bool(reader.get("persistence_mode", "nvmlDeviceGetPersistenceMode", handle))
    mode = reader.get("compute_mode", "nvmlDeviceGetComputeMode", handle)
    gpu["compute_mode"] = compute_mode_name(mode)
    power = gpu["power"]
    # The limit in effect is the enforced one (the lowest of all limiters); what was set through
    # nvmlDeviceSetPowerManagementLimit is read back by nvmlDeviceGetPowerManagementLimit, which
    # nvidia-smi prints as "Requested Power Limit" (field case 15: 500 W in effect, 700 W requested).
    power["requested_limit_w"] = watts_from_milliwatts(
        reader.get("power.requested_limit_w", "nvmlDeviceGetPowerManagementLimit", handle))
    power["default_limit_w"] = watts_from_milliwatts(
        reader.get("power.default_limit_w", "nvmlDeviceGetPowerManagementDefaultLimit", handle))
    power["enforced_limit_w"] = watts_from_milliwatts(
        reader.get("power.enforced_limit_w", "nvmlDeviceGetEnforcedPowerLimit", handle))
    power["limit_w"] = power["enforced_limit_w"]
    low, high = _pair(reader.get("power.min_max_limit_w", "nvmlDeviceGetPowerManagementLimitConstraints", handle))
    power["min_limit_w"] = watts_from_milliwatts(low)
    power["max_limit_w"] = watts_from_milliwatts(high)
    power["draw_w"] = watts_from_milliwatts(reader.get("power.draw_w", "nvmlDeviceGetPowerUsage", handle))
    temperature = reader.get("temperature_c", "nvmlDeviceGetTemperature", handle,
                             getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
    gpu["temperature_c"] = temperature


def _read_memory_health(nvml: Any, reader: _FieldReader, handle: Any, gpu: Dict[str, Any]) -> None:
    ecc = gpu["ecc"]
    current, pending = _pair(reader.get("ecc.mode", "nvmlDeviceGetEccMode", handle))
    ecc["mode_current"], ecc["mode_pending"] = _bool(current), _bool(pending)
    # NotSupported: the GPU has no ECC (GeForce, some workstation boards), which is not ECC off.
    if ecc["mode_current"] is not None:
        ecc["supported"] = True
    elif any(u.get("field") == "ecc.mode" and u.get("error") == "NotSupported" for u in reader.unsupported):
        ecc["supported"] = False
    if ecc["mode_current"]:
        corrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_CORRECTED", 0)
        uncorrected = getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1)
        for counter_name, counter in (("volatile", getattr(nvml, "NVML_VOLATILE_ECC", 0)),
                                      ("aggregate", getattr(nvml, "NVML_AGGREGATE_ECC", 1))):
            for kind_name, kind in (("corrected", corrected), ("uncorrected", uncorrected)):
                ecc[counter_name][kind_name] = reader.get(
                    "ecc.%s.%s" % (counter_name, kind_name), "nvmlDeviceGetTotalEccErrors", handle, kind, counter)
    rows = reader.get("remapped_rows", "nvmlDeviceGetRemappedRows", handle)
    if isinstance(rows, (list, tuple)) and len(rows) == 4:
        gpu["remapped_rows"] = {
            "correctable": rows[0],
            "uncorrectable": rows[1],
            "pending": bool(rows[2]),
            "failed": bool(rows[3]),
        }
    retired = gpu["retired_pages"]
    for key, cause in (("single_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS"),
                       ("double_bit_ecc", "NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR")):
        pages = reader.get("retired_pages." + key, "nvmlDeviceGetRetiredPages", handle,
                           getattr(nvml, cause, 0 if key == "single_bit_ecc" else 1))
        retired[key] = None if pages is None else len(pages)
    retired["pending"] = _bool(reader.get("retired_pages.pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle))
    # nvmlDeviceGetMemoryInfo_v2 (pynvml: version=nvmlMemory_v2) is the one that reports the memory
    # the driver reserves for itself; the v1 call counts it as used.
    version_2 = getattr(nvml, "nvmlMemory_v2", None)
    calls = [("nvmlDeviceGetMemoryInfo", (handle, version_2))] if version_2 is not None else []
    memory = _first(reader, "memory", calls + [("nvmlDeviceGetMemoryInfo", (handle,))])
    if memory is not None:
        gpu["memory"]["total_mib"] = mib_from_bytes(getattr(memory, "total", None))
        gpu["memory"]["used_mib"] = mib_from_bytes(getattr(memory, "used", None))
        gpu["memory"]["free_mib"] = mib_from_bytes(getattr(memory, "free", None))
        gpu["memory"]["reserved_mib"] = mib_from_bytes(getattr(memory, "reserved", None))


def _read_mig(nvml: Any, reader: _FieldReader, handle: Any, gpu: Dict[str, Any]) -> None:
    current, pending = _pair(reader.get("mig.mode", "nvmlDeviceGetMigMode", handle))
    gpu["mig"]["mode_current"], gpu["mig"]["mode_pending"] = _bool(current), _bool(pending)
    if gpu["mig"]["mode_current"]:
        gpu["mig"]["devices"] = _read_mig_devices(nvml, reader, handle)


def _read_clocks_and_links(nvml: Any, reader: _FieldReader, handle: Any, gpu: Dict[str, Any]) -> None:
    sm = getattr(nvml, "NVML_CLOCK_SM", 1)
    mem = getattr(nvml, "NVML_CLOCK_MEM", 2)
    clocks = gpu["clocks"]
    clocks["sm_mhz"] = reader.get("clocks.sm_mhz", "nvmlDeviceGetClockInfo", handle, sm)
    clocks["mem_mhz"] = reader.get("clocks.mem_mhz", "nvmlDeviceGetClockInfo", handle, mem)
    clocks["sm_max_mhz"] = reader.get("clocks.sm_max_mhz", "nvmlDeviceGetMaxClockInfo", handle, sm)
    clocks["mem_max_mhz"] = reader.get("clocks.mem_max_mhz", "nvmlDeviceGetMaxClockInfo", handle, mem)
    mask = _first(reader, "clocks_event_reasons", [("nvmlDeviceGetCurrentClocksEventReasons", (handle,)),
                                                   ("nvmlDeviceGetCurrentClocksThrottleReasons", (handle,))])
    gpu["clocks_event_reasons"] = clocks_event_reason_names(mask)
    pcie = gpu["pcie"]
    pcie["gen_current"] = reader.get("pcie.gen_current", "nvmlDeviceGetCurrPcieLinkGeneration", handle)
    pcie["gen_max"] = _first(reader, "pcie.gen_max", [
        ("nvmlDeviceGetGpuMaxPcieLinkGeneration", (handle,)),
        ("nvmlDeviceGetMaxPcieLinkGeneration", (handle,)),
    ])
    pcie["width_current"] = reader.get("pcie.width_current", "nvmlDeviceGetCurrPcieLinkWidth", handle)
    pcie["width_max"] = reader.get("pcie.width_max", "nvmlDeviceGetMaxPcieLinkWidth", handle)
    if not gpu["mig"]["mode_current"]:
        utilization = reader.get("utilization_gpu_pct", "nvmlDeviceGetUtilizationRates", handle)
        gpu["utilization_gpu_pct"] = getattr(utilization, "gpu", None)


def _gpu_instance_profiles(nvml: Any, handle: Any) -> List[str]:
    """Names of the GPU instance profiles the driver offers on this GPU, in NVML profile order."""
    names = []
    for profile in range(int(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0))):
        try:
            info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)
        except Exception as err:  # pylint: disable=broad-except
            if not is_nvml_error(nvml, err):
                raise
            if error_name(nvml, err) == "GpuIsLost":
                raise _GpuLost()
            continue  # NotSupported / InvalidArgument: this profile is not offered here
        match = _MIG_PROFILE.search(_text(getattr(info, "name", None)) or "")
        if match and match.group(1) not in names:
            names.append(match.group(1))
    return names


def read_extended(nvml: Any, reader: Any, handle: Any, gpu: Dict[str, Any]) -> None:
    """Fill ``gpu["extended"]`` (facts_model.new_gpu_extended) through NVML.

    :param nvml: the pynvml module (initialised).
    :param reader: the per-GPU field reader of :func:`read_gpu` (turns NVML errors into ``None``
        plus an ``unsupported`` note).
    :param handle: the device handle.
    :param gpu: the GPU record, already holding ``mig`` (read by :func:`read_gpu` before).
    :returns: nothing; the record is changed in place.
    :raises: nothing for NVML errors but GpuIsLost, which ends the GPU's reading.

    Calls (nvidia-ml-py 13.615.71): ``nvmlDeviceGetDefaultApplicationsClock(handle,
    NVML_CLOCK_GRAPHICS | NVML_CLOCK_MEM)`` (MHz), ``nvmlDeviceGetBAR1MemoryInfo(handle).bar1Total``
    (bytes → MiB), ``nvmlDeviceGetGspFirmwareVersion(handle)``, ``nvmlDeviceGetPerformanceState(handle)``
    (``nvmlPstates_t``), ``nvmlDeviceGetGpuInstanceProfileInfo(handle, profile)`` for every
    ``NVML_GPU_INSTANCE_PROFILE_*`` below ``NVML_GPU_INSTANCE_PROFILE_COUNT`` (its ``name``, "MIG
    1g.10gb"), and ``nvmlDeviceGetFieldValues(handle, [NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])``
    (``value.uiVal``, an ``NVML_GPU_RECOVERY_ACTION_*``), ``nvmlDeviceGetMaxPcieLinkGeneration(handle)``
    (the generation attainable by this GPU in this system). MIG capability: ``nvmlDeviceGetMigMode``
    answered (capable) or said NotSupported (not capable).
    """
    extended = gpu["extended"]
    for key, clock in (("app_clocks_default_graphics_mhz", getattr(nvml, "NVML_CLOCK_GRAPHICS", 0)),
                       ("app_clocks_default_mem_mhz", getattr(nvml, "NVML_CLOCK_MEM", 2))):
        extended[key] = reader.get("extended." + key, "nvmlDeviceGetDefaultApplicationsClock", handle, clock)
    bar1 = reader.get("extended.bar1_total_mib", "nvmlDeviceGetBAR1MemoryInfo", handle)
    extended["bar1_total_mib"] = mib_from_bytes(getattr(bar1, "bar1Total", None))
    extended["gsp_firmware_version"] = _text(
        reader.get("extended.gsp_firmware_version", "nvmlDeviceGetGspFirmwareVersion", handle))
    extended["performance_state"] = performance_state_name(
        reader.get("extended.performance_state", "nvmlDeviceGetPerformanceState", handle))
    if gpu["mig"]["mode_current"] is not None:
        extended["mig_capable"] = True
    elif any(note["gpu"] == gpu["index"] and note["field"] == "mig.mode" and note["error"] == "NotSupported"
             for note in reader.unsupported):
        extended["mig_capable"] = False
    if extended["mig_capable"]:
        extended["mig_profiles_offered"] = _gpu_instance_profiles(nvml, handle)
    elif extended["mig_capable"] is False:
        extended["mig_profiles_offered"] = []
    extended["pcie_gen_attainable"] = reader.get(
        "extended.pcie_gen_attainable", "nvmlDeviceGetMaxPcieLinkGeneration", handle)
    field = getattr(nvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    values = reader.get("extended.recovery_action", "nvmlDeviceGetFieldValues", handle, [field]) if field else None
    if values:
        value = values[0]
        if getattr(value, "nvmlReturn", 1) == 0:
            code = getattr(getattr(value, "value", None), "uiVal", None)
            extended["recovery_action"] = None if code is None else GPU_RECOVERY_ACTIONS.get(code, "action_%d" % code)


def _read_processes(reader: _FieldReader, handle: Any, gpu: Dict[str, Any]) -> None:
    processes = reader.get("processes", "nvmlDeviceGetComputeRunningProcesses", handle)
    if processes is None:
        return
    gpu["processes"] = [
        {"pid": getattr(proc, "pid", None), "name": None,
         "used_memory_mib": mib_from_bytes(getattr(proc, "usedGpuMemory", None))}
        for proc in processes
    ]


def _cuda_version(value: Optional[int]) -> Optional[str]:
    """NVML's CUDA driver version integer, 13000 → ``"13.0"`` (major*1000 + minor*10)."""
    if value is None:
        return None
    return "%d.%d" % (value // 1000, (value % 1000) // 10)


def read_nvml(nvml: Any, shutdown: bool = True) -> Dict[str, Any]:
    """Read the driver and every GPU of this node through NVML.

    :param nvml: the pynvml module (nvidia-ml-py), not yet initialised.
    :param shutdown: call ``nvmlShutdown`` at the end (default ``True``).
    :returns: ``{"init_error": str|None, "driver": {"userspace_version", "nvml_version",
        "cuda_driver_version"}, "gpus": [GPU records], "device_count": int|None,
        "unsupported": [{gpu, field, call, error}]}``. When ``nvmlInit`` fails,
        ``init_error`` names the NVML error (``LibRmVersionMismatch``, ``DriverNotLoaded``,
        ``LibraryNotFound``, ``NoPermission``, ...) and nothing else is read.
    :raises: nothing for NVML errors.

    Sources: nvmlInit, nvmlSystemGetDriverVersion (the userspace library's driver version),
    nvmlSystemGetNVMLVersion, nvmlSystemGetCudaDriverVersion_v2, nvmlDeviceGetCount_v2.
    """
    result = {
        "init_error": None,
        "driver": {"userspace_version": None, "nvml_version": None, "cuda_driver_version": None},
        "gpus": [],
        "device_count": None,
        "unsupported": [],
    }  # type: Dict[str, Any]
    try:
        nvml.nvmlInit()
    except Exception as err:  # pylint: disable=broad-except
        if not is_nvml_error(nvml, err) and not isinstance(err, OSError):
            raise
        result["init_error"] = "LibraryNotFound" if isinstance(err, OSError) else error_name(nvml, err)
        return result
    try:
        system = _FieldReader(nvml, -1, result["unsupported"])
        driver = result["driver"]
        driver["userspace_version"] = _text(system.get("driver.userspace_version", "nvmlSystemGetDriverVersion"))
        driver["nvml_version"] = _text(system.get("driver.nvml_version", "nvmlSystemGetNVMLVersion"))
        driver["cuda_driver_version"] = _cuda_version(_first(
            system, "driver.cuda_driver_version",
            [("nvmlSystemGetCudaDriverVersion_v2", ()), ("nvmlSystemGetCudaDriverVersion", ())]))
        count = system.get("gpu_count", "nvmlDeviceGetCount")
        result["device_count"] = count
        for index in range(count or 0):
            result["gpus"].append(read_gpu(nvml, index, result["unsupported"]))
    except _GpuLost:
        result["unsupported"].append({"gpu": -1, "field": "gpu_count", "call": "nvmlDeviceGetCount",
                                      "error": "GpuIsLost"})
    finally:
        if shutdown:
            try:
                nvml.nvmlShutdown()
            except Exception:  # pylint: disable=broad-except
                pass
    return result


def load_pynvml() -> Optional[Any]:
    """Import and return the ``pynvml`` module (package nvidia-ml-py), or ``None`` when absent.

    The older community package that also installs a ``pynvml`` module (pynvml < 12) is
    accepted too: both expose the same function names.
    """
    try:
        import pynvml  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    return pynvml
