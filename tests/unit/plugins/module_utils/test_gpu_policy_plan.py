# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for policy planning (field cases 04 and 15 included)."""

import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_gpu
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_policy_plan import (
    PolicyError,
    compute_mode_key,
    diff_view,
    gpu_pending,
    normalize_policy,
    plan_policy,
    policy_report,
    wanted_power_limit_w,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_text import parse_nvidia_smi_text

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures", "cases")


def _read(case, name):
    with open(os.path.join(FIXTURES, case, name), encoding="utf-8") as handle:
        return handle.read()


def make_gpu(index, name="NVIDIA H100 80GB HBM3", limit=700.0, default=700.0, low=200.0, high=700.0,
             enforced=None, persistence=False, ecc=(True, True), compute="Default"):
    """A facts-model record as nvml_reader fills it (limit_w = nvmlDeviceGetPowerManagementLimit)."""
    gpu = new_gpu(index)
    gpu.update({"uuid": "GPU-%08d-0000-0000-0000-000000000000" % index, "name": name,
                "pci_bus_id": "0000:%02x:00.0" % (0x18 + 0x20 * index),
                "persistence_mode": persistence, "compute_mode": compute})
    gpu["power"].update({"limit_w": limit, "default_limit_w": default, "min_limit_w": low, "max_limit_w": high,
                         "enforced_limit_w": limit if enforced is None else enforced})
    gpu["ecc"]["mode_current"], gpu["ecc"]["mode_pending"] = ecc
    gpu["remapped_rows"].update({"correctable": 0, "uncorrectable": 0, "pending": False, "failed": False})
    return gpu


# --- policy spec --------------------------------------------------------------------------------

def test_normalize_policy_values():
    policy = normalize_policy({"gpus": "0,2", "power_limit_w": "600W", "persistence_mode": "yes",
                               "ecc_mode": True, "compute_mode": "Exclusive_Process"})
    assert policy == {"gpus": [0, 2], "power_limit_w": 600.0, "power_limit_percent": None,
                      "persistence_mode": True, "ecc_mode": True, "compute_mode": "exclusive_process"}


def test_normalize_policy_lists_every_problem():
    with pytest.raises(PolicyError) as err:
        normalize_policy({"power_limit_w": 600, "power_limit_percent": 80, "compute_mode": "exclusive_thread",
                          "persistance_mode": True})
    messages = err.value.errors
    assert any("persistance_mode" in message for message in messages)
    assert any("not both" in message for message in messages)
    assert any("compute_mode must be one of default, exclusive_process, prohibited" in m for m in messages)


def test_percent_of_default_resolves_per_gpu():
    policy = normalize_policy({"power_limit_percent": 85})
    assert wanted_power_limit_w(policy, make_gpu(0, default=350.0, high=350.0, low=100.0)) == 297.5
    assert wanted_power_limit_w(policy, make_gpu(1)) == 595.0


def test_compute_mode_names():
    assert compute_mode_key("Exclusive_Process") == "exclusive_process"
    assert compute_mode_key("Default") == "default"
    assert compute_mode_key(None) is None


# --- plan -----------------------------------------------------------------------------------------

def test_plan_lists_changes_with_before_after_and_effect():
    gpus = [make_gpu(0), make_gpu(1, limit=600.0)]
    plan = plan_policy({"power_limit_w": 600, "persistence_mode": True, "ecc_mode": True,
                        "compute_mode": "exclusive_process"}, gpus)
    gpu0 = plan["gpus"][0]
    assert gpu0["changes"] == [
        {"setting": "power_limit_w", "before": 700.0, "after": 600.0, "effect": "immediate"},
        {"setting": "persistence_mode", "before": False, "after": True, "effect": "immediate"},
        {"setting": "compute_mode", "before": "default", "after": "exclusive_process", "effect": "immediate"},
    ]
    assert gpu0["prior"]["power_limit_w"] == 700.0
    assert [change["setting"] for change in plan["gpus"][1]["changes"]] == ["persistence_mode", "compute_mode"]
    assert plan["changes"] == 5
    assert plan["reboot_required"] is False


def test_plan_selects_gpus_by_index_uuid_and_bus_id():
    gpus = [make_gpu(0), make_gpu(1), make_gpu(2)]
    plan = plan_policy({"gpus": [2, gpus[0]["uuid"], "00000000:38:00.0"], "persistence_mode": True}, gpus)
    assert [gpu["index"] for gpu in plan["gpus"]] == [0, 1, 2]
    with pytest.raises(PolicyError) as err:
        plan_policy({"gpus": [7], "persistence_mode": True}, gpus)
    assert "no GPU 7 on this node (GPU indices present: 0, 1, 2)" in str(err.value)


def test_power_limit_out_of_range_is_refused_naming_each_gpu_and_range():
    gpus = [make_gpu(0), make_gpu(1, name="NVIDIA L40S", limit=350.0, default=350.0, low=100.0, high=350.0)]
    with pytest.raises(PolicyError) as err:
        plan_policy({"power_limit_w": 400, "persistence_mode": True}, gpus)
    assert err.value.errors == [
        "GPU 1 (0000:38:00.0, NVIDIA L40S): power limit 400 W is outside its range [100, 350] W"]


def test_percent_out_of_range_says_how_it_was_computed():
    with pytest.raises(PolicyError) as err:
        plan_policy({"power_limit_percent": 110}, [make_gpu(0)])
    assert err.value.errors == [
        "GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3): power limit 770 W (110% of the default 700 W) "
        "is outside its range [200, 700] W"]


def test_ecc_change_is_reboot_required_and_already_pending_is_not_changed_again():
    plan = plan_policy({"ecc_mode": False}, [make_gpu(0, ecc=(True, True)), make_gpu(1, ecc=(True, False))])
    assert plan["gpus"][0]["changes"] == [
        {"setting": "ecc_mode", "before": True, "after": False, "effect": "reboot_required"}]
    assert plan["gpus"][0]["reboot_required"] == ["ECC mode disabled after the next reboot"]
    assert plan["gpus"][1]["changes"] == []
    assert plan["gpus"][1]["pending"] == [{"setting": "ecc_mode", "value": False, "current": True,
                                           "requires": "reboot"}]
    assert plan["gpus"][1]["reboot_required"] == ["ECC mode pending: enabled now, disabled after the next reboot"]
    assert plan["changes"] == 1 and plan["reboot_required"] is True


def test_ecc_pending_the_other_way_is_cancelled_without_reboot():
    plan = plan_policy({"ecc_mode": True}, [make_gpu(0, ecc=(True, False))])
    assert plan["gpus"][0]["changes"] == [
        {"setting": "ecc_mode", "before": False, "after": True, "effect": "immediate"}]


def test_unsupported_settings_are_skipped_or_refused_under_strict():
    gpu = make_gpu(0, ecc=(None, None))
    plan = plan_policy({"ecc_mode": True, "persistence_mode": True}, [gpu])
    assert plan["unsupported"] == [{"index": 0, "setting": "ecc_mode"}]
    assert [change["setting"] for change in plan["gpus"][0]["changes"]] == ["persistence_mode"]
    with pytest.raises(PolicyError) as err:
        plan_policy({"ecc_mode": True}, [gpu], strict=True)
    assert "ecc_mode is not supported on this GPU (strict)" in str(err.value)


def test_unreadable_gpu_is_refused():
    gpu = make_gpu(3)
    gpu["readable"] = False
    gpu["errors"] = ["GpuIsLost"]
    with pytest.raises(PolicyError) as err:
        plan_policy({"persistence_mode": True}, [make_gpu(0), gpu])
    assert "GPU 3 (0000:78:00.0, NVIDIA H100 80GB HBM3) cannot be read (GpuIsLost)" in str(err.value)


# --- field case 15: requested 700 W, enforced 500 W, range [200, 700] W ---------------------------

@pytest.fixture(name="case15_gpu")
def fixture_case15_gpu():
    facts = parse_nvidia_smi_text(_read("15-power-limit-range-and-enforced-vs-requested", "input.txt"))
    gpu = facts["gpus"][0]
    gpu["index"] = 0
    return gpu


def test_case15_policy_700_w_is_not_in_effect(case15_gpu):
    plan = plan_policy({"power_limit_w": 700}, [case15_gpu])
    gpu = plan["gpus"][0]
    assert gpu["changes"] == []  # the request already says 700 W: setting it again changes nothing
    assert gpu["not_in_effect"][0]["setting"] == "power_limit_w"
    assert (gpu["not_in_effect"][0]["requested"], gpu["not_in_effect"][0]["enforced"]) == (700.0, 500.0)
    report = policy_report(plan["policy"], case15_gpu)
    assert report["in_effect"]["power_limit_w"] == 500.0
    assert report["requested"]["power_limit_w"] == 700.0
    assert report["drift"] == ["power_limit_w"]


def test_case15_50_w_refused_with_range_200_700(case15_gpu):
    with pytest.raises(PolicyError) as err:
        plan_policy({"power_limit_w": 50}, [case15_gpu])
    assert err.value.errors == ["GPU 0 (0000:06:00.0): power limit 50 W is outside its range [200, 700] W"]


def test_case15_prior_value_is_kept_for_rollback(case15_gpu):
    plan = plan_policy({"power_limit_w": 450}, [case15_gpu])
    gpu = plan["gpus"][0]
    assert gpu["changes"] == [{"setting": "power_limit_w", "before": 700.0, "after": 450.0, "effect": "immediate"}]
    assert (gpu["prior"]["power_limit_w"], gpu["prior"]["enforced_power_limit_w"]) == (700.0, 500.0)


# --- field case 04: remapped rows pending while "Reset Required: No" -------------------------------

@pytest.fixture(name="case04_gpu")
def fixture_case04_gpu():
    facts = parse_nvidia_smi_text(_read("04-a10-remapped-rows-pending", "input.txt"))
    gpu = facts["gpus"][0]
    gpu["index"] = 0
    return gpu


def test_case04_remap_pending_means_reset_required(case04_gpu):
    pending = gpu_pending(case04_gpu)
    assert pending["reboot_required"] == []
    assert len(pending["reset_required"]) == 1
    assert pending["reset_required"][0].startswith("row remapping pending (4 uncorrectable, 0 correctable rows)")


def test_case04_policy_plan_carries_the_reset_required(case04_gpu):
    plan = plan_policy({"persistence_mode": True}, [case04_gpu])
    assert plan["gpus"][0]["changes"] == []  # persistence is already Enabled in the capture
    assert plan["reset_required"] is True


# --- report and diff --------------------------------------------------------------------------------

def test_report_wanted_in_effect_pending():
    policy = normalize_policy({"power_limit_w": 600, "ecc_mode": False, "persistence_mode": True})
    gpu = make_gpu(0, limit=600.0, persistence=True, ecc=(True, False))
    report = policy_report(policy, gpu)
    assert report["wanted"] == {"power_limit_w": 600.0, "persistence_mode": True, "ecc_mode": False}
    assert report["in_effect"] == {"power_limit_w": 600.0, "persistence_mode": True, "ecc_mode": True,
                                   "compute_mode": "default"}
    assert report["pending"] == {"ecc_mode": False}
    assert report["drift"] == []
    assert report["reboot_required"] == ["ECC mode pending: enabled now, disabled after the next reboot"]


def test_diff_view_projects_changes_in_check_mode_and_reads_back_after():
    gpus = [make_gpu(0)]
    plan = plan_policy({"power_limit_w": 500, "ecc_mode": False}, gpus)
    before, after = diff_view(plan)
    assert before == {"gpu0": {"power_limit_w": 700.0, "ecc_mode": True}}
    assert after == {"gpu0": {"power_limit_w": 500.0, "ecc_mode": False}}
    read_back = [make_gpu(0, limit=500.0, ecc=(True, False))]
    assert diff_view(plan, read_back)[1] == {"gpu0": {"power_limit_w": 500.0, "ecc_mode": False}}


@pytest.mark.parametrize("value", ["nan", "inf", float("inf"), "-inf", float("nan")])
def test_power_limit_nan_and_inf_are_refused_with_the_value_named(value):
    with pytest.raises(PolicyError) as err:
        normalize_policy({"power_limit_w": value})
    assert "power_limit_w must be a finite number, got %r" % (value,) in str(err.value)
