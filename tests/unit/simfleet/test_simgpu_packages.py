# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated driver packages: names, versions, dependencies, and the module "build"."""

import os
import shutil
import subprocess

import pytest

from simfleet.gpu import pkgbuild, simgpu

KERNEL = "6.1.0-31-amd64"
pytestmark = pytest.mark.skipif(
    not all(shutil.which(tool) for tool in ("dpkg-deb", "as", "objcopy", "modinfo", "depmod")),
    reason="needs dpkg-deb, binutils and kmod on the host")


@pytest.fixture(name="debs", scope="module")
def fixture_debs(tmp_path_factory):
    paths = pkgbuild.build_packages(str(tmp_path_factory.mktemp("debs")))
    return {os.path.basename(p): p for p in paths}


def _field(deb, name):
    return subprocess.run(["dpkg-deb", "-f", deb, name], check=True, capture_output=True, text=True).stdout.strip()


def test_package_names_and_versions(debs):
    assert "libnvidia-ml1_580.126.20-1_amd64.deb" in debs
    assert "nvidia-kernel-open-dkms_620.70.06-1_amd64.deb" in debs
    assert "nvidia-kernel-dkms_595.91.07-1_amd64.deb" in debs
    assert not [name for name in debs if name.startswith("nvidia-kernel-dkms_620.")]
    assert "nvidia-fabricmanager-570_570.172.08-1_amd64.deb" in debs
    assert "nvidia-fabricmanager_580.105.08-1_amd64.deb" in debs
    assert "nvidia-driver-pinning-580_580-1_all.deb" in debs
    assert "nvidia-driver-pinning-595.71.05_595.71.05-1_all.deb" in debs
    assert not [name for name in debs if name.startswith(("nvidia-driver-pinning-535", "nvidia-driver-pinning-570"))]
    for branch, spec in pkgbuild.BRANCHES.items():
        assert len(spec["versions"]) >= 2, branch
        for version in spec["versions"]:
            assert "nvidia-driver_%s-1_amd64.deb" % version in debs


def test_control_fields(debs):
    lib = debs["libnvidia-ml1_580.126.20-1_amd64.deb"]
    assert _field(lib, "Package") == "libnvidia-ml1"
    assert _field(lib, "Version") == "580.126.20-1"
    assert _field(lib, "Depends") == "nvidia-kernel-support (= 580.126.20-1)"
    driver = debs["nvidia-driver_620.70.06-1_amd64.deb"]
    assert _field(driver, "Depends") == ("nvidia-driver-libs (= 620.70.06-1), nvidia-driver-cuda (= 620.70.06-1), "
                                         "nvidia-kernel-open-dkms (= 620.70.06-1), firmware-nvidia-gsp (= 620.70.06-1)")
    driver = debs["nvidia-driver_580.126.20-1_amd64.deb"]
    assert "nvidia-kernel-dkms (= 580.126.20-1) | nvidia-kernel-open-dkms (= 580.126.20-1)" in _field(driver, "Depends")
    meta = debs["cuda-drivers-580_580.178.04-1_amd64.deb"]
    assert _field(meta, "Depends") == ("nvidia-driver (>= 580.105.08-1), nvidia-driver-cuda (>= 580.105.08-1), "
                                       "nvidia-kernel-dkms (>= 580.105.08-1)")
    assert _field(debs["cuda-drivers_595.71.05-1_amd64.deb"], "Depends") == "cuda-drivers-595 (= 595.71.05-1)"
    pin = debs["nvidia-driver-pinning-580_580-1_all.deb"]
    assert (_field(pin, "Provides"), _field(pin, "Conflicts")) == ("nvidia-driver-pinning", "nvidia-driver-pinning")
    assert _field(debs["nvidia-kernel-dkms_580.126.20-1_amd64.deb"], "Conflicts") == "nvidia-kernel-open-dkms"


def test_pinning_file(debs, tmp_path):
    subprocess.run(["dpkg-deb", "-x", debs["nvidia-driver-pinning-580_580-1_all.deb"], str(tmp_path)], check=True)
    text = (tmp_path / "etc/apt/preferences.d/nvidia-driver-pin").read_text()
    assert "Pin: version 580.*\nPin-Priority: 1000\n" in text
    assert " libnvidia-ml1 " in text


def test_libnvidia_ml1_installs_the_userspace_marker(debs, tmp_path):
    subprocess.run(["dpkg-deb", "-x", debs["libnvidia-ml1_595.91.07-1_amd64.deb"], str(tmp_path)], check=True)
    driver = simgpu().driver
    assert driver.userspace_version(str(tmp_path)) == "595.91.07"
    with open(tmp_path / "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.595.91.07", "rb") as handle:
        assert handle.read(4) == b"\x7fELF"


def _script(deb, name, tmp_path):
    control = tmp_path / ("control-" + os.path.basename(deb))
    subprocess.run(["dpkg-deb", "-e", deb, str(control)], check=True)
    return str(control / name)


def _run(script, root, *args):
    env = dict(os.environ, SIMGPU_ROOT=root, SIMGPU_KERNEL_RELEASE=KERNEL)
    return subprocess.run(["sh", script] + list(args), env=env, capture_output=True, text=True, check=False)


def test_postinst_builds_a_module_modinfo_reads_and_prerm_removes_it(debs, tmp_path):
    deb = debs["nvidia-kernel-open-dkms_580.126.20-1_amd64.deb"]
    root = str(tmp_path / "root")
    os.makedirs(root)
    result = _run(_script(deb, "postinst", tmp_path), root, "configure")
    assert result.returncode == 0, result.stderr
    version = subprocess.run(["modinfo", "-b", root, "-k", KERNEL, "-F", "version", "nvidia"],
                             check=True, capture_output=True, text=True).stdout.strip()
    license_ = subprocess.run(["modinfo", "-b", root, "-k", KERNEL, "-F", "license", "nvidia"],
                              check=True, capture_output=True, text=True).stdout.strip()
    assert (version, license_) == ("580.126.20", "Dual MIT/GPL")
    assert simgpu().driver.on_disk_module(root, KERNEL) == {
        "version": "580.126.20", "flavor": "open",
        "path": os.path.join(root, "lib/modules", KERNEL, "updates/dkms/nvidia.ko")}
    result = _run(_script(deb, "prerm", tmp_path), root, "remove")
    assert result.returncode == 0, result.stderr
    assert simgpu().driver.on_disk_module(root, KERNEL) is None


def test_postinst_fails_for_a_build_fail_fault(debs, tmp_path):
    from simfleet.gpu.faults import apply_fault
    from simfleet.gpu.state import initial_state, save_state, state_path

    root = str(tmp_path / "root")
    save_state(state_path(root), apply_fault(initial_state("v100", "n1"), "build_fail", ["580.178.04"]))
    deb = debs["nvidia-kernel-dkms_580.178.04-1_amd64.deb"]
    result = _run(_script(deb, "postinst", tmp_path), root, "configure")
    assert result.returncode == 10
    assert "Error! Bad return status for module build on kernel: %s (x86_64)" % KERNEL in result.stderr
    assert simgpu().driver.on_disk_module(root, KERNEL) is None
    other = debs["nvidia-kernel-dkms_580.126.20-1_amd64.deb"]
    assert _run(_script(other, "postinst", tmp_path), root, "configure").returncode == 0
    assert simgpu().driver.on_disk_module(root, KERNEL)["flavor"] == "proprietary"


def test_build_is_cached(debs):
    out_dir = os.path.dirname(next(iter(debs.values())))
    assert sorted(pkgbuild.build_packages(out_dir)) == sorted(debs.values())
