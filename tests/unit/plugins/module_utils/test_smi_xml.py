# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the ``nvidia-smi -q -x`` parser, on field case 01 and the fixtures in tests/fixtures/smi."""

from __future__ import annotations

import os
import random

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_gpu
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import (
    SmiParseError,
    parse_nvidia_smi_xml,
)

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures")


def _read(*parts: str) -> str:
    with open(os.path.join(FIXTURES, *parts), encoding="utf-8") as handle:
        return handle.read()


CASE_01 = ("cases", "01-a100-sxm4-mig-xml-v12", "input.xml")


# ---------------------------------------------------------------------------------------------
# Field case 01: A100-SXM4-80GB, MIG on, DTD v12, attached_gpus=4 with one <gpu>
# ---------------------------------------------------------------------------------------------

@pytest.fixture(name="case01")
def fixture_case01():
    return parse_nvidia_smi_xml(_read(*CASE_01))


def test_case01_driver_and_gpu_count_mismatch_is_a_warning(case01):
    assert case01["driver"] == {"userspace_version": "535.54.03", "cuda_driver_version": "12.2"}
    assert case01["attached_gpus"] == 4
    assert len(case01["gpus"]) == 1
    assert len(case01["warnings"]) == 1
    assert "attached_gpus=4" in case01["warnings"][0] and "1 <gpu>" in case01["warnings"][0]


def test_case01_identity(case01):
    gpu = case01["gpus"][0]
    assert gpu["index"] == 0
    assert gpu["name"] == "NVIDIA A100-SXM4-80GB"
    assert gpu["architecture"] == "Ampere"
    assert gpu["vbios_version"] == "92.00.36.00.02"
    assert gpu["uuid"] == "GPU-00000000-0000-0000-0000-000000000001"
    assert gpu["serial"] == "0000000000001"
    assert gpu["pci_bus_id"] == "0000:01:00.0"
    assert gpu["pci_device_id"] == "0x20b210de"
    assert gpu["readable"] is True and gpu["errors"] == []


def test_case01_modes_mig_and_utilization(case01):
    gpu = case01["gpus"][0]
    assert gpu["persistence_mode"] is False  # a "persistence on" policy must see drift here
    assert gpu["compute_mode"] == "Default"
    assert gpu["mig"]["mode_current"] is True and gpu["mig"]["mode_pending"] is True
    devices = gpu["mig"]["devices"]
    assert [device["gpu_instance_id"] for device in devices] == [3, 4, 5, 6]
    assert {device["compute_instance_id"] for device in devices} == {0}
    assert {device["memory_total_mib"] for device in devices} == {19968}
    assert {device["sm_count"] for device in devices} == {14}
    assert {device["profile"] for device in devices} == {None}  # the XML does not name profiles
    assert gpu["utilization_gpu_pct"] is None  # N/A under MIG, never 0


def test_case01_power_ecc_memory_health(case01):
    gpu = case01["gpus"][0]
    assert gpu["power"] == {
        "limit_w": 500.0,
        "default_limit_w": 500.0,
        "enforced_limit_w": 500.0,
        "requested_limit_w": 500.0,
        "min_limit_w": 100.0,
        "max_limit_w": 500.0,
        "draw_w": 67.03,
    }
    assert gpu["ecc"] == {
        "supported": True,
        "mode_current": True,
        "mode_pending": True,
        "volatile": {"corrected": 0, "uncorrected": 0},
        "aggregate": {"corrected": 0, "uncorrected": 0},
    }
    # <remapped_rows>N/A</remapped_rows> is a scalar here: every value unknown, not 0.
    assert gpu["remapped_rows"] == {"correctable": None, "uncorrectable": None, "pending": None, "failed": None}
    assert gpu["retired_pages"] == {"single_bit_ecc": None, "double_bit_ecc": None, "pending": None}


def test_case01_clocks_temperature_memory_pcie_processes(case01):
    gpu = case01["gpus"][0]
    assert gpu["temperature_c"] == 27
    assert gpu["memory"] == {"total_mib": 81920, "used_mib": 50, "free_mib": 80999, "reserved_mib": 869}
    assert gpu["pcie"] == {"gen_current": 4, "gen_max": 4, "width_current": 16, "width_max": 16}
    assert gpu["clocks"] == {"sm_mhz": 1275, "mem_mhz": 1593, "sm_max_mhz": 1410, "mem_max_mhz": 1593}
    assert gpu["clocks_event_reasons"] == []  # every reason "Not Active"
    assert gpu["processes"] == []  # <processes /> present and empty


