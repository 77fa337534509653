# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drop-in pynvml: real nvidia-ml-py wrappers over the simulated node, and the boot rules."""

import pynvml as real_pynvml
import pytest

from simfleet.gpu.faults import apply_fault
from simfleet.gpu.state import initial_state


def test_identity_and_structures_come_from_the_real_package(make_node, nvml):
    make_node("h100")
    nvml.nvmlInit()
    assert nvml.nvmlSystemGetDriverVersion() == "580.126.20"
    assert nvml.nvmlSystemGetCudaDriverVersion() == 13000
    assert nvml.nvmlSystemGetNVMLVersion() == "13.580.126.20"
    assert nvml.nvmlDeviceGetCount() == 8
    handle = nvml.nvmlDeviceGetHandleByIndex(3)
    assert nvml.nvmlDeviceGetName(handle) == "NVIDIA H100 80GB HBM3"
    pci = nvml.nvmlDeviceGetPciInfo(handle)
    assert pci.__class__ is real_pynvml.nvmlPciInfo_t
    assert pci.busId == "00000000:5D:00.0"
    assert pci.pciDeviceId == 0x233010DE
    memory = nvml.nvmlDeviceGetMemoryInfo(handle)
    assert memory.__class__ is real_pynvml.c_nvmlMemory_t
    assert memory.total == 81559 * 1024 * 1024
    assert nvml.nvmlDeviceGetArchitecture(handle) == real_pynvml.NVML_DEVICE_ARCH_HOPPER
    assert nvml.nvmlDeviceGetPowerManagementLimitConstraints(handle) == [200000, 700000]
    assert nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle) == 700000
    assert nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle) == 5
    assert nvml.nvmlDeviceGetMaxPcieLinkWidth(handle) == 16
    assert nvml.nvmlDeviceGetCurrentClocksEventReasons(handle) == real_pynvml.nvmlClocksEventReasonGpuIdle
    assert nvml.nvmlDeviceGetCurrentClocksThrottleReasons(handle) == real_pynvml.nvmlClocksEventReasonGpuIdle
    assert nvml.nvmlDeviceGetMaxClockInfo(handle, real_pynvml.NVML_CLOCK_SM) == 1980
    assert nvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    by_bus = nvml.nvmlDeviceGetHandleByPciBusId("0000:5d:00.0")
    assert nvml.nvmlDeviceGetUUID(by_bus) == nvml.nvmlDeviceGetUUID(handle)
    nvml.nvmlShutdown()


def test_not_supported_field_raises_the_real_class(make_node, nvml):
    state = apply_fault(initial_state("h100", "n1"), "nvml_not_supported", {"field": "power_limit", "gpu": 2})
    make_node("h100", state=state)
    nvml.nvmlInit()
    with pytest.raises(real_pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(2))
    assert nvml.nvmlDeviceGetPowerManagementLimit(nvml.nvmlDeviceGetHandleByIndex(1)) == 700000
    # A100/H100 retire no pages (row remapping instead): NotSupported, as on the real boards.
    with pytest.raises(real_pynvml.NVMLError_NotSupported):
        nvml.nvmlDeviceGetRetiredPages(nvml.nvmlDeviceGetHandleByIndex(0), 0)


@pytest.mark.parametrize("loaded, userspace, loaded_version, error", [
    (False, "580.126.20", None, real_pynvml.NVMLError_DriverNotLoaded),
    (True, None, "580.126.20", real_pynvml.NVMLError_LibraryNotFound),
    (True, "580.126.20", "580.105.08", real_pynvml.NVMLError_LibRmVersionMismatch),
])
def test_init_failures(tmp_path, monkeypatch, nvml, loaded, userspace, loaded_version, error):
    from simfleet.gpu.state import write_node_root

    root = str(tmp_path / "root")
    write_node_root(root, initial_state("a100", "n1"), loaded=loaded, userspace_version=userspace,
                    module_version="580.126.20", loaded_version=loaded_version, kernel_release="6.1.0-31-amd64")
    monkeypatch.setenv("SIMGPU_ROOT", root)
    with pytest.raises(error):
        nvml.nvmlInit()


