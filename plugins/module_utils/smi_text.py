# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse the human-readable ``nvidia-smi -q`` output into the facts model.

``nvidia-smi -q`` (also with ``-d POWER`` and the other display filters) prints a banner
``==============NVSMI LOG==============``, a few ``Key : Value`` lines (driver and CUDA version,
attached GPUs), then one section per GPU headed ``GPU 00000000:07:00.0``. Inside, a line is
either ``Label : value`` or a section label alone, whose contents are indented deeper.

This module walks those sections once (:func:`_section_tree`), naming every label with the
element name ``nvidia-smi -q -x`` uses for the same value (:data:`_TEXT_TO_XML`, plus a
mechanical lower_snake_case rule for the labels that need no table entry). The tree it builds is
the one the XML parser reads, and :func:`smi_xml.facts_from_smi_tree` turns it into facts, so
both formats give the same facts by the same code.

Pure: no file or process I/O; standard library only. Compatible with Python 3.7.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple
from xml.etree import ElementTree

from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import (
    ROOT_TAG,
    SmiParseError,
    smi_output_text,
    line_excerpt,
    facts_from_smi_tree,
    gpu_count_warnings,
)

BANNER = "==============NVSMI LOG=============="

# Text label (lower-case, single spaces) → XML element name, per enclosing XML element;
# the entry under None applies anywhere. Labels not listed here take the mechanical name
# (lower-case, non-alphanumerics → "_"), which already equals the XML name for most of them
# ("Product Name" → product_name, "FB Memory Usage" → fb_memory_usage, "SRAM Correctable" →
# sram_correctable). Source: the text and XML forms of the same nvidia-smi outputs
# (drivers R515-R595), e.g. field case 01 (XML) beside field case 04 (text).
_CLOCK_LABELS = {"graphics": "graphics_clock", "sm": "sm_clock", "memory": "mem_clock", "video": "video_clock"}
_POWER_LABELS = {"instantaneous power draw": "instant_power_draw"}
_REASON_LABELS = {
    "idle": "clocks_event_reason_gpu_idle",
    "applications clocks setting": "clocks_event_reason_applications_clocks_setting",
    "sw power cap": "clocks_event_reason_sw_power_cap",
    "hw slowdown": "clocks_event_reason_hw_slowdown",
    "hw thermal slowdown": "clocks_event_reason_hw_thermal_slowdown",
    "hw power brake slowdown": "clocks_event_reason_hw_power_brake_slowdown",
    "sync boost": "clocks_event_reason_sync_boost",
    "sw thermal slowdown": "clocks_event_reason_sw_thermal_slowdown",
    "display clock setting": "clocks_event_reason_display_clocks_setting",
}
_TEXT_TO_XML: Dict[Optional[str], Dict[str, str]] = {
    None: {},
    "gpu": {
        "serial number": "serial",
        "gpu uuid": "uuid",
    },
    "pci": {
        "bus id": "pci_bus_id",
        "device id": "pci_device_id",
        "sub system id": "pci_sub_system_id",
        "gpu link info": "pci_gpu_link_info",
    },
    "pci_gpu_link_info": {"pcie generation": "pcie_gen", "link width": "link_widths"},
    "pcie_gen": {
        "max": "max_link_gen",
        "current": "current_link_gen",
        "device current": "device_current_link_gen",
        "device max": "max_device_link_gen",
        "host max": "max_host_link_gen",
    },
    "link_widths": {"max": "max_link_width", "current": "current_link_width"},
    "mig_mode": {"current": "current_mig", "pending": "pending_mig"},
    "ecc_mode": {"current": "current_ecc", "pending": "pending_ecc"},
    "utilization": {"gpu": "gpu_util", "memory": "memory_util", "encoder": "encoder_util",
                    "decoder": "decoder_util", "jpeg": "jpeg_util", "ofa": "ofa_util"},
    "volatile": {"sram uncorrectable sec-ded": "sram_uncorrectable_secded"},
    "aggregate": {"sram uncorrectable sec-ded": "sram_uncorrectable_secded"},
    "retired_pages": {
        "single bit ecc": "multiple_single_bit_retirement",
        "double bit ecc": "double_bit_retirement",
        "pending page blacklist": "pending_blacklist",
        "pending page retirement": "pending_retirement",
    },
    "remapped_rows": {
        "correctable error": "remapped_row_corr",
        "uncorrectable error": "remapped_row_unc",
        "pending": "remapped_row_pending",
        "remapping failure occurred": "remapped_row_failure",
        "bank remap availability histogram": "row_remapper_histogram",
    },
    "temperature": {"gpu current temp": "gpu_temp", "memory current temp": "memory_temp"},
    "gpu_power_readings": _POWER_LABELS,
    "power_readings": _POWER_LABELS,
    "clocks": _CLOCK_LABELS,
    "max_clocks": _CLOCK_LABELS,
    "applications_clocks": _CLOCK_LABELS,
    "default_applications_clocks": _CLOCK_LABELS,
    "clocks_event_reasons": _REASON_LABELS,
    "clocks_throttle_reasons": _REASON_LABELS,
    "processes": {"process id": "pid", "name": "process_name", "used gpu memory": "used_memory"},
}

