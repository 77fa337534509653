# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Parse ``nvidia-smi -q -x`` (XML) into the facts model.

``nvidia-smi -q -x`` prints one ``<nvidia_smi_log>`` document per call, described by the DTD
named in its DOCTYPE (``nvsmi_device_v11.dtd`` for drivers around R515, ``v12`` from R535,
``v13`` from R570). The element names used here are those of the documents that nvidia-smi
prints for those drivers; where the schema changed between versions both names are read:

* power: ``<power_readings>`` (``power_limit``, ``enforced_power_limit``) up to v11,
  ``<gpu_power_readings>`` (``current_power_limit``, ``requested_power_limit``, and
  ``average_power_draw``/``instant_power_draw`` instead of ``power_draw`` on newer drivers);
* clocks event reasons: ``<clocks_throttle_reasons>`` before R535, ``<clocks_event_reasons>`` after;
* ECC counters: ``<single_bit>``/``<double_bit>`` per memory location (old), then
  ``sram_correctable``/``sram_uncorrectable``/``dram_*`` (v11, v12), then
  ``sram_uncorrectable_parity``/``sram_uncorrectable_secded`` (v13);
* ``<remapped_rows>`` is the scalar ``N/A`` on GPUs without row remapping, a block otherwise.

The walk from the element tree to facts (:func:`gpus_from_smi_tree`) is shared with the
``nvidia-smi -q`` text parser (:mod:`smi_text`), which builds the same tree from text.

Pure: no file or process I/O. Standard library only (``xml.etree.ElementTree``); the DOCTYPE is
removed before parsing and entity declarations are refused, so nothing external is ever loaded.
Compatible with Python 3.7.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional
from xml.etree import ElementTree

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import (
    CLOCKS_EVENT_REASON_BITS,
    new_gpu,
    new_gpu_extended,
    new_mig_device,
    normalize_pci_bus_id,
    null_if_na,
    parse_enabled,
    parse_int,
    parse_number,
)

ROOT_TAG = "nvidia_smi_log"


class SmiParseError(ValueError):
    """The text given is not ``nvidia-smi`` output of the expected kind.

    The message says what was expected and where parsing stopped (line and column, or the
    offending line), so that an operator can tell a truncated capture from the wrong file.
    """


# --------------------------------------------------------------------------------------------
# Entry point for XML
# --------------------------------------------------------------------------------------------

_DOCTYPE = re.compile(r"<!DOCTYPE\s[^>\[]*(?:\[[^\]]*\])?\s*>", re.IGNORECASE)


