# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the gpu_policy module's main() against the simulated fleet's NVML (a fake node root).

The NVML test double is the simulated fleet's drop-in pynvml: the real nvidia-ml-py wrappers over
a simulated library serving ``$SIMGPU_ROOT/var/lib/simgpu/state.json``, with the pending/current
rules of real GPUs (ECC pending until boot, power limit bounded, settings reset at boot,
NoPermission for non-root).
"""

import json
import os
import shutil
import subprocess
import sys

import pynvml as real_pynvml
import pytest
import yaml

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from simnode import fault, make_node_root, run_main, state_of, warnings_of  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import boot_node_root, state_path, update_state, write_node_root  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu import PYNVML_DROPIN  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.modules import gpu_policy  # noqa: E402


@pytest.fixture(name="node")
def fixture_node(tmp_path, monkeypatch):
    """Make a fake node root of a GPU class and point the module's pynvml at it."""

    def make(profile="h100"):
        return make_node_root(tmp_path, monkeypatch, gpu_policy, profile)

    return make


def run_module(args, capsys, check_mode=False, diff=False):
    """Run gpu_policy.main() as Ansible does; see simnode.run_main."""
    return run_main(gpu_policy.main, args, capsys, check_mode=check_mode, diff=diff)


H100_POLICY = {"power_limit_w": 600, "persistence_mode": True, "compute_mode": "exclusive_process", "ecc_mode": True}


def test_apply_then_second_run_changes_nothing(node, capsys):
    root = node("h100")
    code, result = run_module(H100_POLICY, capsys)
    assert code == 0, result
    assert result["changed"] is True
    assert len(result["gpus"]) == 8
    gpu = result["gpus"][0]
    assert gpu["in_effect"] == {"power_limit_w": 600.0, "persistence_mode": True, "ecc_mode": True,
                                "compute_mode": "exclusive_process"}
    assert sorted((r["setting"], r["status"]) for r in gpu["results"]) == [
        ("compute_mode", "applied"), ("ecc_mode", "ok"), ("persistence_mode", "applied"), ("power_limit_w", "applied")]
    assert gpu["prior"]["power_limit_w"] == 700.0
    assert result["reboot_required"] is False
    states = state_of(root)["gpus"]
    assert {g["power"]["limit_mw"] for g in states} == {600000}
    assert {(g["persistence_mode"], g["compute_mode"]) for g in states} == {(1, 3)}

    code, result = run_module(H100_POLICY, capsys)
    assert code == 0 and result["changed"] is False
    assert {r["status"] for g in result["gpus"] for r in g["results"]} == {"ok"}


def test_check_mode_changes_nothing_and_shows_the_diff(node, capsys):
    root = node("h100")
    code, result = run_module({"gpus": ["1"], "power_limit_w": 450, "persistence_mode": True}, capsys,
                              check_mode=True, diff=True)
    assert code == 0 and result["changed"] is True
    assert result["diff"] == {"before": {"gpu1": {"power_limit_w": 700.0, "persistence_mode": False}},
                              "after": {"gpu1": {"power_limit_w": 450.0, "persistence_mode": True}}}
    assert [r["status"] for r in result["gpus"][0]["results"]] == ["would_change", "would_change"]
    assert state_of(root)["gpus"][1]["power"]["limit_mw"] == 700000
    assert state_of(root)["gpus"][1]["persistence_mode"] == 0


def test_check_mode_after_apply_changes_nothing(node, capsys):
    node("h100")
    run_module(H100_POLICY, capsys)
    code, result = run_module(H100_POLICY, capsys, check_mode=True, diff=True)
    assert code == 0 and result["changed"] is False
    assert result["diff"]["before"] == result["diff"]["after"]