def test_case01_record_has_exactly_the_schema_keys(case01):
    gpu = case01["gpus"][0]
    template = new_gpu(0)
    assert set(gpu) == set(template)
    for key, value in template.items():
        if isinstance(value, dict):
            assert set(gpu[key]) == set(value), key


# ---------------------------------------------------------------------------------------------
# DTD v13: hand-written H100 / R580 fixture
# ---------------------------------------------------------------------------------------------

@pytest.fixture(name="h100")
def fixture_h100():
    return parse_nvidia_smi_xml(_read("smi", "h100-sxm5-r580-v13.xml"))


def test_v13_driver_and_count(h100):
    assert h100["driver"] == {"userspace_version": "580.95.05", "cuda_driver_version": "13.0"}
    assert h100["attached_gpus"] == 2
    assert [gpu["index"] for gpu in h100["gpus"]] == [0, 1]
    assert h100["warnings"] == []


def test_v13_mig_disabled_gpu(h100):
    gpu = h100["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["architecture"] == "Hopper"
    assert gpu["pci_bus_id"] == "0000:18:00.0"
    assert gpu["pci_device_id"] == "0x233010de"
    assert gpu["persistence_mode"] is True
    assert gpu["mig"] == {"mode_current": False, "mode_pending": False, "devices": []}
    # <gpu_power_readings> of R570+: no power_draw, average_power_draw is the draw.
    assert gpu["power"] == {
        "limit_w": 700.0,
        "default_limit_w": 700.0,
        "enforced_limit_w": 700.0,
        "requested_limit_w": 700.0,
        "min_limit_w": 200.0,
        "max_limit_w": 700.0,
        "draw_w": 71.42,
    }
    assert gpu["clocks_event_reasons"] == ["gpu_idle"]
    assert gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False}
    assert gpu["pcie"] == {"gen_current": 5, "gen_max": 5, "width_current": 16, "width_max": 16}
    assert gpu["utilization_gpu_pct"] == 0
    assert gpu["processes"] == []


def test_v13_mig_enabled_gpu(h100):
    gpu = h100["gpus"][1]
    assert gpu["pci_bus_id"] == "0000:2a:00.0"  # "00000000:2A:00.0" normalised
    assert gpu["compute_mode"] == "Exclusive_Process"
    assert gpu["mig"]["mode_current"] is True and gpu["mig"]["mode_pending"] is True
    assert [(d["gpu_instance_id"], d["compute_instance_id"], d["sm_count"], d["memory_total_mib"])
            for d in gpu["mig"]["devices"]] == [(1, 0, 60, 40192), (2, 0, 60, 40192)]
    assert gpu["power"]["limit_w"] == 500.0
    assert gpu["power"]["default_limit_w"] == 700.0
    assert gpu["power"]["draw_w"] == 412.55
    # v13 ECC layout: sram_correctable + dram_correctable; parity + secded + dram_uncorrectable.
    assert gpu["ecc"]["volatile"] == {"corrected": 2, "uncorrected": 0}
    assert gpu["ecc"]["aggregate"] == {"corrected": 6, "uncorrected": 1}
    assert gpu["remapped_rows"] == {"correctable": 1, "uncorrectable": 0, "pending": False, "failed": False}
    # only <clocks_event_reasons> counts, not the microsecond <clocks_event_reasons_counters>
    assert gpu["clocks_event_reasons"] == ["sw_power_cap"]
    assert gpu["utilization_gpu_pct"] is None
    assert gpu["temperature_c"] == 52
    assert gpu["memory"] == {"total_mib": 81559, "used_mib": 31770, "free_mib": 48638, "reserved_mib": 1151}
    assert gpu["clocks"] == {"sm_mhz": 1755, "mem_mhz": 2619, "sm_max_mhz": 1980, "mem_max_mhz": 2619}
    assert gpu["processes"] == [{"pid": 48211, "name": "/usr/bin/python3", "used_memory_mib": 31744}]