def parse_nvidia_smi_xml(text: Any) -> Dict[str, Any]:
    """Parse the output of ``nvidia-smi -q -x``.

    :param text: the whole output, ``str`` (``bytes`` are decoded as UTF-8).
    :returns: ``{"driver": {"userspace_version": str|None, "cuda_driver_version": str|None},
        "attached_gpus": int|None, "gpus": [gpu record], "warnings": [str]}``. Each gpu record
        is a :func:`facts_model.new_gpu` dictionary (``index`` = position of the ``<gpu>``
        element, 0-based) filled with every field the document holds; every "no value" word
        ("N/A", "[Not Supported]", "[Requested functionality has been deprecated]", ...) is
        ``None``. See :func:`gpus_from_smi_tree` for the source element of each field.
        ``warnings`` holds, e.g., the disagreement of ``<attached_gpus>`` with the number of
        ``<gpu>`` elements.
    :raises SmiParseError: for empty input, input that is not XML (an nvidia-smi error message,
        binary data), XML that is not well-formed (a truncated capture: the message gives the line
        and column where parsing stopped), a DOCTYPE with entity declarations, or a root element
        other than ``<nvidia_smi_log>``.

    Source: ``nvidia-smi -q -x`` (nvidia-smi(1), "-x, --xml-format"), DTD v11/v12/v13.
    """
    text = smi_output_text(text, "nvidia-smi -q -x output")
    stripped = text.lstrip("\ufeff \t\r\n")
    skipped = text[:len(text) - len(stripped)].count("\n")  # keeps reported line numbers true
    if not stripped:
        raise SmiParseError("nvidia-smi -q -x output is empty; expected an <%s> XML document" % ROOT_TAG)
    if not stripped.startswith("<"):
        raise SmiParseError(
            "expected an <%s> XML document from nvidia-smi -q -x, but line %d is not XML: %s"
            % (ROOT_TAG, skipped + 1, line_excerpt(stripped.splitlines()[0])))
    entity = re.search(r"<!ENTITY", stripped, re.IGNORECASE)
    if entity:
        line = skipped + _line_of(stripped, entity.start())
        raise SmiParseError(
            "refusing nvidia-smi -q -x output with an <!ENTITY declaration at line %d; expected a plain "
            "<%s> document (nvidia-smi never declares entities)" % (line, ROOT_TAG))
    # Blank the DOCTYPE out (keeping line numbers): the DTD file it names is never loaded.
    body = _DOCTYPE.sub(lambda m: "\n" * m.group(0).count("\n"), stripped, count=1)
    try:
        root = ElementTree.fromstring(body)
    except ElementTree.ParseError as err:
        line, column = getattr(err, "position", (0, 0))
        lines = body.splitlines()
        reason = str(err).split(":", 1)[0]
        truncated = reason in ("no element found", "unclosed token", "unclosed CDATA section")
        hint = "; the document ends before </%s>, the capture looks truncated" % ROOT_TAG if truncated else ""
        context = ": %s" % line_excerpt(lines[line - 1]) if 0 < line <= len(lines) else ""
        raise SmiParseError(
            "nvidia-smi -q -x output is not well-formed XML, expected a complete <%s> document; "
            "parsing stopped at line %d, column %d (%s%s)%s"
            % (ROOT_TAG, line + skipped, column, reason, hint, context))
    if root.tag != ROOT_TAG:
        raise SmiParseError(
            "expected root element <%s> (nvidia-smi -q -x), found <%s> at line 1" % (ROOT_TAG, root.tag))
    result = facts_from_smi_tree(root)
    result["warnings"] = gpu_count_warnings(result["attached_gpus"], len(result["gpus"]), "<gpu> element") \
        + result["warnings"]
    return result


# --------------------------------------------------------------------------------------------
# Shared between the XML and the text parser
# --------------------------------------------------------------------------------------------

def facts_from_smi_tree(root: ElementTree.Element, fmt: str = "smi-xml") -> Dict[str, Any]:
    """Turn an ``<nvidia_smi_log>`` element tree into the parser result.

    Shared by :func:`parse_nvidia_smi_xml` and :func:`smi_text.parse_nvidia_smi_text` (which
    builds the same tree from ``nvidia-smi -q`` text).

    :param root: the ``<nvidia_smi_log>`` element.
    :param fmt: ``smi-xml`` or ``smi-text``, for the ``unparsed`` entries.
    :returns: ``{"driver": {"userspace_version", "cuda_driver_version"}, "attached_gpus",
        "gpus", "warnings": [], "unparsed": unparsed_keys(...)}`` (the gpu-count warning is added by the callers, who know what
        a GPU is called in their format).
    :raises: nothing.

    Sources: ``<driver_version>``, ``<cuda_version>`` (the CUDA version the driver supports,
    as NVML ``nvmlSystemGetCudaDriverVersion``), ``<attached_gpus>``, each ``<gpu>``.
    """
    reads = set()  # type: set
    _READS.append(reads)
    try:
        result = {
            "driver": {
                "userspace_version": _first_value(root, "driver_version", "kmd_version"),
                "cuda_driver_version": _first_value(root, "cuda_version", "cuda_umd_version"),
            },
            "attached_gpus": parse_int(_value(root, "attached_gpus")),
            "gpus": gpus_from_smi_tree(root),
            "warnings": [],
        }
        # Read too: the R610 names of the versions, which repeat the deprecated ones.
        _first_value(root, "kmd_version")
        _first_value(root, "cuda_umd_version")
    finally:
        _READS.pop()
    result["unparsed"] = unparsed_keys(root, reads, fmt)
    return result


#: The elements read while facts_from_smi_tree runs (a stack: one set per run).
_READS = []  # type: List[set]

