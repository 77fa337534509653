# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for the ``nvidia-smi -q`` text parser, on field cases 04, 15 and 26."""

from __future__ import annotations

import os
import random

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_text import parse_nvidia_smi_text
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import (
    SmiParseError,
    parse_nvidia_smi_xml,
)

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures")


def _read(*parts: str) -> str:
    with open(os.path.join(FIXTURES, *parts), encoding="utf-8") as handle:
        return handle.read()


# ---------------------------------------------------------------------------------------------
# Field case 04: NVIDIA A10, driver 535.129.03, remapped rows pending
# ---------------------------------------------------------------------------------------------

@pytest.fixture(name="case04")
def fixture_case04():
    return parse_nvidia_smi_text(_read("cases", "04-a10-remapped-rows-pending", "input.txt"))


def test_case04_remapped_rows_pending_with_four_uncorrectable(case04):
    gpu = case04["gpus"][0]
    # "Reset Required: No" and all-zero ECC counters, yet a remap waits for a GPU reset.
    assert gpu["remapped_rows"] == {"correctable": 0, "uncorrectable": 4, "pending": True, "failed": False}
    assert gpu["ecc"] == {
        "supported": True,
        "mode_current": True,
        "mode_pending": True,
        "volatile": {"corrected": 0, "uncorrected": 0},
        "aggregate": {"corrected": 0, "uncorrected": 0},
    }


def test_case04_driver_identity_and_modes(case04):
    assert case04["driver"] == {"userspace_version": "535.129.03", "cuda_driver_version": "12.2"}
    assert case04["attached_gpus"] == 1
    assert case04["warnings"] == []
    gpu = case04["gpus"][0]
    assert gpu["name"] == "NVIDIA A10"
    assert gpu["architecture"] == "Ampere"
    assert gpu["uuid"] == "GPU-00000000-0000-0000-0000-000000000001"
    assert gpu["serial"] == "0000000000001"
    assert gpu["vbios_version"] == "94.02.5C.00.04"
    assert gpu["pci_bus_id"] == "0000:07:00.0"
    assert gpu["pci_device_id"] == "0x223610de"
    assert gpu["persistence_mode"] is True
    assert gpu["compute_mode"] == "Default"
    assert gpu["mig"] == {"mode_current": None, "mode_pending": None, "devices": []}  # MIG Mode N/A


def test_case04_power_clocks_and_the_rest(case04):
    gpu = case04["gpus"][0]
    assert gpu["power"] == {
        "limit_w": 150.0,
        "default_limit_w": 150.0,
        "enforced_limit_w": 150.0,
        "requested_limit_w": 150.0,
        "min_limit_w": 100.0,
        "max_limit_w": 150.0,
        "draw_w": 43.89,
    }
    assert gpu["temperature_c"] == 33
    assert gpu["clocks"] == {"sm_mhz": 225, "mem_mhz": 405, "sm_max_mhz": 1695, "mem_max_mhz": 6251}
    assert gpu["clocks_event_reasons"] == ["gpu_idle"]  # "Idle : Active", P8
    assert gpu["memory"] == {"total_mib": 23028, "used_mib": 4, "free_mib": 22511, "reserved_mib": 512}
    assert gpu["pcie"] == {"gen_current": 4, "gen_max": 4, "width_current": 16, "width_max": 16}
    assert gpu["utilization_gpu_pct"] == 0  # a real 0 %, not N/A
    assert gpu["retired_pages"] == {"single_bit_ecc": None, "double_bit_ecc": None, "pending": None}
    assert gpu["processes"] == []  # "Processes : None"


# ---------------------------------------------------------------------------------------------
# Field case 15: nvidia-smi -q -d power, driver 595.71.05, Current 500 W vs Requested 700 W
# ---------------------------------------------------------------------------------------------

@pytest.fixture(name="case15")
def fixture_case15():
    return parse_nvidia_smi_text(_read("cases", "15-power-limit-range-and-enforced-vs-requested", "input.txt"))


