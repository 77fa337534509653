# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Two captures of one machine state in two formats give the same facts: a unit test over the real
captures of the conformance corpus (tests/fixtures/corpus/, the ``pair`` entries of MANIFEST.yml).

Each unordered pair is read, each file with the reader of its format, and the facts both formats
carry are compared GPU by GPU (GPUs matched by PCI bus id, else by UUID; the capture tool masked the
identifiers the same way in both files):

* the stable facts of the machine state (count, names, identifiers, driver version, power limits,
  memory total, persistence, ECC, MIG and compute modes, VBIOS, PCIe maximum, maximum clocks,
  fabric registration, ECC and row-remapping counters, ...) are equal, watts within 0.01 W;
* instantaneous readings (temperature, power draw, utilisation, clocks, memory used, P-state,
  current PCIe link) only have a value on both sides or on neither: the two files were taken
  seconds apart;
* a kernel log and nvidia-smi's own answer of one incident name the same GPU, lost on both sides.

What each format carries is the explicit table :data:`CARRIES`; a fact only one format carries is
not compared, and a format's facts are checked to be exactly its row of that table.

``nvidia-smi --query-gpu=... --format=csv`` captures keep their header line and units; the
collection reads ``--query-gpu`` only in the trace form (gpu_trace.parse_smi_query: ten fixed fields,
``noheader,nounits``), so their cells are read here by the header's field names (:func:`_csv_gpus`),
with nvidia-smi's "no value" words as no value."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log, smi_messages
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_text import parse_nvidia_smi_text
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import parse_nvidia_smi_xml

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
ENTRIES = yaml.safe_load((CORPUS / "MANIFEST.yml").read_text(encoding="utf-8"))
FORMAT = dict((e["path"], e["format"]) for e in ENTRIES)
PAIR_ENTRIES = [e for e in ENTRIES if "pair" in e]
#: Each unordered pair once, in path order.
PAIRS = sorted(set(tuple(sorted((e["path"], e["pair"]))) for e in PAIR_ENTRIES))

WATTS_TOLERANCE = 0.01

# --------------------------------------------------------------------------------------------
# The facts compared, and which format carries which
# --------------------------------------------------------------------------------------------

#: Node facts: name → kind.
NODE_FACTS = {
    "driver_version": "stable",
    "cuda_version": "stable",
    "gpu_count": "stable",     # GPUs described
    "attached_gpus": "stable",  # the count nvidia-smi prints
}

#: GPU facts (paths in the gpus[] records of the facts) → kind: ``stable`` values are compared,
#: ``watts`` within WATTS_TOLERANCE, ``reading`` only for having a value on both sides or neither.
GPU_FACTS = {
    "index": "stable",
    "name": "stable",
    "serial": "stable",
    "uuid": "stable",
    "pci_bus_id": "stable",
    "pci_device_id": "stable",
    "vbios_version": "stable",
    "persistence_mode": "stable",
    "compute_mode": "stable",
    "power.limit_w": "watts",
    "power.enforced_limit_w": "watts",
    "power.requested_limit_w": "watts",
    "power.default_limit_w": "watts",
    "power.min_limit_w": "watts",
    "power.max_limit_w": "watts",
    "memory.total_mib": "stable",
    "memory.reserved_mib": "stable",
    "ecc.supported": "stable",
    "ecc.mode_current": "stable",
    "ecc.mode_pending": "stable",
    "ecc.volatile.corrected": "stable",
    "ecc.volatile.uncorrected": "stable",
    "ecc.aggregate.corrected": "stable",
    "ecc.aggregate.uncorrected": "stable",
    "remapped_rows.correctable": "stable",
    "remapped_rows.uncorrectable": "stable",
    "remapped_rows.pending": "stable",
    "remapped_rows.failed": "stable",
    "retired_pages.single_bit_ecc": "stable",
    "retired_pages.double_bit_ecc": "stable",
    "retired_pages.pending": "stable",
    "mig.mode_current": "stable",
    "mig.mode_pending": "stable",
    "extended.mig_capable": "stable",
    "fabric.state": "stable",
    "fabric.status": "stable",
    "fabric.clique_id": "stable",
    "fabric.cluster_uuid": "stable",
    "clocks.sm_max_mhz": "stable",
    "clocks.mem_max_mhz": "stable",
    "extended.app_clocks_default_graphics_mhz": "stable",
    "extended.app_clocks_default_mem_mhz": "stable",
    "pcie.gen_max": "stable",
    "extended.pcie_gen_attainable": "stable",
    "pcie.width_max": "stable",
    "lost": "stable",  # the GPU fell off the bus / cannot be opened
    "temperature_c": "reading",
    "power.draw_w": "reading",
    "utilization_gpu_pct": "reading",
    "clocks.sm_mhz": "reading",
    "clocks.mem_mhz": "reading",
    "memory.used_mib": "reading",
    "memory.free_mib": "reading",
    "clocks_event_reasons": "reading",
    "extended.performance_state": "reading",
    "pcie.gen_current": "reading",
    "pcie.width_current": "reading",
}