#: Keys with a value that no fact takes, on purpose: they say nothing about the driver lifecycle or
#: the GPU's health (names, brands, timestamps, display and encoder figures, per-process memory
#: beside the GPU's own), or repeat a value read elsewhere. Paths as in :func:`unparsed_keys`.
IGNORED_KEYS = frozenset((
    # the log's own: when it was taken
    "timestamp",
    # names, brands, part numbers and board ids: not the driver's, read by no decision
    "product_brand", "board_id", "board_part_number", "gpu_part_number", "module_id", "gpu_module_id",
    "minor_number", "multigpu_board", "platform_info", "platformInfo", "pdi", "gpu_pdi", "inforom_version",
    "inforom_bbx_flush", "inforom_bbx_object_flush", "vgpu_software_licensed_product", "gpu_virtualization_mode",
    # display, accounting and host-side modes
    "display_mode", "display_attached", "display_active", "accounting_mode", "accounting_mode_buffer_size",
    "addressing_mode", "driver_model",
    # workload figures of the moment, not the contract nor health: encoder/FBC sessions, fans, voltage,
    # utilization beside the GPU's (read), the supported-clocks table, capabilities
    "encoder_stats", "fbc_stats", "fan_speed", "voltage", "utilization", "supported_clocks", "capabilities",
    "edpp_multiplier", "sparse_operation_mode",
    # confidential computing and DRAM encryption modes (not part of this collection's contract yet)
    "cc_protected_memory_usage", "conf_compute_protected_memory_usage", "dram_encryption_mode",
))

#: Unparsed entries kept one by one (all are counted).
MAX_UNPARSED = 256


def _leaves(element: ElementTree.Element, path: str):
    children = list(element)
    if not children:
        yield path, element
        return
    for child in children:
        yield from _leaves(child, "%s/%s" % (path, child.tag) if path else child.tag)


def unparsed_keys(root: ElementTree.Element, reads: set, fmt: str = "smi-xml") -> Dict[str, Any]:
    """The keys with a value that no fact took: fail loud on a layout this reader does not know.

    :param root: the ``<nvidia_smi_log>`` tree. :param reads: ids of the elements the facts read.
    :param fmt: ``smi-xml`` or ``smi-text`` (what the entries say they came from).
    :returns: ``{"count": int, "keys": [{"format", "key": "<section path>/<key>" (element names,
        under the GPU or the log), "value": str, "gpu": PCI bus id | None}]}`` (the first
        :data:`MAX_UNPARSED`), leaving out values that are "no value" (N/A ...) and the sections of
        :data:`IGNORED_KEYS`. Shown as the facts' ``unparsed``; a key no field
        takes is a layout this reader does not know yet, or a value no decision reads yet.
    :raises: nothing.
    """
    keys = []  # type: List[Dict[str, Any]]
    count = 0
    for child in root:
        if child.tag == "gpu":
            bus = normalize_pci_bus_id(child.get("id") or "") or child.get("id")
            leaves = _leaves(child, "")
        else:
            bus = None
            leaves = _leaves(child, child.tag)
        for path, node in leaves:
            if id(node) in reads or path.split("/", 1)[0] in IGNORED_KEYS:
                continue
            value = null_if_na(node.text)
            if value is None:
                continue
            count += 1
            if len(keys) < MAX_UNPARSED:
                keys.append({"format": fmt, "key": path, "value": value[:200], "gpu": bus})
    return {"count": count, "keys": keys}


def gpu_count_warnings(attached: Optional[int], found: int, what: str) -> List[str]:
    """Return the warning for an ``attached_gpus`` count that disagrees with the GPUs listed.

    :param attached: the ``attached_gpus`` value (``None`` when absent: no warning).
    :param found: how many GPUs the output describes.
    :param what: what one GPU is called in the format (``"<gpu> element"``, ``"GPU section"``).
    :returns: ``[]`` or a one-element list of ``str``.
    """
    if attached is None or attached == found:
        return []
    return ["nvidia-smi reports attached_gpus=%d but the output describes %d %s(s); facts cover "
            "only the %d described" % (attached, found, what, found)]


