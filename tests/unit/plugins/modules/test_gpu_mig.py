# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Run the gpu_mig module's main() against the simulated fleet's NVML and nvidia-smi (a fake node root).

MIG mode changes are pending until a GPU reset or boot, refused with InUse while compute processes
run; MIG devices vanish at boot or reset; nvidia-smi -r refuses busy GPUs "In use by another client".
"""

import os
import stat
import sys

import pytest

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures", "cases")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from simnode import fault, make_node_root, run_main, state_of, warnings_of  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu import SIMGPU_LIB_DIR  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import boot_node_root  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.modules import gpu_mig  # noqa: E402

ALL_1G = [{"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]
CONFIG = {
    "version": "v1",
    "mig-configs": {
        "all-disabled": [{"devices": "all", "mig-enabled": False}],
        "all-1g.10gb": ALL_1G,
        "half-balanced": [
            {"devices": [0, 1, 2, 3], "mig-enabled": False},
            {"devices": [4, 5, 6, 7], "device-filter": "0x233010DE", "mig-enabled": True,
             "mig-devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}},
        ],
    },
}


def _write_smi(path, body):
    with open(path, "w") as handle:
        handle.write("#!%s\n%s" % (sys.executable, body))
    os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)
    return path


@pytest.fixture(name="node")
def fixture_node(tmp_path, monkeypatch):
    """A fake node root of a GPU class with the simulated NVML and nvidia-smi."""

    def make(profile="h100"):
        root = make_node_root(tmp_path, monkeypatch, gpu_mig, profile)
        monkeypatch.setattr(gpu_mig, "_reset_holders", lambda: (False, [], []))
        smi = _write_smi(str(tmp_path / "nvidia-smi"),
                         "import sys\nsys.path.insert(0, %r)\nfrom simgpu import smi\nsys.exit(smi.main(sys.argv[1:]))\n"
                         % SIMGPU_LIB_DIR)
        return root, smi

    return make


def run_module(args, capsys, check_mode=False, diff=False):
    """Run gpu_mig.main() as Ansible does; see simnode.run_main."""
    return run_main(gpu_mig.main, args, capsys, check_mode=check_mode, diff=diff)


def layout_in_state(gpu):
    counts = {}
    for inst in gpu["mig"]["instances"]:
        profile = [p for p in gpu["mig"]["profiles"] if p["nvml_profile"] == inst["profile"]][0]
        counts[profile["name"]] = counts.get(profile["name"], 0) + 1
    return counts


def test_apply_enables_mig_resets_and_creates_then_is_idempotent(node, capsys):
    root, smi = node("h100")
    code, result = run_module({"layout": ALL_1G, "nvidia_smi": smi}, capsys)
    assert code == 0, result
    assert result["changed"] is True and result["reboot_required"] is False
    gpu = result["gpus"][0]
    assert gpu["status"] == "applied"
    assert gpu["actions"] == ["set_mode", "reset", "create_instances"]
    assert gpu["after"] == {"mode_current": True, "mode_pending": True, "mig_devices": {"1g.10gb": 7}}
    assert result["reset"]["gpus"] == [0, 1, 2, 3, 4, 5, 6, 7] and result["reset"]["rc"] == 0
    assert [layout_in_state(g) for g in state_of(root)["gpus"]] == [{"1g.10gb": 7}] * 8

    code, result = run_module({"layout": ALL_1G, "nvidia_smi": smi}, capsys)
    assert code == 0 and result["changed"] is False
    assert {g["status"] for g in result["gpus"]} == {"ok"}


def test_check_mode_shows_the_diff_and_changes_nothing(node, capsys):
    root, smi = node("h100")
    code, result = run_module({"config": CONFIG, "label": "half-balanced", "nvidia_smi": smi}, capsys,
                              check_mode=True, diff=True)
    assert code == 0 and result["changed"] is True
    assert result["diff"]["before"]["gpu4"] == {"mode_current": False, "mode_pending": False, "mig_devices": {}}
    assert result["diff"]["after"]["gpu4"] == {"mode_current": True, "mode_pending": True,
                                               "mig_devices": {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}}
    assert result["diff"]["after"]["gpu0"] == result["diff"]["before"]["gpu0"]
    assert [g["status"] for g in result["gpus"]] == ["ok"] * 4 + ["would_change"] * 4
    assert {g["mig"]["current"] for g in state_of(root)["gpus"]} == {0}


def test_mixed_layout_applies_and_check_mode_after_is_clean(node, capsys):
    root, smi = node("h100")
    code, result = run_module({"config": CONFIG, "label": "half-balanced", "nvidia_smi": smi}, capsys)
    assert code == 0, result
    assert [layout_in_state(g) for g in state_of(root)["gpus"]][3:5] == [{}, {"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}]
    code, result = run_module({"config": CONFIG, "label": "half-balanced", "nvidia_smi": smi}, capsys,
                              check_mode=True, diff=True)
    assert code == 0 and result["changed"] is False
    assert result["diff"]["before"] == result["diff"]["after"]


def test_running_process_refuses_naming_it_then_idle_applies(node, capsys):
    root, smi = node("h100")
    fault(root, "gpu_busy", {"gpu": 2})
    code, result = run_module({"layout": ALL_1G, "nvidia_smi": smi}, capsys)
    assert code == 1
    assert result["msg"] == ("MIG change refused: GPU 2 (0000:3a:00.0, NVIDIA H100 80GB HBM3) runs pid 31200 "
                             "(python3). Stop these processes (drain the node) or set force: true.")
    assert result["blocked"][0]["processes"][0]["pid"] == 31200
    assert {g["mig"]["pending"] for g in state_of(root)["gpus"]} == {0}  # nothing touched, not even idle GPUs

    fault(root, "clear", {"kind": "gpu_busy"})
    code, result = run_module({"layout": ALL_1G, "nvidia_smi": smi}, capsys)
    assert code == 0 and result["changed"] is True
    assert layout_in_state(state_of(root)["gpus"][2]) == {"1g.10gb": 7}


def test_force_with_a_running_process_fails_on_that_gpu_only(node, capsys):
    root, smi = node("h100")
    fault(root, "gpu_busy", {"gpu": 1})
    code, result = run_module({"layout": ALL_1G, "force": True, "nvidia_smi": smi}, capsys)
    assert code == 1
    statuses = dict((g["index"], g["status"]) for g in result["gpus"])
    assert statuses[1] == "failed" and statuses[0] == "applied"
    assert "setting MIG mode enabled failed: NVML InUse" in result["msg"]


def test_no_reset_allowed_means_reboot_required_then_boot_unit_work(node, capsys):
    root, smi = node("h100")
    code, result = run_module({"layout": ALL_1G, "allow_reset": False, "nvidia_smi": smi}, capsys)
    assert code == 0, result
    assert result["reboot_required"] is True and result["changed"] is True
    assert result["gpus"][0]["status"] == "reboot_required"
    assert result["gpus"][0]["after"]["mode_current"] is False and result["gpus"][0]["after"]["mode_pending"] is True
    assert "reset" not in result
    boot_node_root(root)  # pending MIG mode becomes current; no MIG devices after a boot
    code, result = run_module({"layout": ALL_1G, "allow_reset": False, "nvidia_smi": smi}, capsys)
    assert code == 0 and result["changed"] is True and result["reboot_required"] is False
    assert result["gpus"][0]["actions"] == ["create_instances"]


def test_case13_reset_refused_with_no_processes_points_at_nvidia_drm(node, capsys, tmp_path, monkeypatch):
    root, _smi = node("h100")
    with open(os.path.join(FIXTURES, "13-mig-reset-blocked-by-nvidia-drm", "input.txt")) as handle:
        transcript = handle.read()
    refusing = _write_smi(str(tmp_path / "nvidia-smi-refusing"),
                          "import sys\nsys.stdout.write(%r)\nsys.exit(255)\n" % transcript.split("\n", 1)[1])
    monkeypatch.setattr(gpu_mig, "_reset_holders", lambda: (True, [], []))
    code, result = run_module({"layout": [{"devices": [0], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}}],
                               "nvidia_smi": refusing}, capsys)
    assert code == 0, result
    assert result["reboot_required"] is True
    assert result["reset"]["rc"] == 255
    assert result["diagnosis"]["causes"] == ["nvidia_drm"]
    assert "modprobe -r nvidia_drm" in result["diagnosis"]["message"]
    assert result["gpus"][0]["status"] == "reboot_required"
    assert any("nvidia_drm" in warning for warning in warnings_of(result))
    assert state_of(root)["gpus"][0]["mig"]["pending"] == 1 and state_of(root)["gpus"][0]["mig"]["current"] == 0


def test_layout_that_does_not_fit_is_refused_before_any_change(node, capsys):
    root, smi = node("h100")
    code, result = run_module({"layout": [{"devices": "all", "mig-enabled": True,
                                           "mig-devices": {"3g.40gb": 2, "1g.10gb": 1}}], "nvidia_smi": smi}, capsys)
    assert code == 1
    assert result["msg"].startswith("MIG layout refused before any GPU was changed: GPU 0 (0000:18:00.0, "
                                    "NVIDIA H100 80GB HBM3): layout 1g.10gb×1 + 3g.40gb×2 needs 9 memory slices")
    assert {g["mig"]["pending"] for g in state_of(root)["gpus"]} == {0}


def test_profiles_are_those_of_each_gpu(node, capsys):
    _root, smi = node("a100")
    code, result = run_module({"layout": ALL_1G, "nvidia_smi": smi}, capsys)
    assert code == 1  # an A100-40GB offers 1g.10gb, but only 4 of them
    assert "GPU 0 (0000:07:00.0, NVIDIA A100-SXM4-40GB): 7 × 1g.10gb asked, at most 4 fit on this GPU" in result["msg"]
    code, result = run_module({"layout": [{"devices": [0], "mig-enabled": True, "mig-devices": {"2g.20gb": 3}}],
                               "nvidia_smi": smi}, capsys)
    assert code == 1
    assert "GPU 0 (0000:07:00.0, NVIDIA A100-SXM4-40GB): MIG profile 2g.20gb does not exist on this GPU " \
        "(profiles: 1g.10gb, 1g.5gb, 1g.5gb+me, 2g.10gb, 3g.20gb, 4g.20gb, 7g.40gb)" in result["msg"]


def test_assert_mode(node, capsys):
    _root, smi = node("h100")
    code, result = run_module({"layout": ALL_1G, "mode": "assert", "nvidia_smi": smi}, capsys)
    assert code == 1
    assert result["mismatches"][0] == "GPU 0 (0000:18:00.0, NVIDIA H100 80GB HBM3): MIG mode disabled, wanted enabled"
    run_module({"layout": ALL_1G, "nvidia_smi": smi}, capsys)
    code, result = run_module({"layout": ALL_1G, "mode": "assert", "nvidia_smi": smi}, capsys)
    assert code == 0 and result["changed"] is False


def test_gpu_without_mig_is_skipped_with_a_warning(node, capsys):
    _root, smi = node("l40s")
    code, result = run_module({"layout": ALL_1G, "nvidia_smi": smi}, capsys)
    assert code == 0 and result["changed"] is False
    assert [item["index"] for item in result["skipped"]] == [0, 1, 2, 3]
    assert len(warnings_of(result)) == 4
    assert warnings_of(result)[0].endswith("NVIDIA L40S) has no MIG (NVML gives no MIG mode); skipped")


def test_no_permission_names_root(node, capsys, monkeypatch):
    root, smi = node("h100")
    monkeypatch.setenv("SIMGPU_FAKE_UID", "1000")
    monkeypatch.setattr(gpu_mig, "read_permission_context",
                        lambda: {"euid": 1000, "container": False, "cap_sys_admin": False})
    code, result = run_module({"layout": ALL_1G, "nvidia_smi": smi}, capsys)
    assert code == 1
    assert result["msg"].startswith("NVML refused to set the MIG configuration of GPU 0")
    assert "become: true" in result["msg"]
    assert {g["mig"]["pending"] for g in state_of(root)["gpus"]} == {0}
