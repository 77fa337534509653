# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for MIG layout planning and the reset diagnosis (field case 13)."""

import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_gpu, new_mig_device
from ansible_collections.gpufleet.nvidia.plugins.module_utils.mig_plan import (
    MigConfigError,
    assert_messages,
    blocked_message,
    current_layout,
    diagnose_reset_failure,
    layout_errors,
    parse_mig_config,
    plan_mig,
    profile_memory_slices,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_messages import classify_smi_output

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures", "cases")

# H100 80GB HBM3 GPU-instance profiles as `nvidia-smi mig -lgip` lists them (id, instances, slices,
# memory): 1g.10gb 19 7/1/9.75 GiB, 1g.10gb+me 20 1/1, 1g.20gb 15 4/1/19.62 GiB, 2g.20gb 14 3/2,
# 3g.40gb 9 2/3/39.5 GiB, 4g.40gb 5 1/4, 7g.80gb 0 1/7/79.25 GiB.
H100_PROFILES = [
    {"name": "1g.10gb", "id": 19, "instance_count": 7, "slice_count": 1, "memory_mib": 9984},
    {"name": "1g.10gb+me", "id": 20, "instance_count": 1, "slice_count": 1, "memory_mib": 9984},
    {"name": "1g.20gb", "id": 15, "instance_count": 4, "slice_count": 1, "memory_mib": 20096},
    {"name": "2g.20gb", "id": 14, "instance_count": 3, "slice_count": 2, "memory_mib": 20096},
    {"name": "3g.40gb", "id": 9, "instance_count": 2, "slice_count": 3, "memory_mib": 40448},
    {"name": "4g.40gb", "id": 5, "instance_count": 1, "slice_count": 4, "memory_mib": 40448},
    {"name": "7g.80gb", "id": 0, "instance_count": 1, "slice_count": 7, "memory_mib": 81152},
]

CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.10gb": [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}],
        "mixed": [
            {"devices": [0, 1], "mig-enabled": False},
            {"devices": [2], "device-filter": "0x233010DE", "mig-enabled": True,
             "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
        ],
    },
}


def make_gpu(index, mig=(False, False), devices=None, processes=None, device_id="0x233010de"):
    gpu = new_gpu(index)
    gpu.update({"name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "0000:%02x:00.0" % (0x18 + 0x20 * index),
                "uuid": "GPU-%d" % index, "pci_device_id": device_id, "processes": processes or []})
    gpu["mig"]["mode_current"], gpu["mig"]["mode_pending"] = mig
    for gi_id, profile in devices or []:
        device = new_mig_device()
        device.update({"gpu_instance_id": gi_id, "compute_instance_id": 0, "profile": profile})
        gpu["mig"]["devices"].append(device)
    return gpu


def profiles_for(gpus):
    return {gpu["index"]: H100_PROFILES for gpu in gpus}


# --- config format ----------------------------------------------------------------------------------