def gpus_from_smi_tree(root: ElementTree.Element) -> List[Dict[str, Any]]:
    """Build one :func:`facts_model.new_gpu` record per ``<gpu>`` child of ``root``.

    Field → element (``nvidia-smi -q -x``; the text labels of ``nvidia-smi -q`` map onto the
    same names in :mod:`smi_text`):

    * ``uuid`` ``<uuid>``, ``name`` ``<product_name>``, ``serial`` ``<serial>``,
      ``architecture`` ``<product_architecture>``, ``vbios_version`` ``<vbios_version>``;
    * ``pci_bus_id`` ``<pci><pci_bus_id>`` (else the ``id`` attribute), normalised to
      ``"0000:3b:00.0"``; ``pci_device_id`` ``<pci><pci_device_id>`` as ``"0x233010de"``;
    * ``persistence_mode`` (bool) ``<persistence_mode>``; ``compute_mode`` ``<compute_mode>`` as
      printed (``"Default"``, ``"Exclusive_Process"``, ``"Prohibited"``);
    * ``power`` (W): see :func:`_power`;
    * ``ecc``: ``<ecc_mode>`` current/pending (bool) and ``<ecc_errors>`` volatile/aggregate sums,
      see :func:`_ecc_count`;
    * ``remapped_rows``: ``<remapped_rows>`` ``remapped_row_corr``, ``remapped_row_unc``,
      ``remapped_row_pending`` (bool), ``remapped_row_failure`` (bool);
    * ``retired_pages``: ``<retired_pages>`` retired counts of ``multiple_single_bit_retirement``
      and ``double_bit_retirement``, ``pending_retirement`` (else ``pending_blacklist``) as bool;
    * ``mig``: ``<mig_mode>`` current/pending (bool), ``<mig_devices><mig_device>``
      (``gpu_instance_id``, ``compute_instance_id``, ``fb_memory_usage/total`` MiB,
      ``device_attributes/shared/multiprocessor_count``; ``profile`` stays ``None``: the
      document does not name it);
    * ``clocks`` (MHz): ``<clocks>`` and ``<max_clocks>`` ``sm_clock``/``mem_clock``;
    * ``clocks_event_reasons``: names of the reasons printed ``Active``, see :func:`_clock_reasons`;
    * ``temperature_c`` ``<temperature><gpu_temp>``; ``memory`` (MiB) ``<fb_memory_usage>``;
    * ``pcie``: ``gen_current`` ``device_current_link_gen`` (else ``current_link_gen``),
      ``gen_max`` ``max_device_link_gen`` (the GPU's own maximum; else ``max_link_gen``),
      ``width_current``/``width_max`` from ``"16x"``;
    * ``utilization_gpu_pct`` ``<utilization><gpu_util>`` (``None`` when N/A, as under MIG);
    * ``processes``: ``[{pid, name, used_memory_mib}]`` from ``<processes><process_info>``,
      ``[]`` when ``<processes>`` is empty, ``None`` when it is absent.
    """
    return [_gpu(index, element) for index, element in enumerate(root.findall("gpu"))]


# --------------------------------------------------------------------------------------------
# Field readers
# --------------------------------------------------------------------------------------------