def test_case15_current_limit_is_not_the_requested_one(case15):
    gpu = case15["gpus"][0]
    assert gpu["pci_bus_id"] == "0000:06:00.0"
    assert gpu["power"] == {
        "limit_w": 500.0,            # Current Power Limit: what is in effect
        "default_limit_w": 700.0,
        "enforced_limit_w": 500.0,
        "requested_limit_w": 700.0,  # Requested Power Limit: not in effect
        "min_limit_w": 200.0,        # the window nvidia-smi -pl accepts: [200, 700] W
        "max_limit_w": 700.0,
        "draw_w": 78.83,             # Average Power Draw (driver prints no plain "Power Draw")
    }


def test_case15_partial_output_leaves_other_fields_unknown(case15):
    assert case15["driver"] == {"userspace_version": "595.71.05", "cuda_driver_version": "13.2"}
    assert case15["attached_gpus"] == 4
    gpu = case15["gpus"][0]
    assert gpu["name"] is None and gpu["temperature_c"] is None
    assert gpu["clocks_event_reasons"] is None and gpu["processes"] is None
    assert gpu["ecc"]["mode_current"] is None


def test_case15_transcript_lines_and_gpu_count_are_warnings(case15):
    warnings = case15["warnings"]
    assert any("before the nvidia-smi -q banner" in warning for warning in warnings)
    assert any("attached_gpus=4" in warning and "1 GPU section" in warning for warning in warnings)
    skipped = [warning for warning in warnings if "skipped" in warning and warning.startswith("line ")]
    assert [warning.split(":")[0] for warning in skipped] == ["line 19", "line 21", "line 22"]


# ---------------------------------------------------------------------------------------------
# Field case 26 is `lspci -vvv`, not nvidia-smi output: refused with a clear message
# ---------------------------------------------------------------------------------------------

def test_case26_lspci_output_is_not_nvidia_smi_text():
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_text(_read("cases", "26-pcie-switch-ports-downgraded-gpu-ok", "input.txt"))
    message = str(err.value)
    assert "NVSMI LOG" in message and "54 line(s)" in message
    assert "PCI bridge" in message  # the first line is quoted, so the operator sees what it was


# ---------------------------------------------------------------------------------------------
# Text and XML give the same facts: hand-written text rendering of GPU 1 of v100-sxm2-r515-v11.xml
# ---------------------------------------------------------------------------------------------

