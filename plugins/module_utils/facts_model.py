# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``ansible_facts.nvidia`` model: one schema whatever the source.

Every reader (NVML, ``nvidia-smi -q -x``, a captured support bundle) fills the
same dictionaries, built by the constructors here, so that deciding code never
has to know where a value came from. Units live in the key names (``_w``,
``_mhz``, ``_c``, ``_mib``); a value the source could not give is ``None``,
never 0. The schema is documented field by field in docs/facts.md.

Only plain ``dict``/``list``/``str``/``int``/``float``/``bool``/``None`` values
are used, so the facts serialise to JSON unchanged. Compatible with Python 3.7.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

SCHEMA_VERSION = 1

SOURCES = ("nvml", "nvidia-smi", "capture", "none")

DRIVER_STATES = ("not_installed", "not_loaded", "ok", "reboot_pending", "broken")

# Values nvidia-smi and NVML-backed tools print for "no value". Compared after
# stripping and lower-casing. Source: nvidia-smi -q output of drivers 470-595
# (field cases 01, 04, 15 and 26), which print these literally.
_NULL_WORDS = frozenset(
    (
        "",
        "n/a",
        "[n/a]",
        "not supported",
        "[not supported]",
        "[requested functionality has been deprecated]",
        "requested functionality has been deprecated",
        "[unknown error]",
        "unknown error",
        "[insufficient permissions]",
        "insufficient permissions",
        "[gpu requires reset]",
        "[gpu is lost]",
        "none",
    )
)

_NUMBER = re.compile(r"^\s*(-?\d+(?:\.\d+)?)")
# The one rule for an annotation nvidia-smi prints after a value, or instead of one: a trailing
# "[...]" is dropped ("610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD Version
# instead]" → "610.57.04", R610), and a value that is nothing but "[...]" is no value ("[N/A]",
# "[Not Supported]", "[Requested functionality has been deprecated]", "[Unknown Error]").
_ANNOTATED = re.compile(r"^(?P<value>.*?)\s*\[[^\[\]]*\]$")


def null_if_na(value: Optional[str]) -> Optional[str]:
    """Return ``value`` stripped, or ``None`` when it is one of nvidia-smi's "no value" words.

    :param value: a text value as printed by ``nvidia-smi`` (``"N/A"``, ``"[Not Supported]"``, ...)
        or ``None``.
    :returns: the stripped text without a trailing ``[...]`` annotation (``"610.57.04 [Deprecated;
        ...]"`` → ``"610.57.04"``, one rule for every key), or ``None`` for "N/A", "[N/A]", "[Not
        Supported]", "[Requested functionality has been deprecated]", "[Unknown Error]",
        "[Insufficient Permissions]", any other value that is nothing but ``[...]``, empty text
        and ``None``.
    :raises: nothing.
    """
    if value is None:
        return None
    text = value.strip()
    if text.lower() in _NULL_WORDS:
        return None
    annotated = _ANNOTATED.match(text)
    if annotated:
        text = annotated.group("value").strip()
        if text.lower() in _NULL_WORDS:
            return None
    return text


def parse_number(value: Optional[str]) -> Optional[float]:
    """Parse the leading number of a value with a unit, ``"67.03 W"`` → ``67.03``.

    :param value: text such as ``"500.00 W"``, ``"1410 MHz"``, ``"27 C"``, ``"81920 MiB"``,
        or a "no value" word.
    :returns: the number as ``float``, or ``None`` when the value is a "no value" word
        (see :func:`null_if_na`) or holds no leading number.
    :raises: nothing.
    """
    text = null_if_na(value)
    if text is None:
        return None
    match = _NUMBER.match(text)
    if not match:
        return None
    return float(match.group(1))


def parse_int(value: Optional[str]) -> Optional[int]:
    """Like :func:`parse_number`, rounded to ``int`` (``"16x"`` → 16, ``"4"`` → 4)."""
    number = parse_number(value)
    return None if number is None else int(round(number))


def parse_enabled(value: Optional[str]) -> Optional[bool]:
    """Map ``"Enabled"``/``"Disabled"`` (and ``"On"``/``"Off"``, ``"Yes"``/``"No"``) to ``bool``.

    :returns: ``True``, ``False``, or ``None`` for a "no value" word or anything else.
    """
    text = null_if_na(value)
    if text is None:
        return None
    lowered = text.lower()
    if lowered in ("enabled", "enable", "on", "yes", "true", "1"):
        return True
    if lowered in ("disabled", "disable", "off", "no", "false", "0"):
        return False
    return None


