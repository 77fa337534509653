# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift report (and a rollout report) as Prometheus metrics, written with ``prometheus_client``.

For node_exporter's textfile collector (``--collector.textfile.directory``): one ``*.prom`` file
written atomically by ``prometheus_textfile.write_families`` (``prometheus_client.write_to_textfile``).

Per-GPU series carry the labels dcgm-exporter puts on its ``DCGM_FI_*`` series, with the same
names and value formats, so a query can join them (``* on(Hostname, UUID) group_left ...``):

* ``Hostname``: the node's host name (``ansible_nodename`` from the fact cache, which is what
  ``uname -n`` and dcgm-exporter's ``os.Hostname()`` give; else the inventory name);
* ``UUID`` (``GPU-…``), ``gpu`` (the NVML index, as text), ``modelName`` (the product name);
* ``pci_bus_id`` in NVML's ``busId`` form, ``00000000:18:00.0`` (8-digit domain, upper-case hex),
  the form dcgm-exporter writes; the facts keep the short ``0000:18:00.0``.

Sources: dcgm-exporter's README and NVIDIA's DCGM-Exporter documentation (sample output:
``DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="GPU-…",pci_bus_id="00000000:0D:00.0",device="nvidia0",
modelName="NVIDIA L40S",Hostname="…",DCGM_FI_DRIVER_VERSION="…"}``); NVML ``nvmlPciInfo_t``
(``busId``: ``domain:bus:device.function``, 8 hex digits of domain; ``busIdLegacy``: 4).
The metrics, their labels and units are listed in docs/drift.md.
"""

from __future__ import annotations

import re
from typing import Any, Dict, Iterable, List, Mapping, Optional

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import prometheus_textfile
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift import FINDING_SEVERITIES
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_outcome import OUTCOMES, outcome

#: The labels that identify a GPU, named and formatted as dcgm-exporter's.
GPU_LABELS = ("Hostname", "UUID", "gpu", "pci_bus_id", "modelName")

#: The outcomes of a rollout's nodes (each node in one; rollout_outcome.OUTCOMES).
ROLLOUT_RESULTS = OUTCOMES

_BUS_ID = re.compile(r"^(?:([0-9a-fA-F]{1,8}):)?([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def dcgm_bus_id(bus_id: Any) -> str:
    """A PCI bus id in NVML's ``busId`` form as dcgm-exporter writes it: ``0000:3b:00.0`` → ``00000000:3B:00.0``.

    :returns: ``""`` for ``None``; text that is not a PCI address is returned as it is.
    """
    if bus_id is None:
        return ""
    match = _BUS_ID.match(str(bus_id).strip())
    if not match:
        return str(bus_id)
    domain, bus, device, function = match.groups()
    return "%08X:%02X:%02X.%s" % (int(domain or "0", 16), int(bus, 16), int(device, 16), function)


def _gauge(name: str, text: str, labels: Iterable[str]) -> Any:
    from prometheus_client.core import GaugeMetricFamily  # pylint: disable=import-outside-toplevel
    return GaugeMetricFamily(name, text, labels=list(labels))


def _number(value: Any) -> Optional[float]:
    if isinstance(value, bool):
        return 1.0 if value else 0.0
    if isinstance(value, (int, float)):
        return float(value)
    return None


def drift_families(report: Mapping[str, Any], timestamp: float) -> List[Any]:
    """The drift report's metric families (``prometheus_client`` ``GaugeMetricFamily`` objects).

    :param report: ``drift.roll_up`` output; per-GPU series for the nodes whose ``gpus`` it kept.
    :param timestamp: epoch seconds of the run.
    :returns: families in the order of docs/drift.md; a GPU value that is unknown (``null``) has no sample.
    """
    nodes = report["nodes"]
    in_sync = _gauge("gpufleet_drift_node_in_sync", "1 when the node matches its class's declared state.",
                     ("Hostname", "node", "class"))
    findings = _gauge("gpufleet_drift_node_findings", "Drift findings of a node per severity (nodes with findings).",
                      ("Hostname", "node", "class", "severity"))
    driver = _gauge("gpufleet_driver_info", "NVIDIA driver versions and driver state of a node (value 1).",
                    ("Hostname", "node", "class", "loaded_version", "userspace_version", "on_disk_version", "state"))
    gpu_info = _gauge("gpufleet_gpu_info", "A GPU of a judged node with its class, serial, driver and compute mode "
                      "(value 1).", GPU_LABELS + ("class", "serial", "driver_version", "driver_state", "compute_mode"))
    gpu_findings = _gauge("gpufleet_gpu_drift_findings", "Drift findings naming this GPU.", GPU_LABELS + ("severity",))
    power = _gauge("gpufleet_gpu_power_limit_watts", "Power limits of the GPU in watts (limit: enforced, requested, "
                   "default, min, max).", GPU_LABELS + ("limit",))
    persistence = _gauge("gpufleet_gpu_persistence_mode", "1 when persistence mode is on.", GPU_LABELS)
    ecc = _gauge("gpufleet_gpu_ecc_mode", "1 when ECC is on now (current mode).", GPU_LABELS)
    rows = _gauge("gpufleet_gpu_remapped_rows", "Rows remapped by the GPU's row remapper (cause: correctable, "
                  "uncorrectable).", GPU_LABELS + ("cause",))
    rows_pending = _gauge("gpufleet_gpu_remapped_rows_pending", "1 when a row remapping waits for a GPU reset.", GPU_LABELS)
    rows_failed = _gauge("gpufleet_gpu_remapped_rows_failed", "1 when a row remapping failed.", GPU_LABELS)
    xids = _gauge("gpufleet_gpu_fatal_xid_events", "Fatal Xid events in the node's current kernel log naming this GPU.",
                  GPU_LABELS)
    for name in sorted(nodes):
        node = nodes[name]
        klass = node["class"]
        host = node.get("hostname") or name
        in_sync.add_metric([host, name, klass], 1.0 if node["in_sync"] else 0.0)
        if node["findings"]:
            counts = dict((severity, 0) for severity in FINDING_SEVERITIES)
            for finding in node["findings"]:
                counts[finding["severity"]] += 1
            for severity in reversed(FINDING_SEVERITIES):
                findings.add_metric([host, name, klass, severity], float(counts[severity]))
        versions = node.get("driver") or {}
        driver.add_metric([host, name, klass, versions.get("loaded") or "", versions.get("userspace") or "",
                           versions.get("on_disk") or "", versions.get("state") or "unknown"], 1.0)
        for gpu in node.get("gpus") or []:
            labels = [host, str(gpu.get("uuid") or ""), "" if gpu.get("index") is None else str(gpu["index"]),
                      dcgm_bus_id(gpu.get("pci_bus_id")), str(gpu.get("name") or "")]
            gpu_info.add_metric(labels + [klass, str(gpu.get("serial") or ""),
                                          versions.get("loaded") or versions.get("userspace") or "",
                                          versions.get("state") or "unknown", str(gpu.get("compute_mode") or "")], 1.0)
            gpu_findings.add_metric(labels + [gpu.get("worst_severity") or "none"], float(gpu.get("findings") or 0))
            limits = gpu.get("power") or {}
            for limit, key in (("enforced", "enforced_limit_w"), ("requested", "limit_w"), ("default", "default_limit_w"),
                               ("min", "min_limit_w"), ("max", "max_limit_w")):
                if _number(limits.get(key)) is not None:
                    power.add_metric(labels + [limit], _number(limits.get(key)))
            for family, value in ((persistence, gpu.get("persistence_mode")), (ecc, gpu.get("ecc_mode"))):
                if _number(value) is not None:
                    family.add_metric(labels, _number(value))
            remap = gpu.get("remapped_rows") or {}
            for cause in ("correctable", "uncorrectable"):
                if _number(remap.get(cause)) is not None:
                    rows.add_metric(labels + [cause], _number(remap.get(cause)))
            for family, key in ((rows_pending, "pending"), (rows_failed, "failed")):
                if _number(remap.get(key)) is not None:
                    family.add_metric(labels, _number(remap.get(key)))
            xids.add_metric(labels, float(gpu.get("fatal_xid_events") or 0))
    classes = _gauge("gpufleet_drift_class_nodes", "Nodes per GPU class and drift status (in_sync, drifted, missing).",
                     ("class", "status"))
    for klass, entry in sorted(report["classes"].items()):
        for status in ("in_sync", "drifted", "missing"):
            classes.add_metric([klass, status], float(entry[status]))
    checks = _gauge("gpufleet_drift_findings", "Drift findings in the fleet per check and severity.", ("check", "severity"))
    totals = {}  # type: Dict[tuple, int]
    for finding in report["findings"]:
        key = (finding["check"], finding["severity"])
        totals[key] = totals.get(key, 0) + 1
    for (check, severity), count in sorted(totals.items()):
        checks.add_metric([check, severity], float(count))
    summary = report["summary"]
    fleet = _gauge("gpufleet_drift_nodes", "Nodes judged by the drift report, per status (all, in_sync, drifted, "
                   "missing).", ("status",))
    for status in ("nodes", "in_sync", "drifted", "missing"):
        fleet.add_metric(["all" if status == "nodes" else status], float(summary[status]))
    stamp = _gauge("gpufleet_drift_report_timestamp_seconds", "When the drift report ran (Unix time, seconds).", ())
    stamp.add_metric([], float(int(timestamp)))
    return [in_sync, findings, driver, gpu_info, gpu_findings, power, persistence, ecc, rows, rows_pending,
            rows_failed, xids, classes, checks, fleet, stamp]


def rollout_families(rollout: Mapping[str, Any]) -> List[Any]:
    """A rollout report's metric families (``rollout-report.json`` of ``rollout_report.render``).

    :param rollout: ``{"rollout_id", "status", "stop_reason", "nodes": [{"node", "stage", "class"?,
        "result", "outcome"?}], "stages": [{"name", "counts": {outcome: n}}], "budgets": {class: {"nodes", "max_unavailable",
        "out_of_service", "free", "failed", "failure_budget"}} | None}``.
    :returns: families: ``gpufleet_rollout_info``, ``_stopped``, ``_nodes{class,result}``,
        ``_stage_nodes{stage,result}`` (``result`` is the node's one outcome, rollout_outcome), ``_capacity_free_nodes``, ``_out_of_service_nodes``,
        ``_failure_budget_left_nodes`` (per class; budgets only for a rollout run in steps).
    """
    rollout_id = str(rollout.get("rollout_id") or "")
    info = _gauge("gpufleet_rollout_info", "The rollout's status and stop reason (value 1).",
                  ("rollout_id", "status", "stop_reason"))
    info.add_metric([rollout_id, str(rollout.get("status") or "unknown"), str(rollout.get("stop_reason") or "")], 1.0)
    stopped = _gauge("gpufleet_rollout_stopped", "1 when the rollout stopped (a stop reason holds).", ("rollout_id",))
    stopped.add_metric([rollout_id], 1.0 if rollout.get("status") == "stopped" else 0.0)
    per_class = {}  # type: Dict[str, Dict[str, int]]
    for node in rollout.get("nodes") or []:
        counts = per_class.setdefault(str(node.get("class") or "unclassified"), dict((r, 0) for r in ROLLOUT_RESULTS))
        result = node.get("outcome") if node.get("outcome") in OUTCOMES else outcome(node)
        counts[result] += 1
    nodes = _gauge("gpufleet_rollout_nodes", "Nodes of the rollout per GPU class and outcome (each node in one).",
                   ("rollout_id", "class", "result"))
    for klass, counts in sorted(per_class.items()):
        for result, count in sorted(counts.items()):
            nodes.add_metric([rollout_id, klass, result], float(count))
    stages = _gauge("gpufleet_rollout_stage_nodes", "Nodes of the rollout per stage and outcome (each node in one).",
                    ("rollout_id", "stage", "result"))
    for stage in rollout.get("stages") or []:
        for result, count in sorted((stage.get("counts") or {}).items()):
            stages.add_metric([rollout_id, str(stage.get("name")), result], float(count))
    free = _gauge("gpufleet_rollout_capacity_free_nodes", "Nodes of a class that may still go out of service now "
                  "(max_unavailable less those out of service).", ("rollout_id", "class"))
    out = _gauge("gpufleet_rollout_out_of_service_nodes", "Nodes of a class out of service now.", ("rollout_id", "class"))
    left = _gauge("gpufleet_rollout_failure_budget_left_nodes", "Failures a class may still have before the rollout "
                  "stops (failure budget less failed nodes, at least 0).", ("rollout_id", "class"))
    for klass, row in sorted((rollout.get("budgets") or {}).items()):
        free.add_metric([rollout_id, klass], float(row.get("free") or 0))
        out.add_metric([rollout_id, klass], float(row.get("out_of_service") or 0))
        left.add_metric([rollout_id, klass], float(max(0, int(row.get("failure_budget") or 0) - int(row.get("failed") or 0))))
    return [info, stopped, nodes, stages, free, out, left]


def write_textfile(path: str, report: Mapping[str, Any], timestamp: float,
                   rollout: Optional[Mapping[str, Any]] = None) -> None:
    """Write the drift (and rollout) metrics to ``path`` with ``prometheus_client.write_to_textfile``.

    The file is written to a temporary name in the same directory and renamed (node_exporter never
    reads half a file).

    :param report: ``drift.roll_up`` output. :param timestamp: epoch seconds of the run.
    :param rollout: a rollout report (``rollout-report.json``) or ``None``.
    :raises prometheus_textfile.PrometheusUnavailable: when ``prometheus_client`` is not installed
        on the controller.
    :raises OSError: when the directory cannot be written.
    """
    prometheus_textfile.require()
    families = drift_families(report, timestamp)
    if rollout is not None:
        families += rollout_families(rollout)
    prometheus_textfile.write_families(path, families)