def test_out_of_range_power_limit_refused_before_any_gpu_is_touched(node, capsys):
    root = node("h100")
    code, result = run_module({"power_limit_w": 750, "persistence_mode": True}, capsys)
    assert code == 1
    assert result["msg"].startswith("GPU policy refused before any GPU was changed: ")
    assert "GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3): power limit 750 W is outside its range [200, 700] W" \
        in result["msg"]
    assert len(result["errors"]) == 8
    states = state_of(root)["gpus"]
    assert {g["power"]["limit_mw"] for g in states} == {700000}
    assert {g["persistence_mode"] for g in states} == {0}  # persistence was valid, but nothing was touched


def test_percent_of_default_on_l40s(node, capsys):
    root = node("l40s")
    code, result = run_module({"power_limit_percent": 85}, capsys)
    assert code == 0, result
    assert [g["in_effect"]["power_limit_w"] for g in result["gpus"]] == [297.5] * 4
    assert state_of(root)["gpus"][0]["power"]["limit_mw"] == 297500


def test_ecc_change_is_reboot_required_then_in_effect_after_boot(node, capsys):
    root = node("a100")
    code, result = run_module({"gpus": ["0"], "ecc_mode": False}, capsys)
    assert code == 0, result
    assert result["changed"] is True and result["reboot_required"] is True
    gpu = result["gpus"][0]
    assert gpu["results"][0]["status"] == "pending_reboot"
    assert gpu["in_effect"]["ecc_mode"] is True and gpu["pending"] == {"ecc_mode": False}
    assert gpu["reboot_required"] == ["ECC mode pending: enabled now, disabled after the next reboot"]
    # run again before the reboot: nothing to change, still pending
    code, result = run_module({"gpus": ["0"], "ecc_mode": False}, capsys)
    assert (result["changed"], result["reboot_required"]) == (False, True)
    assert result["gpus"][0]["results"][0]["status"] == "pending_reboot"

    boot_node_root(root)
    code, result = run_module({"gpus": ["0"], "ecc_mode": False}, capsys)
    assert (code, result["changed"], result["reboot_required"]) == (0, False, False)
    assert result["gpus"][0]["in_effect"]["ecc_mode"] is False and result["gpus"][0]["pending"] == {}


def test_reboot_resets_power_persistence_and_compute_mode(node, capsys):
    root = node("h100")
    run_module(H100_POLICY, capsys)
    boot_node_root(root)
    code, result = run_module(H100_POLICY, capsys, check_mode=True)
    assert result["changed"] is True
    assert result["gpus"][0]["in_effect"]["power_limit_w"] == 700.0
    assert result["gpus"][0]["in_effect"]["persistence_mode"] is False


# --- field case 04: remapped rows pending while nvidia-smi's "Reset Required" says No ----------------

def test_case04_remap_pending_is_reported_as_reset_required(node, capsys):
    root = node("a100")

    def remap_pending(state):
        state["gpus"][2]["remapped_rows"].update(uncorrectable=4, pending=True)

    update_state(state_path(root), remap_pending)
    code, result = run_module({"persistence_mode": True}, capsys)
    assert code == 0, result
    assert result["reset_required"] is True
    assert result["gpus"][2]["reset_required"][0].startswith(
        "row remapping pending (4 uncorrectable, 0 correctable rows): reset the GPU or reboot")
    assert [g["reset_required"] for g in result["gpus"] if g["index"] != 2] == [[]] * 7
    boot_node_root(root)  # the remap takes effect at boot
    code, result = run_module({"persistence_mode": True}, capsys, check_mode=True)
    assert result["reset_required"] is False


# --- field case 14: NotSupported vs NoPermission --------------------------------------------------