# "Label    : value": the colon is preceded by white space, so "GPU 00000000:07:00.0" is a header.
_KEY_VALUE = re.compile(r"^(?P<key>\S.*?)\s+:(?:\s(?P<value>.*))?$")
_GPU_HEADER = re.compile(r"^GPU\s+(?P<bus>(?:[0-9A-Fa-f]{4,8}:)?[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])$")
_TOP_LEVEL_KEYS = ("timestamp", "driver_version", "cuda_version", "attached_gpus")


def parse_nvidia_smi_text(text: Any) -> Dict[str, Any]:
    """Parse the human-readable output of ``nvidia-smi -q`` (optionally ``-d SECTION,...``).

    :param text: the output, ``str`` (``bytes`` are decoded as UTF-8). Lines before the
        ``NVSMI LOG`` banner (a shell prompt, the command line) are skipped with a warning; only
        the first log is read when several follow each other (``nvidia-smi -q -l``).
    :returns: the same shape as :func:`smi_xml.parse_nvidia_smi_xml`:
        ``{"driver": {"userspace_version", "cuda_driver_version"}, "attached_gpus": int|None,
        "gpus": [facts_model.new_gpu records], "warnings": [str]}``. Fields whose section was not
        printed (e.g. with ``-d POWER``) stay ``None``; "no value" words become ``None``.
    :raises SmiParseError: for empty input, binary data, text without the ``NVSMI LOG`` banner
        (e.g. ``lspci`` output or an nvidia-smi error message), or a log without any
        ``Key : Value`` line; the message names the line where parsing stopped.

    Source: ``nvidia-smi -q`` (nvidia-smi(1), "-q, --query"), drivers R515 to R595.
    """
    text = smi_output_text(text, "nvidia-smi -q output")
    lines = text.expandtabs(8).splitlines()
    for number, line in enumerate(lines, 1):
        bad = re.search(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\ufffd]", line)
        if bad:
            raise SmiParseError(
                "expected nvidia-smi -q text, found binary data at line %d, column %d; parsing stopped there"
                % (number, bad.start() + 1))
    if not any(line.strip() for line in lines):
        raise SmiParseError("nvidia-smi -q output is empty; expected the %r banner" % BANNER)
    start = next((i for i, line in enumerate(lines) if line.strip() == BANNER), None)
    if start is None:
        first = next(line for line in lines if line.strip())
        raise SmiParseError(
            "expected the %r banner of nvidia-smi -q output; none found in %d line(s) (first line: %s)"
            % (BANNER, len(lines), line_excerpt(first)))
    warnings = []
    if any(line.strip() for line in lines[:start]):
        warnings.append("skipped %d line(s) before the nvidia-smi -q banner at line %d" % (start, start + 1))
    root, tree_warnings = _section_tree(lines, start + 1)
    if not any(child.tag in _TOP_LEVEL_KEYS or child.tag == "gpu" for child in root):
        raise SmiParseError(
            "expected 'Key : Value' lines after the nvidia-smi -q banner at line %d; found none before the end "
            "(line %d)" % (start + 1, len(lines)))
    result = facts_from_smi_tree(root, "smi-text")
    result["warnings"] = (warnings + gpu_count_warnings(result["attached_gpus"], len(result["gpus"]), "GPU section")
                          + tree_warnings)
    return result


