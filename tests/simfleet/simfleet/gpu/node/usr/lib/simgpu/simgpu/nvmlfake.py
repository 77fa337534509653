# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A stand-in for ``libnvidia-ml.so.1`` at the ctypes level, served from the node's state.

The drop-in ``pynvml`` runs the real nvidia-ml-py wrappers unchanged and only swaps the
loaded library for :class:`FakeNvmlLib`. Each C entry point (``nvmlDeviceGetName``,
``nvmlDeviceGetHandleByIndex_v2``, ...) is a method ``c_<symbol>`` here that receives the
same ctypes arguments the real library would (``byref()`` outputs, string buffers, structure
references, opaque handles) and returns an ``nvmlReturn_t`` code. The wrappers then build
their usual return values (``c_nvmlMemory_t``, ``nvmlPciInfo_t``, lists of processes, ...)
and raise the usual ``NVMLError_*`` classes.

Symbols not implemented here answer NOT_SUPPORTED for ``nvmlDevice*``/``nvmlGpuInstance*``/
``nvmlComputeInstance*`` calls (what many real GPUs answer for optional features) and are
missing otherwise (pynvml then raises NVMLError_FunctionNotFound).
"""

from __future__ import annotations

import ctypes
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple

from . import catalog, device as D
from .device import SimError

_MAGIC = 0x7A
_DEV, _MIG, _GI, _CI = 1, 2, 3, 4
_NA_UINT = 0xFFFFFFFF
_EVENT_REASONS_ALL = 0x1FF
_NO_INIT_CHECK = ("nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlErrorString", "nvmlShutdown")


def _encode(kind: int, gpu: int, a: int = 0, b: int = 0) -> int:
    return (_MAGIC << 40) | (kind << 32) | (gpu << 16) | (a << 8) | b


def _decode(value: Optional[int]) -> Optional[Tuple[int, int, int, int]]:
    if not value or (value >> 40) != _MAGIC:
        return None
    return (value >> 32) & 0xFF, (value >> 16) & 0xFFFF, (value >> 8) & 0xFF, value & 0xFF


def _addr(arg: Any) -> Optional[int]:
    if arg is None:
        return None
    if isinstance(arg, int):
        return arg
    try:
        return ctypes.cast(arg, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):
        return None


def _val(arg: Any) -> Any:
    if isinstance(arg, (int, bytes, str)) or arg is None:
        return arg
    if isinstance(arg, ctypes._SimpleCData):
        return arg.value
    return arg


def _out(arg: Any) -> Any:
    """The object an output argument designates (``byref(x)`` -> x, ``pointer(x)`` -> x)."""
    if arg is None:
        return None
    if type(arg).__name__ == "CArgObject":
        return arg._obj
    if isinstance(arg, ctypes._Pointer):
        return arg.contents
    return arg


def _set(arg: Any, value: Any) -> None:
    _out(arg).value = value


def _set_handle(arg: Any, value: int) -> None:
    target = _out(arg)
    ctypes.c_void_p.from_buffer(target).value = value


def _put_str(buf: Any, text: str, length: Any) -> None:
    data = text.encode()
    if length is not None and len(data) + 1 > int(_val(length)):
        raise SimError(D.INSUFFICIENT_SIZE)
    buf.value = data


def _mig_uuid(gpu: Dict[str, Any], gi_id: int, ci_id: int) -> str:
    return "MIG-" + str(uuid.uuid5(uuid.NAMESPACE_OID, "%s/%d/%d" % (gpu["uuid"], gi_id, ci_id)))


class _CFunc:
    """One C entry point: callable like a ctypes function, attributes (restype) assignable."""

    def __init__(self, lib: "FakeNvmlLib", name: str, impl: Any) -> None:
        self.lib = lib
        self.name = name
        self.impl = impl
        self.restype = None
        self.argtypes = None

    def __call__(self, *args: Any) -> Any:
        if self.name not in _NO_INIT_CHECK and self.lib.refcount <= 0:
            return D.UNINITIALIZED
        try:
            result = self.impl(self.lib, *args)
        except SimError as err:
            return err.code
        return D.SUCCESS if result is None else result


def _not_supported(_lib: "FakeNvmlLib", *_args: Any) -> int:
    return D.NOT_SUPPORTED


class FakeNvmlLib:
    """The simulated NVML library; bound to a node root at each nvmlInit."""

    def __init__(self) -> None:
        self.node: Optional[D.Node] = None
        self.refcount = 0
        self._funcs: Dict[str, _CFunc] = {}

    def bind(self, root: Optional[str]) -> None:
        """Serve the node at ``root`` (``SIMGPU_ROOT`` when None)."""
        self.node = D.Node(root)

    def __getattr__(self, name: str) -> _CFunc:
        if name.startswith("_"):
            raise AttributeError(name)
        funcs = self.__dict__.setdefault("_funcs", {})
        if name in funcs:
            return funcs[name]
        impl = getattr(type(self), "c_" + name, None)
        if impl is None:
            if name.startswith(("nvmlDevice", "nvmlGpuInstance", "nvmlComputeInstance")):
                impl = _not_supported
            else:
                raise AttributeError(name)
        func = _CFunc(self, name, impl)
        funcs[name] = func
        return func

    # ------------------------------------------------------------ helpers

    def _state(self) -> Dict[str, Any]:
        assert self.node is not None
        return self.node.state()

    def _gpu(self, handle: Any, field: Optional[str] = None) -> Dict[str, Any]:
        decoded = _decode(_addr(handle))
        if decoded is None or decoded[0] != _DEV:
            raise SimError(D.INVALID_ARGUMENT)
        gpus = self._state()["gpus"]
        index = decoded[1]
        if index >= len(gpus):
            raise SimError(D.INVALID_ARGUMENT)
        gpu = gpus[index]
        if D.bus_state(gpu) != "ok":
            raise SimError(D.GPU_IS_LOST)
        if field is not None:
            D.require(gpu, field)
        return gpu

    def _any(self, handle: Any) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
        """(gpu, mig device or None) for a full-GPU or MIG device handle."""
        decoded = _decode(_addr(handle))
        if decoded is None or decoded[0] not in (_DEV, _MIG):
            raise SimError(D.INVALID_ARGUMENT)
        gpu = self._gpu(_encode(_DEV, decoded[1]))
        if decoded[0] == _DEV:
            return gpu, None
        for mig in D.mig_devices(gpu):
            if mig["gi_id"] == decoded[2] and mig["ci_id"] == decoded[3]:
                return gpu, mig
        raise SimError(D.INVALID_ARGUMENT)

    def _gi(self, handle: Any) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        decoded = _decode(_addr(handle))
        if decoded is None or decoded[0] not in (_GI, _CI):
            raise SimError(D.INVALID_ARGUMENT)
        gpu = self._gpu(_encode(_DEV, decoded[1]))
        return gpu, D.find_gi(gpu, decoded[2])

    def _index_of(self, gpu: Dict[str, Any]) -> int:
        for position, candidate in enumerate(self.node.enumerated(self._state())):  # type: ignore[union-attr]
            if candidate["index"] == gpu["index"]:
                return position
        raise SimError(D.GPU_IS_LOST)

    # ------------------------------------------------------------ init / system

    def c_nvmlInitWithFlags(self, flags: Any = 0) -> None:
        if self.node is None:
            self.bind(None)
        self.node.driver_version()  # type: ignore[union-attr]
        self.refcount += 1

    def c_nvmlInit_v2(self) -> None:
        self.c_nvmlInitWithFlags(0)

    c_nvmlInit = c_nvmlInit_v2

    def c_nvmlShutdown(self) -> int:
        if self.refcount <= 0:
            return D.UNINITIALIZED
        self.refcount -= 1
        return D.SUCCESS

    def c_nvmlErrorString(self, code: Any) -> bytes:
        return D.ERROR_STRING.get(int(_val(code)), "Unknown Error").encode()

    def c_nvmlSystemGetDriverVersion(self, buf: Any, length: Any) -> None:
        _put_str(buf, self.node.driver_version(), length)  # type: ignore[union-attr]

    def c_nvmlSystemGetNVMLVersion(self, buf: Any, length: Any) -> None:
        _put_str(buf, catalog.nvml_version(self.node.driver_version()), length)  # type: ignore[union-attr]

    def c_nvmlSystemGetCudaDriverVersion(self, out: Any) -> None:
        major, minor = catalog.cuda_version(self.node.driver_version())  # type: ignore[union-attr]
        _set(out, major * 1000 + minor * 10)

    c_nvmlSystemGetCudaDriverVersion_v2 = c_nvmlSystemGetCudaDriverVersion

    def c_nvmlSystemGetDriverBranch(self, info: Any, length: Any) -> None:
        branch = catalog.branch_of(self.node.driver_version())  # type: ignore[union-attr]
        _out(info).branch = ("r%d_00" % branch).encode()

    def c_nvmlSystemGetProcessName(self, pid: Any, buf: Any, length: Any) -> None:
        for gpu in self._state()["gpus"]:
            for proc in gpu.get("processes") or []:
                if int(proc["pid"]) == int(_val(pid)):
                    _put_str(buf, proc["name"], length)
                    return
        raise SimError(D.NOT_FOUND)

    # ------------------------------------------------------------ enumeration

    def c_nvmlDeviceGetCount_v2(self, out: Any) -> None:
        _set(out, len(self.node.enumerated(self._state())))  # type: ignore[union-attr]

    c_nvmlDeviceGetCount = c_nvmlDeviceGetCount_v2

    def _handle_for(self, gpu: Dict[str, Any], out: Any) -> None:
        if D.is_lost(gpu):
            raise SimError(D.GPU_IS_LOST)
        _set_handle(out, _encode(_DEV, gpu["index"]))

    def c_nvmlDeviceGetHandleByIndex_v2(self, index: Any, out: Any) -> None:
        gpus = self.node.enumerated(self._state())  # type: ignore[union-attr]
        position = int(_val(index))
        if not 0 <= position < len(gpus):
            raise SimError(D.INVALID_ARGUMENT)
        self._handle_for(gpus[position], out)

    c_nvmlDeviceGetHandleByIndex = c_nvmlDeviceGetHandleByIndex_v2

    def c_nvmlDeviceGetHandleByPciBusId_v2(self, bus_id: Any, out: Any) -> None:
        wanted = _val(bus_id)
        wanted = (wanted.decode() if isinstance(wanted, bytes) else str(wanted)).strip().upper()
        short = wanted.split(":", 1)[1] if wanted.count(":") == 2 else wanted
        for gpu in self.node.enumerated(self._state()):  # type: ignore[union-attr]
            if gpu["pci"]["bus_id"].upper().split(":", 1)[1] == short:
                self._handle_for(gpu, out)
                return
        raise SimError(D.NOT_FOUND)

    c_nvmlDeviceGetHandleByPciBusId = c_nvmlDeviceGetHandleByPciBusId_v2

    def c_nvmlDeviceGetHandleByUUID(self, uuid_arg: Any, out: Any) -> None:
        wanted = _val(uuid_arg)
        wanted = wanted.decode() if isinstance(wanted, bytes) else str(wanted)
        for gpu in self.node.enumerated(self._state()):  # type: ignore[union-attr]
            if gpu["uuid"] == wanted:
                self._handle_for(gpu, out)
                return
            if not D.is_lost(gpu):
                for mig in D.mig_devices(gpu):
                    if _mig_uuid(gpu, mig["gi_id"], mig["ci_id"]) == wanted:
                        _set_handle(out, _encode(_MIG, gpu["index"], mig["gi_id"], mig["ci_id"]))
                        return
        raise SimError(D.NOT_FOUND)

    def c_nvmlDeviceGetHandleBySerial(self, serial: Any, out: Any) -> None:
        wanted = _val(serial)
        wanted = wanted.decode() if isinstance(wanted, bytes) else str(wanted)
        for gpu in self.node.enumerated(self._state()):  # type: ignore[union-attr]
            if gpu["serial"] == wanted:
                self._handle_for(gpu, out)
                return
        raise SimError(D.NOT_FOUND)

    def c_nvmlDeviceGetIndex(self, handle: Any, out: Any) -> None:
        _set(out, self._index_of(self._gpu(handle)))

    def c_nvmlDeviceGetMinorNumber(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle)["minor_number"]))

    # ------------------------------------------------------------ identity

    def c_nvmlDeviceGetUUID(self, handle: Any, buf: Any, length: Any) -> None:
        gpu, mig = self._any(handle)
        _put_str(buf, _mig_uuid(gpu, mig["gi_id"], mig["ci_id"]) if mig else gpu["uuid"], length)

    def c_nvmlDeviceGetName(self, handle: Any, buf: Any, length: Any) -> None:
        gpu, mig = self._any(handle)
        name = gpu["name"] if mig is None else "%s MIG %s" % (gpu["name"], mig["profile"]["name"])
        _put_str(buf, name, length)

    def c_nvmlDeviceGetSerial(self, handle: Any, buf: Any, length: Any) -> None:
        _put_str(buf, self._gpu(handle, "serial")["serial"], length)

    def c_nvmlDeviceGetBrand(self, handle: Any, out: Any) -> None:
        _set(out, 2 if self._gpu(handle)["brand"] == "Tesla" else 14)

    def _fill_pci(self, gpu: Dict[str, Any], info: Any, legacy: bool) -> None:
        pci = gpu["pci"]
        info.domain = int(pci["domain"])
        info.bus = int(pci["bus"])
        info.device = int(pci["device"])
        info.pciDeviceId = int(pci["device_id"])
        info.pciSubSystemId = int(pci["subsystem_id"])
        info.busId = pci["bus_id"].encode()
        if legacy:
            info.busIdLegacy = pci["bus_id"][4:].encode()

    def c_nvmlDeviceGetPciInfo_v3(self, handle: Any, info: Any) -> None:
        self._fill_pci(self._gpu(handle), _out(info), legacy=True)

    c_nvmlDeviceGetPciInfo_v2 = c_nvmlDeviceGetPciInfo_v3

    def c_nvmlDeviceGetPciInfoExt(self, handle: Any, info: Any) -> None:
        gpu = self._gpu(handle)
        target = _out(info)
        self._fill_pci(gpu, target, legacy=False)
        target.baseClass = 3
        target.subClass = 2

    def c_nvmlDeviceGetArchitecture(self, handle: Any, out: Any) -> None:
        arch = self._gpu(handle)["architecture"]
        _set(out, int(catalog.ARCHITECTURES.get(arch, {}).get("nvml", 0xFFFFFFFF)))  # type: ignore[arg-type]

    def c_nvmlDeviceGetCudaComputeCapability(self, handle: Any, major: Any, minor: Any) -> None:
        cc = self._gpu(handle)["cuda_cc"]
        _set(major, int(cc[0]))
        _set(minor, int(cc[1]))

    def c_nvmlDeviceGetVbiosVersion(self, handle: Any, buf: Any, length: Any) -> None:
        _put_str(buf, self._gpu(handle, "vbios_version")["vbios_version"], length)

    def c_nvmlDeviceGetGspFirmwareVersion(self, handle: Any, buf: Any) -> None:
        # GSP firmware ships with the driver from Turing on and carries the driver's version
        # (nvidia-smi -q: "GSP Firmware Version : 580.95.05"); Volta and older have none.
        gpu = self._gpu(handle, "gsp_firmware_version")
        if gpu["architecture"] in ("Kepler", "Maxwell", "Pascal", "Volta"):
            raise SimError(D.NOT_SUPPORTED)
        _put_str(buf, gpu.get("gsp_firmware_version") or self.node.driver_version(), 64)  # type: ignore[union-attr]

    def c_nvmlDeviceGetFieldValues(self, handle: Any, count: Any, values: Any) -> None:
        # Only NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (230) is served; every other field is NotSupported.
        gpu = self._gpu(handle)
        array = _out(values)
        for slot in range(int(_val(count))):
            entry = array[slot]
            if int(entry.fieldId) == 230:
                entry.nvmlReturn = 0
                entry.valueType = 1  # NVML_VALUE_TYPE_UNSIGNED_INT
                entry.value.uiVal = int(gpu.get("recovery_action", 0))
            else:
                entry.nvmlReturn = D.NOT_SUPPORTED

    def c_nvmlDeviceGetBoardPartNumber(self, handle: Any, buf: Any, length: Any) -> None:
        _put_str(buf, self._gpu(handle)["board_part_number"], length)

    def c_nvmlDeviceGetInforomImageVersion(self, handle: Any, buf: Any, length: Any) -> None:
        _put_str(buf, self._gpu(handle)["inforom_image"], length)

    def c_nvmlDeviceGetModuleId(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle).get("module_id") or 0))

    def c_nvmlDeviceGetDisplayMode(self, handle: Any, out: Any) -> None:
        self._gpu(handle)
        _set(out, 0)

    c_nvmlDeviceGetDisplayActive = c_nvmlDeviceGetDisplayMode

    # ------------------------------------------------------------ modes and power

    def c_nvmlDeviceGetPersistenceMode(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "persistence_mode")["persistence_mode"]))

    def c_nvmlDeviceGetComputeMode(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "compute_mode")["compute_mode"]))

    def c_nvmlDeviceGetPowerManagementMode(self, handle: Any, out: Any) -> None:
        self._gpu(handle, "power_limit")
        _set(out, 1)

    def c_nvmlDeviceGetPowerManagementLimit(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "power_limit")["power"]["limit_mw"]))

    def c_nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "power_limit")["power"]["default_mw"]))

    def c_nvmlDeviceGetEnforcedPowerLimit(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "power_limit")["power"]["limit_mw"]))

    def c_nvmlDeviceGetPowerManagementLimitConstraints(self, handle: Any, low: Any, high: Any) -> None:
        power = self._gpu(handle, "power_limit")["power"]
        _set(low, int(power["min_mw"]))
        _set(high, int(power["max_mw"]))

    def c_nvmlDeviceGetPowerUsage(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "power_usage")["power"]["draw_mw"]))

    def c_nvmlDeviceGetTotalEnergyConsumption(self, handle: Any, out: Any) -> None:
        gpu = self._gpu(handle, "power_usage")
        since = float((self._state().get("boot") or {}).get("time") or time.time())
        _set(out, int(max(0.0, time.time() - since) * int(gpu["power"]["draw_mw"])))

    def c_nvmlDeviceGetPerformanceState(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "performance_state").get("performance_state", 0)))

    c_nvmlDeviceGetPowerState = c_nvmlDeviceGetPerformanceState

    def c_nvmlDeviceSetPowerManagementLimit(self, handle: Any, limit: Any) -> None:
        D.set_power_limit(self.node, self._gpu(handle)["index"], int(_val(limit)))  # type: ignore[arg-type]

    def c_nvmlDeviceSetPersistenceMode(self, handle: Any, mode: Any) -> None:
        D.set_persistence_mode(self.node, self._gpu(handle)["index"], int(_val(mode)))  # type: ignore[arg-type]

    def c_nvmlDeviceSetComputeMode(self, handle: Any, mode: Any) -> None:
        D.set_compute_mode(self.node, self._gpu(handle)["index"], int(_val(mode)))  # type: ignore[arg-type]

    def c_nvmlDeviceSetEccMode(self, handle: Any, mode: Any) -> None:
        D.set_ecc_mode(self.node, self._gpu(handle)["index"], int(_val(mode)))  # type: ignore[arg-type]

    def c_nvmlDeviceSetMigMode(self, handle: Any, mode: Any, status: Any) -> None:
        result = D.set_mig_mode(self.node, self._gpu(handle)["index"], int(_val(mode)))  # type: ignore[arg-type]
        _set(status, int(result))

    # ------------------------------------------------------------ ECC and memory health

    def c_nvmlDeviceGetEccMode(self, handle: Any, current: Any, pending: Any) -> None:
        ecc = self._gpu(handle, "ecc_mode")["ecc"]
        _set(current, int(ecc["current"]))
        _set(pending, int(ecc["pending"]))

    def _ecc_count(self, handle: Any, error_type: Any, counter_type: Any) -> int:
        ecc = self._gpu(handle, "ecc_errors")["ecc"]
        if not int(ecc["current"]):
            raise SimError(D.NOT_SUPPORTED)
        kind = "uncorrected" if int(_val(error_type)) == 1 else "corrected"
        counter = "aggregate" if int(_val(counter_type)) == 1 else "volatile"
        return int(ecc[counter][kind])

    def c_nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: Any, counter_type: Any, out: Any) -> None:
        _set(out, self._ecc_count(handle, error_type, counter_type))

    def c_nvmlDeviceGetMemoryErrorCounter(self, handle: Any, error_type: Any, counter_type: Any,
                                          location: Any, out: Any) -> None:
        count = self._ecc_count(handle, error_type, counter_type)
        _set(out, count if int(_val(location)) == 1 else 0)

    def c_nvmlDeviceGetRemappedRows(self, handle: Any, corr: Any, unc: Any, pending: Any, failure: Any) -> None:
        rows = self._gpu(handle, "remapped_rows")["remapped_rows"]
        _set(corr, int(rows["correctable"]))
        _set(unc, int(rows["uncorrectable"]))
        _set(pending, 1 if rows["pending"] else 0)
        _set(failure, 1 if rows["failure"] else 0)

    def _pages(self, handle: Any, cause: Any) -> List[int]:
        pages = self._gpu(handle, "retired_pages")["retired_pages"]
        key = "double_bit" if int(_val(cause)) == 1 else "single_bit"
        return [int(p) for p in pages.get(key) or []]

    def c_nvmlDeviceGetRetiredPages(self, handle: Any, cause: Any, count: Any, pages: Any) -> int:
        found = self._pages(handle, cause)
        counter = _out(count)
        if pages is None:
            counter.value = len(found)
            return D.INSUFFICIENT_SIZE if found else D.SUCCESS
        if counter.value < len(found):
            counter.value = len(found)
            return D.INSUFFICIENT_SIZE
        for i, address in enumerate(found):
            pages[i] = address
        counter.value = len(found)
        return D.SUCCESS

    def c_nvmlDeviceGetRetiredPages_v2(self, handle: Any, cause: Any, count: Any, pages: Any,
                                       times: Any = None) -> int:
        ret = self.c_nvmlDeviceGetRetiredPages(handle, cause, count, pages)
        if pages is not None and times is not None and ret == D.SUCCESS:
            stamp = int((self._state().get("boot") or {}).get("time") or 0)
            for i in range(_out(count).value):
                times[i] = stamp
        return ret

    def c_nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any, out: Any) -> None:
        _set(out, 1 if self._gpu(handle, "retired_pages")["retired_pages"].get("pending") else 0)

    # ------------------------------------------------------------ MIG queries

    def c_nvmlDeviceGetMigMode(self, handle: Any, current: Any, pending: Any) -> None:
        mig = self._gpu(handle, "mig_mode")["mig"]
        _set(current, int(mig["current"]))
        _set(pending, int(mig["pending"]))

    def c_nvmlDeviceGetMaxMigDeviceCount(self, handle: Any, out: Any) -> None:
        self._gpu(handle, "mig_mode")
        _set(out, 7)

    def c_nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: Any, out: Any) -> None:
        gpu = self._gpu(handle, "mig_mode")
        migs = D.mig_devices(gpu)
        position = int(_val(index))
        if not 0 <= position < len(migs):
            raise SimError(D.NOT_FOUND)
        _set_handle(out, _encode(_MIG, gpu["index"], migs[position]["gi_id"], migs[position]["ci_id"]))

    def c_nvmlDeviceIsMigDeviceHandle(self, handle: Any, out: Any) -> None:
        _gpu, mig = self._any(handle)
        _set(out, 1 if mig else 0)

    def c_nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: Any, out: Any) -> None:
        gpu, mig = self._any(handle)
        if mig is None:
            raise SimError(D.INVALID_ARGUMENT)
        _set_handle(out, _encode(_DEV, gpu["index"]))

    def c_nvmlDeviceGetGpuInstanceId(self, handle: Any, out: Any) -> None:
        _gpu, mig = self._any(handle)
        if mig is None:
            raise SimError(D.NOT_SUPPORTED)
        _set(out, int(mig["gi_id"]))

    def c_nvmlDeviceGetComputeInstanceId(self, handle: Any, out: Any) -> None:
        _gpu, mig = self._any(handle)
        if mig is None:
            raise SimError(D.NOT_SUPPORTED)
        _set(out, int(mig["ci_id"]))

    def c_nvmlDeviceGetAttributes_v2(self, handle: Any, out: Any) -> None:
        _gpu, mig = self._any(handle)
        if mig is None:
            raise SimError(D.NOT_SUPPORTED)
        attrs = _out(out)
        attrs.multiprocessorCount = mig["sm"]
        attrs.sharedCopyEngineCount = mig["ce"]
        attrs.sharedDecoderCount = mig["dec"]
        attrs.sharedEncoderCount = mig["enc"]
        attrs.sharedJpegCount = mig["jpeg"]
        attrs.sharedOfaCount = mig["ofa"]
        attrs.gpuInstanceSliceCount = int(mig["profile"]["slices"])
        attrs.computeInstanceSliceCount = int(mig["slices"])
        attrs.memorySizeMB = int(mig["memory_mib"])

    # ------------------------------------------------------------ memory, clocks, sensors

    def _memory(self, handle: Any) -> Tuple[int, int, int]:
        gpu, mig = self._any(handle)
        D.require(gpu, "memory")
        mib = 1024 * 1024
        if mig is not None:
            return mig["memory_mib"] * mib, 0, 0
        mem = gpu["memory"]
        return int(mem["total_mib"]) * mib, int(mem["reserved_mib"]) * mib, int(mem["used_mib"]) * mib

    def c_nvmlDeviceGetMemoryInfo(self, handle: Any, out: Any) -> None:
        total, reserved, used = self._memory(handle)
        info = _out(out)
        info.total = total
        info.used = used + reserved
        info.free = total - used - reserved

    def c_nvmlDeviceGetMemoryInfo_v2(self, handle: Any, out: Any) -> None:
        total, reserved, used = self._memory(handle)
        info = _out(out)
        info.total = total
        info.reserved = reserved
        info.used = used
        info.free = total - used - reserved

    def c_nvmlDeviceGetBAR1MemoryInfo(self, handle: Any, out: Any) -> None:
        gpu = self._gpu(handle, "memory")
        info = _out(out)
        total = int(gpu["memory"]["bar1_total_mib"]) * 1024 * 1024
        info.bar1Total = total
        info.bar1Used = 1024 * 1024
        info.bar1Free = total - 1024 * 1024

    _CLOCK_KEYS = {0: "graphics", 1: "sm", 2: "mem", 3: "video"}

    def _clock(self, handle: Any, clock_type: Any, prefix: str) -> int:
        gpu = self._gpu(handle, "clocks")
        key = self._CLOCK_KEYS.get(int(_val(clock_type)))
        if key is None:
            raise SimError(D.INVALID_ARGUMENT)
        value = gpu["clocks"].get(prefix + key)
        if value is None:
            raise SimError(D.NOT_SUPPORTED)
        return int(value)

    def c_nvmlDeviceGetClockInfo(self, handle: Any, clock_type: Any, out: Any) -> None:
        _set(out, self._clock(handle, clock_type, ""))

    def c_nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: Any, out: Any) -> None:
        _set(out, self._clock(handle, clock_type, "max_"))

    def c_nvmlDeviceGetApplicationsClock(self, handle: Any, clock_type: Any, out: Any) -> None:
        _set(out, self._clock(handle, clock_type, "app_"))

    c_nvmlDeviceGetDefaultApplicationsClock = c_nvmlDeviceGetApplicationsClock

    def c_nvmlDeviceGetClock(self, handle: Any, clock_type: Any, clock_id: Any, out: Any) -> None:
        prefix = {0: "", 1: "app_", 2: "app_", 3: "max_"}.get(int(_val(clock_id)))
        if prefix is None:
            raise SimError(D.INVALID_ARGUMENT)
        _set(out, self._clock(handle, clock_type, prefix))

    def c_nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "clocks_event_reasons").get("clocks_event_reasons", 0)))

    c_nvmlDeviceGetCurrentClocksThrottleReasons = c_nvmlDeviceGetCurrentClocksEventReasons

    def c_nvmlDeviceGetSupportedClocksEventReasons(self, handle: Any, out: Any) -> None:
        self._gpu(handle, "clocks_event_reasons")
        _set(out, _EVENT_REASONS_ALL)

    c_nvmlDeviceGetSupportedClocksThrottleReasons = c_nvmlDeviceGetSupportedClocksEventReasons

    def c_nvmlDeviceGetTemperature(self, handle: Any, sensor: Any, out: Any) -> None:
        gpu = self._gpu(handle, "temperature")
        if int(_val(sensor)) != 0:
            raise SimError(D.INVALID_ARGUMENT)
        _set(out, int(gpu["temperature"]["gpu"]))

    def c_nvmlDeviceGetTemperatureV(self, handle: Any, info: Any) -> None:
        gpu = self._gpu(handle, "temperature")
        target = _out(info)
        if int(target.sensorType) != 0:
            raise SimError(D.INVALID_ARGUMENT)
        target.temperature = int(gpu["temperature"]["gpu"])

    _THRESHOLD_KEYS = {0: "shutdown", 1: "slowdown", 2: "max_mem", 3: "max_gpu"}

    def c_nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: Any, out: Any) -> None:
        gpu = self._gpu(handle, "temperature")
        key = self._THRESHOLD_KEYS.get(int(_val(threshold)))
        value = gpu["temperature"].get(key) if key else None
        if value is None:
            raise SimError(D.NOT_SUPPORTED)
        _set(out, int(value))

    def c_nvmlDeviceGetFanSpeed(self, handle: Any, out: Any) -> None:
        _set(out, int(self._gpu(handle, "fan_speed")["fan_percent"]))

    def c_nvmlDeviceGetUtilizationRates(self, handle: Any, out: Any) -> None:
        util = self._gpu(handle, "utilization")["utilization"]
        target = _out(out)
        target.gpu = int(util["gpu"])
        target.memory = int(util["memory"])

    # ------------------------------------------------------------ PCIe

    def _pcie(self, handle: Any, key: str) -> int:
        return int(self._gpu(handle, "pcie")["pcie"][key])

    def c_nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any, out: Any) -> None:
        _set(out, self._pcie(handle, "gen_current"))

    def c_nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any, out: Any) -> None:
        _set(out, self._pcie(handle, "width_current"))

    def c_nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any, out: Any) -> None:
        _set(out, self._pcie(handle, "gen_max"))

    def c_nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any, out: Any) -> None:
        _set(out, self._pcie(handle, "width_max"))

    def c_nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle: Any, out: Any) -> None:
        _set(out, self._pcie(handle, "gen_gpu_max"))

    def c_nvmlDeviceGetPcieReplayCounter(self, handle: Any, out: Any) -> None:
        _set(out, self._pcie(handle, "replay_counter"))

    # ------------------------------------------------------------ processes

    def _procs(self, handle: Any, count: Any, procs: Any, entries: List[Dict[str, Any]]) -> int:
        counter = _out(count)
        if not entries:
            counter.value = 0
            return D.SUCCESS
        if procs is None or counter.value < len(entries):
            counter.value = len(entries)
            return D.INSUFFICIENT_SIZE
        for i, proc in enumerate(entries):
            procs[i].pid = int(proc["pid"])
            procs[i].usedGpuMemory = int(proc.get("used_mib") or 0) * 1024 * 1024
            gi = proc.get("gpu_instance_id")
            ci = proc.get("compute_instance_id")
            procs[i].gpuInstanceId = _NA_UINT if gi is None else int(gi)
            procs[i].computeInstanceId = _NA_UINT if ci is None else int(ci)
        counter.value = len(entries)
        return D.SUCCESS

    def c_nvmlDeviceGetComputeRunningProcesses_v3(self, handle: Any, count: Any, procs: Any) -> int:
        gpu = self._gpu(handle, "processes")
        return self._procs(handle, count, procs, list(gpu.get("processes") or []))

    c_nvmlDeviceGetComputeRunningProcesses_v2 = c_nvmlDeviceGetComputeRunningProcesses_v3
    c_nvmlDeviceGetComputeRunningProcesses = c_nvmlDeviceGetComputeRunningProcesses_v3

    def c_nvmlDeviceGetGraphicsRunningProcesses_v3(self, handle: Any, count: Any, procs: Any) -> int:
        self._gpu(handle, "processes")
        return self._procs(handle, count, procs, [])

    c_nvmlDeviceGetGraphicsRunningProcesses_v2 = c_nvmlDeviceGetGraphicsRunningProcesses_v3
    c_nvmlDeviceGetMPSComputeRunningProcesses_v3 = c_nvmlDeviceGetGraphicsRunningProcesses_v3
    c_nvmlDeviceGetMPSComputeRunningProcesses_v2 = c_nvmlDeviceGetGraphicsRunningProcesses_v3

    # ------------------------------------------------------------ MIG management

    def _profile(self, gpu: Dict[str, Any], profile: Any) -> Dict[str, Any]:
        D.require(gpu, "mig_mode")
        found = D.gi_profile(gpu, int(_val(profile)))
        if found is None:
            raise SimError(D.NOT_SUPPORTED)
        return found

    def _fill_gi_profile(self, gpu: Dict[str, Any], profile_arg: Any, out: Any, named: bool) -> None:
        profile = self._profile(gpu, profile_arg)
        info = _out(out)
        info.id = int(profile["id"])
        info.isP2pSupported = 0
        info.sliceCount = int(profile["slices"])
        info.instanceCount = int(profile["max_count"])
        info.multiprocessorCount = int(profile["sm"])
        info.copyEngineCount = int(profile["ce"])
        info.decoderCount = int(profile["dec"])
        info.encoderCount = int(profile["enc"])
        info.jpegCount = int(profile["jpeg"])
        info.ofaCount = int(profile["ofa"])
        info.memorySizeMB = int(profile["memory_mib"])
        if named:
            info.name = ("MIG " + profile["name"]).encode()

    def c_nvmlDeviceGetGpuInstanceProfileInfo(self, handle: Any, profile: Any, out: Any) -> None:
        self._fill_gi_profile(self._gpu(handle), profile, out, named=False)

    def c_nvmlDeviceGetGpuInstanceProfileInfoV(self, handle: Any, profile: Any, out: Any) -> None:
        self._fill_gi_profile(self._gpu(handle), profile, out, named=True)

    def c_nvmlDeviceGetGpuInstanceRemainingCapacity(self, handle: Any, profile_id: Any, out: Any) -> None:
        gpu = self._gpu(handle, "mig_mode")
        profile = D.gi_profile_by_id(gpu, int(_val(profile_id)))
        if profile is None:
            raise SimError(D.INVALID_ARGUMENT)
        _set(out, D.gi_remaining_capacity(gpu, profile))

    def c_nvmlDeviceCreateGpuInstance(self, handle: Any, profile_id: Any, out: Any) -> None:
        gpu = self._gpu(handle, "mig_mode")
        profile = D.gi_profile_by_id(gpu, int(_val(profile_id)))
        if profile is None:
            raise SimError(D.INVALID_ARGUMENT)
        gi_id = D.create_gpu_instance(self.node, gpu["index"], profile["nvml_profile"])  # type: ignore[arg-type]
        _set_handle(out, _encode(_GI, gpu["index"], gi_id))

    def c_nvmlDeviceGetGpuInstances(self, handle: Any, profile_id: Any, instances: Any, count: Any) -> None:
        gpu = self._gpu(handle, "mig_mode")
        found = [inst for inst in gpu["mig"]["instances"] if int(inst["profile_id"]) == int(_val(profile_id))]
        for i, inst in enumerate(found):
            instances[i] = ctypes.cast(ctypes.c_void_p(_encode(_GI, gpu["index"], inst["id"])), instances._type_)
        _out(count).value = len(found)

    def c_nvmlDeviceGetGpuInstanceById(self, handle: Any, gi_id: Any, out: Any) -> None:
        gpu = self._gpu(handle, "mig_mode")
        inst = D.find_gi(gpu, int(_val(gi_id)))
        _set_handle(out, _encode(_GI, gpu["index"], inst["id"]))

    def c_nvmlGpuInstanceGetInfo(self, gi_handle: Any, out: Any) -> None:
        gpu, inst = self._gi(gi_handle)
        info = _out(out)
        ctypes.c_void_p.from_buffer(info, type(info).device.offset).value = _encode(_DEV, gpu["index"])
        info.id = int(inst["id"])
        info.profileId = int(inst["profile_id"])
        info.placement.start = int(inst["placement"]["start"])
        info.placement.size = int(inst["placement"]["size"])

    def c_nvmlGpuInstanceDestroy(self, gi_handle: Any) -> None:
        gpu, inst = self._gi(gi_handle)
        D.destroy_gpu_instance(self.node, gpu["index"], inst["id"])  # type: ignore[arg-type]

    def _fill_ci_profile(self, gi_handle: Any, profile: Any, out: Any, named: bool) -> None:
        gpu, inst = self._gi(gi_handle)
        slices = D.CI_PROFILE_SLICES.get(int(_val(profile)))
        gi_prof = D.gi_profile(gpu, inst["profile"]) or {}
        if slices is None or slices > int(gi_prof.get("slices", 0)):
            raise SimError(D.NOT_SUPPORTED)
        share = float(slices) / max(1, int(gi_prof["slices"]))
        info = _out(out)
        info.id = int(_val(profile))
        info.sliceCount = slices
        info.instanceCount = int(gi_prof["slices"]) // slices
        info.multiprocessorCount = int(round(int(gi_prof["sm"]) * share))
        info.sharedCopyEngineCount = int(gi_prof["ce"])
        info.sharedDecoderCount = int(gi_prof["dec"])
        info.sharedEncoderCount = int(gi_prof["enc"])
        info.sharedJpegCount = int(gi_prof["jpeg"])
        info.sharedOfaCount = int(gi_prof["ofa"])
        if named:
            name = gi_prof["name"] if slices == int(gi_prof["slices"]) else "%dc.%s" % (slices, gi_prof["name"])
            info.name = ("MIG " + name).encode()

    def c_nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gi_handle: Any, profile: Any, _eng: Any, out: Any) -> None:
        self._fill_ci_profile(gi_handle, profile, out, named=False)

    def c_nvmlGpuInstanceGetComputeInstanceProfileInfoV(self, gi_handle: Any, profile: Any, _eng: Any, out: Any) -> None:
        self._fill_ci_profile(gi_handle, profile, out, named=True)

    def c_nvmlGpuInstanceGetComputeInstanceRemainingCapacity(self, gi_handle: Any, profile: Any, out: Any) -> None:
        gpu, inst = self._gi(gi_handle)
        slices = D.CI_PROFILE_SLICES.get(int(_val(profile)))
        if slices is None:
            raise SimError(D.INVALID_ARGUMENT)
        _set(out, D.ci_slices_left(gpu, inst) // slices)

    def c_nvmlGpuInstanceCreateComputeInstance(self, gi_handle: Any, profile: Any, out: Any) -> None:
        gpu, inst = self._gi(gi_handle)
        ci_id = D.create_compute_instance(self.node, gpu["index"], inst["id"], int(_val(profile)))  # type: ignore[arg-type]
        _set_handle(out, _encode(_CI, gpu["index"], inst["id"], ci_id))

    def c_nvmlGpuInstanceGetComputeInstances(self, gi_handle: Any, profile: Any, instances: Any, count: Any) -> None:
        gpu, inst = self._gi(gi_handle)
        found = [ci for ci in inst["compute_instances"] if int(ci["profile"]) == int(_val(profile))]
        for i, ci in enumerate(found):
            instances[i] = ctypes.cast(ctypes.c_void_p(_encode(_CI, gpu["index"], inst["id"], ci["id"])),
                                       instances._type_)
        _out(count).value = len(found)

    def c_nvmlGpuInstanceGetComputeInstanceById(self, gi_handle: Any, ci_id: Any, out: Any) -> None:
        gpu, inst = self._gi(gi_handle)
        for ci in inst["compute_instances"]:
            if int(ci["id"]) == int(_val(ci_id)):
                _set_handle(out, _encode(_CI, gpu["index"], inst["id"], ci["id"]))
                return
        raise SimError(D.NOT_FOUND)

    def _ci(self, ci_handle: Any) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
        decoded = _decode(_addr(ci_handle))
        if decoded is None or decoded[0] != _CI:
            raise SimError(D.INVALID_ARGUMENT)
        gpu, inst = self._gi(ci_handle)
        for ci in inst["compute_instances"]:
            if int(ci["id"]) == decoded[3]:
                return gpu, inst, ci
        raise SimError(D.NOT_FOUND)

    def c_nvmlComputeInstanceGetInfo_v2(self, ci_handle: Any, out: Any) -> None:
        gpu, inst, ci = self._ci(ci_handle)
        info = _out(out)
        cls = type(info)
        ctypes.c_void_p.from_buffer(info, cls.device.offset).value = _encode(_DEV, gpu["index"])
        ctypes.c_void_p.from_buffer(info, cls.gpuInstance.offset).value = _encode(_GI, gpu["index"], inst["id"])
        info.id = int(ci["id"])
        info.profileId = int(ci["profile"])
        info.placement.start = int(ci["placement"]["start"])
        info.placement.size = int(ci["placement"]["size"])

    c_nvmlComputeInstanceGetInfo = c_nvmlComputeInstanceGetInfo_v2

    def c_nvmlComputeInstanceDestroy(self, ci_handle: Any) -> None:
        gpu, inst, ci = self._ci(ci_handle)
        D.destroy_compute_instance(self.node, gpu["index"], inst["id"], ci["id"])  # type: ignore[arg-type]