def _gpu(index: int, element: ElementTree.Element) -> Dict[str, Any]:
    gpu = new_gpu(index)
    gpu["uuid"] = _value(element, "uuid")
    gpu["name"] = _value(element, "product_name")
    gpu["serial"] = _value(element, "serial")
    gpu["architecture"] = _value(element, "product_architecture")
    gpu["vbios_version"] = _value(element, "vbios_version")
    gpu["pci_bus_id"] = normalize_pci_bus_id(_value(element, "pci/pci_bus_id") or element.get("id"))
    gpu["pci_device_id"] = _device_id(_value(element, "pci/pci_device_id"))
    gpu["persistence_mode"] = parse_enabled(_value(element, "persistence_mode"))
    gpu["compute_mode"] = _value(element, "compute_mode")
    gpu["power"] = _power(element)
    gpu["ecc"] = _ecc(element)
    gpu["remapped_rows"] = _remapped_rows(element)
    gpu["retired_pages"] = _retired_pages(element)
    gpu["mig"] = _mig(element)
    gpu["fabric"] = _fabric(element)
    gpu["clocks"] = {
        "sm_mhz": parse_int(_value(element, "clocks/sm_clock")),
        "mem_mhz": parse_int(_value(element, "clocks/mem_clock")),
        "sm_max_mhz": parse_int(_value(element, "max_clocks/sm_clock")),
        "mem_max_mhz": parse_int(_value(element, "max_clocks/mem_clock")),
    }
    gpu["clocks_event_reasons"] = _clock_reasons(element)
    gpu["temperature_c"] = parse_int(_value(element, "temperature/gpu_temp"))
    gpu["memory"] = {
        "total_mib": parse_int(_value(element, "fb_memory_usage/total")),
        "used_mib": parse_int(_value(element, "fb_memory_usage/used")),
        "free_mib": parse_int(_value(element, "fb_memory_usage/free")),
        "reserved_mib": parse_int(_value(element, "fb_memory_usage/reserved")),
    }
    link = "pci/pci_gpu_link_info/"
    gpu["pcie"] = {
        "gen_current": parse_int(_first_value(element, link + "pcie_gen/device_current_link_gen",
                                              link + "pcie_gen/current_link_gen")),
        "gen_max": parse_int(_first_value(element, link + "pcie_gen/max_device_link_gen",
                                          link + "pcie_gen/max_link_gen")),
        "width_current": parse_int(_value(element, link + "link_widths/current_link_width")),
        "width_max": parse_int(_value(element, link + "link_widths/max_link_width")),
    }
    gpu["utilization_gpu_pct"] = parse_int(_value(element, "utilization/gpu_util"))
    gpu["processes"] = _processes(element)
    gpu["extended"] = _extended(element, gpu["mig"])
    # nvidia-smi prints "[GPU requires reset]" in the values it cannot read, and R550+ a
    # <gpu_reset_status><reset_required>Yes: either way the GPU needs a reset (gpu_health).
    if parse_enabled(_value(element, "gpu_reset_status/reset_required")) or any(
            "requires reset" in (node.text or "").lower() for node in element.iter()):
        gpu["errors"].append("GpuRequiresReset")
    return gpu


def _extended(element: ElementTree.Element, mig: Dict[str, Any]) -> Dict[str, Any]:
    """The contract's extra values (facts_model.new_gpu_extended) from one ``<gpu>`` element.

    ``<default_applications_clocks>`` (MHz), ``<bar1_memory_usage><total>`` (MiB),
    ``<gsp_firmware_version>``, ``<performance_state>``, ``<pcie_gen><max_link_gen>`` (the
    generation attainable with the host; ``<max_device_link_gen>`` is the GPU's own); MIG capable when ``<current_mig>`` reads
    Enabled/Disabled, not capable when it reads N/A. ``nvidia-smi -q -x`` does not list the GPU
    instance profiles offered (``nvidia-smi mig -lgip`` does), so ``mig_profiles_offered`` stays
    ``None`` unless MIG is unsupported (``[]``); nor the recovery action (``None``).
    """
    extended = new_gpu_extended()
    extended["app_clocks_default_graphics_mhz"] = parse_int(_value(element, "default_applications_clocks/graphics_clock"))
    extended["app_clocks_default_mem_mhz"] = parse_int(_value(element, "default_applications_clocks/mem_clock"))
    extended["bar1_total_mib"] = parse_int(_value(element, "bar1_memory_usage/total"))
    extended["gsp_firmware_version"] = _value(element, "gsp_firmware_version")
    extended["pcie_gen_attainable"] = parse_int(_value(element, "pci/pci_gpu_link_info/pcie_gen/max_link_gen"))
    state = _value(element, "performance_state")
    extended["performance_state"] = state if state and re.match(r"^P\d{1,2}$", state) else None
    if mig["mode_current"] is not None:
        extended["mig_capable"] = True
    elif element.find("mig_mode/current_mig") is not None:
        extended["mig_capable"] = False
        extended["mig_profiles_offered"] = []
    return extended


