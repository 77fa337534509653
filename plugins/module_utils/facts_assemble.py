# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Assemble ``ansible_facts.nvidia`` from raw inputs, whatever the source.

The gpu_facts module collects raw inputs (texts of files and command outputs, and the result of
the NVML reader) from the live host or from a captured bundle; this module turns them into the
one facts document of :mod:`facts_model`. No I/O happens here: the same inputs always give the
same facts, which is what makes captures replayable in tests.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_loaded
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_on_disk
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_packages
from ansible_collections.gpufleet.nvidia.plugins.module_utils import installed_packages
from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi_messages
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_state as ds
from ansible_collections.gpufleet.nvidia.plugins.module_utils.contract import contract_from_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import gpu_label, node_health
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import (
    branch_of,
    new_facts,
    new_gpu,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_headline import node_headline
from ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_log import (
    decode_escapes,
    gpu_identities,
    parse_kernel_log,
    summarize_xids,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log_coverage
from ansible_collections.gpufleet.nvidia.plugins.module_utils import node_signals
from ansible_collections.gpufleet.nvidia.plugins.module_utils import nvswitch_log
from ansible_collections.gpufleet.nvidia.plugins.module_utils import rollout_marks
from ansible_collections.gpufleet.nvidia.plugins.module_utils.pcie_links import gpu_link_report, parse_lspci_links
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_text import parse_nvidia_smi_text
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import SmiParseError, parse_nvidia_smi_xml

# Capture bundle file name → input key (see the gpu_facts module's capture_dir option).
CAPTURE_FILES = {
    "nvidia-smi-q.xml": "smi_xml",
    "nvidia-smi-q.txt": "smi_text",
    "dmesg.txt": "kernel_log",
    "proc-driver-nvidia-version.txt": "proc_version",
    "sys-module-nvidia-version.txt": "sys_module_version",
    "modinfo-nvidia.txt": "modinfo",
    "uname-r.txt": "running_kernel",
    "dpkg-l.txt": "dpkg_l",
    "rpm-qa.txt": "rpm_qa",
    "apt-mark-showhold.txt": "apt_mark_showhold",
    "lspci-vvv.txt": "lspci",
    "lib-modules-nvidia.txt": "modules_find",
    "mokutil-sb-state.txt": "mokutil_sb_state",
    "sys-module-nvidia-peermem-version.txt": "peermem_version",
}


class CaptureError(ValueError):
    """A captured file could not be read or parsed; ``filename`` names it."""

    def __init__(self, filename: str, problem: str) -> None:
        super(CaptureError, self).__init__("%s: %s" % (filename, problem))
        self.filename = filename


def decode_capture(raw: Dict[str, bytes]) -> Dict[str, str]:
    """Decode a captured bundle's files into inputs, refusing binary data.

    :param raw: file name (a key of :data:`CAPTURE_FILES`) → the file's bytes.
    :returns: input key → text.
    :raises CaptureError: for a file holding NUL bytes or text that is not UTF-8, naming the file.
    """
    inputs = {}
    for filename, data in raw.items():
        key = CAPTURE_FILES.get(filename)
        if key is None:
            continue
        if b"\x00" in data:
            raise CaptureError(filename, "holds binary data (NUL bytes); expected the text output it is named after")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as err:
            raise CaptureError(filename, "is not UTF-8 text (byte %d); expected the text output it is named after"
                               % err.start)
        inputs[key] = text
    if "running_kernel" in inputs:
        inputs["running_kernel"] = driver_on_disk.kernel_release_from_uname(inputs["running_kernel"])
    return inputs


def _gpus_from_smi(inputs: Dict[str, Any], warnings: List[str], capture: bool) -> Optional[Dict[str, Any]]:
    for key, filename, parser in (("smi_xml", "nvidia-smi-q.xml", parse_nvidia_smi_xml),
                                  ("smi_text", "nvidia-smi-q.txt", parse_nvidia_smi_text)):
        text = inputs.get(key)
        if not text:
            continue
        failure = smi_messages.parse_nvidia_smi_error(text)
        report = "<nvidia_smi_log" in text or "Attached GPUs" in text
        if failure["nvml_error"] and not report:
            # nvidia-smi printed its failure instead of a report: evidence, not a parse error.
            inputs.setdefault("smi_error", text)
            return None
        answers = smi_messages.parse_smi_answers(text)
        if answers["answered"] and not report:
            return _gpus_from_smi_answers(answers)
        try:
            return parser(text)
        except SmiParseError as err:
            if capture:
                raise CaptureError(filename, str(err))
            warnings.append("nvidia-smi output could not be parsed: %s" % err)
            return None
    return None


def _gpus_from_smi_answers(answers: Dict[str, Any]) -> Dict[str, Any]:
    """The GPUs nvidia-smi's own answer names (smi_messages.parse_smi_answers): none for "No devices
    were found", one unreadable record per "Unable to determine the device handle" line."""
    gpus = []
    for index, entry in enumerate(answers["unreadable"]):
        gpu = new_gpu(index)
        gpu.update(pci_bus_id=entry["pci_bus_id"], readable=False, errors=[entry["error"]])
        gpus.append(gpu)
    said = "nvidia-smi: No devices were found" if answers["no_devices"] else \
        "nvidia-smi could not open %s" % ", ".join("GPU %s (%s)" % (e["pci_bus_id"], e["error"]) for e in answers["unreadable"])
    return {"gpus": gpus, "attached_gpus": None, "driver": {}, "warnings": [said]}


def _annotate_xids(events: List[Dict[str, Any]], gpus: List[Dict[str, Any]]) -> None:
    by_bus = dict((gpu.get("pci_bus_id"), gpu.get("index")) for gpu in gpus if gpu.get("pci_bus_id"))
    for event in events:
        event["gpu_index"] = by_bus.get(event.get("pci_bus_id"))


def _versions_from_api_mismatch(kernel_log: Optional[Dict[str, Any]], driver: Dict[str, Any],
                                warnings: List[str]) -> None:
    """Use "NVRM: API mismatch" kernel-log lines as evidence of the userspace and loaded versions.

    The kernel module prints both versions when a client library of another version talks to it
    (field case 23); they fill versions that no other source gave.
    """
    if not kernel_log or not kernel_log.get("api_mismatches"):
        return
    last = kernel_log["api_mismatches"][-1]
    if driver["userspace_version"] is None:
        driver["userspace_version"] = last.get("client_version")
    if driver["loaded_version"] is None:
        driver["loaded_version"] = last.get("kernel_module_version")
    warnings.append("kernel log: NVRM API mismatch, client %s against kernel module %s"
                    % (last.get("client_version"), last.get("kernel_module_version")))


def _apply_pcie_links(inputs: Dict[str, Any], facts: Dict[str, Any]) -> None:
    """Add ``pcie_gpu_links`` from ``lspci -vvv``; fill GPU link fields the GPU source left null."""
    if not inputs.get("lspci"):
        return
    idle = {}
    for gpu in facts["gpus"]:
        reasons = gpu.get("clocks_event_reasons")
        utilization = gpu.get("utilization_gpu_pct")
        if (reasons is not None and "gpu_idle" in reasons) or utilization == 0:
            idle[gpu.get("pci_bus_id")] = True
        elif utilization is not None or reasons is not None:
            idle[gpu.get("pci_bus_id")] = False
    report = gpu_link_report(parse_lspci_links(inputs["lspci"]), idle)
    facts["pcie_gpu_links"] = report
    by_bus = dict((link["pci_bus_id"], link) for link in report["gpus"])
    for gpu in facts["gpus"]:
        link = by_bus.get(gpu.get("pci_bus_id"))
        if link is None:
            continue
        for key in ("gen_current", "gen_max", "width_current", "width_max"):
            if gpu["pcie"].get(key) is None:
                gpu["pcie"][key] = link[key]
    if report["degraded_gpus"]:
        facts["warnings"].append("PCIe link of GPU(s) %s runs below its capability" % ", ".join(report["degraded_gpus"]))


def _node_section(inputs: Dict[str, Any], facts: Dict[str, Any], capture: bool) -> None:
    """Fill ``facts["node"]`` and ``facts["driver_messages"]`` from the kernel log, modinfo, mokutil, sysfs."""
    node = facts["node"]
    kernel_log = inputs.get("kernel_log")
    failures = node_signals.module_load_failures(kernel_log)
    node["module_load_failures"] = failures
    node["probe_failures"] = node_signals.probe_failures(kernel_log)
    messages = [dict(message, kind="reset_required") for message in node_signals.reset_required_messages(kernel_log)]
    facts["driver_messages"] = (node_signals.gpu_init_failures(kernel_log) + messages)[:16]
    if kernel_log:
        facts["sxid_events"] = nvswitch_log.parse_sxids(kernel_log)
        facts["kernel_log_unrecognised"] = kernel_log_coverage.unrecognised_lines(kernel_log)
    node["secure_boot"] = node_signals.parse_mokutil_sb_state(inputs.get("mokutil_sb_state"))
    node["module_signer"] = node_signals.module_signer(inputs.get("modinfo"))
    if any(f["reason"] == "signature_rejected" for f in failures):
        node["module_signer_trusted"] = False
    elif node["secure_boot"] and node["module_signer"] and facts["driver"]["loaded_version"]:
        node["module_signer_trusted"] = True
    peermem = driver_loaded.parse_sys_module_version(inputs["peermem_version"]) if inputs.get("peermem_version") else None
    node["peermem_loaded_version"] = peermem
    if peermem:
        node["peermem_state"] = "loaded"
    elif any(f["module"] == "nvidia_peermem" for f in failures):
        node["peermem_state"] = "failed"
    elif not capture and "peermem_version" in inputs:
        node["peermem_state"] = "not_loaded"


def assemble_facts(raw: Dict[str, Any], capture: bool = False) -> Dict[str, Any]:
    """Build the ``ansible_facts.nvidia`` document from raw inputs.

    :param raw: for a capture, file name → bytes (see :data:`CAPTURE_FILES`); for a live host,
        input key → value: ``nvml`` (the result of :func:`nvml_reader.read_nvml`), ``smi_xml``,
        ``smi_error`` (output of a failed ``nvidia-smi``), ``kernel_log``, ``kernel_log_error``,
        ``proc_version``, ``sys_module_version``, ``modinfo``, ``running_kernel``, ``dpkg_l``,
        ``rpm_qa``, ``apt_mark_showhold``, ``mokutil_sb_state`` (``mokutil --sb-state``),
        ``peermem_version`` (``/sys/module/nvidia_peermem/version``; present with ``None`` when
        the file is absent on a live host) (texts); ``rollout_flag``, ``rollout_drain``
        (:func:`node_lock.read_state` of the node_upgrade role's flag and drain record).
    :param capture: ``True`` when ``raw`` is a captured bundle.
    :returns: the facts document of :func:`facts_model.new_facts`, plus ``xid_summary``,
        ``kernel_log_gpus`` (with a kernel log: ``[{pci_bus_id, uuid, serial}]`` the driver
        printed, :func:`kernel_log.gpu_identities`), ``health`` (:func:`gpu_health.node_health`),
        ``contract`` (:func:`contract.contract_from_facts`, docs/contract.md), ``rollout``
        (:func:`rollout_marks.rollout_marks`) and ``headline``
        (:func:`facts_headline.node_headline`). ``gpu_count`` is ``None`` when neither NVML nor
        nvidia-smi answered.
    :raises CaptureError: for a captured file that is binary or cannot be parsed.
    """
    inputs = decode_capture(raw) if capture else dict(raw)
    if inputs.get("kernel_log"):
        # One decoding of the shippers' escapes (#012, \n) for every reader of the log.
        inputs["kernel_log"] = decode_escapes(inputs["kernel_log"])
    nvml = inputs.get("nvml")
    nvml_ok = bool(nvml) and nvml.get("init_error") is None
    smi_warnings = []  # type: List[str]
    smi = None if nvml_ok else _gpus_from_smi(inputs, smi_warnings, capture)

    if capture:
        source = "capture"
    elif nvml_ok:
        source = "nvml"
    elif smi is not None:
        source = "nvidia-smi"
    else:
        source = "none"
    facts = new_facts(source)
    facts["warnings"].extend(smi_warnings)
    driver = facts["driver"]
    driver["running_kernel"] = inputs.get("running_kernel")

    # GPUs and the userspace side
    if nvml_ok:
        facts["gpus"] = nvml["gpus"]
        facts["attached_gpus"] = nvml.get("device_count")
        facts["unsupported"] = nvml.get("unsupported", [])
        driver["userspace_version"] = nvml["driver"].get("userspace_version")
        driver["nvml_version"] = nvml["driver"].get("nvml_version")
        driver["cuda_driver_version"] = nvml["driver"].get("cuda_driver_version")
    elif smi is not None:
        facts["gpus"] = smi["gpus"]
        facts["attached_gpus"] = smi.get("attached_gpus")
        facts["warnings"].extend(smi.get("warnings", []))
        facts["unparsed"] = smi.get("unparsed")
        driver["userspace_version"] = smi["driver"].get("userspace_version")
        driver["cuda_driver_version"] = smi["driver"].get("cuda_driver_version")
    # Unknown stays unknown: without an answer from NVML or nvidia-smi the GPUs were not counted.
    facts["gpu_count"] = len(facts["gpus"]) if nvml_ok or smi is not None else None
    lost = [gpu_label(gpu) for gpu in facts["gpus"] if not gpu.get("readable", True)]
    if lost:
        facts["warnings"].append("%s could not be read (%s)" % (
            "; ".join(lost),
            ", ".join(sorted(set(e for gpu in facts["gpus"] for e in gpu.get("errors", []))))))

    # NVML error evidence: from the NVML reader, or from a failed nvidia-smi's own words
    nvml_error = nvml.get("init_error") if nvml else None
    if nvml_error is None and inputs.get("smi_error"):
        nvml_error = smi_messages.nvml_error_from_text(inputs["smi_error"])
    if nvml_error is None and inputs.get("smi_text") and smi is None:
        nvml_error = smi_messages.nvml_error_from_text(inputs["smi_text"])
    if nvml_error:
        facts["nvml_error"] = nvml_error

    # Kernel module: loaded, on disk, flavour
    loaded = None
    if inputs.get("sys_module_version"):
        loaded = driver_loaded.parse_sys_module_version(inputs["sys_module_version"])
    proc = driver_loaded.parse_proc_driver_version(inputs["proc_version"]) if inputs.get("proc_version") else {}
    loaded = loaded or proc.get("loaded_version")
    driver["loaded_version"] = loaded
    modinfo = driver_on_disk.parse_modinfo(inputs["modinfo"]) if inputs.get("modinfo") else {}
    driver["on_disk_version"] = modinfo.get("on_disk_version")
    driver["kernel_module_type"] = proc.get("kernel_module_type") or modinfo.get("kernel_module_type")

    # Packages
    packages = []  # type: List[Dict[str, Any]]
    packages_read = inputs.get("dpkg_l") is not None or inputs.get("rpm_qa") is not None
    if inputs.get("dpkg_l"):
        packages = installed_packages.parse_dpkg_l(inputs["dpkg_l"])
        driver["package_manager"] = "dpkg"
    elif inputs.get("rpm_qa"):
        packages = installed_packages.parse_rpm_qa(inputs["rpm_qa"])
        driver["package_manager"] = "rpm"
    if inputs.get("apt_mark_showhold"):
        installed_packages.mark_held(packages, installed_packages.parse_apt_mark_showhold(inputs["apt_mark_showhold"]))
    driver["packages"] = packages
    if driver["userspace_version"] is None:
        driver["userspace_version"] = driver_packages.userspace_version_from_packages(packages)

    kernel_log = parse_kernel_log(inputs["kernel_log"]) if inputs.get("kernel_log") else None
    _versions_from_api_mismatch(kernel_log, driver, facts["warnings"])
    _node_section(inputs, facts, capture)
    loaded = driver["loaded_version"]
    driver["branch"] = branch_of(driver["userspace_version"] or loaded or driver["on_disk_version"])
    module_for_kernel = None
    if modinfo:
        module_for_kernel = modinfo.get("on_disk_version") is not None
        kernel_release = modinfo.get("kernel_release")
        if module_for_kernel and kernel_release and driver["running_kernel"]:
            module_for_kernel = kernel_release == driver["running_kernel"]
        elif modinfo.get("not_found"):
            module_for_kernel = False
    evidence = {
        "live": not capture,
        "nvml_error": nvml_error,
        "nvml_initialized": nvml_ok or smi is not None,
        "module_found_for_running_kernel": module_for_kernel,
        "running_kernel": driver["running_kernel"],
        "secure_boot": facts["node"]["secure_boot"],
        "module_signer": facts["node"]["module_signer"],
        "signature_rejected": facts["node"]["module_signer_trusted"] is False,
        "kernel_log_nvrm": "NVRM:" in (inputs.get("kernel_log") or ""),
    }
    if not capture:
        evidence["module_loaded"] = loaded is not None
    if inputs.get("modules_find") is not None:
        present = driver_on_disk.nvidia_modules_by_kernel(inputs["modules_find"])
        evidence["module_present_for"] = sorted(present)
        driver["module_present_for"] = sorted(present)
        if driver["running_kernel"]:
            found = driver["running_kernel"] in present
            if module_for_kernel is None or not found:
                evidence["module_found_for_running_kernel"] = found
    driver["state"], driver["state_reasons"] = ds.driver_state(
        driver["userspace_version"], loaded, driver["on_disk_version"],
        packages if packages_read else None, evidence)
    if driver["state"] == "not_loaded" and (
            evidence["signature_rejected"]
            or (facts["node"]["secure_boot"] and evidence.get("module_found_for_running_kernel"))):
        # Built for this kernel, not loaded, Secure Boot on (field case 33): the signature was refused.
        driver["not_loaded_cause"] = "module_signature_rejected"
        if facts["node"]["module_signer_trusted"] is None:
            facts["node"]["module_signer_trusted"] = False

    _apply_pcie_links(inputs, facts)

    # Kernel log
    if kernel_log is not None:
        parsed = kernel_log
        events = parsed["events"]
        _annotate_xids(events, facts["gpus"])
        facts["xid_events"] = events
        facts["xid_summary"] = summarize_xids(parsed)
        facts["kernel_log_gpus"] = [dict(identity, pci_bus_id=bus)
                                    for bus, identity in sorted(gpu_identities(inputs["kernel_log"]).items())]
    else:
        facts["xid_summary"] = summarize_xids([], rate_limited=False)
        if inputs.get("kernel_log_error"):
            facts["warnings"].append(inputs["kernel_log_error"])
    facts["rollout"] = (rollout_marks.rollout_marks(inputs.get("rollout_flag"), inputs.get("rollout_drain"))
                        if not capture else rollout_marks.not_read())
    facts["health"] = node_health(facts)
    facts["contract"] = contract_from_facts(facts)
    facts["headline"] = node_headline(facts)
    return facts