# ---------------------------------------------------------------------------------------------
# DTD v11: hand-written V100 / R515 fixture (older element names)
# ---------------------------------------------------------------------------------------------

@pytest.fixture(name="v100")
def fixture_v100():
    return parse_nvidia_smi_xml(_read("smi", "v100-sxm2-r515-v11.xml"))


def test_v11_power_readings_enforced_below_requested(v100):
    assert v100["driver"]["userspace_version"] == "515.86.01"
    gpu = v100["gpus"][1]
    assert gpu["name"] == "Tesla V100-SXM2-32GB" and gpu["architecture"] == "Volta"
    assert gpu["power"] == {
        "limit_w": 250.0,            # enforced_power_limit: what is in effect
        "default_limit_w": 300.0,
        "enforced_limit_w": 250.0,
        "requested_limit_w": 300.0,  # power_limit: what was set
        "min_limit_w": 150.0,
        "max_limit_w": 300.0,
        "draw_w": 249.88,
    }


def test_v11_throttle_reasons_ecc_retired_pages_and_link(v100):
    healthy, busy = v100["gpus"]
    assert healthy["clocks_event_reasons"] == []
    assert busy["clocks_event_reasons"] == ["sw_power_cap", "hw_slowdown", "hw_power_brake_slowdown"]
    assert busy["persistence_mode"] is False
    assert busy["ecc"] == {
        "supported": True,
        "mode_current": True,
        "mode_pending": False,
        "volatile": {"corrected": 3, "uncorrected": 1},
        "aggregate": {"corrected": 16, "uncorrected": 1},
    }
    assert busy["retired_pages"] == {"single_bit_ecc": 2, "double_bit_ecc": 1, "pending": True}
    assert healthy["retired_pages"] == {"single_bit_ecc": 0, "double_bit_ecc": 0, "pending": False}
    assert busy["remapped_rows"]["pending"] is None  # V100 has no row remapper
    assert busy["pcie"] == {"gen_current": 3, "gen_max": 3, "width_current": 8, "width_max": 16}
    assert busy["utilization_gpu_pct"] == 97
    assert busy["processes"] == [{"pid": 23817, "name": "./train", "used_memory_mib": 16384}]


# ---------------------------------------------------------------------------------------------
# Small documents for layouts and values the fixtures do not show
# ---------------------------------------------------------------------------------------------

def _doc(gpu_body: str, attached: str = "1") -> str:
    return ('<?xml version="1.0" ?>\n<!DOCTYPE nvidia_smi_log SYSTEM "nvsmi_device_v12.dtd">\n'
            "<nvidia_smi_log><driver_version>535.54.03</driver_version>"
            "<attached_gpus>%s</attached_gpus>"
            '<gpu id="00000000:3B:00.0">%s</gpu></nvidia_smi_log>' % (attached, gpu_body))


def test_no_value_words_become_none():
    gpu = parse_nvidia_smi_xml(_doc(
        "<gpu_power_readings>"
        "<power_draw>[Not Supported]</power_draw>"
        "<current_power_limit>[Requested functionality has been deprecated]</current_power_limit>"
        "<default_power_limit>Requested functionality has been deprecated</default_power_limit>"
        "<min_power_limit>[N/A]</min_power_limit><max_power_limit></max_power_limit>"
        "</gpu_power_readings>"
        "<persistence_mode>[Not Supported]</persistence_mode>"
        "<temperature><gpu_temp>N/A</gpu_temp></temperature>"
        "<compute_mode>[Insufficient Permissions]</compute_mode>"
        "<utilization><gpu_util>[Not Supported]</gpu_util></utilization>"
    ))["gpus"][0]
    assert set(gpu["power"].values()) == {None}
    assert gpu["persistence_mode"] is None
    assert gpu["temperature_c"] is None
    assert gpu["compute_mode"] is None
    assert gpu["utilization_gpu_pct"] is None
    assert gpu["pci_bus_id"] == "0000:3b:00.0"  # from the id attribute when <pci> is absent
    assert gpu["processes"] is None  # no <processes> element at all: unknown, not "none running"
    assert gpu["clocks_event_reasons"] is None