_SMI_REPORT_GPU = frozenset(GPU_FACTS) - {"lost"}

#: format → (node facts it carries, GPU facts it carries). -q text and -q -x are read into the same
#: facts by one code path (smi_xml.facts_from_smi_tree).
CARRIES = {
    "smi-text": (frozenset(NODE_FACTS), _SMI_REPORT_GPU),
    "smi-xml": (frozenset(NODE_FACTS), _SMI_REPORT_GPU),
    # --query-gpu has no CUDA version field.
    "smi-csv": (frozenset(NODE_FACTS) - {"cuda_version"}, _SMI_REPORT_GPU),
    # A kernel log names the GPUs the driver set up or logged an Xid for: bus id, UUID, Xid 79.
    "kernel-log": (frozenset(), frozenset(("pci_bus_id", "uuid", "lost"))),
    # nvidia-smi's answer instead of a report names the GPUs it could not open.
    "smi-error": (frozenset(), frozenset(("pci_bus_id", "lost"))),
}

# --------------------------------------------------------------------------------------------
# Readers: each format's facts as {"node": {...}, "gpus": [{...}], "complete": bool}
# --------------------------------------------------------------------------------------------


def _get(record, path):
    for part in path.split("."):
        record = record[part]
    return record


def _smi_report(parsed):
    node = {
        "driver_version": parsed["driver"]["userspace_version"],
        "cuda_version": parsed["driver"]["cuda_driver_version"],
        "gpu_count": len(parsed["gpus"]),
        "attached_gpus": parsed["attached_gpus"],
    }
    gpus = [dict((path, _get(gpu, path)) for path in _SMI_REPORT_GPU) for gpu in parsed["gpus"]]
    return {"node": node, "gpus": gpus, "complete": True}


def _no_value(cell):
    """nvidia-smi's "no value" cells: empty, N/A, or nothing but a bracketed word ([N/A], [Not Supported])."""
    return cell is None or cell.strip() in ("", "N/A") or bool(re.match(r"^\[[^\[\]]*\]$", cell.strip()))