def _section_tree(lines: List[str], first: int) -> Tuple[ElementTree.Element, List[str]]:
    """Build the ``<nvidia_smi_log>`` element tree of the log starting at ``lines[first]``.

    The one walker of the text format: indentation gives nesting; a ``Label : value`` line is a
    leaf (lines indented under it, such as "HW Thermal Slowdown" under "HW Slowdown", or "Type"
    under "Process ID", are its siblings, as in the XML); a label alone opens a section. Labels
    are named by :func:`_xml_name`. Two format-forced reshapes follow: the flat process list is
    grouped into ``<process_info>`` elements, and each ``GPU <bus id>`` header becomes
    ``<gpu id="...">``.

    :returns: ``(root, warnings)``; warnings name top-level lines that are not nvidia-smi output
        (which are skipped). Stops at a second banner.
    """
    root = ElementTree.Element(ROOT_TAG)
    stack: List[Tuple[int, ElementTree.Element]] = [(-1, root)]
    warnings: List[str] = []
    for number in range(first, len(lines)):
        line = lines[number]
        if not line.strip():
            continue
        if line.strip() == BANNER:
            warnings.append("read only the first nvidia-smi -q log; another begins at line %d" % (number + 1))
            break
        indent = len(line) - len(line.lstrip(" "))
        while stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1]
        body = line.strip()
        match = _KEY_VALUE.match(body)
        gpu = _GPU_HEADER.match(body) if match is None else None
        if parent is root and gpu is not None:
            element = ElementTree.SubElement(root, "gpu", {"id": gpu.group("bus")})
            stack.append((indent, element))
        elif match is not None:
            tag = _xml_name(parent.tag, match.group("key"))
            if parent is root and tag not in _TOP_LEVEL_KEYS:
                warnings.append("line %d: skipped %s, unknown at the top level of nvidia-smi -q output" % (number + 1, line_excerpt(body)))
                continue
            ElementTree.SubElement(parent, tag).text = match.group("value") or ""
        elif parent is root:
            warnings.append("line %d: skipped %s, unknown at the top level of nvidia-smi -q output" % (number + 1, line_excerpt(body)))
        else:
            element = ElementTree.SubElement(parent, _xml_name(parent.tag, body))
            stack.append((indent, element))
    for processes in root.iter("processes"):
        _group_processes(processes)
    return root, warnings


def _xml_name(parent_tag: str, label: str) -> str:
    """The ``nvidia-smi -q -x`` element name of a text label inside ``parent_tag``."""
    key = " ".join(label.lower().split())
    for table in (_TEXT_TO_XML.get(parent_tag, {}), _TEXT_TO_XML[None]):
        if key in table:
            return table[key]
    return re.sub(r"[^a-z0-9]+", "_", key).strip("_") or "unnamed"


def _group_processes(section: ElementTree.Element) -> None:
    """Regroup the flat text process list into ``<process_info>`` children, as in the XML.

    A process starts at "GPU instance ID" (printed first for every process) or, where that is
    absent, at a "Process ID" when the current group already holds one.
    """
    children = list(section)
    if not children:
        return
    groups: List[ElementTree.Element] = []
    for child in children:
        section.remove(child)
        tags = {element.tag for element in groups[-1]} if groups else set()
        if not groups or child.tag == "gpu_instance_id" or (child.tag == "pid" and "pid" in tags):
            groups.append(ElementTree.Element("process_info"))
        groups[-1].append(child)
    section.extend(groups)