def test_legacy_single_and_double_bit_ecc_layout():
    block = ("<single_bit><device_memory>4</device_memory><register_file>1</register_file>"
             "<l1_cache>N/A</l1_cache><total>%s</total></single_bit>"
             "<double_bit><device_memory>0</device_memory><register_file>N/A</register_file>"
             "<total>N/A</total></double_bit>")
    gpu = parse_nvidia_smi_xml(_doc(
        "<ecc_errors><volatile>%s</volatile><aggregate>%s</aggregate></ecc_errors>"
        % (block % "5", block % "N/A")))["gpus"][0]
    assert gpu["ecc"]["volatile"] == {"corrected": 5, "uncorrected": 0}
    # total N/A: the locations are summed (4 + 1)
    assert gpu["ecc"]["aggregate"] == {"corrected": 5, "uncorrected": 0}


def test_all_na_ecc_counters_are_none():
    gpu = parse_nvidia_smi_xml(_doc(
        "<ecc_mode><current_ecc>N/A</current_ecc><pending_ecc>N/A</pending_ecc></ecc_mode>"
        "<ecc_errors><volatile><sram_correctable>N/A</sram_correctable>"
        "<dram_uncorrectable>N/A</dram_uncorrectable></volatile></ecc_errors>"))["gpus"][0]
    assert gpu["ecc"] == {"supported": False, "mode_current": None, "mode_pending": None,
                          "volatile": {"corrected": None, "uncorrected": None},
                          "aggregate": {"corrected": None, "uncorrected": None}}


def test_more_gpu_elements_than_attached_is_a_warning_too():
    result = parse_nvidia_smi_xml(_doc("<product_name>X</product_name>", attached="0"))
    assert len(result["gpus"]) == 1
    assert result["warnings"] and "attached_gpus=0" in result["warnings"][0]


def test_bytes_input_and_doctype_never_loaded():
    # The DOCTYPE names a DTD file that does not exist; parsing must not try to read it.
    text = _read(*CASE_01).replace("nvsmi_device_v12.dtd", "/nonexistent/dir/nvsmi_device_v12.dtd")
    result = parse_nvidia_smi_xml(text.encode("utf-8"))
    assert result["gpus"][0]["name"] == "NVIDIA A100-SXM4-80GB"


# ---------------------------------------------------------------------------------------------
# Malformed input
# ---------------------------------------------------------------------------------------------

def test_truncated_xml_names_line_and_truncation():
    text = _read(*CASE_01)
    cut = text[: text.index("<gpu_power_readings>") + 40]
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_xml(cut)
    message = str(err.value)
    assert "<nvidia_smi_log>" in message
    assert "line %d" % cut.count("\n") in message or "line %d" % (cut.count("\n") + 1) in message
    assert "truncated" in message


def test_random_bytes_are_refused():
    rng = random.Random(1)
    garbage = bytes(rng.getrandbits(8) for _byte in range(512))
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_xml(garbage)
    assert "nvidia-smi" in str(err.value)
    # the same bytes read as Latin-1 text: not XML either
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_xml("<" + garbage.decode("latin-1"))
    assert "not well-formed" in str(err.value) and "line 1," in str(err.value)
    assert "truncated" not in str(err.value)


def test_wrong_root_element():
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_xml("<?xml version='1.0'?><html><body>login</body></html>")
    assert "expected root element <nvidia_smi_log>" in str(err.value)
    assert "<html>" in str(err.value)


def test_nvidia_smi_error_message_instead_of_xml():
    text = ("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
            "Make sure that the latest NVIDIA driver is installed and running.\n")
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_xml(text)
    assert "line 1 is not XML" in str(err.value)
    assert "NVIDIA-SMI has failed" in str(err.value)


def test_entity_declarations_are_refused():
    text = ('<?xml version="1.0"?>\n<!DOCTYPE nvidia_smi_log [\n<!ENTITY x SYSTEM "file:///etc/passwd">\n]>\n'
            "<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>")
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_xml(text)
    assert "<!ENTITY" in str(err.value) and "line 3" in str(err.value)


@pytest.mark.parametrize("text", ["", "   \n", b""])
def test_empty_output(text):
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_xml(text)
    assert "empty" in str(err.value)


def test_parse_error_is_a_value_error():
    assert issubclass(SmiParseError, ValueError)