def new_driver() -> Dict[str, Any]:
    """Return an empty ``driver`` section, every value ``None``.

    Keys: ``userspace_version`` (str, NVML ``nvmlSystemGetDriverVersion`` or ``nvidia-smi``
    ``<driver_version>``), ``loaded_version`` (str, ``/sys/module/nvidia/version`` or
    ``/proc/driver/nvidia/version``), ``on_disk_version`` (str, ``modinfo -F version nvidia`` for
    the running kernel), ``branch`` (str, e.g. ``"580"``), ``kernel_module_type``
    (``"open"``/``"proprietary"``), ``cuda_driver_version`` (str, e.g. ``"13.0"``), ``state``
    (one of :data:`DRIVER_STATES`), ``state_reasons`` (list of str), ``not_loaded_cause``
    (``"module_signature_rejected"`` when a ``not_loaded`` module was refused under Secure Boot,
    else ``None``), ``packages`` (list of
    ``{name, version, status, held}``), ``package_manager`` (``"dpkg"``/``"rpm"``/``None``),
    ``nvml_version`` (str), ``running_kernel`` (str, ``uname -r``).
    """
    return {
        "userspace_version": None,
        "loaded_version": None,
        "on_disk_version": None,
        "branch": None,
        "kernel_module_type": None,
        "cuda_driver_version": None,
        "nvml_version": None,
        "running_kernel": None,
        "state": None,
        "state_reasons": [],
        "not_loaded_cause": None,
        "package_manager": None,
        "packages": [],
    }


def new_gpu(index: int) -> Dict[str, Any]:
    """Return an empty GPU record with ``index`` set and every other value ``None``.

    The shape is the one documented in docs/facts.md: identity (``uuid``, ``name``, ``serial``,
    ``pci_bus_id`` as ``"0000:3b:00.0"``, ``pci_device_id`` as ``"0x233010de"``,
    ``architecture``, ``vbios_version``), modes (``persistence_mode`` bool, ``compute_mode`` str),
    ``power`` (watts), ``ecc``, ``remapped_rows``, ``retired_pages``, ``mig``, ``clocks`` (MHz),
    ``clocks_event_reasons`` (list of names), ``temperature_c``, ``memory`` (MiB), ``pcie``,
    ``utilization_gpu_pct``, ``processes``, ``fabric`` (NVLink fabric registration: ``state``,
    ``status``, ``clique_id``, ``cluster_uuid``; smi_xml._fabric), ``readable`` (False when the GPU could not be read at
    all, e.g. NVML GpuIsLost) and ``errors`` (list of str).
    """
    return {
        "index": index,
        "uuid": None,
        "name": None,
        "serial": None,
        "pci_bus_id": None,
        "pci_device_id": None,
        "architecture": None,
        "vbios_version": None,
        "fabric": {"state": None, "status": None, "clique_id": None, "cluster_uuid": None},
        "readable": True,
        "errors": [],
        "persistence_mode": None,
        "compute_mode": None,
        "power": {
            "limit_w": None,
            "default_limit_w": None,
            "enforced_limit_w": None,
            "requested_limit_w": None,
            "min_limit_w": None,
            "max_limit_w": None,
            "draw_w": None,
        },
        "ecc": {
            "supported": None,
            "mode_current": None,
            "mode_pending": None,
            "volatile": {"corrected": None, "uncorrected": None},
            "aggregate": {"corrected": None, "uncorrected": None},
        },
        "remapped_rows": {
            "correctable": None,
            "uncorrectable": None,
            "pending": None,
            "failed": None,
        },
        "retired_pages": {
            "single_bit_ecc": None,
            "double_bit_ecc": None,
            "pending": None,
        },
        "mig": {
            "mode_current": None,
            "mode_pending": None,
            "devices": [],
        },
        "clocks": {"sm_mhz": None, "mem_mhz": None, "sm_max_mhz": None, "mem_max_mhz": None},
        "clocks_event_reasons": None,
        "temperature_c": None,
        "memory": {"total_mib": None, "used_mib": None, "free_mib": None, "reserved_mib": None},
        "pcie": {"gen_current": None, "gen_max": None, "width_current": None, "width_max": None},
        "utilization_gpu_pct": None,
        "processes": None,
        "extended": new_gpu_extended(),
    }