V100_TEXT = """\
==============NVSMI LOG==============

Timestamp                                 : Thu Mar  2 14:05:17 2023
Driver Version                            : 515.86.01
CUDA Version                              : 11.7

Attached GPUs                             : 1
GPU 00000000:1B:00.0
    Product Name                          : Tesla V100-SXM2-32GB
    Product Brand                         : Tesla
    Product Architecture                  : Volta
    Display Mode                          : Disabled
    Display Active                        : Disabled
    Persistence Mode                      : Disabled
    MIG Mode
        Current                           : N/A
        Pending                           : N/A
    Accounting Mode                       : Disabled
    Accounting Mode Buffer Size           : 4000
    Serial Number                         : 0323000000002
    GPU UUID                              : GPU-00000000-0000-0000-0000-0000000000b1
    Minor Number                          : 1
    VBIOS Version                         : 88.00.80.00.01
    PCI
        Bus                               : 0x1B
        Device                            : 0x00
        Domain                            : 0x0000
        Device Id                         : 0x1DB510DE
        Bus Id                            : 00000000:1B:00.0
        Sub System Id                     : 0x124910DE
        GPU Link Info
            PCIe Generation
                Max                       : 3
                Current                   : 3
            Link Width
                Max                       : 16x
                Current                   : 8x
    Fan Speed                             : N/A
    Performance State                     : P0
    Clocks Throttle Reasons
        Idle                              : Not Active
        Applications Clocks Setting       : Not Active
        SW Power Cap                      : Active
        HW Slowdown                       : Active
            HW Thermal Slowdown           : Not Active
            HW Power Brake Slowdown       : Active
        Sync Boost                        : Not Active
        SW Thermal Slowdown               : Not Active
        Display Clock Setting             : Not Active
    FB Memory Usage
        Total                             : 32768 MiB
        Reserved                          : 307 MiB
        Used                              : 16390 MiB
        Free                              : 16071 MiB
    Compute Mode                          : Exclusive_Process
    Utilization
        Gpu                               : 97 %
        Memory                            : 41 %
    ECC Mode
        Current                           : Enabled
        Pending                           : Disabled
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable            : 0
            DRAM Correctable              : 3
            DRAM Uncorrectable            : 1
        Aggregate
            SRAM Correctable              : 2
            SRAM Uncorrectable            : 0
            DRAM Correctable              : 14
            DRAM Uncorrectable            : 1
    Retired Pages
        Single Bit ECC                    : 2
        Double Bit ECC                    : 1
        Pending Page Blacklist            : Yes
    Remapped Rows                         : N/A
    Temperature
        GPU Current Temp                  : 71 C
        GPU Shutdown Temp                 : 90 C
        Memory Current Temp               : 69 C
    Power Readings
        Power Management                  : Supported
        Power Draw                        : 249.88 W
        Power Limit                       : 300.00 W
        Default Power Limit               : 300.00 W
        Enforced Power Limit              : 250.00 W
        Min Power Limit                   : 150.00 W
        Max Power Limit                   : 300.00 W
    Clocks
        Graphics                          : 1380 MHz
        SM                                : 1380 MHz
        Memory                            : 877 MHz
        Video                             : 1260 MHz
    Max Clocks
        Graphics                          : 1530 MHz
        SM                                : 1530 MHz
        Memory                            : 877 MHz
        Video                             : 1372 MHz
    Processes
        GPU instance ID                   : N/A
        Compute instance ID               : N/A
        Process ID                        : 23817
            Type                          : C
            Name                          : ./train
            Used GPU Memory               : 16384 MiB
"""


def test_text_and_xml_of_the_same_gpu_give_the_same_record():
    from_text = parse_nvidia_smi_text(V100_TEXT)
    from_xml = parse_nvidia_smi_xml(_read("smi", "v100-sxm2-r515-v11.xml"))
    text_gpu = dict(from_text["gpus"][0])
    xml_gpu = dict(from_xml["gpus"][1])
    assert text_gpu.pop("index") == 0 and xml_gpu.pop("index") == 1
    # The text sample prints no BAR1 or default application clocks section; the XML does.
    text_extended, xml_extended = text_gpu.pop("extended"), xml_gpu.pop("extended")
    assert text_extended["performance_state"] == xml_extended["performance_state"] == "P0"
    assert text_extended["bar1_total_mib"] is None and xml_extended["bar1_total_mib"] == 32768
    assert (xml_extended["app_clocks_default_graphics_mhz"], xml_extended["app_clocks_default_mem_mhz"]) == (1290, 877)
    assert text_gpu == xml_gpu
    assert text_gpu["clocks_event_reasons"] == ["sw_power_cap", "hw_slowdown", "hw_power_brake_slowdown"]
    assert text_gpu["retired_pages"] == {"single_bit_ecc": 2, "double_bit_ecc": 1, "pending": True}
    assert from_text["driver"] == from_xml["driver"]


