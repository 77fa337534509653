# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated ``nvidia-smi`` (front end ``/usr/bin/nvidia-smi`` from the nvidia-smi package).

Supported: the summary table (no arguments), ``-L``, ``-q -x`` (XML shaped like the driver's:
``nvsmi_device_v13.dtd`` elements from R570 on, the v12 elements of R535), ``--query-gpu=...
--format=csv[,noheader][,nounits]``, ``-i`` (index, PCI bus id, UUID, serial), ``-pm``,
``-pl``, ``-e``, ``-c``, ``-mig``, ``-r`` (GPU reset) and ``-f``. Messages and exit codes follow
the real tool (exit code = the NVML error code: 9 driver not loaded, 12 library not found,
15 GPU lost, 18 driver/library version mismatch, 2 bad arguments, 4 no permission, 6 not
found, 255 reset refused). Everything is read from and written to the same state as NVML.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, TextIO, Tuple, Union

from . import catalog, device as D, driver, root_dir
from .device import SimError

NA = "N/A"
XmlNode = Tuple[str, Union[str, List[Any], None]]

_COMPUTE_MODE = {0: "Default", 1: "Exclusive_Thread", 2: "Prohibited", 3: "Exclusive_Process"}
_COMPUTE_MODE_ARG = {"DEFAULT": 0, "EXCLUSIVE_THREAD": 1, "PROHIBITED": 2, "EXCLUSIVE_PROCESS": 3}
_EVENT_REASONS = [
    ("gpu_idle", 0x1), ("applications_clocks_setting", 0x2), ("sw_power_cap", 0x4), ("hw_slowdown", 0x8),
    ("hw_thermal_slowdown", 0x40), ("hw_power_brake_slowdown", 0x80), ("sync_boost", 0x10),
    ("sw_thermal_slowdown", 0x20), ("display_clocks_setting", 0x100),
]


class Context:
    """What every renderer needs: the node, its state, the driver version and branch."""

    def __init__(self, node: D.Node, version: str) -> None:
        self.node = node
        self.version = version
        self.branch = catalog.branch_of(version)
        self.state = node.state()
        self.loaded = driver.loaded_module(node.root) or {"flavor": "proprietary"}

    @property
    def new_schema(self) -> bool:
        """Elements of the v13 era (average/instant power draw, sram parity/secded, ...)."""
        return self.branch >= 570


def _enabled(value: Any) -> str:
    return "Enabled" if int(value) else "Disabled"


def _watts(milliwatts: Any) -> str:
    return "%.2f W" % (int(milliwatts) / 1000.0)


def _mib(value: Any) -> str:
    return "%d MiB" % int(value)


def _mhz(value: Any) -> str:
    return NA if value is None else "%d MHz" % int(value)


def _bus_short(gpu: Dict[str, Any]) -> str:
    return gpu["pci"]["bus_id"][4:]


def _lost_message(gpu: Dict[str, Any]) -> str:
    return ("Unable to determine the device handle for GPU%s: GPU is lost.  "
            "Reboot the system to recover this GPU" % _bus_short(gpu))


# ------------------------------------------------------------------ XML