def test_version_mismatch_fault_takes_effect_at_next_boot(make_node, nvml):
    node = make_node("a100", version="580.126.20")
    nvml.nvmlInit()
    nvml.nvmlShutdown()
    state = apply_fault(node.state(), "version_mismatch", {})
    from simfleet.gpu.state import save_state

    save_state(node.state_path, state)
    result = node.boot()
    assert result["loaded"]["version"] == "580.125.20"
    with pytest.raises(real_pynvml.NVMLError_LibRmVersionMismatch):
        nvml.nvmlInit()
    code, out, _err = node.smi("-q", "-x")
    assert code == 18
    assert out == "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: 580.126\n"


def test_pending_ecc_applied_at_boot(make_node, nvml):
    node = make_node("h100")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetEccMode(handle, 0)
    assert nvml.nvmlDeviceGetEccMode(handle) == [1, 0]
    nvml.nvmlShutdown()
    node.boot()
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetEccMode(nvml.nvmlDeviceGetHandleByIndex(0)) == [0, 0]
    assert nvml.nvmlDeviceGetEccMode(nvml.nvmlDeviceGetHandleByIndex(1)) == [1, 1]


def test_power_limit_bounded_and_back_to_default_at_boot(make_node, nvml):
    node = make_node("h100")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(4)
    with pytest.raises(real_pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetPowerManagementLimit(handle, 150000)
    with pytest.raises(real_pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceSetPowerManagementLimit(handle, 701000)
    nvml.nvmlDeviceSetPowerManagementLimit(handle, 500000)
    nvml.nvmlDeviceSetPersistenceMode(handle, 1)
    nvml.nvmlDeviceSetComputeMode(handle, real_pynvml.NVML_COMPUTEMODE_EXCLUSIVE_PROCESS)
    assert nvml.nvmlDeviceGetPowerManagementLimit(handle) == 500000
    assert nvml.nvmlDeviceGetEnforcedPowerLimit(handle) == 500000
    nvml.nvmlShutdown()
    node.boot()
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(4)
    assert nvml.nvmlDeviceGetPowerManagementLimit(handle) == 700000
    assert nvml.nvmlDeviceGetPersistenceMode(handle) == 0
    assert nvml.nvmlDeviceGetComputeMode(handle) == real_pynvml.NVML_COMPUTEMODE_DEFAULT


def test_setters_need_root(make_node, nvml, monkeypatch):
    make_node("h100")
    monkeypatch.setenv("SIMGPU_FAKE_UID", "1000")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(real_pynvml.NVMLError_NoPermission):
        nvml.nvmlDeviceSetPowerManagementLimit(handle, 500000)
    assert nvml.nvmlDeviceGetPowerManagementLimit(handle) == 700000


def test_mig_mode_pending_until_reset_and_in_use_with_processes(make_node, nvml):
    from simfleet.gpu.faults import apply_fault_to_file

    node = make_node("a100")
    apply_fault_to_file(node.state_path, "gpu_busy", {"gpu": 1})  # processes end at boot: after it
    nvml.nvmlInit()
    busy = nvml.nvmlDeviceGetHandleByIndex(1)
    with pytest.raises(real_pynvml.NVMLError_InUse):
        nvml.nvmlDeviceSetMigMode(busy, real_pynvml.NVML_DEVICE_MIG_ENABLE)
    idle = nvml.nvmlDeviceGetHandleByIndex(0)
    assert nvml.nvmlDeviceSetMigMode(idle, 1) == real_pynvml.NVML_ERROR_RESET_REQUIRED
    assert nvml.nvmlDeviceGetMigMode(idle) == [0, 1]
    code, out, _err = node.smi("-i", "0", "-r")
    assert code == 0
    assert "GPU 00000000:07:00.0 was successfully reset." in out
    assert nvml.nvmlDeviceGetMigMode(idle) == [1, 1]
    code, out, _err = node.smi("-i", "1", "-r")
    assert code == 255
    assert "  GPU 00000000:0F:00.0: In use by another client" in out


def test_mig_instances(make_node, nvml):
    node = make_node("h100")
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    nvml.nvmlDeviceSetMigMode(handle, 1)
    node.smi("-i", "0", "-r")
    info = nvml.nvmlDeviceGetGpuInstanceProfileInfo(handle, real_pynvml.NVML_GPU_INSTANCE_PROFILE_3_SLICE)
    assert (info.id, info.instanceCount, info.multiprocessorCount, info.name) == (9, 2, 60, "MIG 3g.40gb")
    gpu_instance = nvml.nvmlDeviceCreateGpuInstance(handle, info.id)
    ci_info = nvml.nvmlGpuInstanceGetComputeInstanceProfileInfo(
        gpu_instance, real_pynvml.NVML_COMPUTE_INSTANCE_PROFILE_3_SLICE,
        real_pynvml.NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
    compute_instance = nvml.nvmlGpuInstanceCreateComputeInstance(gpu_instance, ci_info.id)
    mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)
    assert nvml.nvmlDeviceGetGpuInstanceId(mig) == nvml.nvmlGpuInstanceGetInfo(gpu_instance).id
    assert nvml.nvmlDeviceGetComputeInstanceId(mig) == 0
    assert nvml.nvmlDeviceGetMemoryInfo(mig).total == 40448 * 1024 * 1024
    assert nvml.nvmlDeviceGetName(mig) == "NVIDIA H100 80GB HBM3 MIG 3g.40gb"
    assert nvml.nvmlDeviceGetGpuInstanceRemainingCapacity(handle, info.id) == 1
    with pytest.raises(real_pynvml.NVMLError_InUse):
        nvml.nvmlGpuInstanceDestroy(gpu_instance)
    nvml.nvmlComputeInstanceDestroy(compute_instance)
    nvml.nvmlGpuInstanceDestroy(gpu_instance)
    with pytest.raises(real_pynvml.NVMLError_NotFound):
        nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, 0)


def test_gpu_lost_after_boot_then_absent(make_node, nvml):
    node = make_node("h100")
    from simfleet.gpu.faults import apply_fault_to_file

    apply_fault_to_file(node.state_path, "gpu_lost", ["2"])
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetName(nvml.nvmlDeviceGetHandleByIndex(2)) == "NVIDIA H100 80GB HBM3"
    nvml.nvmlShutdown()
    result = node.boot()
    assert result["lost"] == [2]
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 8
    with pytest.raises(real_pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByIndex(2)
    with pytest.raises(real_pynvml.NVMLError_GpuIsLost):
        nvml.nvmlDeviceGetHandleByPciBusId("00000000:3A:00.0")
    _code, log = node.dmesg()
    assert "NVRM: Xid (PCI:0000:3a:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus." in log
    code, out, err = node.smi("-q", "-x")
    assert code == 15
    assert "<attached_gpus>8</attached_gpus>" in out
    assert out.count("<gpu id=") == 7
    assert "GPU0000:3A:00.0: GPU is lost" in err
    nvml.nvmlShutdown()
    node.boot()
    nvml.nvmlInit()
    assert nvml.nvmlDeviceGetCount() == 7
    buses = [nvml.nvmlDeviceGetPciInfo(nvml.nvmlDeviceGetHandleByIndex(i)).busId for i in range(7)]
    assert "00000000:3A:00.0" not in buses
    _code, log = node.dmesg()
    assert "Xid" not in log


def test_drop_in_can_pretend_pynvml_is_absent(make_node, tmp_path):
    import importlib.util
    import os

    from simfleet.gpu import PYNVML_DROPIN

    node = make_node("l40s")
    os.makedirs(os.path.join(node.root, "etc/simgpu"))
    open(os.path.join(node.root, "etc/simgpu/pynvml-absent"), "w").close()
    spec = importlib.util.spec_from_file_location("simgpu_pynvml_absent", PYNVML_DROPIN)
    with pytest.raises(ModuleNotFoundError):
        spec.loader.exec_module(importlib.util.module_from_spec(spec))