def test_parse_label_entries():
    entries = parse_mig_config(CONFIG, "mixed")
    assert entries == [
        {"devices": [0, 1], "device_filter": [], "mig_enabled": False, "mig_devices": {}},
        {"devices": [2], "device_filter": ["0x233010de"], "mig_enabled": True,
         "mig_devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
    ]


def test_parse_refuses_unknown_label_version_and_bad_entries():
    with pytest.raises(MigConfigError) as err:
        parse_mig_config(CONFIG, "all-2g.20gb")
    assert "no label 'all-2g.20gb' (labels: all-1g.10gb, all-disabled, mixed)" in str(err.value)
    with pytest.raises(MigConfigError) as err:
        parse_mig_config({"version": "v2", "mig-configs": {"x": [{"devices": "all", "mig-enabled": True,
                                                                  "mig-devices": {"1g": 7}}]}}, "x")
    assert err.value.errors[0] == "mig config version must be v1, got 'v2'"
    assert "'1g' is not a MIG profile name" in str(err.value)
    with pytest.raises(MigConfigError) as err:
        parse_mig_config([{"devices": "all", "mig-enabled": False, "mig-devices": {"1g.10gb": 1}}])
    assert "mig-devices given with mig-enabled: false" in str(err.value)


# --- profiles ----------------------------------------------------------------------------------------

def test_memory_slices_of_h100_profiles():
    slices = {profile["name"]: profile_memory_slices(profile, H100_PROFILES) for profile in H100_PROFILES}
    assert slices == {"1g.10gb": 1, "1g.10gb+me": 1, "1g.20gb": 2, "2g.20gb": 2, "3g.40gb": 4, "4g.40gb": 4,
                      "7g.80gb": 8}


def test_layouts_checked_against_profiles():
    assert layout_errors({"1g.10gb": 7}, H100_PROFILES) == []
    assert layout_errors({"4g.40gb": 1, "3g.40gb": 1}, H100_PROFILES) == []
    assert layout_errors({"1g.10gb": 8}, H100_PROFILES) == ["8 × 1g.10gb asked, at most 7 fit on this GPU"]
    assert layout_errors({"3g.40gb": 2, "1g.10gb": 1}, H100_PROFILES) == [
        "layout 1g.10gb×1 + 3g.40gb×2 needs 9 memory slices, the GPU has 8"]
    assert layout_errors({"4g.40gb": 1, "2g.20gb": 2}, H100_PROFILES) == [
        "layout 2g.20gb×2 + 4g.40gb×1 needs 8 compute slices, the GPU has 7"]
    errors = layout_errors({"1g.5gb": 7}, H100_PROFILES)
    assert errors[0].startswith("MIG profile 1g.5gb does not exist on this GPU (profiles: 1g.10gb, 1g.10gb+me")


def test_current_layout_counts_gpu_instances():
    gpu = make_gpu(0, mig=(True, True), devices=[(1, "3g.40gb"), (2, "1g.10gb"), (3, "1g.10gb")])
    assert current_layout(gpu) == {"3g.40gb": 1, "1g.10gb": 2}


# --- plan --------------------------------------------------------------------------------------------

def test_plan_enables_mig_and_lays_out_with_reset():
    gpus = [make_gpu(0), make_gpu(1, mig=(True, True), devices=[(i, "1g.10gb") for i in range(7, 14)])]
    plan = plan_mig(parse_mig_config(CONFIG, "all-1g.10gb"), gpus, profiles_for(gpus))
    gpu0, gpu1 = plan["gpus"]
    assert (gpu0["set_mode"], gpu0["needs_reset"], gpu0["layout_change"]) == (True, True, True)
    assert gpu0["before"] == {"mode_current": False, "mode_pending": False, "mig_devices": {}}
    assert (gpu1["set_mode"], gpu1["needs_reset"], gpu1["layout_change"], gpu1["change"]) == (None, False, False, False)
    assert plan["changes"] == 1 and plan["reset_required"] is True


def test_plan_device_filter_and_indices():
    gpus = [make_gpu(0, mig=(True, True)), make_gpu(1), make_gpu(2), make_gpu(3, device_id="0x20b010de")]
    plan = plan_mig(parse_mig_config(CONFIG, "mixed"), gpus, profiles_for(gpus))
    assert [gpu["index"] for gpu in plan["gpus"]] == [0, 1, 2]  # GPU 3 matched by no entry: left alone
    assert plan["gpus"][0]["set_mode"] is False and plan["gpus"][0]["needs_reset"] is True
    assert plan["gpus"][1]["change"] is False
    assert plan["gpus"][2]["wanted"]["mig_devices"] == {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}


def test_plan_refuses_layouts_that_do_not_fit_naming_the_gpu():
    gpus = [make_gpu(0)]
    entries = parse_mig_config([{"devices": "all", "mig-enabled": True, "mig-devices": {"7g.80gb": 1, "1g.10gb": 1}}])
    with pytest.raises(MigConfigError) as err:
        plan_mig(entries, gpus, profiles_for(gpus))
    assert err.value.errors == [
        "GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3): layout 1g.10gb×1 + 7g.80gb×1 needs 8 compute slices, "
        "the GPU has 7",
        "GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3): layout 1g.10gb×1 + 7g.80gb×1 needs 9 memory slices, "
        "the GPU has 8"]


def test_plan_refuses_missing_gpu_and_overlap():
    gpus = [make_gpu(0)]
    with pytest.raises(MigConfigError) as err:
        plan_mig(parse_mig_config([{"devices": [0, 4], "mig-enabled": False}]), gpus, profiles_for(gpus))
    assert "entry 0 names GPU 4, not on this node (GPU indices present: 0)" in str(err.value)
    overlap = parse_mig_config([{"devices": "all", "mig-enabled": False}, {"devices": [0], "mig-enabled": False}])
    with pytest.raises(MigConfigError) as err:
        plan_mig(overlap, gpus, profiles_for(gpus))
    assert "is matched by entries 0 and 1" in str(err.value)


def test_gpu_without_mig_is_skipped_or_refused_under_strict():
    l40s = make_gpu(0, mig=(None, None), device_id="0x26b510de")
    entries = parse_mig_config(CONFIG, "all-1g.10gb")
    plan = plan_mig(entries, [l40s], {0: []})
    assert plan["gpus"] == [] and plan["skipped"][0]["index"] == 0
    with pytest.raises(MigConfigError):
        plan_mig(entries, [l40s], {0: []}, strict=True)
    # "all-disabled" on a GPU without MIG is simply nothing to do
    assert plan_mig(parse_mig_config(CONFIG, "all-disabled"), [l40s], {0: []})["changes"] == 0


def test_running_process_blocks_the_change_and_is_named():
    gpus = [make_gpu(0, processes=[{"pid": 4242, "name": "python3", "used_memory_mib": 1024}]), make_gpu(1)]
    plan = plan_mig(parse_mig_config(CONFIG, "all-1g.10gb"), gpus, profiles_for(gpus))
    assert [gpu["index"] for gpu in plan["blocked"]] == [0]
    assert blocked_message(plan) == (
        "MIG change refused: GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3) runs pid 4242 (python3). "
        "Stop these processes (drain the node) or set force: true.")


def test_process_on_a_gpu_already_as_wanted_does_not_block():
    gpu = make_gpu(0, mig=(False, False), processes=[{"pid": 7, "name": "train"}])
    plan = plan_mig(parse_mig_config(CONFIG, "all-disabled"), [gpu], profiles_for([gpu]))
    assert plan["blocked"] == [] and plan["changes"] == 0


def test_assert_messages():
    gpus = [make_gpu(0), make_gpu(1, mig=(True, True), devices=[(1, "1g.10gb")] * 1 + [(2, "1g.10gb"), (3, "1g.10gb")])]
    plan = plan_mig(parse_mig_config(CONFIG, "all-1g.10gb"), gpus, profiles_for(gpus))
    assert assert_messages(plan) == [
        "GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3): MIG mode disabled, wanted enabled",
        "GPU 1 (0000:38:00.0, NVIDIA H100 80GB HBM3): MIG devices 1g.10gb×3, wanted 1g.10gb×7",
    ]


# --- field case 13: reset refused "In use by another client", no user processes, nvidia_drm ---------

def _case13():
    with open(os.path.join(FIXTURES, "13-mig-reset-blocked-by-nvidia-drm", "input.txt"), encoding="utf-8") as fh:
        return fh.read()


def test_case13_diagnosis_names_nvidia_drm_not_processes():
    entries = classify_smi_output(_case13())
    gpus = []
    for index, bus in enumerate(["0000:01:00.0", "0000:47:00.0", "0000:81:00.0", "0000:c2:00.0"]):
        gpu = make_gpu(index)
        gpu["pci_bus_id"] = bus
        gpus.append(gpu)
    diagnosis = diagnose_reset_failure(gpus, entries, nvidia_drm_loaded=True)
    assert diagnosis["causes"] == ["nvidia_drm"]
    assert diagnosis["gpus"] == ["0000:01:00.0", "0000:47:00.0", "0000:81:00.0", "0000:c2:00.0"]
    assert "modprobe -r nvidia_drm" in diagnosis["message"]
    assert "no compute process holds the GPUs" in diagnosis["message"]
    assert "kill" not in diagnosis["message"].lower()
    assert diagnosis["reboot_required"] is True


def test_case13_persistenced_holding_the_gpus():
    diagnosis = diagnose_reset_failure([make_gpu(0)], classify_smi_output(_case13()), persistenced_pids=[811])
    assert diagnosis["causes"] == ["nvidia_persistenced"]
    assert "systemctl stop nvidia-persistenced" in diagnosis["message"]
    assert "pid 811" in diagnosis["message"]


def test_reset_refused_with_processes_names_them():
    gpu = make_gpu(0, processes=[{"pid": 4242, "name": "python3"}])
    diagnosis = diagnose_reset_failure([gpu], [{"pci_bus_id": "0000:18:00.0", "status": "in_use",
                                                "message": "GPU 00000000:18:00.0: In use by another client",
                                                "range_w": None}])
    assert diagnosis["causes"] == ["compute_processes"]
    assert "pid 4242 (python3)" in diagnosis["message"]