def _render_xml(nodes: List[XmlNode], depth: int, out: List[str]) -> None:
    pad = "\t" * depth
    for tag, value in nodes:
        attrs = ""
        if "|" in tag:
            tag, attrs = tag.split("|", 1)
            attrs = " " + attrs
        if isinstance(value, list):
            out.append("%s<%s%s>" % (pad, tag, attrs))
            _render_xml(value, depth + 1, out)
            out.append("%s</%s>" % (pad, tag))
        elif value is None:
            out.append("%s<%s%s>\n%s</%s>" % (pad, tag, attrs, pad, tag))
        else:
            text = str(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            if text.startswith("\n"):
                out.append("%s<%s%s>%s%s</%s>" % (pad, tag, attrs, text, pad, tag))
            else:
                out.append("%s<%s%s>%s</%s>" % (pad, tag, attrs, text, tag))


def _sup(gpu: Dict[str, Any], field: str, value: Callable[[], Any]) -> Any:
    return value() if D.supported(gpu, field) else NA


def _fabric_state(ctx: Context, gpu: Dict[str, Any]) -> Tuple[str, str]:
    if gpu["architecture"] not in ("Hopper", "Blackwell") or not ctx.state.get("system", {}).get("nvswitch_count"):
        return NA, NA
    from . import daemons  # local import: daemons imports this module's helpers indirectly

    if daemons.fabricmanager_running(ctx.node.root, ctx.version):
        return "Completed", "Success"
    return "In Progress", NA


def _mig_devices_xml(ctx: Context, gpu: Dict[str, Any]) -> Union[str, List[XmlNode]]:
    migs = D.mig_devices(gpu)
    if not migs:
        return "\n" + "\t" * 3 + "None\n"
    out: List[XmlNode] = []
    for index, mig in enumerate(migs):
        out.append(("mig_device", [
            ("index", str(index)), ("gpu_instance_id", str(mig["gi_id"])), ("compute_instance_id", str(mig["ci_id"])),
            ("device_attributes", [("shared", [
                ("multiprocessor_count", str(mig["sm"])), ("copy_engine_count", str(mig["ce"])),
                ("encoder_count", str(mig["enc"])), ("decoder_count", str(mig["dec"])),
                ("ofa_count", str(mig["ofa"])), ("jpg_count", str(mig["jpeg"]))])]),
            ("ecc_error_count", [("volatile_count", [("sram_uncorrectable", "0")])]),
            ("fb_memory_usage", [("total", _mib(mig["memory_mib"])), ("reserved", _mib(0)), ("used", _mib(0)),
                                 ("free", _mib(mig["memory_mib"]))]),
            ("bar1_memory_usage", [("total", _mib(32767)), ("used", _mib(0)), ("free", _mib(32767))]),
        ]))
    return out


def _ecc_errors_xml(ctx: Context, gpu: Dict[str, Any]) -> List[XmlNode]:
    ecc = gpu["ecc"]
    on = D.supported(gpu, "ecc_errors") and int(ecc.get("current", 0)) == 1

    def count(counter: str, kind: str) -> str:
        return str(int(ecc[counter][kind])) if on else NA

    def zero() -> str:
        return "0" if on else NA

    if ctx.new_schema:
        volatile = [("sram_correctable", zero()), ("sram_uncorrectable_parity", zero()),
                    ("sram_uncorrectable_secded", zero()), ("dram_correctable", count("volatile", "corrected")),
                    ("dram_uncorrectable", count("volatile", "uncorrected"))]
        aggregate = [("sram_correctable", zero()), ("sram_uncorrectable_parity", zero()),
                     ("sram_uncorrectable_secded", zero()), ("dram_correctable", count("aggregate", "corrected")),
                     ("dram_uncorrectable", count("aggregate", "uncorrected")),
                     ("sram_threshold_exceeded", "No" if on else NA)]
        return [("volatile", volatile), ("aggregate", aggregate),
                ("aggregate_uncorrectable_sram_sources", [(k, zero()) for k in (
                    "sram_l2", "sram_sm", "sram_microcontroller", "sram_pcie", "sram_other")]),
                ("channel_repair_pending", "No" if on else NA), ("tpc_repair_pending", "No" if on else NA)]
    return [("volatile", [("sram_correctable", zero()), ("sram_uncorrectable", zero()),
                          ("dram_correctable", count("volatile", "corrected")),
                          ("dram_uncorrectable", count("volatile", "uncorrected"))]),
            ("aggregate", [("sram_correctable", zero()), ("sram_uncorrectable", zero()),
                           ("dram_correctable", count("aggregate", "corrected")),
                           ("dram_uncorrectable", count("aggregate", "uncorrected"))])]


def _retired_pages_xml(gpu: Dict[str, Any]) -> List[XmlNode]:
    if not D.supported(gpu, "retired_pages"):
        return [("multiple_single_bit_retirement", [("retired_count", NA), ("retired_pagelist", NA)]),
                ("double_bit_retirement", [("retired_count", NA), ("retired_pagelist", NA)]),
                ("pending_blacklist", NA), ("pending_retirement", NA)]
    pages = gpu["retired_pages"]

    def page_list(key: str) -> List[XmlNode]:
        items = pages.get(key) or []
        return [("retired_count", str(len(items))),
                ("retired_pagelist", [("retired_page_address", "0x%016x" % int(p)) for p in items] or None)]

    pending = "Yes" if pages.get("pending") else "No"
    return [("multiple_single_bit_retirement", page_list("single_bit")),
            ("double_bit_retirement", page_list("double_bit")),
            ("pending_blacklist", pending), ("pending_retirement", pending)]


def _remapped_rows_xml(gpu: Dict[str, Any]) -> Union[str, List[XmlNode]]:
    if not D.supported(gpu, "remapped_rows"):
        return NA
    rows = gpu["remapped_rows"]
    banks = {"Hopper": 2560, "Blackwell": 3840}.get(gpu["architecture"], 640)
    return [("remapped_row_corr", str(rows["correctable"])), ("remapped_row_unc", str(rows["uncorrectable"])),
            ("remapped_row_pending", "Yes" if rows["pending"] else "No"),
            ("remapped_row_failure", "Yes" if rows["failure"] else "No"),
            ("row_remapper_histogram", [
                ("row_remapper_histogram_max", "%d bank(s)" % banks),
                ("row_remapper_histogram_high", "0 bank(s)"), ("row_remapper_histogram_partial", "0 bank(s)"),
                ("row_remapper_histogram_low", "0 bank(s)"), ("row_remapper_histogram_none", "0 bank(s)")])]


def _temperature_xml(ctx: Context, gpu: Dict[str, Any]) -> List[XmlNode]:
    temp = gpu["temperature"]
    ok = D.supported(gpu, "temperature")

    def c(value: Any) -> str:
        return NA if (value is None or not ok) else "%d C" % int(value)

    if ctx.new_schema:
        tlimit = None if temp.get("max_gpu") is None else int(temp["max_gpu"]) - int(temp["gpu"])
        return [("gpu_temp", c(temp["gpu"])), ("gpu_temp_tlimit", c(tlimit)),
                ("gpu_temp_max_tlimit_threshold", c(-8)), ("gpu_temp_slow_tlimit_threshold", c(-2)),
                ("gpu_temp_max_gpu_tlimit_threshold", c(0)), ("gpu_target_temperature", NA),
                ("memory_temp", c(temp.get("memory"))),
                ("gpu_temp_max_mem_tlimit_threshold", c(0 if temp.get("max_mem") is not None else None))]
    return [("gpu_temp", c(temp["gpu"])), ("gpu_temp_tlimit", NA),
            ("gpu_temp_max_threshold", c(temp.get("shutdown"))), ("gpu_temp_slow_threshold", c(temp.get("slowdown"))),
            ("gpu_temp_max_gpu_threshold", c(temp.get("max_gpu"))), ("gpu_target_temperature", NA),
            ("memory_temp", c(temp.get("memory"))), ("gpu_temp_max_mem_threshold", c(temp.get("max_mem")))]


def _power_xml(ctx: Context, gpu: Dict[str, Any]) -> List[XmlNode]:
    power = gpu["power"]
    limits = D.supported(gpu, "power_limit")
    usage = D.supported(gpu, "power_usage")
    draw = _watts(power["draw_mw"]) if usage else NA
    avg = _watts(int(power["draw_mw"]) - 350) if usage else NA
    head: List[XmlNode] = [("power_state", "P%d" % int(gpu.get("performance_state", 0)))]
    if ctx.new_schema:
        head += [("average_power_draw", avg), ("instant_power_draw", draw)]
    else:
        head += [("power_draw", draw)]

    def lim(key: str) -> str:
        return _watts(power[key]) if limits else NA

    return head + [("current_power_limit", lim("limit_mw")), ("requested_power_limit", lim("limit_mw")),
                   ("default_power_limit", lim("default_mw")), ("min_power_limit", lim("min_mw")),
                   ("max_power_limit", lim("max_mw"))]


def gpu_xml(ctx: Context, gpu: Dict[str, Any]) -> XmlNode:
    """The ``<gpu>`` element of ``nvidia-smi -q -x`` for one GPU."""
    new = ctx.new_schema
    pci = gpu["pci"]
    pcie = gpu["pcie"]
    clocks = gpu["clocks"]
    mem = gpu["memory"]
    mig = gpu["mig"]
    mig_ok = D.supported(gpu, "mig_mode")
    pcie_ok = D.supported(gpu, "pcie")
    clocks_ok = D.supported(gpu, "clocks")
    util_ok = D.supported(gpu, "utilization")
    mem_ok = D.supported(gpu, "memory")
    gsp = ctx.loaded.get("flavor") == "open" or gpu["architecture"] not in ("Volta",)
    reasons = int(gpu.get("clocks_event_reasons", 0))
    rows = gpu.get("remapped_rows") or {}

    def pc(value: Any) -> str:
        return str(value) if pcie_ok else NA

    def ck(key: str) -> str:
        return _mhz(clocks.get(key)) if clocks_ok else NA

    body: List[XmlNode] = [
        ("product_name", gpu["name"]), ("product_brand", gpu["brand"]),
        ("product_architecture", gpu["architecture"]),
        ("display_mode", "Requested functionality has been deprecated" if new else "Disabled"),
    ]
    if new:
        body.append(("display_attached", "No"))
    body += [
        ("display_active", "Disabled"),
        ("persistence_mode", _sup(gpu, "persistence_mode", lambda: _enabled(gpu["persistence_mode"]))),
        ("addressing_mode", "None"),
        ("mig_mode", [("current_mig", _enabled(mig["current"]) if mig_ok else NA),
                      ("pending_mig", _enabled(mig["pending"]) if mig_ok else NA)]),
        ("mig_devices", _mig_devices_xml(ctx, gpu)),
        ("accounting_mode", "Disabled"), ("accounting_mode_buffer_size", "4000"),
        ("driver_model", [("current_dm", NA), ("pending_dm", NA)]),
        ("serial", _sup(gpu, "serial", lambda: gpu["serial"])), ("uuid", gpu["uuid"]),
    ]
    if new:
        body.append(("pdi", NA))
    body += [
        ("minor_number", str(gpu["minor_number"])),
        ("vbios_version", _sup(gpu, "vbios_version", lambda: gpu["vbios_version"])),
        ("multigpu_board", "No"), ("board_id", "0x%x00" % int(pci["bus"])),
        ("board_part_number", gpu["board_part_number"]), ("gpu_part_number", gpu["gpu_part_number"]),
        ("gpu_fru_part_number", NA),
    ]
    if new:
        body.append(("platformInfo", [("chassis_serial_number", NA), ("slot_number", NA), ("tray_index", NA),
                                      ("host_id", NA), ("peer_type", NA), ("module_id", str(gpu["module_id"])),
                                      ("gpu_fabric_guid", NA)]))
    else:
        body.append(("gpu_module_id", str(gpu["module_id"])))
    body.append(("inforom_version", [("img_version", gpu["inforom_image"]), ("oem_object", "2.1"),
                                     ("ecc_object", "7.16"), ("pwr_object", NA)]))
    if new:
        body.append(("inforom_bbx_flush", [("latest_timestamp", NA), ("latest_duration", NA)]))
    body.append(("gpu_operation_mode", [("current_gom", NA), ("pending_gom", NA)]))
    virt: List[XmlNode] = [("virtualization_mode", "None"), ("host_vgpu_mode", NA)]
    if new:
        body.append(("c2c_mode", "Disabled"))
        body.append(("gpu_virtualization_mode", virt + [("vgpu_heterogeneous_mode", NA)]))
        body.append(("gpu_recovery_action", "Reset" if rows.get("pending") else "None"))
        body.append(("gsp_firmware_version", ctx.version if gsp else NA))
    else:
        body.append(("gsp_firmware_version", ctx.version if gsp else NA))
        body.append(("gpu_virtualization_mode", virt))
        body.append(("gpu_reset_status", [("reset_required", "Yes" if rows.get("pending") else "No"),
                                          ("drain_and_reset_recommended", "No")]))
    body.append(("ibmnpu", [("relaxed_ordering_mode", NA)]))
    pci_xml: List[XmlNode] = [("pci_bus", "%02X" % int(pci["bus"])), ("pci_device", "%02X" % int(pci["device"])),
                              ("pci_domain", "%04X" % int(pci["domain"]))]
    if new:
        pci_xml += [("pci_base_class", "3"), ("pci_sub_class", "2")]
    atomics: List[XmlNode] = [("atomic_caps_outbound", NA), ("atomic_caps_inbound", NA)]
    pci_xml += [
        ("pci_device_id", "%08X" % int(pci["device_id"])), ("pci_bus_id", pci["bus_id"]),
        ("pci_sub_system_id", "%08X" % int(pci["subsystem_id"])),
        ("pci_gpu_link_info", [
            ("pcie_gen", [("max_link_gen", pc(pcie["gen_max"])), ("current_link_gen", pc(pcie["gen_current"])),
                          ("device_current_link_gen", pc(pcie["gen_current"])),
                          ("max_device_link_gen", pc(pcie["gen_gpu_max"])), ("max_host_link_gen", pc(pcie["gen_max"]))]),
            ("link_widths", [("max_link_width", pc("%dx" % int(pcie["width_max"]))),
                             ("current_link_width", pc("%dx" % int(pcie["width_current"])))])]),
        ("pci_bridge_chip", [("bridge_chip_type", NA), ("bridge_chip_fw", NA)]),
        ("replay_counter", pc(pcie.get("replay_counter", 0))), ("replay_rollover_counter", "0"),
        ("tx_util", "0 KB/s"), ("rx_util", "0 KB/s"),
    ]
    pci_xml += atomics if new else list(reversed(atomics))
    body.append(("pci", pci_xml))
    body.append(("fan_speed", "%d %%" % gpu["fan_percent"] if D.supported(gpu, "fan_speed") else NA))
    body.append(("performance_state", _sup(gpu, "performance_state", lambda: "P%d" % int(gpu.get("performance_state", 0)))))
    reasons_ok = D.supported(gpu, "clocks_event_reasons")
    body.append(("clocks_event_reasons", [
        ("clocks_event_reason_" + name, ("Active" if reasons & bit else "Not Active") if reasons_ok else NA)
        for name, bit in _EVENT_REASONS]))
    if new:
        body.append(("clocks_event_reasons_counters", [
            ("clocks_event_reasons_counters_" + name, "0 us" if reasons_ok else NA)
            for name in ("sw_power_cap", "sync_boost", "sw_therm_slowdown", "hw_therm_slowdown", "hw_power_brake")]))
        body.append(("sparse_operation_mode", "Disabled"))
    free = int(mem["total_mib"]) - int(mem["reserved_mib"]) - int(mem["used_mib"])
    body += [
        ("fb_memory_usage", [("total", _mib(mem["total_mib"]) if mem_ok else NA),
                             ("reserved", _mib(mem["reserved_mib"]) if mem_ok else NA),
                             ("used", _mib(mem["used_mib"]) if mem_ok else NA),
                             ("free", _mib(free) if mem_ok else NA)]),
        ("bar1_memory_usage", [("total", _mib(mem["bar1_total_mib"])), ("used", _mib(1)),
                               ("free", _mib(int(mem["bar1_total_mib"]) - 1))]),
        ("cc_protected_memory_usage", [("total", _mib(0)), ("used", _mib(0)), ("free", _mib(0))]),
        ("compute_mode", _sup(gpu, "compute_mode", lambda: _COMPUTE_MODE.get(int(gpu["compute_mode"]), "Default"))),
        ("utilization", [("gpu_util", "%d %%" % gpu["utilization"]["gpu"] if util_ok else NA),
                         ("memory_util", "%d %%" % gpu["utilization"]["memory"] if util_ok else NA),
                         ("encoder_util", "0 %" if util_ok else NA), ("decoder_util", "0 %" if util_ok else NA),
                         ("jpeg_util", "0 %" if util_ok else NA), ("ofa_util", "0 %" if util_ok else NA)]),
        ("encoder_stats", [("session_count", "0"), ("average_fps", "0"), ("average_latency", "0")]),
        ("fbc_stats", [("session_count", "0"), ("average_fps", "0"), ("average_latency", "0")]),
    ]
    if new:
        body.append(("dram_encryption_mode", [("current_dram_encryption", NA), ("pending_dram_encryption", NA)]))
    ecc_ok = D.supported(gpu, "ecc_mode")
    body += [
        ("ecc_mode", [("current_ecc", _enabled(gpu["ecc"]["current"]) if ecc_ok else NA),
                      ("pending_ecc", _enabled(gpu["ecc"]["pending"]) if ecc_ok else NA)]),
        ("ecc_errors", _ecc_errors_xml(ctx, gpu)),
        ("retired_pages", _retired_pages_xml(gpu)),
        ("remapped_rows", _remapped_rows_xml(gpu)),
        ("temperature", _temperature_xml(ctx, gpu)),
        ("supported_gpu_target_temp", [("gpu_target_temp_min", NA), ("gpu_target_temp_max", NA)]),
        ("gpu_power_readings", _power_xml(ctx, gpu)),
    ]
    module_power: List[XmlNode] = [("power_state", "P%d" % int(gpu.get("performance_state", 0)))]
    module_power += [("average_power_draw", NA), ("instant_power_draw", NA)] if new else [("power_draw", NA)]
    module_power += [(k, NA) for k in ("current_power_limit", "requested_power_limit", "default_power_limit",
                                       "min_power_limit", "max_power_limit")]
    if new:
        body.append(("gpu_memory_power_readings", [("average_power_draw", NA), ("instant_power_draw", NA)]))
    body.append(("module_power_readings", module_power))
    if new:
        body.append(("power_smoothing", NA))
        body.append(("power_profiles", [("power_profile_requested_profiles", NA),
                                        ("power_profile_enforced_profiles", NA)]))
    body += [
        ("clocks", [("graphics_clock", ck("graphics")), ("sm_clock", ck("sm")), ("mem_clock", ck("mem")),
                    ("video_clock", ck("video"))]),
        ("applications_clocks", [("graphics_clock", ck("app_graphics")), ("mem_clock", ck("app_mem"))]),
        ("default_applications_clocks", [("graphics_clock", ck("max_graphics")), ("mem_clock", ck("max_mem"))]),
        ("deferred_clocks", [("mem_clock", NA)]),
        ("max_clocks", [("graphics_clock", ck("max_graphics")), ("sm_clock", ck("max_sm")),
                        ("mem_clock", ck("max_mem")), ("video_clock", ck("max_video"))]),
        ("max_customer_boost_clocks", [("graphics_clock", ck("max_graphics"))]),
        ("clock_policy", [("auto_boost", NA), ("auto_boost_default", NA)]),
    ]
    if not new:
        body.append(("voltage", [("graphics_volt", NA)]))
    fstate, fstatus = _fabric_state(ctx, gpu)
    fabric: List[XmlNode] = [("state", fstate), ("status", fstatus)]
    if new:
        health_fields = ("summary", "bandwidth", "route_recovery_in_progress", "route_unhealthy",
                         "access_timeout_recovery", "incorrect_configuration")
        fabric += [("cliqueId", NA if fstate == NA else "0"), ("clusterUuid", NA),
                   ("health", [(k, NA) for k in health_fields])]
    body.append(("fabric", fabric))
    if clocks_ok:
        graphics = [("supported_graphics_clock", _mhz(int(clocks["max_graphics"]) - 15 * i)) for i in range(3)]
        body.append(("supported_clocks", [("supported_mem_clock", [("value", ck("max_mem"))] + graphics)]))
    else:
        body.append(("supported_clocks", NA))
    procs: List[XmlNode] = []
    if D.supported(gpu, "processes"):
        for proc in gpu.get("processes") or []:
            gi = proc.get("gpu_instance_id")
            ci = proc.get("compute_instance_id")
            procs.append(("process_info", [
                ("gpu_instance_id", NA if gi is None else str(gi)), ("compute_instance_id", NA if ci is None else str(ci)),
                ("pid", str(proc["pid"])), ("type", "C"), ("process_name", proc["name"]),
                ("used_memory", _mib(proc.get("used_mib") or 0))]))
    body.append(("processes", procs or None))
    body.append(("accounted_processes", None))
    if new:
        body.append(("capabilities", [("egm", "disabled")]))
    return ("gpu|id=\"%s\"" % pci["bus_id"], body)


def query_xml(ctx: Context, gpus: List[Dict[str, Any]], attached: int) -> str:
    """The whole ``nvidia-smi -q -x`` document for ``gpus`` (``attached`` = GPUs enumerated)."""
    major, minor = catalog.cuda_version(ctx.version)
    dtd = "nvsmi_device_v13.dtd" if ctx.branch >= 580 else "nvsmi_device_v12.dtd"
    head: List[XmlNode] = [
        ("timestamp", time.strftime("%a %b %e %H:%M:%S %Y")), ("driver_version", ctx.version),
        ("cuda_version", "%d.%d" % (major, minor)), ("attached_gpus", str(attached)),
    ]
    lines = ['<?xml version="1.0" ?>', '<!DOCTYPE nvidia_smi_log SYSTEM "%s">' % dtd, "<nvidia_smi_log>"]
    _render_xml(head, 1, lines)
    for gpu in gpus:
        _render_xml([gpu_xml(ctx, gpu)], 1, lines)
        lines.append("")
    if lines[-1] == "":
        lines.pop()
    lines.append("</nvidia_smi_log>")
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ CSV queries

_NOT_SUPPORTED = "[Not Supported]"
_NA_CSV = "[N/A]"


def _q(field: Optional[str], unit: str, get: Callable[[Context, Dict[str, Any]], Any]) -> Tuple[Optional[str], str, Any]:
    return field, unit, get


def _mw(key: str) -> Callable[[Context, Dict[str, Any]], str]:
    return lambda ctx, g: "%.2f" % (int(g["power"][key]) / 1000.0)


QUERY_FIELDS: Dict[str, Tuple[Optional[str], str, Callable[[Context, Dict[str, Any]], Any]]] = {
    "index": _q(None, "", lambda ctx, g: str(ctx.node.enumerated(ctx.state).index(g))),
    "count": _q(None, "", lambda ctx, g: str(len(ctx.node.enumerated(ctx.state)))),
    "name": _q(None, "", lambda ctx, g: g["name"]),
    "uuid": _q(None, "", lambda ctx, g: g["uuid"]),
    "serial": _q("serial", "", lambda ctx, g: g["serial"]),
    "pci.bus_id": _q(None, "", lambda ctx, g: g["pci"]["bus_id"]),
    "pci.device_id": _q(None, "", lambda ctx, g: "0x%08X" % int(g["pci"]["device_id"])),
    "driver_version": _q(None, "", lambda ctx, g: ctx.version),
    "vbios_version": _q("vbios_version", "", lambda ctx, g: g["vbios_version"]),
    "persistence_mode": _q("persistence_mode", "", lambda ctx, g: _enabled(g["persistence_mode"])),
    "compute_mode": _q("compute_mode", "", lambda ctx, g: _COMPUTE_MODE.get(int(g["compute_mode"]), "Default")),
    "pstate": _q("performance_state", "", lambda ctx, g: "P%d" % int(g.get("performance_state", 0))),
    "power.draw": _q("power_usage", "W", lambda ctx, g: "%.2f" % (int(g["power"]["draw_mw"]) / 1000.0)),
    "power.limit": _q("power_limit", "W", _mw("limit_mw")),
    "enforced.power.limit": _q("power_limit", "W", _mw("limit_mw")),
    "power.default_limit": _q("power_limit", "W", _mw("default_mw")),
    "power.min_limit": _q("power_limit", "W", _mw("min_mw")),
    "power.max_limit": _q("power_limit", "W", _mw("max_mw")),
    "ecc.mode.current": _q("ecc_mode", "", lambda ctx, g: _enabled(g["ecc"]["current"])),
    "ecc.mode.pending": _q("ecc_mode", "", lambda ctx, g: _enabled(g["ecc"]["pending"])),
    "ecc.errors.corrected.volatile.total": _q("ecc_errors", "", lambda ctx, g: str(g["ecc"]["volatile"]["corrected"])),
    "ecc.errors.corrected.aggregate.total": _q("ecc_errors", "", lambda ctx, g: str(g["ecc"]["aggregate"]["corrected"])),
    "ecc.errors.uncorrected.volatile.total": _q("ecc_errors", "", lambda ctx, g: str(g["ecc"]["volatile"]["uncorrected"])),
    "ecc.errors.uncorrected.aggregate.total": _q("ecc_errors", "", lambda ctx, g: str(g["ecc"]["aggregate"]["uncorrected"])),
    "mig.mode.current": _q("mig_mode", "", lambda ctx, g: _enabled(g["mig"]["current"])),
    "mig.mode.pending": _q("mig_mode", "", lambda ctx, g: _enabled(g["mig"]["pending"])),
    "temperature.gpu": _q("temperature", "", lambda ctx, g: str(g["temperature"]["gpu"])),
    "temperature.memory": _q("temperature", "", lambda ctx, g: NA if g["temperature"].get("memory") is None
                             else str(g["temperature"]["memory"])),
    "clocks.current.graphics": _q("clocks", "MHz", lambda ctx, g: str(g["clocks"]["graphics"])),
    "clocks.current.sm": _q("clocks", "MHz", lambda ctx, g: str(g["clocks"]["sm"])),
    "clocks.current.memory": _q("clocks", "MHz", lambda ctx, g: str(g["clocks"]["mem"])),
    "clocks.max.graphics": _q("clocks", "MHz", lambda ctx, g: str(g["clocks"]["max_graphics"])),
    "clocks.max.sm": _q("clocks", "MHz", lambda ctx, g: str(g["clocks"]["max_sm"])),
    "clocks.max.memory": _q("clocks", "MHz", lambda ctx, g: str(g["clocks"]["max_mem"])),
    "clocks_event_reasons.active": _q("clocks_event_reasons", "", lambda ctx, g: "0x%016X" % int(g["clocks_event_reasons"])),
    "memory.total": _q("memory", "MiB", lambda ctx, g: str(g["memory"]["total_mib"])),
    "memory.reserved": _q("memory", "MiB", lambda ctx, g: str(g["memory"]["reserved_mib"])),
    "memory.used": _q("memory", "MiB", lambda ctx, g: str(g["memory"]["used_mib"])),
    "memory.free": _q("memory", "MiB", lambda ctx, g: str(
        int(g["memory"]["total_mib"]) - int(g["memory"]["reserved_mib"]) - int(g["memory"]["used_mib"]))),
    "utilization.gpu": _q("utilization", "%", lambda ctx, g: str(g["utilization"]["gpu"])),
    "utilization.memory": _q("utilization", "%", lambda ctx, g: str(g["utilization"]["memory"])),
    "pcie.link.gen.current": _q("pcie", "", lambda ctx, g: str(g["pcie"]["gen_current"])),
    "pcie.link.gen.max": _q("pcie", "", lambda ctx, g: str(g["pcie"]["gen_max"])),
    "pcie.link.gen.gpumax": _q("pcie", "", lambda ctx, g: str(g["pcie"]["gen_gpu_max"])),
    "pcie.link.width.current": _q("pcie", "", lambda ctx, g: str(g["pcie"]["width_current"])),
    "pcie.link.width.max": _q("pcie", "", lambda ctx, g: str(g["pcie"]["width_max"])),
    "retired_pages.pending": _q("retired_pages", "", lambda ctx, g: "Yes" if g["retired_pages"].get("pending") else "No"),
}
_ALIASES = {
    "gpu_name": "name", "gpu_uuid": "uuid", "gpu_serial": "serial", "gpu_bus_id": "pci.bus_id",
    "clocks.gr": "clocks.current.graphics", "clocks.sm": "clocks.current.sm", "clocks.mem": "clocks.current.memory",
    "clocks.max.gr": "clocks.max.graphics", "clocks.max.mem": "clocks.max.memory",
    "clocks_throttle_reasons.active": "clocks_event_reasons.active", "power.management": "persistence_mode",
    "pcie.link.gen.gpucurrent": "pcie.link.gen.current", "pcie.link.gen.hostmax": "pcie.link.gen.max",
    "persistence.mode": "persistence_mode",
}


def query_csv(ctx: Context, gpus: List[Dict[str, Any]], fields: Sequence[str], header: bool, units: bool) -> str:
    """``--query-gpu`` output. Raises ValueError naming the first unknown field."""
    resolved = []
    for name in fields:
        key = _ALIASES.get(name, name)
        if key not in QUERY_FIELDS:
            raise ValueError(name)
        resolved.append((name, QUERY_FIELDS[key]))
    lines = []
    if header:
        lines.append(", ".join("%s [%s]" % (name, spec[1]) if spec[1] and units else name for name, spec in resolved))
    for gpu in gpus:
        row = []
        for _name, (field, unit, get) in resolved:
            if field is not None and not D.supported(gpu, field):
                row.append(_NOT_SUPPORTED)
                continue
            value = get(ctx, gpu)
            if value == NA:
                row.append(_NA_CSV)
            elif unit and units:
                row.append("%s %s" % (value, unit))
            else:
                row.append(value)
        lines.append(", ".join(row))
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------ table and list


def list_gpus(ctx: Context, gpus: List[Dict[str, Any]]) -> str:
    """``nvidia-smi -L``."""
    out = []
    for gpu in gpus:
        out.append("GPU %d: %s (UUID: %s)" % (ctx.node.enumerated(ctx.state).index(gpu), gpu["name"], gpu["uuid"]))
        for index, mig in enumerate(D.mig_devices(gpu)):
            from .nvmlfake import _mig_uuid

            uuid = _mig_uuid(gpu, mig["gi_id"], mig["ci_id"])
            out.append("  MIG %-13s Device %2d: (UUID: %s)" % (mig["profile"]["name"], index, uuid))
    return "\n".join(out) + ("\n" if out else "")


def summary_table(ctx: Context, gpus: List[Dict[str, Any]]) -> str:
    """The default ``nvidia-smi`` table (layout of R550 and later, 89 columns)."""
    major, minor = catalog.cuda_version(ctx.version)

    def row(text: str) -> str:
        return "| " + text.ljust(88) + "|"

    top = "+" + "-" * 89 + "+"
    sep = "+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+"
    out = [time.strftime("%a %b %e %H:%M:%S %Y"), top,
           row("NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %s"
               % (ctx.version, ctx.version, "%d.%d" % (major, minor))),
           "|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+",
           "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
           "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
           "|                                         |                        |               MIG M. |",
           "|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|"]
    for gpu in gpus:
        index = ctx.node.enumerated(ctx.state).index(gpu)
        pm = "On" if int(gpu["persistence_mode"]) else "Off"
        ecc = str(gpu["ecc"]["volatile"]["uncorrected"]) if int(gpu["ecc"]["current"]) else "Off"
        draw = "%4dW" % (int(gpu["power"]["draw_mw"]) // 1000) if D.supported(gpu, "power_usage") else " N/A"
        cap = "%4dW" % (int(gpu["power"]["limit_mw"]) // 1000) if D.supported(gpu, "power_limit") else " N/A"
        mem = "%dMiB / %6dMiB" % (int(gpu["memory"]["used_mib"]), int(gpu["memory"]["total_mib"]))
        util = "%d%%" % gpu["utilization"]["gpu"] if D.supported(gpu, "utilization") else "N/A"
        mode = _COMPUTE_MODE.get(int(gpu["compute_mode"]), "Default")
        migm = _enabled(gpu["mig"]["current"]) if D.supported(gpu, "mig_mode") else "N/A"
        left = ("%4d  %s" % (index, gpu["name"])).ljust(37)[:37] + pm.ljust(4)
        power = "%s / %s " % (draw, cap)
        seg1 = (" N/A   %2dC    P%d" % (int(gpu["temperature"]["gpu"]), int(gpu.get("performance_state", 0))))
        out.append("|%s|   %s Off | %20s |" % (left, gpu["pci"]["bus_id"], ecc))
        out.append("|%s%s|%s |%8s %12s |" % (seg1, power.rjust(41 - len(seg1)), mem.rjust(23), util, mode))
        out.append("|%s|%s| %20s |" % (" " * 41, " " * 24, migm))
        out.append(sep)
    out += ["", top, row("Processes:"),
            row(" GPU   GI   CI              PID   Type   Process name                        GPU Memory"),
            row("       ID   ID                                                               Usage"),
            "|" + "=" * 89 + "|"]
    procs = [(ctx.node.enumerated(ctx.state).index(g), p) for g in gpus for p in g.get("processes") or []]
    if not procs:
        out.append(row(" No running processes found"))
    for index, proc in procs:
        out.append(row(" %4d   N/A  N/A   %10d      C   %-35s %7dMiB" % (
            index, int(proc["pid"]), proc["name"][:35], int(proc.get("used_mib") or 0))))
    out.append(top)
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------ command line


class _Args:
    def __init__(self) -> None:
        self.query = False
        self.xml = False
        self.list = False
        self.ids: Optional[List[str]] = None
        self.query_gpu: Optional[List[str]] = None
        self.format: List[str] = []
        self.setter: Optional[Tuple[str, str]] = None
        self.reset = False
        self.filename: Optional[str] = None
        self.help = False


_SETTERS = {"-pm": "pm", "--persistence-mode": "pm", "-pl": "pl", "--power-limit": "pl", "-e": "e",
            "--ecc-config": "e", "-c": "c", "--compute-mode": "c", "-mig": "mig", "--multi-instance-gpu": "mig"}


def _parse(argv: Sequence[str]) -> _Args:
    args = _Args()
    items = list(argv)
    while items:
        item = items.pop(0)
        key, value = (item.split("=", 1) + [None])[:2] if item.startswith("--") else (item, None)

        def take() -> str:
            if value is not None:
                return value
            if not items:
                raise ValueError(item)
            return items.pop(0)

        if key in ("-h", "--help"):
            args.help = True
        elif key in ("-q", "--query"):
            args.query = True
        elif key in ("-x", "--xml-format"):
            args.xml = True
        elif key in ("-L", "--list-gpus"):
            args.list = True
        elif key in ("-i", "--id"):
            args.ids = [part.strip() for part in take().split(",") if part.strip()]
        elif key == "--query-gpu":
            args.query_gpu = [part.strip() for part in take().split(",") if part.strip()]
        elif key == "--format":
            args.format = [part.strip() for part in take().split(",")]
        elif key in ("-f", "--filename"):
            args.filename = take()
        elif key in ("-r", "--gpu-reset"):
            args.reset = True
        elif key in _SETTERS:
            args.setter = (_SETTERS[key], take())
        elif key in ("-d", "--display"):
            take()
        else:
            raise ValueError(item)
    return args


def _select(ctx: Context, ids: Optional[List[str]]) -> List[Dict[str, Any]]:
    gpus = ctx.node.enumerated(ctx.state)
    if not ids:
        return gpus
    chosen = []
    for ident in ids:
        match = None
        if ident.isdigit() and int(ident) < len(gpus):
            match = gpus[int(ident)]
        else:
            low = ident.lower()
            for gpu in gpus:
                bus = gpu["pci"]["bus_id"].lower()
                if low in (gpu["uuid"].lower(), gpu["serial"], bus, bus[4:]):
                    match = gpu
        if match is None:
            raise LookupError(ident)
        if match not in chosen:
            chosen.append(match)
    return chosen


def _setter(ctx: Context, gpus: List[Dict[str, Any]], what: str, raw: str, out: List[str]) -> int:
    node = ctx.node
    if what == "pl":
        try:
            watts = float(raw)
        except ValueError:
            out.append("Invalid power limit %s." % raw)
            return 2
    elif what == "c":
        mode = _COMPUTE_MODE_ARG.get(raw.upper(), int(raw) if raw.isdigit() else -1)
        if mode not in (0, 1, 2, 3):
            out.append('Invalid compute mode "%s".' % raw)
            return 2
    elif raw not in ("0", "1"):
        out.append("Invalid value %s." % raw)
        return 2
    for gpu in gpus:
        bus = gpu["pci"]["bus_id"]
        index = gpu["index"]
        try:
            if what == "pm":
                before = int(gpu["persistence_mode"])
                D.set_persistence_mode(node, index, int(raw))
                word = _enabled(int(raw))
                if before == int(raw):
                    out.append("Persistence mode is already %s for GPU %s." % (word, bus))
                else:
                    out.append("%s Legacy persistence mode for GPU %s." % (word, bus))
            elif what == "pl":
                power = gpu["power"]
                if not D.supported(gpu, "power_limit"):
                    raise SimError(D.NOT_SUPPORTED)
                milliwatts = int(round(watts * 1000))
                if not power["min_mw"] <= milliwatts <= power["max_mw"]:
                    out.append("Provided power limit %.2f W is not a valid power limit which should be between "
                               "%.2f W and %.2f W for GPU %s" % (watts, power["min_mw"] / 1000.0,
                                                                 power["max_mw"] / 1000.0, bus))
                    out.append("Terminating early due to previous errors.")
                    return 2
                before = int(power["limit_mw"])
                D.set_power_limit(node, index, milliwatts)
                out.append("Power limit for GPU %s was set to %.2f W from %.2f W." % (bus, watts, before / 1000.0))
                if not int(gpu["persistence_mode"]):
                    out.append("Warning: persistence mode is disabled on device %s. See the Known Issues section of "
                               "the nvidia-smi(1) man page for more information. Run with [--help | -h] switch to get "
                               "more information on how to enable persistence mode." % bus)
            elif what == "e":
                pending = int(gpu["ecc"]["pending"]) if D.supported(gpu, "ecc_mode") else None
                D.set_ecc_mode(node, index, int(raw))
                if pending == int(raw):
                    out.append("ECC support is already %s for GPU %s." % (_enabled(int(raw)), bus))
                else:
                    out.append("%s ECC support for GPU %s." % (_enabled(int(raw)), bus))
            elif what == "c":
                before = int(gpu["compute_mode"])
                D.set_compute_mode(node, index, mode)
                name = _COMPUTE_MODE[mode].upper()
                if before == mode:
                    out.append("Compute mode is already set to %s for GPU %s." % (name, bus))
                else:
                    out.append("Set compute mode to %s for GPU %s." % (name, bus))
            elif what == "mig":
                status = D.set_mig_mode(node, index, int(raw))
                word = "enable" if raw == "1" else "disable"
                if status == D.SUCCESS:
                    out.append("%sd MIG Mode for GPU %s" % (word.capitalize(), bus))
                else:
                    out.append("Warning: MIG mode is in pending %s state for GPU %s:%s" % (
                        word, bus, D.ERROR_STRING[D.RESET_REQUIRED]))
                    out.append("Reboot the system or try nvidia-smi --gpu-reset to make MIG mode effective on GPU %s"
                               % bus)
        except SimError as err:
            if err.code == D.NOT_SUPPORTED:
                label = {"pm": "persistence mode", "pl": None, "e": "ECC config", "c": "compute mode",
                         "mig": "MIG Mode"}[what]
                if label is None:
                    out.append("Changing power management limit is not supported for GPU: %s." % bus)
                else:
                    out.append("Unable to set %s for GPU %s: Not Supported" % (label, bus))
                out.append("Treating as warning and moving on.")
                continue
            if what == "pl":
                out.append("Failed to set power management limit for GPU %s: %s" % (bus, D.ERROR_STRING.get(err.code)))
            elif what == "mig":
                out.append("Unable to %s MIG Mode for GPU %s: %s" % ("enable" if raw == "1" else "disable", bus,
                                                                     D.ERROR_STRING.get(err.code)))
            else:
                label = {"pm": "persistence mode", "e": "ECC config", "c": "compute mode"}[what]
                out.append("Unable to set %s for GPU %s: %s" % (label, bus, D.ERROR_STRING.get(err.code)))
            out.append("Terminating early due to previous errors.")
            return err.code
    out.append("All done.")
    if what == "e":
        out.append("Reboot required.")
    return 0


def _reset(ctx: Context, gpus: List[Dict[str, Any]], out: List[str]) -> int:
    failed = []
    for gpu in gpus:
        try:
            D.reset_gpu(ctx.node, gpu["index"])
        except SimError as err:
            if err.code == D.NO_PERMISSION:
                out.append("Unable to reset GPU %s: Insufficient Permissions" % gpu["pci"]["bus_id"])
                out.append("Terminating early due to previous errors.")
                return D.NO_PERMISSION
            failed.append((gpu, err.code))
            continue
        out.append("GPU %s was successfully reset." % gpu["pci"]["bus_id"])
    if failed:
        out.append("The following GPUs could not be reset:")
        for gpu, code in failed:
            out.append("  GPU %s: %s" % (gpu["pci"]["bus_id"], D.ERROR_STRING.get(code, "Unknown Error")))
        out.append("")
        busy = [g for g, code in failed if code == D.IN_USE]
        if busy:
            out.append("%d device%s currently being used by one or more other processes (e.g., Fabric Manager, CUDA "
                       "application, graphics application such as an X server, or a monitoring application such as "
                       "another instance of nvidia-smi). Please first kill all processes using %s and all compute "
                       "applications running in the system." % (
                           len(busy), " is" if len(busy) == 1 else "s are", "this device" if len(busy) == 1
                           else "these devices"))
        return 255
    out.append("All done.")
    return 0


def main(argv: Sequence[str], root: Optional[str] = None, stdout: TextIO = sys.stdout,
         stderr: TextIO = sys.stderr) -> int:
    """Run ``nvidia-smi argv`` against the node at ``root``; return the exit code."""
    try:
        args = _parse(argv)
    except ValueError:
        stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
        return 2
    if args.help:
        stdout.write("NVIDIA System Management Interface -- simulated for the gpufleet.nvidia test fleet.\n\n"
                     "Supported: -L, -q -x, --query-gpu=... --format=csv[,noheader][,nounits], -i, -pm, -pl, -e, "
                     "-c, -mig, -r, -f.\n")
        return 0
    node = D.Node(root_dir(root))
    try:
        version = node.driver_version()
    except SimError as err:
        if err.code == D.LIBRARY_NOT_FOUND:
            stdout.write("NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the "
                         "NVIDIA Display Driver is properly installed and present in your system.\nPlease also try "
                         "adding directory that contains libnvidia-ml.so to your system PATH.\n")
        elif err.code == D.DRIVER_NOT_LOADED:
            stdout.write("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
                         "that the latest NVIDIA driver is installed and running.\n\n")
        elif err.code == D.LIB_RM_VERSION_MISMATCH:
            library = driver.userspace_version(node.root) or ""
            stdout.write("Failed to initialize NVML: Driver/library version mismatch\n"
                         "NVML library version: %s\n" % ".".join(library.split(".")[:2]))
        else:
            stdout.write("Failed to initialize NVML: %s\n" % D.ERROR_STRING.get(err.code, "Unknown Error"))
        return err.code
    ctx = Context(node, version)
    try:
        selected = _select(ctx, args.ids)
    except LookupError:
        stdout.write("No devices were found\n")
        return D.NOT_FOUND
    lost = [g for g in selected if D.is_lost(g)]
    usable = [g for g in selected if not D.is_lost(g)]
    for gpu in lost:
        stderr.write(_lost_message(gpu) + "\n")
    lines: List[str] = []
    if args.setter:
        code = _setter(ctx, usable, args.setter[0], args.setter[1], lines)
    elif args.reset:
        code = _reset(ctx, usable, lines)
    elif args.query_gpu is not None:
        fmt = [part for part in args.format if part]
        if not fmt or fmt[0] != "csv":
            stdout.write('"--format=" switch is missing. Please run \'nvidia-smi -h\' for help.\n')
            return 2
        try:
            text = query_csv(ctx, usable, args.query_gpu, "noheader" not in fmt, "nounits" not in fmt)
        except ValueError as err:
            stdout.write('Field "%s" is not a valid field to query.\n\n' % err)
            return 2
        lines = [text.rstrip("\n")]
        code = 0
    elif args.query and args.xml:
        lines = [query_xml(ctx, usable, len(node.enumerated(ctx.state))).rstrip("\n")]
        code = 0
    elif args.list:
        lines = [list_gpus(ctx, usable).rstrip("\n")]
        code = 0
    elif args.query or args.xml:
        stdout.write("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\n\n")
        return 2
    else:
        lines = [summary_table(ctx, usable).rstrip("\n")]
        code = 0
    text = "\n".join(lines) + "\n" if lines else ""
    if args.filename:
        with open(args.filename, "w", encoding="utf-8") as handle:
            handle.write(text)
    else:
        stdout.write(text)
    if lost and code == 0:
        return D.GPU_IS_LOST
    return code