def _csv_cells(text):
    """The rows of a ``--format=csv`` capture as {field: cell}, the header's unit cut from the cells."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    header, body = rows[0], [row for row in rows[1:] if row]
    names = []
    for column in header:
        match = re.match(r"^(?P<name>\S+)(?: \[(?P<unit>[^\]]+)\])?$", column.strip())
        names.append((match.group("name"), match.group("unit")))
    result = []
    for row in body:
        assert len(row) == len(names), "a row of %d cells under a header of %d" % (len(row), len(names))
        cells = {}
        for (name, unit), cell in zip(names, row):
            cell = cell.strip()
            if unit and cell.endswith(" " + unit):
                cell = cell[:-len(unit) - 1]
            cells[name] = None if _no_value(cell) else cell
        result.append(cells)
    return result


def _int(cell):
    return None if cell is None else int(cell)


def _float(cell):
    return None if cell is None else float(cell)


def _bool(cell):
    return None if cell is None else {"enabled": True, "disabled": False, "yes": True, "no": False}[cell.lower()]


def _bus_id(cell):
    """``00000000:0C:00.0`` → ``0000:0c:00.0``."""
    if cell is None:
        return None
    domain, bus, rest = cell.lower().split(":")
    return "%04x:%s:%s" % (int(domain, 16), bus, rest)


def _device_id(cell):
    return None if cell is None else "0x%08x" % int(cell, 16)


def _supported(row, name):
    """A mode printed as a value is supported, printed as N/A is not; no field, not known."""
    if name not in row:
        return None
    return row[name] is not None


#: GPU fact → how a --query-gpu row gives it (the field names of ``nvidia-smi --help-query-gpu``).
_CSV_GPU = {
    "index": lambda r: _int(r["index"]),
    "name": lambda r: r["name"],
    "serial": lambda r: r["serial"],
    "uuid": lambda r: r["uuid"],
    "pci_bus_id": lambda r: _bus_id(r["pci.bus_id"]),
    "pci_device_id": lambda r: _device_id(r["pci.device_id"]),
    "vbios_version": lambda r: r["vbios_version"],
    "persistence_mode": lambda r: _bool(r["persistence_mode"]),
    "compute_mode": lambda r: r["compute_mode"],
    # power.limit is the limit software asked for (-q "Requested Power Limit"), enforced.power.limit the
    # one in effect (-q "Current Power Limit", NVML nvmlDeviceGetEnforcedPowerLimit).
    "power.limit_w": lambda r: _float(r["enforced.power.limit"]),
    "power.enforced_limit_w": lambda r: _float(r["enforced.power.limit"]),
    "power.requested_limit_w": lambda r: _float(r["power.limit"]),
    "power.default_limit_w": lambda r: _float(r["power.default_limit"]),
    "power.min_limit_w": lambda r: _float(r["power.min_limit"]),
    "power.max_limit_w": lambda r: _float(r["power.max_limit"]),
    "memory.total_mib": lambda r: _int(r["memory.total"]),
    "memory.reserved_mib": lambda r: _int(r["memory.reserved"]),
    "ecc.supported": lambda r: _supported(r, "ecc.mode.current"),
    "ecc.mode_current": lambda r: _bool(r["ecc.mode.current"]),
    "ecc.mode_pending": lambda r: _bool(r["ecc.mode.pending"]),
    "ecc.volatile.corrected": lambda r: _int(r["ecc.errors.corrected.volatile.total"]),
    "ecc.volatile.uncorrected": lambda r: _int(r["ecc.errors.uncorrected.volatile.total"]),
    "ecc.aggregate.corrected": lambda r: _int(r["ecc.errors.corrected.aggregate.total"]),
    "ecc.aggregate.uncorrected": lambda r: _int(r["ecc.errors.uncorrected.aggregate.total"]),
    "remapped_rows.correctable": lambda r: _int(r["remapped_rows.correctable"]),
    "remapped_rows.uncorrectable": lambda r: _int(r["remapped_rows.uncorrectable"]),
    "remapped_rows.pending": lambda r: _bool(r["remapped_rows.pending"]),
    "remapped_rows.failed": lambda r: _bool(r["remapped_rows.failure"]),
    "retired_pages.single_bit_ecc": lambda r: _int(r["retired_pages.single_bit_ecc.count"]),
    "retired_pages.double_bit_ecc": lambda r: _int(r["retired_pages.double_bit.count"]),
    "retired_pages.pending": lambda r: _bool(r["retired_pages.pending"]),
    "mig.mode_current": lambda r: _bool(r["mig.mode.current"]),
    "mig.mode_pending": lambda r: _bool(r["mig.mode.pending"]),
    "extended.mig_capable": lambda r: _supported(r, "mig.mode.current"),
    "fabric.state": lambda r: None if r["fabric.state"] is None else r["fabric.state"].lower().replace(" ", "_"),
    "fabric.status": lambda r: r["fabric.status"],
    "fabric.clique_id": lambda r: r["fabric.cliqueId"],
    "fabric.cluster_uuid": lambda r: r["fabric.clusterUuid"],
    "clocks.sm_max_mhz": lambda r: _int(r["clocks.max.sm"]),
    "clocks.mem_max_mhz": lambda r: _int(r["clocks.max.memory"]),
    "extended.app_clocks_default_graphics_mhz": lambda r: _int(r["clocks.default_applications.graphics"]),
    "extended.app_clocks_default_mem_mhz": lambda r: _int(r["clocks.default_applications.memory"]),
    # pcie.link.gen.gpumax is the GPU's own maximum (-q "Device Max"), pcie.link.gen.max the one
    # attainable with the host (-q "Max").
    "pcie.gen_max": lambda r: _int(r["pcie.link.gen.gpumax"]),
    "extended.pcie_gen_attainable": lambda r: _int(r["pcie.link.gen.max"]),
    "pcie.width_max": lambda r: _int(r["pcie.link.width.max"]),
    "temperature_c": lambda r: _int(r["temperature.gpu"]),
    "power.draw_w": lambda r: _float(r["power.draw"]),
    "utilization_gpu_pct": lambda r: _int(r["utilization.gpu"]),
    "clocks.sm_mhz": lambda r: _int(r["clocks.current.sm"]),
    "clocks.mem_mhz": lambda r: _int(r["clocks.current.memory"]),
    "memory.used_mib": lambda r: _int(r["memory.used"]),
    "memory.free_mib": lambda r: _int(r["memory.free"]),
    "clocks_event_reasons": lambda r: r["clocks_event_reasons.active"],
    "extended.performance_state": lambda r: r["pstate"],
    "pcie.gen_current": lambda r: _int(r["pcie.link.gen.gpucurrent"]),
    "pcie.width_current": lambda r: _int(r["pcie.link.width.current"]),
}


def _csv_gpus(text):
    rows = _csv_cells(text)
    versions = set(row["driver_version"] for row in rows)
    counts = set(_int(row["count"]) for row in rows)
    assert len(versions) <= 1 and len(counts) <= 1, "rows disagree on the driver version or count"
    node = {
        "driver_version": versions.pop() if versions else None,
        "gpu_count": len(rows),
        "attached_gpus": counts.pop() if counts else None,
    }
    gpus = [dict((path, read(row)) for path, read in _CSV_GPU.items()) for row in rows]
    return {"node": node, "gpus": gpus, "complete": True}


def _kernel_log_gpus(text):
    lost = set(e["pci_bus_id"] for e in kernel_log.parse_kernel_log(text)["events"] if e["xid"] == 79)
    identities = kernel_log.gpu_identities(text)
    buses = sorted(set(identities) | lost)
    gpus = [{"pci_bus_id": bus, "uuid": identities.get(bus, {}).get("uuid"), "lost": bus in lost} for bus in buses]
    # Only the GPUs the log names: not an enumeration, so not a GPU count.
    return {"node": {}, "gpus": gpus, "complete": False}


def _smi_error_gpus(text):
    answers = smi_messages.parse_smi_answers(text)
    gpus = [{"pci_bus_id": entry["pci_bus_id"], "lost": True} for entry in answers["unreadable"]]
    return {"node": {}, "gpus": gpus, "complete": False}


READERS = {
    "smi-text": lambda text: _smi_report(parse_nvidia_smi_text(text)),
    "smi-xml": lambda text: _smi_report(parse_nvidia_smi_xml(text)),
    "smi-csv": _csv_gpus,
    "kernel-log": _kernel_log_gpus,
    "smi-error": _smi_error_gpus,
}


def _read(path):
    fmt = FORMAT[path]
    facts = READERS[fmt]((CORPUS / path).read_text(encoding="utf-8"))
    node_facts, gpu_facts = CARRIES[fmt]
    assert set(facts["node"]) == node_facts, "%s: node facts %s, CARRIES says %s" % (path, sorted(facts["node"]), sorted(node_facts))
    for gpu in facts["gpus"]:
        assert set(gpu) == gpu_facts, "%s: GPU facts %s, CARRIES says %s" % (path, sorted(gpu), sorted(gpu_facts))
    return facts


# --------------------------------------------------------------------------------------------
# Comparison
# --------------------------------------------------------------------------------------------


def _match(left, right, label):
    """Pairs of (left GPU, right GPU): by PCI bus id where both give one, else by a UUID unique on both sides."""
    matched = []
    for gpu in left["gpus"]:
        found = []
        if gpu.get("pci_bus_id"):
            found = [other for other in right["gpus"] if other.get("pci_bus_id") == gpu["pci_bus_id"]]
        elif gpu.get("uuid") and [g.get("uuid") for g in left["gpus"]].count(gpu["uuid"]) == 1:
            found = [other for other in right["gpus"] if other.get("uuid") == gpu["uuid"]]
        assert len(found) <= 1, "%s: GPU %s matches %d GPUs" % (label, gpu.get("pci_bus_id") or gpu.get("uuid"), len(found))
        if found:
            matched.append((gpu, found[0]))
    if left["complete"] and right["complete"]:
        assert len(matched) == len(left["gpus"]) == len(right["gpus"]), \
            "%s: %d and %d GPUs, %d matched" % (label, len(left["gpus"]), len(right["gpus"]), len(matched))
    assert matched, "%s: no GPU named on both sides" % label
    return matched


def _same(kind, one, other):
    if kind == "reading":
        return (one is None) == (other is None)
    if kind == "watts" and one is not None and other is not None:
        return abs(one - other) <= WATTS_TOLERANCE
    return one == other


def _differences(pair):
    """Every fact both formats carry, compared: (comparisons made, [(fact, left, right), ...] that differ)."""
    left_path, right_path = pair
    left, right = _read(left_path), _read(right_path)
    label = "%s vs %s" % pair
    (left_node, left_gpu), (right_node, right_gpu) = CARRIES[FORMAT[left_path]], CARRIES[FORMAT[right_path]]
    compared, differ = 0, []
    for fact in sorted(left_node & right_node):
        compared += 1
        if not _same(NODE_FACTS[fact], left["node"][fact], right["node"][fact]):
            differ.append((fact, left["node"][fact], right["node"][fact]))
    for one, other in _match(left, right, label):
        gpu = one.get("pci_bus_id") or one.get("uuid")
        for fact in sorted(left_gpu & right_gpu):
            compared += 1
            if not _same(GPU_FACTS[fact], one[fact], other[fact]):
                differ.append(("GPU %s %s (%s)" % (gpu, fact, GPU_FACTS[fact]), one[fact], other[fact]))
    return compared, differ


@pytest.mark.parametrize("pair", PAIRS, ids=["%s+%s" % pair for pair in PAIRS])
def test_a_pair_gives_the_same_facts_in_both_formats(pair):
    compared, differ = _differences(pair)
    assert compared > 0, "%s vs %s: no fact carried by both formats" % pair
    for fact, one, other in differ:
        assert one == other, "%s vs %s: %s: %r != %r" % (pair + (fact, one, other))


def test_every_pair_of_the_manifest_is_compared():
    assert PAIR_ENTRIES, "the manifest records no pair"
    done = [pair for pair in PAIRS if FORMAT[pair[0]] in READERS and FORMAT[pair[1]] in READERS and _differences(pair)[0] > 0]
    assert len(done) >= len(PAIR_ENTRIES) / 2, "%d pairs compared of %d pair entries" % (len(done), len(PAIR_ENTRIES))


def test_text_and_query_gpu_pairs_compare_the_facts_of_the_table():
    """Every pair of two nvidia-smi reports compares at least these stable facts (both formats carry them)."""
    wanted = {"name", "pci_bus_id", "uuid", "power.limit_w", "power.default_limit_w", "power.min_limit_w", "power.max_limit_w",
              "memory.total_mib", "persistence_mode", "ecc.mode_current", "ecc.mode_pending", "mig.mode_current",
              "compute_mode", "vbios_version", "pcie.gen_max", "pcie.width_max"}
    for pair in PAIRS:
        formats = set(FORMAT[p] for p in pair)
        if formats <= {"smi-text", "smi-xml", "smi-csv"}:
            assert wanted <= CARRIES[FORMAT[pair[0]]][1] & CARRIES[FORMAT[pair[1]]][1], pair
