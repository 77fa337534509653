# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The hardware contract of a node: what a driver update can change, per GPU and per node.

The contract is read out of the ``ansible_facts.nvidia`` document (facts_model), so it has the
same sources whatever the facts came from: NVML (nvidia-ml-py, preferred), ``nvidia-smi -q -x``
(fallback) or a captured bundle. :data:`GPU_FIELDS` and :data:`NODE_FIELDS` are the one list of
contract fields: key, unit, the label the diff prints, and the NVML call / nvidia-smi element
/ file it comes from; docs/contract.md documents the same list.

Contract values are the ones every node of a GPU class must share (a class's nodes run the
same driver, so the same defaults, limits, clocks, reserved memory, MIG profiles, firmware).
Per-unit values (UUID, serial, PCI bus id, error counters) differ by nature and are kept apart in
``units``, so that a comparison of two nodes never sees them. A value that could not be read
is ``None``, never 0. Standard library only; runs on managed nodes.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_packages import fabricmanager_version_from_packages
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version

CONTRACT_VERSION = 1

# (key, unit or None, label, source). The key is the name in the contract; "path" below says
# where it is read in a facts GPU record.
GPU_FIELDS = (
    ("name", None, "GPU name", "nvmlDeviceGetName; <product_name>"),
    ("architecture", None, "architecture", "nvmlDeviceGetArchitecture; <product_architecture>"),
    ("power_default_limit_w", "W", "default power limit", "nvmlDeviceGetPowerManagementDefaultLimit (mW); <default_power_limit>"),
    ("power_enforced_limit_w", "W", "enforced power limit", "nvmlDeviceGetEnforcedPowerLimit (mW); <current_power_limit> / <enforced_power_limit>"),
    ("power_min_limit_w", "W", "minimum power limit", "nvmlDeviceGetPowerManagementLimitConstraints (mW); <min_power_limit>"),
    ("power_max_limit_w", "W", "maximum power limit", "nvmlDeviceGetPowerManagementLimitConstraints (mW); <max_power_limit>"),
    ("sm_clock_max_mhz", "MHz", "maximum SM clock", "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_SM); <max_clocks><sm_clock>"),
    ("mem_clock_max_mhz", "MHz", "maximum memory clock", "nvmlDeviceGetMaxClockInfo(NVML_CLOCK_MEM); <max_clocks><mem_clock>"),
    ("app_clock_default_graphics_mhz", "MHz", "default application clock (graphics)",
     "nvmlDeviceGetDefaultApplicationsClock(NVML_CLOCK_GRAPHICS); <default_applications_clocks><graphics_clock>"),
    ("app_clock_default_mem_mhz", "MHz", "default application clock (memory)",
     "nvmlDeviceGetDefaultApplicationsClock(NVML_CLOCK_MEM); <default_applications_clocks><mem_clock>"),
    ("memory_total_mib", "MiB", "memory total", "nvmlDeviceGetMemoryInfo_v2 .total (bytes); <fb_memory_usage><total>"),
    ("memory_reserved_mib", "MiB", "reserved memory", "nvmlDeviceGetMemoryInfo_v2 .reserved (bytes); <fb_memory_usage><reserved>"),
    ("bar1_total_mib", "MiB", "BAR1 size", "nvmlDeviceGetBAR1MemoryInfo .bar1Total (bytes); <bar1_memory_usage><total>"),
    ("persistence_mode", None, "persistence mode", "nvmlDeviceGetPersistenceMode; <persistence_mode>"),
    ("compute_mode", None, "compute mode", "nvmlDeviceGetComputeMode; <compute_mode>"),
    ("ecc_current", None, "ECC (current)", "nvmlDeviceGetEccMode [0]; <ecc_mode><current_ecc>"),
    ("ecc_pending", None, "ECC (pending)", "nvmlDeviceGetEccMode [1]; <ecc_mode><pending_ecc>"),
    ("mig_capable", None, "MIG capable", "nvmlDeviceGetMigMode answers / NotSupported; <mig_mode><current_mig> N/A"),
    ("mig_profiles_offered", None, "MIG profiles offered",
     "nvmlDeviceGetGpuInstanceProfileInfo(NVML_GPU_INSTANCE_PROFILE_*) .name; not in nvidia-smi -q"),
    ("pcie_gen_attainable", None, "PCIe generation (attainable)",
     "nvmlDeviceGetMaxPcieLinkGeneration (GPU and system); <pcie_gen><max_link_gen>"),
    ("pcie_width_max", None, "PCIe width (attainable)", "nvmlDeviceGetMaxPcieLinkWidth (GPU and system); <link_widths><max_link_width>"),
    ("vbios_version", None, "VBIOS", "nvmlDeviceGetVbiosVersion; <vbios_version>"),
    ("gsp_firmware_version", None, "GSP firmware", "nvmlDeviceGetGspFirmwareVersion; <gsp_firmware_version>"),
    ("idle_performance_state", None, "performance state at idle", "nvmlDeviceGetPerformanceState; <performance_state>"),
    ("idle_clocks_event_reasons", None, "clocks event reasons at idle",
     "nvmlDeviceGetCurrentClocksEventReasons; <clocks_event_reasons>"),
)  # type: Tuple[Tuple[str, Optional[str], str, str], ...]