def _power(element: ElementTree.Element) -> Dict[str, Optional[float]]:
    """Power facts in watts from ``<gpu_power_readings>`` (newer) or ``<power_readings>`` (older).

    * ``limit_w``: the limit in effect: ``current_power_limit`` (newer drivers; the value of
      NVML ``nvmlDeviceGetEnforcedPowerLimit``), else ``enforced_power_limit``, else ``power_limit``;
    * ``enforced_limit_w``: ``enforced_power_limit``, else ``current_power_limit``;
    * ``requested_limit_w``: ``requested_power_limit`` (what ``nvidia-smi -pl`` / NVML
      ``nvmlDeviceSetPowerManagementLimit`` asked for), else the older ``power_limit``;
    * ``default_limit_w``, ``min_limit_w``, ``max_limit_w``: ``default_power_limit``,
      ``min_power_limit``, ``max_power_limit``;
    * ``draw_w``: ``power_draw``, else ``average_power_draw`` (newer drivers; what NVML
      ``nvmlDeviceGetPowerUsage`` returns there), else ``instant_power_draw``.
    """
    section = element.find("gpu_power_readings")
    if section is None:
        section = element.find("power_readings")
    if section is None:
        return new_gpu(0)["power"]

    def watts(*names: str) -> Optional[float]:
        # R610 moved the limits under <gpu_ceiling_power_limit> ("GPU Ceiling Power Limit" in -q text).
        return parse_number(_first_value(section, *(names + tuple("gpu_ceiling_power_limit/" + n for n in names))))

    return {
        "limit_w": watts("current_power_limit", "enforced_power_limit", "power_limit"),
        "default_limit_w": watts("default_power_limit"),
        "enforced_limit_w": watts("enforced_power_limit", "current_power_limit"),
        "requested_limit_w": watts("requested_power_limit", "power_limit"),
        "min_limit_w": watts("min_power_limit"),
        "max_limit_w": watts("max_power_limit"),
        "draw_w": watts("power_draw", "average_power_draw", "instant_power_draw"),
    }


#: ``<fabric><state>`` words → the ``fabric.state`` fact (NVML ``nvmlGpuFabricState_t``: NOT_SUPPORTED,
#: NOT_STARTED, IN_PROGRESS, COMPLETED).
_FABRIC_STATES = {"completed": "completed", "in progress": "in_progress", "not started": "not_started",
                  "not supported": "not_supported"}


def _fabric(element: ElementTree.Element) -> Dict[str, Any]:
    """The GPU's NVLink fabric registration: ``<fabric>`` (``-q`` text: ``Fabric``), R550 and later.

    :returns: ``{"state": "completed" | "in_progress" | "not_started" | "not_supported" | None (N/A:
        no fabric, e.g. a PCIe GPU) | the word as printed, lower-case, when unknown, "status": str |
        None ("Success" once completed), "clique_id": str | None, "cluster_uuid": str | None}``.
    Source: nvidia-smi ``-q`` "Fabric" (State, Status, CliqueId, ClusterUUID); NVML
    ``nvmlDeviceGetGpuFabricInfo``; field case 43 (``In Progress`` while Fabric Manager is not serving).
    """
    section = element.find("fabric")
    if section is None:
        return {"state": None, "status": None, "clique_id": None, "cluster_uuid": None}
    state = _value(section, "state")
    return {
        "state": _FABRIC_STATES.get(state.lower(), state.lower()) if state else None,
        "status": _value(section, "status"),
        "clique_id": _first_value(section, "cliqueId", "cliqueid", "clique_id"),
        "cluster_uuid": _first_value(section, "clusterUuid", "clusteruuid", "cluster_uuid"),
    }


def _ecc(element: ElementTree.Element) -> Dict[str, Any]:
    errors = element.find("ecc_errors")
    counters = {}
    for counter in ("volatile", "aggregate"):
        section = None if errors is None else errors.find(counter)
        counters[counter] = {
            "corrected": _ecc_count(section, corrected=True),
            "uncorrected": _ecc_count(section, corrected=False),
        }
    current = _value(element, "ecc_mode/current_ecc")
    raw = element.find("ecc_mode/current_ecc")
    # "N/A" (or "[Not Supported]") for the mode: the GPU has no ECC, which is not ECC disabled.
    supported = True if current is not None else (
        False if raw is not None and (raw.text or "").strip().lower() in ("n/a", "[n/a]", "not supported",
                                                                          "[not supported]") else None)
    return {
        "supported": supported,
        "mode_current": parse_enabled(current),
        "mode_pending": parse_enabled(_value(element, "ecc_mode/pending_ecc")),
        "volatile": counters["volatile"],
        "aggregate": counters["aggregate"],
    }


