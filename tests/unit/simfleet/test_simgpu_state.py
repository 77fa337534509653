# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""GPU profiles, state files, fault validation and the node files."""

import json
import os
import re
import subprocess
import sys
import threading

import pytest

from simfleet.gpu import nodefiles
from simfleet.gpu.faults import apply_fault
from simfleet.gpu.profiles import PROFILES
from simfleet.gpu.state import initial_state, load_state, save_state, update_state, write_node_root

KERNEL = "6.1.0-31-amd64"


@pytest.mark.parametrize("profile, count, name, arch, power_w, mig_profiles", [
    ("h100", 8, "NVIDIA H100 80GB HBM3", "Hopper", (700, 200, 700), 7),
    ("a100", 8, "NVIDIA A100-SXM4-40GB", "Ampere", (400, 100, 400), 7),
    ("l40s", 4, "NVIDIA L40S", "Ada Lovelace", (350, 100, 350), 0),
    ("v100", 8, "Tesla V100-SXM2-32GB", "Volta", (300, 150, 300), 0),
    ("b200", 8, "NVIDIA B200", "Blackwell", (1000, 200, 1000), 7),
])
def test_profiles(profile, count, name, arch, power_w, mig_profiles):
    state = initial_state(profile, "node-1")
    gpus = state["gpus"]
    assert len(gpus) == count
    assert {g["name"] for g in gpus} == {name}
    assert {g["architecture"] for g in gpus} == {arch}
    power = gpus[0]["power"]
    assert (power["default_mw"], power["min_mw"], power["max_mw"]) == tuple(w * 1000 for w in power_w)
    assert len(gpus[0]["mig"]["profiles"]) == mig_profiles
    assert len({g["uuid"] for g in gpus}) == count
    assert all(g["pci"]["bus_id"].startswith("00000000:") for g in gpus)
    assert json.loads(json.dumps(state)) == state


def test_profile_facts():
    assert PROFILES["b200"]["open_modules_only"] is True
    assert [PROFILES[p]["nvswitch"] for p in ("h100", "a100", "l40s", "v100", "b200")] == [
        True, True, False, False, True]
    h100_1g = [p for p in initial_state("h100", "n")["gpus"][0]["mig"]["profiles"] if p["name"] == "1g.10gb"][0]
    assert (h100_1g["id"], h100_1g["max_count"], h100_1g["sm"]) == (19, 7, 16)


def test_state_is_node_specific_and_stable():
    assert initial_state("h100", "a")["gpus"][0]["uuid"] == initial_state("h100", "a")["gpus"][0]["uuid"]
    assert initial_state("h100", "a")["gpus"][0]["uuid"] != initial_state("h100", "b")["gpus"][0]["uuid"]