def new_gpu_extended() -> Dict[str, Any]:
    """Return an empty ``extended`` section of a GPU record, every value ``None``.

    The values the hardware contract (docs/contract.md) needs beyond the health facts:
    ``app_clocks_default_graphics_mhz`` / ``app_clocks_default_mem_mhz`` (int, MHz: NVML
    ``nvmlDeviceGetDefaultApplicationsClock``, nvidia-smi ``<default_applications_clocks>``),
    ``bar1_total_mib`` (int, MiB: ``nvmlDeviceGetBAR1MemoryInfo``, ``<bar1_memory_usage><total>``),
    ``gsp_firmware_version`` (str: ``nvmlDeviceGetGspFirmwareVersion``, ``<gsp_firmware_version>``),
    ``performance_state`` (str ``"P0"`` ... ``"P15"``: ``nvmlDeviceGetPerformanceState``,
    ``<performance_state>``), ``mig_capable`` (bool), ``mig_profiles_offered`` (list of GPU instance
    profile names such as ``"1g.10gb"``: ``nvmlDeviceGetGpuInstanceProfileInfo``; ``None`` when not
    read), ``recovery_action`` (str: ``none``, ``gpu_reset``, ``node_reboot``, ``drain_p2p``,
    ``drain_and_reset``, ... from the NVML field ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``),
    ``pcie_gen_attainable`` (int: the highest PCIe generation this GPU and this system can run
    together, ``nvmlDeviceGetMaxPcieLinkGeneration``, nvidia-smi ``<pcie_gen><max_link_gen>``;
    ``pcie.gen_max`` is the GPU's own maximum).
    """
    return {
        "app_clocks_default_graphics_mhz": None,
        "app_clocks_default_mem_mhz": None,
        "bar1_total_mib": None,
        "gsp_firmware_version": None,
        "performance_state": None,
        "mig_capable": None,
        "mig_profiles_offered": None,
        "recovery_action": None,
        "pcie_gen_attainable": None,
    }


# NVML_GPU_RECOVERY_ACTION_* (nvml.h / pynvml 13.615.71) → the word used in ``extended.recovery_action``.
GPU_RECOVERY_ACTIONS = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}  # type: Dict[int, str]


def performance_state_name(value: Optional[int]) -> Optional[str]:
    """NVML ``nvmlPstates_t`` → ``"P0"`` ... ``"P15"``; 32 (``NVML_PSTATE_UNKNOWN``) and ``None`` → ``None``."""
    if value is None or not 0 <= int(value) <= 15:
        return None
    return "P%d" % int(value)


def new_mig_device() -> Dict[str, Any]:
    """Return an empty MIG device record.

    Keys: ``gpu_instance_id`` (int), ``compute_instance_id`` (int), ``profile`` (str such as
    ``"1g.10gb"``, or ``None`` when the source does not name it), ``uuid`` (str),
    ``memory_total_mib`` (int), ``sm_count`` (int).
    """
    return {
        "gpu_instance_id": None,
        "compute_instance_id": None,
        "profile": None,
        "uuid": None,
        "memory_total_mib": None,
        "sm_count": None,
    }


def new_facts(source: str = "none") -> Dict[str, Any]:
    """Return an empty ``ansible_facts.nvidia`` document.

    :param source: one of :data:`SOURCES`.
    :returns: ``{schema_version, source, driver, gpus, gpu_count, attached_gpus, xid_events,
        kernel_log_gpus, driver_messages, sxid_events, kernel_log_unrecognised, node, unsupported,
        warnings}``; ``gpu_count`` is ``None``
        (not counted) until a GPU source answers.
    :raises ValueError: when ``source`` is not one of :data:`SOURCES`.
    """
    if source not in SOURCES:
        raise ValueError("source must be one of %s, got %r" % (", ".join(SOURCES), source))
    return {
        "schema_version": SCHEMA_VERSION,
        "source": source,
        "driver": new_driver(),
        "gpus": [],
        "gpu_count": None,
        "attached_gpus": None,
        "xid_events": [],
        "kernel_log_gpus": [],
        "driver_messages": [],
        "sxid_events": [],
        "kernel_log_unrecognised": None,
        "unparsed": None,
        "node": new_node(),
        "unsupported": [],
        "warnings": [],
    }


def new_node() -> Dict[str, Any]:
    """Return an empty ``node`` section: what the node says beyond the driver versions and the GPUs.

    Keys: ``secure_boot`` (bool: ``mokutil --sb-state``), ``module_signer`` (str: the ``signer:``
    of ``modinfo nvidia``; ``None`` unsigned or not read), ``module_signer_trusted`` (bool: ``False``
    when the kernel refused the module's signature, ``True`` when the signed module is loaded under
    Secure Boot, else ``None``), ``module_load_failures`` (list, node_signals.module_load_failures),
    ``probe_failures`` (list, node_signals.probe_failures: GPUs the loaded driver refused),
    ``peermem_loaded_version`` (str: ``/sys/module/nvidia_peermem/version``), ``peermem_state``
    (``"loaded"``, ``"failed"``, ``"not_loaded"``, or ``None`` when not read).
    """
    return {
        "secure_boot": None,
        "module_signer": None,
        "module_signer_trusted": None,
        "module_load_failures": [],
        "probe_failures": [],
        "peermem_loaded_version": None,
        "peermem_state": None,
    }