def test_case14_ecc_not_supported_is_reported_and_skipped(node, capsys):
    root = node("h100")
    fault(root, "nvml_not_supported", {"field": "ecc_mode", "gpu": 0})
    code, result = run_module({"gpus": ["0", "1"], "ecc_mode": False, "persistence_mode": True}, capsys)
    assert code == 0, result
    assert result["unsupported"] == [{"index": 0, "setting": "ecc_mode"}]
    statuses = dict((r["setting"], r["status"]) for r in result["gpus"][0]["results"])
    assert statuses == {"persistence_mode": "applied", "ecc_mode": "unsupported"}
    assert result["gpus"][0]["reboot_required"] == []  # no reboot scheduled for a setting it cannot take
    assert warnings_of(result) == ["GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3): ecc_mode is not supported; skipped"]
    assert state_of(root)["gpus"][1]["ecc"]["pending"] == 0


def test_case14_not_supported_fails_under_strict_before_any_change(node, capsys):
    root = node("h100")
    fault(root, "nvml_not_supported", {"field": "power_limit", "gpu": 3})
    code, result = run_module({"power_limit_w": 500, "persistence_mode": True, "strict": True}, capsys)
    assert code == 1
    assert "GPU 3 (0000:5d:00.0, NVIDIA H100 80GB HBM3): power_limit_w is not supported on this GPU (strict)" \
        in result["msg"]
    assert {g["persistence_mode"] for g in state_of(root)["gpus"]} == {0}


def test_case14_no_permission_as_a_user_asks_for_root(node, capsys, monkeypatch):
    root = node("h100")
    monkeypatch.setenv("SIMGPU_FAKE_UID", "1000")
    monkeypatch.setattr(gpu_policy, "read_permission_context",
                        lambda: {"euid": 1000, "container": False, "cap_sys_admin": False})
    code, result = run_module({"power_limit_w": 500}, capsys)
    assert code == 1
    assert result["msg"].startswith("NVML refused to set the power limit of GPU 0 (0000:18:00.0, "
                                    "NVIDIA H100 80GB HBM3): Insufficient Permissions.")
    assert "become: true" in result["msg"]
    assert result["changed"] is False
    assert state_of(root)["gpus"][0]["power"]["limit_mw"] == 700000


def test_case14_no_permission_as_root_in_a_container_names_cap_sys_admin(node, capsys, monkeypatch):
    node("h100")
    monkeypatch.setenv("SIMGPU_FAKE_UID", "1000")
    monkeypatch.setattr(gpu_policy, "read_permission_context",
                        lambda: {"euid": 0, "container": True, "cap_sys_admin": False})
    code, result = run_module({"persistence_mode": True}, capsys)
    assert code == 1
    assert "CAP_SYS_ADMIN" in result["msg"] and "--cap-add=SYS_ADMIN" in result["msg"]
    statuses = [r["status"] for g in result["gpus"] for r in g["results"]]
    assert statuses[0] == "no_permission" and set(statuses[1:]) == {"not_attempted"}


def test_selecting_a_missing_gpu_is_refused(node, capsys):
    node("l40s")
    code, result = run_module({"gpus": ["4"], "persistence_mode": True}, capsys)
    assert code == 1
    assert "no GPU 4 on this node (GPU indices present: 0, 1, 2, 3)" in result["msg"]


def test_driver_not_loaded_is_a_clear_error(node, capsys, tmp_path):
    root = node("h100")
    write_node_root(root, state_of(root), loaded=False)
    code, result = run_module({"persistence_mode": True}, capsys)
    assert code == 1
    assert result["nvml_error"] == "DriverNotLoaded"
    assert "NVIDIA kernel module is not loaded" in result["msg"]


# --- the role's boot-time re-apply program, run as the boot unit runs it ---------------------------

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "..")
BOOT_PROGRAM = os.path.join(REPO, "roles", "gpu_policy", "files", "gpu_policy_boot.py")
ROLE_VARS = os.path.join(REPO, "roles", "gpu_policy", "vars", "main.yml")


def _install_boot_program(lib_dir):
    """Lay out the program's library as the role's boot_unit.yml does: only the files vars/main.yml lists."""
    with open(ROLE_VARS) as handle:
        names = yaml.safe_load(handle)["__gpu_policy_module_utils"]
    target = os.path.join(lib_dir, "ansible_collections", "gpufleet", "nvidia", "plugins", "module_utils")
    os.makedirs(target)
    for name in names:
        shutil.copy(os.path.join(REPO, "plugins", "module_utils", name), target)