def _ecc_count(section: Optional[ElementTree.Element], corrected: bool) -> Optional[int]:
    """Sum the corrected or uncorrected ECC counters of a ``<volatile>``/``<aggregate>`` block.

    Layouts read: ``<single_bit>``/``<double_bit>`` with per-location counters and a ``<total>``
    (the total is used when it is a number, else the locations are summed); flat counters named
    ``*_correctable`` / ``*_uncorrectable*`` (``sram_correctable``, ``dram_uncorrectable``,
    ``sram_uncorrectable_parity``, ``sram_uncorrectable_secded``, ...). Flags such as
    ``sram_threshold_exceeded`` are not counters and are skipped.

    :returns: the sum as ``int``, or ``None`` when no counter holds a number (all N/A).
    """
    if section is None:
        return None
    block = section.find("single_bit" if corrected else "double_bit")
    if block is not None:
        total = parse_int(_value(block, "total"))
        if total is not None:
            return total
        return _sum_ints(_value(child, ".") for child in block if child.tag != "total")
    wanted = []
    for child in section:
        tag = child.tag
        if "uncorrectable" in tag:
            is_corrected = False
        elif "correctable" in tag:
            is_corrected = True
        else:
            continue
        if is_corrected == corrected:
            wanted.append(_value(child, "."))
    return _sum_ints(wanted)


def _sum_ints(values: Any) -> Optional[int]:
    numbers = [number for number in (parse_int(value) for value in values) if number is not None]
    return sum(numbers) if numbers else None


def _remapped_rows(element: ElementTree.Element) -> Dict[str, Any]:
    # <remapped_rows>N/A</remapped_rows> (no row remapper) leaves every value None.
    return {
        "correctable": parse_int(_value(element, "remapped_rows/remapped_row_corr")),
        "uncorrectable": parse_int(_value(element, "remapped_rows/remapped_row_unc")),
        "pending": parse_enabled(_value(element, "remapped_rows/remapped_row_pending")),
        "failed": parse_enabled(_value(element, "remapped_rows/remapped_row_failure")),
    }


def _retired_pages(element: ElementTree.Element) -> Dict[str, Any]:
    def count(name: str) -> Optional[int]:
        # XML nests the count (<retired_count>); nvidia-smi -q text prints it on the line itself.
        block = element.find("retired_pages/" + name)
        if block is None:
            return None
        return parse_int(_first_value(block, "retired_count", "."))

    return {
        "single_bit_ecc": count("multiple_single_bit_retirement"),
        "double_bit_ecc": count("double_bit_retirement"),
        "pending": parse_enabled(_first_value(element, "retired_pages/pending_retirement",
                                              "retired_pages/pending_blacklist")),
    }


def _mig(element: ElementTree.Element) -> Dict[str, Any]:
    devices = []
    # -q -x: <mig_devices><mig_device>; -q text: "MIG Device" sections right under the GPU, with
    # "Shared FB Memory Usage" (R590: field corpus h100-mig-r590) for the XML's <fb_memory_usage>.
    for node in element.findall("mig_devices/mig_device") + element.findall("mig_device"):
        device = new_mig_device()
        device["gpu_instance_id"] = parse_int(_value(node, "gpu_instance_id"))
        device["compute_instance_id"] = parse_int(_value(node, "compute_instance_id"))
        device["uuid"] = _value(node, "uuid")
        total = _first_value(node, "fb_memory_usage/total", "shared_fb_memory_usage/total")
        device["memory_total_mib"] = parse_int(total)
        device["sm_count"] = parse_int(_value(node, "device_attributes/shared/multiprocessor_count"))
        devices.append(device)
    return {
        "mode_current": parse_enabled(_value(element, "mig_mode/current_mig")),
        "mode_pending": parse_enabled(_value(element, "mig_mode/pending_mig")),
        "devices": devices,
    }