def branch_of(version: Optional[str]) -> Optional[str]:
    """Return the driver branch of a version, ``"580.126.20"`` → ``"580"``.

    :returns: the digits before the first dot, or ``None`` for ``None``/unparseable input.
    """
    if not version:
        return None
    match = re.match(r"^\s*(\d+)\.", version)
    return match.group(1) if match else None


def mib_from_bytes(value: Optional[int]) -> Optional[int]:
    """Bytes → MiB (integer division), ``None`` stays ``None``."""
    if value is None:
        return None
    return int(value) // (1024 * 1024)


def watts_from_milliwatts(value: Optional[int]) -> Optional[float]:
    """Milliwatts (NVML's unit for every power call) → watts, ``None`` stays ``None``."""
    if value is None:
        return None
    return round(int(value) / 1000.0, 3)


# Clocks event reasons (formerly "throttle reasons"), NVML bit → name. Source: nvml.h
# ``nvmlClocksEventReason*`` constants (NVML API reference, "Clocks Event Reasons"), and the
# DCGM_FI_DEV_CLOCKS_EVENT_REASONS bit list of dcgm-exporter. Names are the ones used in
# ``clocks_event_reasons`` facts and match the element names of ``nvidia-smi -q -x``
# ``<clocks_event_reasons>`` (``<clocks_throttle_reasons>`` before driver 535) without the
# ``clocks_event_reason_`` / ``clocks_throttle_reason_`` prefix.
CLOCKS_EVENT_REASON_BITS = (
    (0x0000000000000001, "gpu_idle"),
    (0x0000000000000002, "applications_clocks_setting"),
    (0x0000000000000004, "sw_power_cap"),
    (0x0000000000000008, "hw_slowdown"),
    (0x0000000000000010, "sync_boost"),
    (0x0000000000000020, "sw_thermal_slowdown"),
    (0x0000000000000040, "hw_thermal_slowdown"),
    (0x0000000000000080, "hw_power_brake_slowdown"),
    (0x0000000000000100, "display_clock_setting"),
)


def clocks_event_reason_names(mask: Optional[int]) -> Optional[List[str]]:
    """Decode an NVML clocks event reasons bit mask into sorted names.

    :param mask: the value of ``nvmlDeviceGetCurrentClocksEventReasons`` (an ``int``), or ``None``.
    :returns: the names of the set bits from :data:`CLOCKS_EVENT_REASON_BITS` in bit order,
        ``[]`` for 0 (no reason: clocks run as high as allowed), ``None`` for ``None``.
        Unknown bits are named ``"bit_0x..."`` so that nothing is silently dropped.
    """
    if mask is None:
        return None
    names = [name for bit, name in CLOCKS_EVENT_REASON_BITS if mask & bit]
    known = 0
    for bit, _name in CLOCKS_EVENT_REASON_BITS:
        known |= bit
    rest = mask & ~known
    bit = 1
    while rest:
        if rest & bit:
            names.append("bit_0x%x" % bit)
            rest &= ~bit
        bit <<= 1
    return names


_PCI_BUS_ID = re.compile(
    r"^(?:PCI:)?(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):(?P<dev>[0-9a-fA-F]{1,2})"
    r"(?:\.(?P<fn>[0-7]))?$"
)


def normalize_pci_bus_id(value: Optional[str]) -> Optional[str]:
    """Normalise a PCI bus id to the 4-digit-domain, lower-case form ``"0000:3b:00.0"``.

    Accepts what NVML (``nvmlPciInfo_t.busId``, ``"00000000:3B:00.0"``), ``nvidia-smi``
    (``<pci_bus_id>``) and the kernel log (``NVRM: Xid (PCI:0000:3b:00)``, no function) print.
    A missing domain is taken as 0 and a missing function as 0.

    :returns: the normalised id, or ``None`` for ``None``/"N/A"/text that is no bus id.
    """
    text = null_if_na(value)
    if text is None:
        return None
    match = _PCI_BUS_ID.match(text)
    if not match:
        return None
    domain = int(match.group("domain") or "0", 16)
    bus = int(match.group("bus"), 16)
    device = int(match.group("dev"), 16)
    return "%04x:%02x:%02x.%s" % (domain & 0xFFFF, bus, device, match.group("fn") or "0")