def _run_boot_program(tmp_path, root, config):
    lib = str(tmp_path / "lib")
    _install_boot_program(lib)
    policy = str(tmp_path / "gpu_policy.json")
    report = str(tmp_path / "state" / "boot-report.json")
    with open(policy, "w") as handle:
        json.dump(config, handle)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SIMGPU_ROOT": root,
           "SIMGPU_REAL_PYNVML": real_pynvml.__file__,
           "PYTHONPATH": os.path.dirname(PYNVML_DROPIN)}
    done = subprocess.run([sys.executable, "-s", BOOT_PROGRAM, "--policy", policy, "--report", report,
                           "--lib", lib], env=env, capture_output=True, text=True, check=False)
    with open(report) as handle:
        return done, json.load(handle)


def test_boot_program_brings_power_persistence_compute_mode_and_mig_back(node, capsys, tmp_path):
    root = node("h100")
    run_module(H100_POLICY, capsys)

    def mig_on_for_gpus_0_and_1(state):
        for gpu in state["gpus"][:2]:
            gpu["mig"].update(current=1, pending=1)

    update_state(state_path(root), mig_on_for_gpus_0_and_1)
    boot_node_root(root)  # power back to 700 W, persistence off, compute mode Default, MIG devices gone
    assert state_of(root)["gpus"][0]["power"]["limit_mw"] == 700000
    config = {"policy": {"gpus": ["all"], "power_limit_w": 600, "power_limit_percent": None, "persistence_mode": True,
                         "compute_mode": "exclusive_process"},
              "mig": {"config": None, "label": None,
                      "layout": [{"devices": [0, 1], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}}]},
              "strict": False, "wait_s": 0}
    done, report = _run_boot_program(tmp_path, root, config)
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["ok"] is True and report["errors"] == []
    assert [g["in_effect"]["power_limit_w"] for g in report["gpus"]] == [600.0] * 8
    assert {g["in_effect"]["persistence_mode"] for g in report["gpus"]} == {True}
    assert [m["in_effect"] for m in report["mig"]] == [{"mig_enabled": True, "mig_devices": {"3g.40gb": 2}}] * 2
    states = state_of(root)["gpus"]
    assert {(g["power"]["limit_mw"], g["persistence_mode"], g["compute_mode"]) for g in states} == {(600000, 1, 3)}
    assert [len(g["mig"]["instances"]) for g in states] == [2, 2, 0, 0, 0, 0, 0, 0]
    assert "GPU policy at boot: in effect (8 GPU(s), 2 MIG GPU(s))" in done.stdout


def test_boot_program_reports_what_is_not_in_effect(node, tmp_path):
    root = node("h100")
    fault(root, "nvml_not_supported", {"field": "persistence_mode", "gpu": 5})
    config = {"policy": {"gpus": ["all"], "power_limit_w": 650, "persistence_mode": True}, "wait_s": 0}
    done, report = _run_boot_program(tmp_path, root, config)
    assert done.returncode == 0, done.stdout + done.stderr  # unsupported is reported and skipped
    statuses = dict((r["setting"], r["status"]) for r in report["gpus"][5]["results"])
    assert statuses == {"power_limit_w": "applied", "persistence_mode": "unsupported"}


def test_boot_program_without_a_loaded_driver_exits_2(node, tmp_path):
    root = node("l40s")
    write_node_root(root, state_of(root), loaded=False)
    done, report = _run_boot_program(tmp_path, root, {"policy": {"persistence_mode": True}, "wait_s": 0})
    assert done.returncode == 2
    assert report["ok"] is False
    assert "NVIDIA kernel module is not loaded" in report["errors"][0]