# nvidia-smi element suffixes whose fact name differs (facts use NVML's names,
# facts_model.CLOCKS_EVENT_REASON_BITS).
_REASON_RENAMES = {"display_clocks_setting": "display_clock_setting"}
_REASON_PREFIXES = ("clocks_event_reason_", "clocks_throttle_reason_")
_REASON_ORDER = [name for _bit, name in CLOCKS_EVENT_REASON_BITS]


def _clock_reasons(element: ElementTree.Element) -> Optional[List[str]]:
    """Names of the clocks event reasons printed ``Active``, in NVML bit order.

    Read from ``<clocks_event_reasons>`` (R535 on) or ``<clocks_throttle_reasons>`` (before),
    children ``clocks_event_reason_<name>`` / ``clocks_throttle_reason_<name>``; names are those
    of :data:`facts_model.CLOCKS_EVENT_REASON_BITS` (``display_clocks_setting`` becomes
    ``display_clock_setting``). Unknown reasons keep their nvidia-smi name, after the known ones.

    :returns: a list (``[]`` when every reason is ``Not Active``), or ``None`` when the section is
        absent or no reason has a value.
    """
    section = element.find("clocks_event_reasons")
    if section is None:
        section = element.find("clocks_throttle_reasons")
    if section is None:
        return None
    active = []
    seen_value = False
    for child in section.iter():
        if child is section:
            continue
        value = _value(child, ".")
        if value is None:
            continue
        name = child.tag
        for prefix in _REASON_PREFIXES:
            if name.startswith(prefix):
                name = name[len(prefix):]
        name = _REASON_RENAMES.get(name, name)
        lowered = value.lower()
        if lowered == "active":
            seen_value = True
            active.append(name)
        elif lowered == "not active":
            seen_value = True
    if not seen_value:
        return None
    known = [name for name in _REASON_ORDER if name in active]
    return known + [name for name in active if name not in _REASON_ORDER]


def _processes(element: ElementTree.Element) -> Optional[List[Dict[str, Any]]]:
    section = element.find("processes")
    if section is None:
        return None
    return [
        {
            "pid": parse_int(_value(node, "pid")),
            "name": _value(node, "process_name"),
            "used_memory_mib": parse_int(_value(node, "used_memory")),
        }
        for node in section.findall("process_info")
    ]


# --------------------------------------------------------------------------------------------
# Small helpers
# --------------------------------------------------------------------------------------------

def _value(element: ElementTree.Element, path: str) -> Optional[str]:
    """Text of the element at ``path`` (``"."`` for ``element`` itself), ``None`` for "no value".

    Every element read here is noted for :func:`unparsed_keys` while :func:`facts_from_smi_tree` runs.
    """
    node = element if path == "." else element.find(path)
    if node is None:
        return None
    if _READS:
        _READS[-1].add(id(node))
    return null_if_na(node.text)


def _first_value(element: ElementTree.Element, *paths: str) -> Optional[str]:
    for path in paths:
        value = _value(element, path)
        if value is not None:
            return value
    return None


def _device_id(value: Optional[str]) -> Optional[str]:
    """``"20B210DE"`` / ``"0x20B210DE"`` → ``"0x20b210de"`` (NVML ``pciDeviceId`` form)."""
    if value is None:
        return None
    match = re.match(r"^(?:0x)?([0-9a-fA-F]{1,8})$", value.strip())
    if not match:
        return None
    return "0x%08x" % int(match.group(1), 16)


def smi_output_text(text: Any, what: str) -> str:
    if isinstance(text, bytes):
        try:
            return text.decode("utf-8")
        except UnicodeDecodeError as err:
            raise SmiParseError("%s is not UTF-8 text: undecodable byte 0x%02x at offset %d; expected the "
                                "output of nvidia-smi" % (what, text[err.start], err.start))
    if not isinstance(text, str):
        raise SmiParseError("%s must be text, got %s" % (what, type(text).__name__))
    return text


def line_excerpt(line: str, limit: int = 60) -> str:
    line = line.strip()
    return repr(line if len(line) <= limit else line[:limit] + "...")


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1