def test_concurrent_updates_are_not_lost(tmp_path):
    path = str(tmp_path / "state.json")
    save_state(path, {"counter": 0})

    def bump():
        for _bump in range(25):
            update_state(path, lambda s: s.__setitem__("counter", s["counter"] + 1))

    threads = [threading.Thread(target=bump) for _worker in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert load_state(path)["counter"] == 150


@pytest.mark.parametrize("kind, args, message", [
    ("melt", {}, "unknown fault kind 'melt'"),
    ("nvml_not_supported", {"field": "color"}, "unknown field 'color'"),
    ("gpu_lost", {"gpu": 9}, "no GPU 9 on this node (it has 8)"),
    ("gpu_lost", {"gpu": 1, "when": "later"}, "when must be next_boot or now"),
    ("contract_outlier", {"field": "color", "value": 1}, "contract_outlier: unknown field 'color'"),
    ("contract_outlier", {"field": "max_sm", "value": "fast"}, "value must be a whole number from 1 to 1000000, not 'fast'"),
    ("contract_outlier", {"field": "max_sm", "value": "-5"}, "not '-5'"),
    ("contract_outlier", {"field": "max_sm", "value": True}, "not True"),
    ("contract_outlier", {"field": "max_sm", "value": "1410", "versoin": "620.82.01"}, "unknown argument versoin"),
    ("contract_outlier", {"field": "max_sm", "value": "1410", "version": "new"}, "driver version such as 620.82.01, not 'new'"),
    ("contract_outlier", {"field": "max_sm", "value": "1410", "gpu": "abc"}, "gpu must be a GPU index or all, not 'abc'"),
])
def test_fault_validation(kind, args, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        apply_fault(initial_state("h100", "n"), kind, args)


def test_fault_command_line_args_and_clear():
    state = initial_state("h100", "n")
    apply_fault(state, "build_fail", ["580.178.04"])
    apply_fault(state, "nvml_not_supported", ["field=ecc_mode", "gpu=3"])
    apply_fault(state, "gpu_lost", ["5", "now"])
    assert state["faults"]["build_fail"] == ["580.178.04"]
    assert state["gpus"][3]["not_supported"] == ["ecc_mode"]
    assert state["gpus"][5]["bus_state"] == "lost"
    apply_fault(state, "clear", [])
    assert state["faults"]["build_fail"] == []
    assert state["gpus"][3]["not_supported"] == []
    assert state["gpus"][5]["bus_state"] == "ok"


def test_a_replaced_gpu_is_back_on_the_bus_with_a_new_uuid_and_serial_in_the_same_slot():
    state = initial_state("h100", "n")
    apply_fault(state, "gpu_lost", ["2"])
    apply_fault(state, "gpu_lost", ["5", "now"])
    old = dict(state["gpus"][5])
    apply_fault(state, "gpu_replaced", ["5"])
    gpu = state["gpus"][5]
    assert gpu["bus_state"] == "ok"
    assert (gpu["pci"], gpu["name"], gpu["minor_number"]) == (old["pci"], old["name"], old["minor_number"])
    assert gpu["uuid"] != old["uuid"] and gpu["uuid"].startswith("GPU-")
    assert gpu["serial"] != old["serial"] and len(gpu["serial"]) == len(old["serial"])
    # Another GPU's armed loss stays; the replaced one's own is over.
    apply_fault(state, "gpu_replaced", ["2"])
    assert state["faults"]["gpu_lost"] == []
    with pytest.raises(ValueError, match="gpu_replaced needs the index of one GPU"):
        apply_fault(state, "gpu_replaced", ["all"])


def test_the_driver_moves_the_contract_and_an_outlier_fault_moves_one_node_more(tmp_path):
    from simfleet.gpu.state import boot_node_root
    root = str(tmp_path / "n")
    state = initial_state("h100", "n")
    apply_fault(state, "contract_outlier", ["field=max_sm", "value=1410", "version=620.82.01"])
    write_node_root(root, state, userspace_version="580.126.20")
    boot_node_root(root)
    gpu = load_state(os.path.join(root, "var/lib/simgpu/state.json"))["gpus"][0]
    assert (gpu["memory"]["reserved_mib"], gpu["clocks"]["app_graphics"], gpu["clocks"]["max_sm"]) == (480, 1980, 1980)
    write_node_root(root, load_state(os.path.join(root, "var/lib/simgpu/state.json")), userspace_version="620.82.01")
    boot_node_root(root)
    gpu = load_state(os.path.join(root, "var/lib/simgpu/state.json"))["gpus"][0]
    # R620 reserves 64 MiB more, 620.82.01 lowers the default application clock, the fault the SM clock.
    assert (gpu["memory"]["reserved_mib"], gpu["clocks"]["app_graphics"], gpu["clocks"]["max_sm"]) == (544, 1935, 1410)
    clear = load_state(os.path.join(root, "var/lib/simgpu/state.json"))
    apply_fault(clear, "clear", ["contract_outlier"])
    write_node_root(root, clear, userspace_version="620.82.01")
    boot_node_root(root)
    gpu = load_state(os.path.join(root, "var/lib/simgpu/state.json"))["gpus"][0]
    assert (gpu["memory"]["reserved_mib"], gpu["clocks"]["max_sm"]) == (544, 1980)


def test_install_into_rootfs_and_the_drop_in_as_pynvml(tmp_path):
    rootfs = str(tmp_path / "rootfs")
    os.makedirs(os.path.join(rootfs, "usr/lib/python3.11"))
    written = nodefiles.install_into_rootfs(rootfs)
    assert "/usr/local/lib/python3.11/dist-packages/pynvml.py" in written
    assert os.readlink(os.path.join(rootfs, "usr/local/lib/python3.11/dist-packages/pynvml.py")) == \
        "/usr/lib/simgpu/pynvml-dropin/pynvml.py"
    assert os.readlink(os.path.join(rootfs, "etc/systemd/system/multi-user.target.wants/simgpu-boot.service")) == \
        "/usr/lib/systemd/system/simgpu-boot.service"
    assert os.access(os.path.join(rootfs, "usr/lib/simgpu/bin/simgpu"), os.X_OK)
    assert os.access(os.path.join(rootfs, "usr/local/bin/dmesg"), os.X_OK)
    # The entry point gets the node's interpreter line at install time (the source has none).
    with open(os.path.join(rootfs, "usr/lib/simgpu/bin/simgpu"), encoding="utf-8") as handle:
        installed = handle.read()
    with open(os.path.join(nodefiles.NODE_DIR, "usr/lib/simgpu/bin/simgpu"), encoding="utf-8") as handle:
        source = handle.read()
    assert not source.startswith("#!")
    assert installed == "#!/usr/bin/python3\n" + source
    assert nodefiles.install_into_rootfs(rootfs) == written
    with open(os.path.join(rootfs, "usr/lib/simgpu/bin/simgpu"), encoding="utf-8") as handle:
        assert handle.read() == installed
    assert nodefiles.node_files_digest() == nodefiles.node_files_digest()

    node_root = str(tmp_path / "node")
    write_node_root(node_root, initial_state("b200", "n"), userspace_version="595.91.07", kernel_release=KERNEL)
    env = dict(os.environ, SIMGPU_ROOT=node_root, SIMGPU_KERNEL_RELEASE=KERNEL)
    code = ("import sys; sys.path.insert(0, %r)\n"
            "import pynvml\n"
            "pynvml.nvmlInit()\n"
            "print(pynvml.__name__, pynvml.NVMLError_NotSupported.__module__, pynvml.SIMGPU_REAL_SOURCE.split('/')[-1])\n"
            "print(pynvml.nvmlSystemGetDriverVersion(), pynvml.nvmlDeviceGetCount())\n"
            % os.path.join(rootfs, "usr/lib/simgpu/pynvml-dropin"))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True, text=True).stdout
    assert out.splitlines() == ["pynvml pynvml nvidia_ml_py_pynvml.py", "595.91.07 8"]
    smi = subprocess.run([sys.executable, os.path.join(rootfs, "usr/lib/simgpu/bin/simgpu"), "nvidia-smi", "-L"],
                         env=env, capture_output=True, text=True, check=False)
    assert smi.returncode == 0
    assert smi.stdout.splitlines()[0].startswith("GPU 0: NVIDIA B200 (UUID: GPU-")