NODE_FIELDS = (
    ("driver_userspace_version", None, "driver (userspace)", "nvmlSystemGetDriverVersion; <driver_version>; packages"),
    ("driver_loaded_version", None, "driver (loaded module)", "/sys/module/nvidia/version; /proc/driver/nvidia/version"),
    ("driver_on_disk_version", None, "driver (module on disk)", "modinfo nvidia (the running kernel's module)"),
    ("cuda_driver_version", None, "CUDA", "nvmlSystemGetCudaDriverVersion_v2; <cuda_version>"),
    ("kernel", None, "kernel", "uname -r"),
    ("kernel_module_type", None, "kernel module flavour", "/proc/driver/nvidia/version; modinfo license"),
    ("fabricmanager_version", None, "Fabric Manager", "package nvidia-fabricmanager(-<branch>) / nvidia-fabric-manager"),
    ("nscq_version", None, "NSCQ", "package libnvidia-nscq(-<branch>)"),
    ("dcgm_version", None, "DCGM", "package datacenter-gpu-manager(-4-core), when the package list holds it"),
    ("peermem_version", None, "nvidia-peermem", "/sys/module/nvidia_peermem/version"),
    ("peermem_state", None, "nvidia-peermem state", "/sys/module/nvidia_peermem; kernel log (node_signals)"),
    ("secure_boot", None, "Secure Boot", "mokutil --sb-state"),
    ("module_signer", None, "module signer", "modinfo nvidia: signer"),
    ("module_signer_trusted", None, "module signer trusted", "kernel log: signature rejected / module loaded under Secure Boot"),
)  # type: Tuple[Tuple[str, Optional[str], str, str], ...]

#: Per-unit values, kept apart from the contract (they differ between the GPUs of a class).
UNIT_FIELDS = ("index", "uuid", "serial", "pci_bus_id", "ecc_aggregate_uncorrected", "remapped_rows_uncorrectable")


def _get(record: Mapping[str, Any], *path: str) -> Any:
    value = record  # type: Any
    for key in path:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def is_idle(gpu: Mapping[str, Any]) -> Optional[bool]:
    """Whether a GPU was idle when read: no compute process and 0 % utilization (or ``gpu_idle`` active).

    :returns: ``True``/``False``, or ``None`` when neither the processes nor the utilization were read.
    """
    processes = gpu.get("processes")
    utilization = gpu.get("utilization_gpu_pct")
    reasons = gpu.get("clocks_event_reasons")
    if processes:
        return False
    if utilization is not None:
        return utilization == 0
    if reasons is not None:
        return "gpu_idle" in reasons
    return None if processes is None else True


def gpu_contract(gpu: Mapping[str, Any]) -> Dict[str, Any]:
    """The contract values of one GPU record (``ansible_facts.nvidia.gpus[]``).

    :param gpu: a facts_model GPU record (any source).
    :returns: ``{key: value}`` for every key of :data:`GPU_FIELDS` (units in the names: W, MHz,
        MiB); ``None`` where the source gave nothing. The idle P-state and clocks event reasons
        are ``None`` when the GPU was not idle when read (:func:`is_idle`), since a busy GPU says
        nothing about its idle contract. ``mig_profiles_offered`` is a sorted list of profile
        names (``"1g.10gb"``) or ``None``.
    :raises: nothing.
    """
    extended = gpu.get("extended") or {}
    idle = is_idle(gpu)
    profiles = extended.get("mig_profiles_offered")
    reasons = gpu.get("clocks_event_reasons")
    return {
        "name": gpu.get("name"),
        "architecture": gpu.get("architecture"),
        "power_default_limit_w": _get(gpu, "power", "default_limit_w"),
        "power_enforced_limit_w": _get(gpu, "power", "enforced_limit_w"),
        "power_min_limit_w": _get(gpu, "power", "min_limit_w"),
        "power_max_limit_w": _get(gpu, "power", "max_limit_w"),
        "sm_clock_max_mhz": _get(gpu, "clocks", "sm_max_mhz"),
        "mem_clock_max_mhz": _get(gpu, "clocks", "mem_max_mhz"),
        "app_clock_default_graphics_mhz": extended.get("app_clocks_default_graphics_mhz"),
        "app_clock_default_mem_mhz": extended.get("app_clocks_default_mem_mhz"),
        "memory_total_mib": _get(gpu, "memory", "total_mib"),
        "memory_reserved_mib": _get(gpu, "memory", "reserved_mib"),
        "bar1_total_mib": extended.get("bar1_total_mib"),
        "persistence_mode": gpu.get("persistence_mode"),
        "compute_mode": gpu.get("compute_mode"),
        "ecc_current": _get(gpu, "ecc", "mode_current"),
        "ecc_pending": _get(gpu, "ecc", "mode_pending"),
        "mig_capable": extended.get("mig_capable"),
        "mig_profiles_offered": None if profiles is None else sorted(profiles),
        "pcie_gen_attainable": extended.get("pcie_gen_attainable"),
        "pcie_width_max": _get(gpu, "pcie", "width_max"),
        "vbios_version": gpu.get("vbios_version"),
        "gsp_firmware_version": extended.get("gsp_firmware_version"),
        "idle_performance_state": extended.get("performance_state") if idle else None,
        "idle_clocks_event_reasons": sorted(reasons) if idle and reasons is not None else None,
    }