MIG_TEXT = """\
==============NVSMI LOG==============

Driver Version                            : 580.95.05
CUDA Version                              : 13.0

Attached GPUs                             : 1
GPU 00000000:2A:00.0
    Product Name                          : NVIDIA H100 80GB HBM3
    MIG Mode
        Current                           : Enabled
        Pending                           : Disabled
    MIG Devices
        MIG Device
            Index                         : 0
            GPU Instance ID               : 1
            Compute Instance ID           : 0
            Device Attributes
                Shared
                    Multiprocessor count  : 60
            FB Memory Usage
                Total                     : 40192 MiB
                Used                      : 31757 MiB
        MIG Device
            Index                         : 1
            GPU Instance ID               : 2
            Compute Instance ID           : 0
            Device Attributes
                Shared
                    Multiprocessor count  : 60
            FB Memory Usage
                Total                     : 40192 MiB
    Clocks Event Reasons
        Idle                              : Not Active
        SW Power Cap                      : Active
    ECC Errors
        Volatile
            SRAM Correctable              : 0
            SRAM Uncorrectable Parity     : 1
            SRAM Uncorrectable SEC-DED    : 2
            DRAM Correctable              : 7
            DRAM Uncorrectable            : 0
    GPU Power Readings
        Average Power Draw                : 412.55 W
        Instantaneous Power Draw          : 418.20 W
        Current Power Limit               : [Not Supported]
        Requested Power Limit             : [Requested functionality has been deprecated]
    Utilization
        Gpu                               : N/A
    Processes
        GPU instance ID                   : 1
        Compute instance ID               : 0
        Process ID                        : 48211
            Type                          : C
            Name                          : /usr/bin/python3
            Used GPU Memory               : 31744 MiB
        GPU instance ID                   : 2
        Compute instance ID               : 0
        Process ID                        : 48377
            Type                          : C
            Name                          : /opt/app/serve
            Used GPU Memory               : 12 MiB
"""


def test_mig_devices_processes_and_v13_ecc_in_text():
    result = parse_nvidia_smi_text(MIG_TEXT)
    gpu = result["gpus"][0]
    assert gpu["mig"]["mode_current"] is True and gpu["mig"]["mode_pending"] is False
    assert [(d["gpu_instance_id"], d["compute_instance_id"], d["sm_count"], d["memory_total_mib"])
            for d in gpu["mig"]["devices"]] == [(1, 0, 60, 40192), (2, 0, 60, 40192)]
    assert gpu["processes"] == [
        {"pid": 48211, "name": "/usr/bin/python3", "used_memory_mib": 31744},
        {"pid": 48377, "name": "/opt/app/serve", "used_memory_mib": 12},
    ]
    assert gpu["ecc"]["volatile"] == {"corrected": 7, "uncorrected": 3}
    assert gpu["clocks_event_reasons"] == ["sw_power_cap"]
    assert gpu["utilization_gpu_pct"] is None
    assert gpu["power"]["draw_w"] == 412.55
    # "[Not Supported]" and "[Requested functionality has been deprecated]" are None, never 0
    assert gpu["power"]["limit_w"] is None and gpu["power"]["requested_limit_w"] is None
    assert result["warnings"] == []


# ---------------------------------------------------------------------------------------------
# Malformed input
# ---------------------------------------------------------------------------------------------

def test_random_bytes_are_refused_with_position():
    rng = random.Random(7)
    garbage = bytes(rng.getrandbits(8) for _byte in range(256))
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_text(garbage.decode("latin-1"))
    assert "binary data at line" in str(err.value)
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_text(garbage)
    assert "not UTF-8" in str(err.value)


def test_xml_given_to_the_text_parser_is_refused():
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_text(_read("cases", "01-a100-sxm4-mig-xml-v12", "input.xml"))
    assert "NVSMI LOG" in str(err.value) and "<?xml" in str(err.value)


def test_banner_alone_is_refused():
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_text("==============NVSMI LOG==============\n\n")
    assert "Key : Value" in str(err.value) and "line 1" in str(err.value)


@pytest.mark.parametrize("text", ["", "\n\n"])
def test_empty_text(text):
    with pytest.raises(SmiParseError) as err:
        parse_nvidia_smi_text(text)
    assert "empty" in str(err.value)


def test_only_the_first_log_is_read():
    text = V100_TEXT + "\n" + V100_TEXT.replace("Tesla V100-SXM2-32GB", "Other")
    result = parse_nvidia_smi_text(text)
    assert [gpu["name"] for gpu in result["gpus"]] == ["Tesla V100-SXM2-32GB"]
    assert any("first nvidia-smi -q log" in warning for warning in result["warnings"])
