# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU trace helpers: NVML samples against the simulated fleet's NVML, nvidia-smi lines, CSV, summary, compare.

The NVML test double is the simulated fleet's drop-in pynvml (the real nvidia-ml-py wrappers over a
simulated library serving ``$SIMGPU_ROOT/var/lib/simgpu/state.json``), as in test_nvml_reader.
"""

import csv
import io
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from simnode import fault  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu import load_pynvml as load_sim_pynvml  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import (  # noqa: E402  pylint: disable=wrong-import-position
    boot_node_root,
    initial_state,
    state_path,
    update_state,
    write_node_root,
)

from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_trace  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import CLOCKS_EVENT_REASON_BITS  # noqa: E402

H100_GPU0 = {"time_s": 0.5, "gpu": 0, "pci_bus_id": "0000:18:00.0", "uuid": "GPU-d64c1ccd-29bf-5a87-a161-c6dff88cf767",
             "pstate": "P0", "sm_clock_mhz": 345, "mem_clock_mhz": 2619, "power_w": 68.9, "temperature_c": 29,
             "utilization_gpu_pct": 0, "clocks_event_reasons": ["gpu_idle"]}


@pytest.fixture(name="node")
def fixture_node(tmp_path, monkeypatch):
    """A booted h100 node root; returns (root, the NVML double initialised)."""
    root = str(tmp_path / "root")
    write_node_root(root, initial_state("h100", "node-h100"))
    boot_node_root(root)
    monkeypatch.setenv("SIMGPU_ROOT", root)
    monkeypatch.delenv("SIMGPU_FAKE_UID", raising=False)
    nvml = load_sim_pynvml()
    nvml.nvmlInit()
    yield root, nvml
    nvml.nvmlShutdown()


def set_gpu(root, index, **values):
    """Change GPU ``index`` of the simulated node: sm_mhz, draw_mw, reasons (mask), pstate, utilization."""

    def mutate(state):
        gpu = state["gpus"][index]
        if "sm_mhz" in values:
            gpu["clocks"]["sm"] = values["sm_mhz"]
        if "draw_mw" in values:
            gpu["power"]["draw_mw"] = values["draw_mw"]
        if "reasons" in values:
            gpu["clocks_event_reasons"] = values["reasons"]
        if "pstate" in values:
            gpu["performance_state"] = values["pstate"]
        if "utilization" in values:
            gpu["utilization"]["gpu"] = values["utilization"]

    update_state(state_path(root), mutate)


class OldPynvml(object):
    """A pynvml from before R535: no nvmlDeviceGetCurrentClocksEventReasons, only ...ThrottleReasons."""

    def __init__(self, nvml):
        self._nvml = nvml
        self.calls = []

    def __getattr__(self, name):
        if name == "nvmlDeviceGetCurrentClocksEventReasons":
            raise AttributeError(name)
        if name.startswith("nvmlDeviceGetCurrentClocks"):
            self.calls.append(name)
        return getattr(self._nvml, name)


# --- NVML -------------------------------------------------------------------------------------

def test_columns_are_the_trace_columns_in_order():
    assert gpu_trace.COLUMNS == ("time_s", "gpu", "pci_bus_id", "uuid", "pstate", "sm_clock_mhz", "mem_clock_mhz",
                                 "power_w", "temperature_c", "utilization_gpu_pct", "clocks_event_reasons")


def test_nvml_sample_reads_every_gpu_with_units(node):
    root, nvml = node
    set_gpu(root, 2, sm_mhz=1410, draw_mw=355049, reasons=0x4 | 0x1, pstate=2, utilization=97)
    found = gpu_trace.nvml_gpus(nvml)
    assert found["error"] is None and len(found["gpus"]) == 8
    notes = []
    rows = gpu_trace.sample_nvml(nvml, found["gpus"], 0.5, notes)
    assert notes == []
    assert len(rows) == 8
    assert rows[0] == H100_GPU0
    # 355049 mW is 355.0 W; the reasons are the facts' names, in bit order.
    assert (rows[2]["sm_clock_mhz"], rows[2]["power_w"], rows[2]["pstate"], rows[2]["utilization_gpu_pct"]) == \
        (1410, 355.0, "P2", 97)
    assert rows[2]["clocks_event_reasons"] == ["gpu_idle", "sw_power_cap"]
    assert [row["gpu"] for row in rows] == list(range(8))
    assert len({row["pci_bus_id"] for row in rows}) == 8


def test_bare_handles_read_the_identity_at_each_sample(node):
    _root, nvml = node
    handles = [nvml.nvmlDeviceGetHandleByIndex(index) for index in range(2)]
    rows = gpu_trace.sample_nvml(nvml, handles, 0.5)
    assert rows[0] == H100_GPU0
    assert rows[1]["gpu"] == 1 and rows[1]["pci_bus_id"] == "0000:2a:00.0"


def test_nvml_error_on_one_value_is_none_for_that_value_only(node):
    root, nvml = node
    fault(root, "nvml_not_supported", {"field": "power_usage", "gpu": 3})
    notes = []
    rows = gpu_trace.sample_nvml(nvml, gpu_trace.nvml_gpus(nvml)["gpus"], 1.0, notes)
    assert rows[3]["power_w"] is None
    # Not 0, and the other values of that GPU and the other GPUs are read.
    assert rows[3]["sm_clock_mhz"] == 345 and rows[3]["clocks_event_reasons"] == ["gpu_idle"]
    assert rows[2]["power_w"] == 68.9
    assert notes == [{"gpu": 3, "column": "power_w", "call": "nvmlDeviceGetPowerUsage", "error": "NotSupported"}]


def test_gpu_lost_during_the_trace_has_every_value_none(node):
    root, nvml = node
    gpus = gpu_trace.nvml_gpus(nvml)["gpus"]
    fault(root, "gpu_lost", {"gpu": 5, "when": "now"})
    notes = []
    rows = gpu_trace.sample_nvml(nvml, gpus, 2.0, notes)
    lost = rows[5]
    assert [lost[column] for column in gpu_trace.VALUE_COLUMNS] == [None] * 7
    # Its identity was read before: the row still names the GPU.
    assert lost["gpu"] == 5 and lost["pci_bus_id"] == gpus[5]["pci_bus_id"] and lost["uuid"] == gpus[5]["uuid"]
    assert rows[4]["sm_clock_mhz"] == 345 and rows[6]["power_w"] == 68.9
    assert notes == [{"gpu": 5, "column": "*", "call": None, "error": "GpuIsLost"}]


def test_gpu_lost_before_the_trace_keeps_its_index(node):
    root, nvml = node
    fault(root, "gpu_lost", {"gpu": 1, "when": "now"})
    found = gpu_trace.nvml_gpus(nvml)
    assert found["gpus"][1]["handle"] is None and found["gpus"][1]["error"] == "GpuIsLost"
    notes = []
    rows = gpu_trace.sample_nvml(nvml, found["gpus"], 0.0, notes)
    assert rows[1]["gpu"] == 1 and rows[1]["sm_clock_mhz"] is None and rows[1]["clocks_event_reasons"] is None
    assert rows[0]["sm_clock_mhz"] == 345
    assert notes == [{"gpu": 1, "column": "*", "call": "nvmlDeviceGetHandleByIndex", "error": "GpuIsLost"}]


def test_old_pynvml_reads_the_reasons_as_throttle_reasons(node):
    root, nvml = node
    set_gpu(root, 0, reasons=0x8)
    old = OldPynvml(nvml)
    notes = []
    rows = gpu_trace.sample_nvml(old, gpu_trace.nvml_gpus(old)["gpus"][:1], 0.0, notes)
    assert rows[0]["clocks_event_reasons"] == ["hw_slowdown"]
    assert old.calls == ["nvmlDeviceGetCurrentClocksThrottleReasons"]
    assert notes == []


def test_reason_names_are_the_facts_table():
    names = [name for _bit, name in CLOCKS_EVENT_REASON_BITS]
    row = gpu_trace.check_row({"clocks_event_reasons": 0x1FF})
    assert row["clocks_event_reasons"] == names


# --- nvidia-smi --------------------------------------------------------------------------------

SMI_LINES = (
    "0, 00000000:18:00.0, GPU-13ce364a-0b50-50a7-a8e4-001a125ae621, P0, 1980, 2619, 310.25, 45, 100, 0x0000000000000004\n"
    "1, 00000000:2A:00.0, GPU-be5790ee-1488-5f34-87bf-10b0a2bd9c31, P2, [N/A], 2619, [Not Supported], 44, N/A, "
    "0x0000000000000005\n"
    "Unable to determine the device handle for GPU0000:3A:00.0: GPU is lost.  Reboot the system to recover this GPU\n"
    "3, 00000000:5D:00.0, GPU-0c7d3d52-1e4c-5e3b-8b0f-5a8a4b8f0f35, [GPU is lost], [GPU is lost], [GPU is lost], "
    "[GPU is lost], [GPU is lost], [GPU is lost], [GPU is lost]\n"
)


def test_smi_argv_asks_for_the_columns_without_header_and_units():
    assert gpu_trace.smi_query_argv() == [
        "nvidia-smi",
        "--query-gpu=index,pci.bus_id,uuid,pstate,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,"
        "clocks_event_reasons.active",
        "--format=csv,noheader,nounits"]
    old = gpu_trace.smi_query_argv("clocks_throttle_reasons.active", "/usr/bin/nvidia-smi")
    assert old[0] == "/usr/bin/nvidia-smi" and old[1].endswith(",utilization.gpu,clocks_throttle_reasons.active")
    with pytest.raises(ValueError, match="clocks_event_reasons.active or clocks_throttle_reasons.active"):
        gpu_trace.smi_query_argv("clocks_event_reasons.sw_power_cap")


def test_smi_lines_parse_into_rows_with_none_for_na_and_a_lost_gpu():
    rows = gpu_trace.parse_smi_query(SMI_LINES, time_s=1.25)
    assert len(rows) == 4
    assert rows[0] == {"time_s": 1.25, "gpu": 0, "pci_bus_id": "0000:18:00.0",
                       "uuid": "GPU-13ce364a-0b50-50a7-a8e4-001a125ae621", "pstate": "P0", "sm_clock_mhz": 1980,
                       "mem_clock_mhz": 2619, "power_w": 310.2, "temperature_c": 45, "utilization_gpu_pct": 100,
                       "clocks_event_reasons": ["sw_power_cap"]}
    second = rows[1]
    assert (second["sm_clock_mhz"], second["power_w"], second["utilization_gpu_pct"]) == (None, None, None)
    assert (second["pstate"], second["mem_clock_mhz"], second["temperature_c"]) == ("P2", 2619, 44)
    assert second["clocks_event_reasons"] == ["gpu_idle", "sw_power_cap"]
    # The lost GPU's line names its bus id only.
    assert rows[2] == dict(gpu_trace.new_row(1.25, None, "0000:3a:00.0"))
    assert rows[2]["pci_bus_id"] == "0000:3a:00.0" and rows[2]["power_w"] is None
    assert rows[3]["gpu"] == 3 and [rows[3][column] for column in gpu_trace.VALUE_COLUMNS] == [None] * 7


def test_smi_unknown_reasons_cell_is_none_not_no_reason():
    rows = gpu_trace.parse_smi_query("0, 00000000:18:00.0, GPU-x, P0, 1980, 2619, 310.25, 45, 100, [N/A]\n"
                                     "1, 00000000:2A:00.0, GPU-y, P0, 1980, 2619, 310.25, 45, 100, 0x0000000000000000\n")
    assert rows[0]["clocks_event_reasons"] is None
    assert rows[1]["clocks_event_reasons"] == []


def test_smi_other_output_is_a_clear_error():
    with pytest.raises(ValueError, match=r"line 1 has 1 comma-separated values, expected 10"):
        gpu_trace.parse_smi_query("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n")
    with pytest.raises(ValueError, match="nvidia-smi --query-gpu output is text, got a NoneType"):
        gpu_trace.parse_smi_query(None)
    assert gpu_trace.parse_smi_query(b"\n") == []


def test_smi_rejected_field_and_lost_line():
    assert gpu_trace.smi_rejected_field('Field "clocks_event_reasons.active" is not a valid field to query.\n\n') == \
        "clocks_event_reasons.active"
    assert gpu_trace.smi_rejected_field("0, 00000000:18:00.0, ...") is None
    assert gpu_trace.smi_lost_gpu("Unable to determine the device handle for GPU0000:9B:00.0: Unknown Error") == \
        "0000:9b:00.0"
    assert gpu_trace.smi_lost_gpu("GPU 0000:9B:00.0 is fine") is None


# --- rows, CSV --------------------------------------------------------------------------------

def test_csv_has_the_header_and_one_line_per_row():
    rows = gpu_trace.parse_smi_query(SMI_LINES, time_s=1.25)
    text = gpu_trace.to_csv(rows)
    lines = text.splitlines()
    assert lines[0] == ("time_s,gpu,pci_bus_id,uuid,pstate,sm_clock_mhz,mem_clock_mhz,power_w,temperature_c,"
                        "utilization_gpu_pct,clocks_event_reasons")
    assert lines[1] == "1.250,0,0000:18:00.0,GPU-13ce364a-0b50-50a7-a8e4-001a125ae621,P0,1980,2619,310.2,45,100,sw_power_cap"
    assert lines[2] == "1.250,1,0000:2a:00.0,GPU-be5790ee-1488-5f34-87bf-10b0a2bd9c31,P2,,2619,,44,,gpu_idle|sw_power_cap"
    assert lines[3] == "1.250,,0000:3a:00.0,,,,,,,,"
    assert len(lines) == 5 and text.endswith("\n")
    # A reader of the CSV gets the same rows back.
    assert gpu_trace.check_rows(list(csv.DictReader(io.StringIO(text)))) == rows


def test_no_active_reason_is_none_in_the_flat_forms():
    row = gpu_trace.check_row({"time_s": 0, "gpu": 0, "clocks_event_reasons": []})
    assert gpu_trace.row_values(row)[-1] == "none"
    assert gpu_trace.to_csv([row]).splitlines()[1].endswith(",none")
    assert gpu_trace.check_row(gpu_trace.row_values(row))["clocks_event_reasons"] == []


def test_rows_round_trip_through_the_list_form():
    rows = gpu_trace.parse_smi_query(SMI_LINES, time_s=0.5)
    assert gpu_trace.check_rows([gpu_trace.row_values(row) for row in rows]) == rows


def test_untrusted_rows_non_numeric_cells_are_none():
    row = gpu_trace.check_row({"time_s": "x", "gpu": True, "pci_bus_id": "not a bus", "uuid": 7, "pstate": "P99",
                               "sm_clock_mhz": "fast", "mem_clock_mhz": float("nan"), "power_w": "1e400",
                               "temperature_c": [1], "utilization_gpu_pct": "55", "clocks_event_reasons": "gpu_idle|<b>"})
    assert row == {"time_s": None, "gpu": None, "pci_bus_id": None, "uuid": None, "pstate": None, "sm_clock_mhz": None,
                   "mem_clock_mhz": None, "power_w": None, "temperature_c": None, "utilization_gpu_pct": 55,
                   "clocks_event_reasons": ["gpu_idle"]}


@pytest.mark.parametrize("rows, message", [
    ("time_s,gpu\n0,0\n", r"a trace is a list of rows \(dicts, or lists of the values of time_s, gpu, .*got a str"),
    ({"0": {}}, "a trace is a list of rows .*got a dict"),
    ([[0.0, 0]], "trace row 0 is not a row: expected a mapping with the keys time_s, .* got a list of 2 values"),
    ([{}, "row"], "trace row 1 is not a row: .*got a str"),
])
def test_malformed_traces_raise_value_error(rows, message):
    with pytest.raises(ValueError, match=message):
        gpu_trace.summarize(rows)
    with pytest.raises(ValueError, match=message):
        gpu_trace.to_csv(rows)


# --- summary and compare ----------------------------------------------------------------------

BUS_IDS = ["0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:4e:00.0",
           "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0"]


def gpu_rows(index, bus_id, samples):
    """Rows of one GPU: ``samples`` is a list of (sm MHz, power W, reasons, pstate)."""
    rows = []
    for number, (sm, power, reasons, pstate) in enumerate(samples):
        row = gpu_trace.new_row(number * 0.5, index, bus_id, "GPU-%d" % index)
        row.update(sm_clock_mhz=sm, mem_clock_mhz=2619, power_w=power, temperature_c=45 + number,
                   utilization_gpu_pct=100, pstate=pstate, clocks_event_reasons=reasons)
        rows.append(row)
    return rows


def node_trace(capped_mhz, power_of=None):
    """A trace of 8 GPUs, 4 samples each: 3 at 1980 MHz unconstrained, 1 power-capped at ``capped_mhz``."""
    rows = []
    for index, bus_id in enumerate(BUS_IDS):
        power = (power_of or {}).get(bus_id, 310.2)
        rows += gpu_rows(index, bus_id, [(1980, power, [], "P0"), (1980, power, [], "P0"),
                                         (capped_mhz, power, ["sw_power_cap"], "P0"), (1980, power, [], "P0")])
    return rows


def test_summary_per_gpu_gives_medians_maxima_capping_shares_and_pstates():
    rows = gpu_rows(0, "0000:18:00.0", [(1980, 300.0, [], "P0"), (1410, 355.0, ["sw_power_cap"], "P0"),
                                        (1395, 349.9, ["gpu_idle", "sw_power_cap"], "P2"), (210, 80.5, None, "P8")])
    rows += gpu_rows(3, None, [(1980, 300.0, [], "P0")])
    summary = gpu_trace.summarize(rows)
    assert list(summary) == ["0000:18:00.0", "3"]
    gpu = summary["0000:18:00.0"]
    assert gpu == {
        "gpu": 0, "pci_bus_id": "0000:18:00.0", "uuid": "GPU-0", "samples": 4,
        "sm_clock_mhz": {"median": 1402.5, "max": 1980},
        "mem_clock_mhz": {"median": 2619, "max": 2619},
        "power_w": {"median": 324.9, "max": 355.0},
        "temperature_c": {"median": 46.5, "max": 48},
        "utilization_gpu_pct": {"median": 100, "max": 100},
        "sm_clock_at_power_cap_mhz": 1402.5,
        # Of the 3 samples whose reasons were read.
        "clocks_event_reasons": {"sw_power_cap": 0.667, "gpu_idle": 0.333},
        "pstates": ["P0", "P2", "P8"],
    }
    assert summary["3"]["sm_clock_at_power_cap_mhz"] is None and summary["3"]["pci_bus_id"] is None


def test_summary_of_unknown_values_is_none():
    row = gpu_trace.new_row(0.0, 0, "0000:18:00.0")
    gpu = gpu_trace.summarize([row])["0000:18:00.0"]
    assert gpu["samples"] == 1 and gpu["sm_clock_mhz"] == {"median": None, "max": None}
    assert gpu["clocks_event_reasons"] == {} and gpu["pstates"] == []


def test_compare_groups_the_gpus_with_one_change_and_names_a_single_gpu():
    before = gpu_trace.summarize(node_trace(1410))
    after = gpu_trace.summarize(node_trace(1140, power_of={"0000:4e:00.0": 355.0}))
    assert gpu_trace.compare(before, after) == [
        "SM clock at power cap: 1410 → 1140 MHz on 8 GPUs",
        "median power draw: 310.2 → 355.0 W on GPU 0000:4e:00.0",
        "max power draw: 310.2 → 355.0 W on GPU 0000:4e:00.0",
    ]


def test_compare_names_the_gpus_of_a_change_on_some_of_them():
    before = gpu_trace.summarize(node_trace(1410))
    after_rows = node_trace(1410)
    for row in after_rows:
        if row["pci_bus_id"] in ("0000:18:00.0", "0000:2a:00.0") and row["clocks_event_reasons"]:
            row["sm_clock_mhz"] = 1140
    assert gpu_trace.compare(before, gpu_trace.summarize(after_rows)) == [
        "SM clock at power cap: 1410 → 1140 MHz on 2 GPUs (0000:18:00.0, 0000:2a:00.0)"]


def test_compare_ignores_changes_under_the_threshold():
    before = gpu_trace.summarize(node_trace(1410))
    # 1410 → 1430 MHz is 1.4 %; 310.2 → 311.1 W is 0.9 W.
    after = gpu_trace.summarize(node_trace(1430, power_of={bus: 311.1 for bus in BUS_IDS}))
    assert gpu_trace.compare(before, after) == []
    assert gpu_trace.compare(before, before) == []


def test_compare_capping_that_appears_reasons_pstates_and_gpus_on_one_side():
    before_rows = gpu_rows(0, "0000:18:00.0", [(1980, 300.0, [], "P0")] * 4)
    before_rows += gpu_rows(1, "0000:2a:00.0", [(1980, 300.0, [], "P0")] * 4)
    after_rows = gpu_rows(0, "0000:18:00.0", [(1980, 300.0, [], "P0")] * 2 + [(1980, 300.0, ["sw_power_cap"], "P2")] * 2)
    after_rows += gpu_rows(2, "0000:3a:00.0", [(1980, 300.0, [], "P0")] * 4)
    assert gpu_trace.compare(gpu_trace.summarize(before_rows), gpu_trace.summarize(after_rows)) == [
        "SM clock at power cap: not capped → 1980 MHz on GPU 0000:18:00.0",
        "share of samples with sw_power_cap: 0 % → 50 % on GPU 0000:18:00.0",
        "P-states seen: P0 → P0, P2 on GPU 0000:18:00.0",
        "GPU 0000:2a:00.0 only in the trace before",
        "GPU 0000:3a:00.0 only in the trace after",
    ]


def test_compare_refuses_what_is_no_summary():
    with pytest.raises(ValueError, match="before is not a trace summary"):
        gpu_trace.compare([], {})
    with pytest.raises(ValueError, match="after: GPU 0000:18:00.0 is not a GPU summary"):
        gpu_trace.compare({}, {"0000:18:00.0": 1410})
    # A summary read back from a file with non-numeric values: those are unknown.
    before = {"0000:18:00.0": {"samples": 3, "sm_clock_at_power_cap_mhz": "fast", "power_w": {"median": 310.2}}}
    after = {"0000:18:00.0": {"samples": 3, "sm_clock_at_power_cap_mhz": None, "power_w": {"median": "355"}}}
    assert gpu_trace.compare(before, after) == ["median power draw: 310.2 → 355.0 W on GPU 0000:18:00.0"]


def test_compare_refuses_what_is_not_a_summary_and_reads_huge_numbers_as_unknown():
    good = {"0000:18:00.0": {"samples": 3, "sm_clock_mhz": {"median": 1410, "max": 1410}}}
    for bad, words in (({}, None), ({"0000:18:00.0": {}}, "no sample count"), ({"x": {"samples": True}}, "no sample count")):
        if words is None:
            assert gpu_trace.compare(bad, good) == ["GPU 0000:18:00.0 only in the trace after"]
            continue
        with pytest.raises(ValueError, match=words):
            gpu_trace.compare(bad, good)
    huge = {"0000:18:00.0": {"samples": 3, "sm_clock_mhz": {"median": 10 ** 400, "max": 1410}}}
    assert gpu_trace.compare(huge, good) == ["median SM clock: unknown → 1410 MHz on GPU 0000:18:00.0"]