def gpu_units(gpu: Mapping[str, Any]) -> Dict[str, Any]:
    """The per-unit values of one GPU record: :data:`UNIT_FIELDS` (never compared between nodes)."""
    return {
        "index": gpu.get("index"),
        "uuid": gpu.get("uuid"),
        "serial": gpu.get("serial"),
        "pci_bus_id": gpu.get("pci_bus_id"),
        "ecc_aggregate_uncorrected": _get(gpu, "ecc", "aggregate", "uncorrected"),
        "remapped_rows_uncorrectable": _get(gpu, "remapped_rows", "uncorrectable"),
    }


def _package_version(packages: List[Mapping[str, Any]], prefixes: Tuple[str, ...]) -> Optional[str]:
    for package in packages:
        name = package.get("name") or ""
        if package.get("installed", True) and name.startswith(prefixes):
            return upstream_version(package.get("version"))
    return None


def node_contract(facts: Mapping[str, Any]) -> Dict[str, Any]:
    """The node-level contract values of a facts document.

    :param facts: ``ansible_facts.nvidia``.
    :returns: ``{key: value}`` for every key of :data:`NODE_FIELDS`; ``None`` where unknown.
    :raises: nothing.
    """
    driver = facts.get("driver") or {}
    node = facts.get("node") or {}
    packages = driver.get("packages") or []
    return {
        "driver_userspace_version": driver.get("userspace_version"),
        "driver_loaded_version": driver.get("loaded_version"),
        "driver_on_disk_version": driver.get("on_disk_version"),
        "cuda_driver_version": driver.get("cuda_driver_version"),
        "kernel": driver.get("running_kernel"),
        "kernel_module_type": driver.get("kernel_module_type"),
        "fabricmanager_version": fabricmanager_version_from_packages(packages),
        "nscq_version": _package_version(packages, ("libnvidia-nscq",)),
        "dcgm_version": _package_version(packages, ("datacenter-gpu-manager",)),
        "peermem_version": node.get("peermem_loaded_version"),
        "peermem_state": node.get("peermem_state"),
        "secure_boot": node.get("secure_boot"),
        "module_signer": node.get("module_signer"),
        "module_signer_trusted": node.get("module_signer_trusted"),
    }


def contract_from_facts(facts: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The hardware contract of a node, from its facts.

    :param facts: ``ansible_facts.nvidia`` (facts_model.new_facts shape), or ``None``.
    :returns: ``{"contract_version": 1, "source": facts source, "node": node_contract(facts),
        "gpus": [gpu_contract(gpu) plus "index"], "units": [gpu_units(gpu)]}``; ``gpus`` and
        ``units`` are in GPU index order, one entry each per GPU.
    :raises ValueError: when ``facts`` is not a mapping (a node without facts has no contract).
    """
    if not isinstance(facts, Mapping):
        raise ValueError("the contract is read from ansible_facts.nvidia, a mapping; got %r" % (type(facts).__name__,))
    gpus = sorted(facts.get("gpus") or [], key=lambda gpu: gpu.get("index") if gpu.get("index") is not None else 0)
    return {
        "contract_version": CONTRACT_VERSION,
        "source": facts.get("source"),
        "node": node_contract(facts),
        "gpus": [dict(gpu_contract(gpu), index=gpu.get("index")) for gpu in gpus],
        "units": [gpu_units(gpu) for gpu in gpus],
    }
