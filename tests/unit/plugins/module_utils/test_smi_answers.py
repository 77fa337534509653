# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""nvidia-smi's newer layout and its own answers: one rule for annotations, the R610 power limits,
"No devices were found" and "Unable to determine the device handle" as facts (field cases 37, 38)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi_messages
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import null_if_na

FIXTURES = Path(__file__).resolve().parents[3] / "fixtures"
CORPUS = FIXTURES / "corpus"
CASES = FIXTURES / "cases"


@pytest.mark.parametrize("raw, value", [
    ("610.57.04 [Deprecated; will be removed in CUDA 14.0. Use KMD Version instead]", "610.57.04"),
    ("13.3 [Deprecated; will be removed in CUDA 14.0. Use CUDA UMD Version instead]", "13.3"),
    ("[N/A]", None),
    ("[Not Supported]", None),
    ("[Requested functionality has been deprecated]", None),
    ("[Some word a later driver prints]", None),
    ("N/A [Deprecated]", None),
    ("250.00 W", "250.00 W"),
])
def test_one_rule_for_annotations(raw, value):
    assert null_if_na(raw) == value


@pytest.mark.parametrize("name, version, cuda", [
    ("rtx-2080-super-r610-610.57.04-idle.txt", "610.57.04", "13.3"),
    ("rtx-2080-super-r610-windows-610.62-idle.txt", "610.62", "13.3"),
])
def test_r610_layout_versions_without_annotation_and_power_limits_read(name, version, cuda):
    facts = assemble_facts({"nvidia-smi-q.txt": (CORPUS / "smi-text" / name).read_bytes()}, capture=True)
    assert facts["driver"]["userspace_version"] == version and facts["driver"]["cuda_driver_version"] == cuda
    assert facts["driver"]["branch"] == "610"
    power = facts["gpus"][0]["power"]
    # Under "GPU Ceiling Power Limit" since R610: 250 W current, requested and default; 105-350 W range.
    assert (power["limit_w"], power["requested_limit_w"], power["default_limit_w"]) == (250.0, 250.0, 250.0)
    assert (power["min_limit_w"], power["max_limit_w"]) == (105.0, 350.0)


def test_no_devices_were_found_is_an_answer():
    # Field case 38: the GPU failed to initialise, so nvidia-smi sees none.
    text = (CASES / "38-gsp-boot-wpr2-already-up-rminitadapter-failed" / "input-nvidia-smi-1104.txt").read_bytes()
    assert smi_messages.parse_smi_answers(text.decode()) == {"no_devices": True, "unreadable": [], "answered": True}
    facts = assemble_facts({"nvidia-smi-q.txt": text}, capture=True)
    assert facts["gpu_count"] == 0 and facts["gpus"] == []
    assert "nvidia-smi: No devices were found" in facts["warnings"]
    with_log = assemble_facts({"nvidia-smi-q.txt": text, "dmesg.txt": (
        CASES / "38-gsp-boot-wpr2-already-up-rminitadapter-failed" / "input-dmesg-1058.log").read_bytes()}, capture=True)
    assert with_log["health"]["state"] == "unhealthy"
    assert [(g["pci_bus_id"], g["listed"]) for g in with_log["health"]["gpus"]] == [("0000:01:00.0", False)]


def test_device_handle_error_names_the_unreadable_gpu_and_the_bundle_is_read():
    case = CASES / "37-xid79-with-nvswitch-sxid20034-fatal"
    facts = assemble_facts({"nvidia-smi-q.txt": (case / "input-nvidia-smi.txt").read_bytes(),
                            "dmesg.txt": (case / "input-dmesg.log").read_bytes()}, capture=True)
    assert [(g["pci_bus_id"], g["readable"], g["errors"]) for g in facts["gpus"]] == [
        ("0000:91:00.0", False, ["Unknown Error"])]
    assert facts["gpu_count"] == 1
    assert facts["health"]["state"] == "unhealthy"
    assert [p["kind"] for p in facts["health"]["problems"]] == ["nvswitch_fatal"]
    assert facts["xid_summary"]["by_xid"] == {"79": 1}
