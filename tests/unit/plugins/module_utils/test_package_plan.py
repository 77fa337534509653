# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The exact package transaction per distribution, the pins, and the field cases 11, 17, 18, 20, 21, 23, 24."""

from __future__ import annotations

import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import distributions
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_local_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_repository
from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_hold
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_failures
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_sets
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_transaction
from ansible_collections.gpufleet.nvidia.plugins.module_utils import repository_versions
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_on_disk import (
    kernel_release_from_uname,
    nvidia_modules_by_kernel,
    parse_modinfo,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.installed_packages import parse_dpkg_l

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = os.path.join(HERE, "..", "..", "..", "fixtures", "cases")


def case(folder, name):
    with open(os.path.join(CASES, folder, name)) as handle:
        return handle.read()


def installed(*pairs, held=True):
    return [{"name": n, "version": v, "installed": True, "held": held} for n, v in pairs]


def step(plan, name):
    return [s for s in plan["steps"] if s["name"] == name][0]


DEB_580 = ["nvidia-driver-cuda", "nvidia-kernel-open-dkms", "nvidia-kernel-support", "firmware-nvidia-gsp",
           "libcuda1", "libnvidia-ml1", "nvidia-smi", "nvidia-persistenced"]


def debian_repo(*versions, pins=("580", "595", "620"), extra=()):
    repo = {}
    for name in DEB_580 + ["nvidia-kernel-dkms", "nvidia-fabricmanager", "libnvidia-nscq"] + list(extra):
        repo[name] = ["%s-1" % v for v in versions]
    for branch in pins:
        repo["nvidia-driver-pinning-%s" % branch] = ["%s-5" % branch]
    return repo


# --- names per distribution and branch generation -------------------------------------------


def test_distribution_ids():
    assert distributions.distribution_id("Debian", "12") == "debian12"
    assert distributions.distribution_id("Ubuntu", "22", "22.04") == "ubuntu2204"
    assert distributions.distribution_id("Ubuntu", "24", "24.04") == "ubuntu2404"
    assert distributions.distribution_id("Rocky", "9") == "rhel9"
    assert distributions.distribution_id("RedHat", "8") == "rhel8"
    with pytest.raises(distributions.PlanError):
        distributions.distribution_id("Debian", "11")


def test_generations_and_pinning_packages():
    assert package_sets.generation("ubuntu2204", "580") == "suffixed"
    assert package_sets.generation("ubuntu2404", "590") == "unsuffixed"
    assert package_sets.generation("debian12", "535") == "unsuffixed"
    assert package_sets.generation("rhel9", "620") == "module-stream"
    assert package_sets.pin_package_name("ubuntu2404", "580") is None
    assert package_sets.pin_package_name("ubuntu2404", "595") == "nvidia-driver-pinning-595"
    assert package_sets.pin_package_name("debian12", "580") == "nvidia-driver-pinning-580"
    assert package_sets.pin_package_name("debian12", "570") is None
    assert package_sets.pin_package_name("rhel9", "620") is None


def names(distribution, branch, flavour, fm=False):
    return [p["name"] for p in package_sets.package_set(distribution, branch, flavour, fabric_manager=fm)]


def test_ubuntu_suffixed_up_to_r580():
    assert names("ubuntu2204", "580", "open", fm=True) == [
        "libnvidia-compute-580", "nvidia-dkms-580-open", "nvidia-kernel-common-580", "nvidia-kernel-source-580-open",
        "nvidia-firmware-580", "nvidia-utils-580", "nvidia-compute-utils-580", "nvidia-modprobe",
        "nvidia-fabricmanager", "libnvidia-nscq"]
    assert "nvidia-fabricmanager-570" in names("ubuntu2204", "570", "proprietary", fm=True)
    assert "nvidia-dkms-570" in names("ubuntu2204", "570", "proprietary")


def test_ubuntu_unsuffixed_with_pinning_package_from_r590():
    assert names("ubuntu2404", "620", "open", fm=True) == [
        "nvidia-driver-pinning-620", "libnvidia-compute", "nvidia-dkms-open", "nvidia-kernel-common",
        "nvidia-kernel-source-open", "nvidia-firmware", "nvidia-utils", "nvidia-compute-utils", "nvidia-modprobe",
        "nvidia-fabricmanager", "libnvidia-nscq"]


def test_debian12_unsuffixed_names_and_old_fabric_manager_suffix():
    assert names("debian12", "580", "proprietary") == ["nvidia-driver-pinning-580", "nvidia-driver-cuda",
                                                       "nvidia-kernel-dkms", "nvidia-kernel-support",
                                                       "firmware-nvidia-gsp", "libcuda1", "libnvidia-ml1",
                                                       "nvidia-smi", "nvidia-persistenced"]
    assert names("debian12", "570", "open", fm=True)[-2:] == ["nvidia-fabricmanager-570", "libnvidia-nscq-570"]


def test_rhel_streams_and_names():
    assert package_sets.module_stream("580", "open") == "580-open"
    assert package_sets.module_stream("580", "proprietary") == "580-dkms"
    assert names("rhel9", "620", "open", fm=True) == [
        "nvidia-driver-cuda", "nvidia-driver-cuda-libs", "nvidia-kmod-common", "kmod-nvidia-open-dkms", "libnvidia-ml",
        "nvidia-modprobe", "nvidia-persistenced", "nvidia-fabricmanager", "libnvidia-nscq"]
    assert "kmod-nvidia-latest-dkms" in names("rhel8", "570", "proprietary", fm=True)
    assert "nvidia-fabric-manager" in names("rhel8", "570", "proprietary", fm=True)
    assert "libnvidia-nscq-570" in names("rhel8", "570", "proprietary", fm=True)


@pytest.mark.parametrize("name,dist,old,new,expected", [
    ("libnvidia-decode-570", "ubuntu2204", "570", "580", "libnvidia-decode-580"),
    ("libnvidia-decode-580", "ubuntu2404", "580", "620", "libnvidia-decode"),
    ("nvidia-dkms-580-open", "ubuntu2404", "580", "595", "nvidia-dkms-open"),
    ("nvidia-headless-no-dkms-450-server", "ubuntu2204", "450", "460", "nvidia-headless-no-dkms-460-server"),
    ("nvidia-fabricmanager-570", "debian12", "570", "580", "nvidia-fabricmanager"),
    ("libnvidia-ml1", "debian12", "580", "620", "libnvidia-ml1"),
])
def test_rename_for_branch(name, dist, old, new, expected):
    assert package_sets.rename_for_branch(name, dist, old, new) == expected


# --- transactions ----------------------------------------------------------------------------


def test_debian12_fresh_install_r620_with_fabric_manager():
    repo = debian_repo("580.126.20", "580.159.03", "620.70.06")
    plan = package_transaction.plan_transaction("debian12", "620", "620.70.06", "open", fabric_manager=True, available=repo)
    assert plan["install"] == ["nvidia-driver-pinning-620=620-5"] + ["%s=620.70.06-1" % n for n in DEB_580] + [
        "nvidia-fabricmanager=620.70.06-1", "libnvidia-nscq=620.70.06-1"]
    assert plan["remove"] == [] and plan["unhold"] == []
    assert [s["name"] for s in plan["steps"]] == ["write the origin pin", "write the pin file",
                                                  "install the driver set", "hold the driver set"]
    assert "Pin: version 620.70.06-*\nPin-Priority: 1001" in plan["preferences"]["content"]
    assert "--allow-downgrades" not in step(plan, "install the driver set")["argv"]
    assert plan["changes"]["install"] and not plan["changes"]["downgrade"]


def test_fabric_manager_pinned_to_the_exact_driver_version_case_11():
    """Field case 11: FM 590.48.01 beside driver 580.126.09 will not start; FM must be the same build."""
    repo = {
        "libnvidia-compute-580": ["580.126.09-0ubuntu1"], "nvidia-dkms-580-open": ["580.126.09-0ubuntu1"],
        "nvidia-kernel-common-580": ["580.126.09-0ubuntu1"], "nvidia-kernel-source-580-open": ["580.126.09-0ubuntu1"],
        "nvidia-firmware-580": ["580.126.09-0ubuntu1"], "nvidia-utils-580": ["580.126.09-0ubuntu1"],
        "nvidia-compute-utils-580": ["580.126.09-0ubuntu1"], "nvidia-modprobe": ["580.126.09-0ubuntu1", "590.48.01-0ubuntu1"],
        "nvidia-fabricmanager": ["580.126.09-1", "590.48.01-1"], "libnvidia-nscq": ["580.126.09-1", "590.48.01-1"],
    }
    plan = package_transaction.plan_transaction("ubuntu2204", "580", "580.126.09", "open", fabric_manager=True, available=repo)
    assert "nvidia-fabricmanager=580.126.09-1" in plan["install"]
    assert "libnvidia-nscq=580.126.09-1" in plan["install"]
    assert "nvidia-fabricmanager" in plan["hold"]
    assert "Pin: version 580.126.09-*" in plan["preferences"]["content"]
    # no FM build of the driver version in the repository: refused, never a neighbouring build
    del repo["nvidia-fabricmanager"][0]
    with pytest.raises(distributions.PlanError) as err:
        package_transaction.plan_transaction("ubuntu2204", "580", "580.126.09", "open", fabric_manager=True, available=repo)
    assert err.value.code == "not_in_repository"
    assert "nvidia-fabricmanager=580.126.09" in str(err.value)


def test_second_run_is_a_noop():
    repo = debian_repo("620.70.06")
    first = package_transaction.plan_transaction("debian12", "620", "620.70.06", "open", available=repo)
    inst = installed(("nvidia-driver-pinning-620", "620-5"), *[(n, "620.70.06-1") for n in DEB_580])
    again = package_transaction.plan_transaction("debian12", "620", "620.70.06", "open", installed=inst, available=repo,
                                                 current_preferences=first["preferences"]["content"])
    assert again["install"] == [] and again["remove"] == [] and again["steps"] == []
    assert again["noop"] is True


def test_lost_hold_is_repinned_without_install():
    repo = debian_repo("620.70.06")
    first = package_transaction.plan_transaction("debian12", "620", "620.70.06", "open", available=repo)
    inst = installed(("nvidia-driver-pinning-620", "620-5"), *[(n, "620.70.06-1") for n in DEB_580])
    inst[3]["held"] = False
    plan = package_transaction.plan_transaction("debian12", "620", "620.70.06", "open", installed=inst, available=repo,
                                                current_preferences=first["preferences"]["content"])
    assert plan["install"] == [] and plan["changes"]["repin"] is True
    assert [s["name"] for s in plan["steps"]] == ["write the origin pin", "write the pin file", "hold the driver set"]


def test_minor_update_within_branch():
    repo = debian_repo("580.126.20", "580.159.03")
    inst = installed(("nvidia-driver-pinning-580", "580-5"), *[(n, "580.126.20-1") for n in DEB_580])
    plan = package_transaction.plan_transaction("debian12", "580", "580.159.03", "open", installed=inst, available=repo)
    assert plan["install"] == ["%s=580.159.03-1" % n for n in DEB_580]
    assert plan["changes"]["upgrade"] and not plan["changes"]["branch_change"]
    assert step(plan, "release holds")["argv"][:2] == ["apt-mark", "unhold"]
    assert [s["name"] for s in plan["steps"]] == ["release holds", "write the origin pin", "write the pin file",
                                                  "install the driver set", "hold the driver set"]


def test_branch_change_580_to_620_replaces_the_pinning_package():
    repo = debian_repo("580.126.20", "620.70.06")
    inst = installed(("nvidia-driver-pinning-580", "580-5"), *[(n, "580.126.20-1") for n in DEB_580])
    plan = package_transaction.plan_transaction("debian12", "620", "620.70.06", "open", installed=inst, available=repo)
    assert plan["install"][0] == "nvidia-driver-pinning-620=620-5"
    assert plan["remove"] == ["nvidia-driver-pinning-580"]
    argv = step(plan, "install the driver set")["argv"]
    assert argv[-1] == "nvidia-driver-pinning-580-"
    assert plan["changes"]["branch_change"] and plan["changes"]["upgrade"]
    assert "nvidia-driver-pinning-580" not in plan["hold"]


def test_downgrade_620_to_580_allows_downgrades():
    repo = debian_repo("580.126.20", "620.70.06")
    inst = installed(("nvidia-driver-pinning-620", "620-5"), *[(n, "620.70.06-1") for n in DEB_580])
    plan = package_transaction.plan_transaction("debian12", "580", "580.126.20", "open", installed=inst, available=repo)
    argv = step(plan, "install the driver set")["argv"]
    assert "--allow-downgrades" in argv
    assert "libnvidia-ml1=580.126.20-1" in argv and "nvidia-driver-pinning-620-" in argv
    assert plan["changes"]["downgrade"] and plan["changes"]["branch_change"]
    assert "Pin: version 580.126.20-*" in plan["preferences"]["content"]


def test_flavour_change_removes_the_other_kernel_package():
    repo = debian_repo("580.126.20")
    inst = installed(*[(n, "580.126.20-1") for n in DEB_580 if n != "nvidia-kernel-open-dkms"] +
                     [("nvidia-kernel-dkms", "580.126.20-1"), ("nvidia-driver-pinning-580", "580-5")])
    plan = package_transaction.plan_transaction("debian12", "580", "580.126.20", "open", installed=inst, available=repo)
    assert plan["install"] == ["nvidia-kernel-open-dkms=580.126.20-1"]
    assert plan["remove"] == ["nvidia-kernel-dkms"]
    assert plan["changes"]["flavour_change"] is True


def test_case_17_every_nvidia_package_held_and_blacklisted():
    """Field case 17: unattended-upgrade moved libnvidia-common-460 460.56 → 460.73.01 under a loaded module."""
    # Installed beside the set, libnvidia-common-580 is carried into the transaction and held too.
    inst = installed(("libnvidia-compute-580", "580.126.09-0ubuntu1"), ("libnvidia-common-580", "580.126.09-0ubuntu1"),
                     held=False)
    repo = {n: ["580.126.20-1ubuntu1"] for n in names("ubuntu2204", "580", "open") + ["libnvidia-common-580"]}
    plan = package_transaction.plan_transaction("ubuntu2204", "580", "580.126.20", "open", installed=inst, available=repo)
    assert "libnvidia-common-580=580.126.20-1ubuntu1" in plan["install"]
    assert "libnvidia-common-580" in plan["hold"] and "libnvidia-compute-580" in plan["hold"]
    assert "Package: nvidia-* libnvidia-* libcuda*" in plan["preferences"]["content"]
    conf = kernel_hold.unattended_upgrades_config()
    assert '    "libnvidia-";' in conf and '    "nvidia-";' in conf and '    "linux-image-";' in conf
    assert conf.splitlines()[2] == "Unattended-Upgrade::Package-Blacklist {"


def test_case_18_branch_change_requests_the_whole_new_branch_and_origin_pin():
    """Field case 18: 450 → 460 must request every 460 package the 450 set had, holds released first."""
    for name in ("input-pr11-cuda-drivers-pin.txt", "input-pr33-branch-450-to-460.txt"):
        text = case("18-apt-held-broken-packages-driver-upgrade-ansible", name)
        verdict = package_failures.classify_apt_failure(100, text, "E: Unable to correct problems, you have held broken packages.")
        assert (verdict["kind"], verdict["retry"]) == ("dependency_conflict", False)
    inst = installed(("libnvidia-compute-570", "570.172.08-0ubuntu1"), ("nvidia-dkms-570-open", "570.172.08-0ubuntu1"),
                     ("nvidia-utils-570", "570.172.08-0ubuntu1"), ("libnvidia-decode-570", "570.172.08-0ubuntu1"),
                     ("nvidia-headless-no-dkms-570-open", "570.172.08-0ubuntu1"))
    repo = {n: ["580.126.20-1ubuntu1"] for n in names("ubuntu2204", "580", "open") +
            ["libnvidia-decode-580", "nvidia-headless-no-dkms-580-open"]}
    plan = package_transaction.plan_transaction("ubuntu2204", "580", "580.126.20", "open", installed=inst, available=repo)
    assert "libnvidia-decode-580=580.126.20-1ubuntu1" in plan["install"]
    assert "nvidia-headless-no-dkms-580-open=580.126.20-1ubuntu1" in plan["install"]
    assert sorted(plan["remove"]) == sorted(p["name"] for p in inst)
    assert plan["unhold"] == sorted(p["name"] for p in inst)
    assert [s["name"] for s in plan["steps"]][0] == "release holds"
    assert plan["origin_preferences"]["content"].endswith("Package: *\nPin: release l=NVIDIA CUDA\nPin-Priority: 600\n")


def test_case_18_package_without_counterpart_is_removed_not_left_behind():
    inst = installed(("libnvidia-compute-570", "570.172.08-0ubuntu1"), ("libnvidia-extra-570", "570.172.08-0ubuntu1"))
    repo = {n: ["580.126.20-1ubuntu1"] for n in names("ubuntu2204", "580", "open")}
    plan = package_transaction.plan_transaction("ubuntu2204", "580", "580.126.20", "open", installed=inst, available=repo)
    assert "libnvidia-extra-570" in plan["remove"]
    assert not any(i.startswith("libnvidia-extra") for i in plan["install"])


def test_rhel9_fresh_install_enables_stream_and_locks_versions():
    repo = {n: ["3:620.70.06-1.el9"] for n in names("rhel9", "620", "open", fm=True)}
    plan = package_transaction.plan_transaction("rhel9", "620", "620.70.06", "open", fabric_manager=True, available=repo)
    argvs = [s["argv"] for s in plan["steps"]]
    assert argvs[0] == ["dnf", "-y", "module", "enable", "nvidia-driver:620-open"]
    assert argvs[1][-10:] == ["install"] + ["%s-620.70.06" % n for n in names("rhel9", "620", "open", fm=True)]
    assert "--exclude" in argvs[1] and "kernel-core" in argvs[1]
    assert argvs[2][:3] == ["dnf", "versionlock", "add"]
    assert plan["versionlock"][0] == "nvidia-driver-cuda-3:620.70.06-1.el9.*"
    assert "nvidia-fabricmanager-3:620.70.06-1.el9.*" in plan["versionlock"]
    assert plan["module"] == {"name": "nvidia-driver", "stream": "620-open", "current": None, "reset": False}


def test_case_21_stream_switch_resets_first():
    """Field case 21: switching nvidia-driver streams is refused by dnf unless the module is reset first."""
    text = case("21-dnf-module-stream-switch-and-kmod-conflict", "input-instructlab-3222-stream-switch.txt")
    verdict = package_failures.classify_dnf_failure(text)
    assert (verdict["kind"], verdict["from_stream"], verdict["to_stream"]) == ("stream_switch_refused", "XXX", "570-open")
    inst = [{"name": n, "version": "3:580.126.20-1.el9", "installed": True} for n in names("rhel9", "580", "open")]
    locks = ["%s-3:580.126.20-1.el9.*" % n for n in names("rhel9", "580", "open")]
    repo = {n: ["3:580.126.20-1.el9", "3:620.70.06-1.el9"] for n in names("rhel9", "620", "open")}
    plan = package_transaction.plan_transaction("rhel9", "620", "620.70.06", "open", installed=inst, available=repo,
                                                current_stream="580-open", locked=locks)
    steps = [s["argv"][:5] for s in plan["steps"]]
    assert steps[0][:3] == ["dnf", "versionlock", "delete"]
    assert steps[1] == ["dnf", "-y", "module", "reset", "nvidia-driver"]
    assert steps[2] == ["dnf", "-y", "module", "enable", "nvidia-driver:620-open"]
    assert plan["module"]["reset"] is True


def test_case_21_precompiled_kmod_swapped_explicitly():
    text = case("21-dnf-module-stream-switch-and-kmod-conflict", "input-precompiled-kmod-50-dkms-vs-precompiled.txt")
    verdict = package_failures.classify_dnf_failure(text)
    assert verdict["kind"] == "flavour_conflict"
    assert verdict["packages"] == ["kmod-nvidia-555.42.02-4.18.0-553.5.1-3:555.42.02-3.el8_10.x86_64",
                                   "kmod-nvidia-latest-dkms-3:555.42.02-1.el8.x86_64"]
    inst = [{"name": "kmod-nvidia-555.42.02-4.18.0-553.5.1", "version": "3:555.42.02-3.el8_10", "installed": True},
            {"name": "nvidia-driver-cuda", "version": "3:555.42.02-1.el8", "installed": True}]
    plan = package_transaction.plan_transaction("rhel8", "580", "580.126.20", "proprietary", installed=inst, current_stream="555")
    assert plan["swap"] == [["kmod-nvidia-555.42.02-4.18.0-553.5.1", "kmod-nvidia-latest-dkms-580.126.20"]]
    swap_step = step(plan, "swap the kernel module flavour")["argv"]
    assert swap_step[-3:] == ["swap", "kmod-nvidia-555.42.02-4.18.0-553.5.1", "kmod-nvidia-latest-dkms-580.126.20"]
    assert not any("--allowerasing" in s.get("argv", []) for s in plan["steps"])
    assert plan["changes"]["flavour_change"] is True
    assert step(plan, "reset the module stream")["argv"] == ["dnf", "-y", "module", "reset", "nvidia-driver"]
    depsolve = package_failures.classify_dnf_failure(case("21-dnf-module-stream-switch-and-kmod-conflict",
                                                          "input-stackhpc-496-depsolve.txt"))
    assert depsolve["kind"] == "depsolve_conflict"
    assert depsolve["packages"] == ["cuda-12-6-12.6.3-1.x86_64", "cuda-runtime-12-6 >= 12.6.3"]


def test_rhel_downgrade_uses_dnf_downgrade():
    inst = [{"name": n, "version": "3:620.70.06-1.el9", "installed": True} for n in names("rhel9", "620", "open")]
    plan = package_transaction.plan_transaction("rhel9", "580", "580.126.20", "open", installed=inst, current_stream="620-open")
    dg = step(plan, "downgrade the driver set")["argv"]
    assert dg[-len(names("rhel9", "580", "open")):] == ["%s-580.126.20" % n for n in names("rhel9", "580", "open")]
    assert plan["changes"]["downgrade"] is True


def test_case_23_module_on_disk_older_than_userspace_is_broken():
    modinfo = parse_modinfo(case("23-dkms-module-older-than-userspace-api-mismatch", "input-nvidia-all-394-modinfo.txt"))
    v = package_failures.verify_module_build("595.84", modinfo["on_disk_version"], modinfo["kernel_release"])
    assert (v["verdict"], v["found"], v["running_kernel"]) == ("broken", "595.80", "7.0.12-zen1-1-zen")
    assert "a reboot would load the wrong module" in v["message"]
    assert package_failures.verify_module_build("595.71.05", "595.58.03")["verdict"] == "broken"
    assert package_failures.verify_module_build("620.70.06", "620.70.06")["verdict"] == "ok"


def test_case_24_no_module_for_running_kernel():
    text = case("24-no-module-for-running-kernel-after-kernel-update", "input.txt")
    running = kernel_release_from_uname([line for line in text.splitlines() if line.startswith("Linux ")][0])
    modules = nvidia_modules_by_kernel(text)
    v = package_failures.verify_module_build("375.39", None, running, modules)
    assert v["verdict"] == "not_built_for_running_kernel"
    assert (v["running_kernel"], v["module_present_for"]) == ("3.13.0-116-generic", ["3.13.0-88-generic"])


def test_kernel_hold_packages_debian_and_ubuntu():
    deb = kernel_hold.kernel_hold_packages("6.1.0-28-amd64", ["linux-image-6.1.0-28-amd64", "linux-image-amd64",
                                                              "linux-headers-6.1.0-28-amd64", "linux-headers-6.1.0-28-common",
                                                              "linux-headers-amd64", "linux-kbuild-6.1", "nvidia-smi"])
    assert deb["hold"] == ["linux-headers-6.1.0-28-amd64", "linux-headers-6.1.0-28-common", "linux-headers-amd64",
                           "linux-image-6.1.0-28-amd64", "linux-image-amd64", "linux-kbuild-6.1"]
    ubu = kernel_hold.kernel_hold_packages("6.8.0-45-generic", ["linux-image-6.8.0-45-generic", "linux-modules-6.8.0-45-generic",
                                                                "linux-generic", "linux-image-generic", "linux-headers-generic",
                                                                "linux-image-6.8.0-40-generic"])
    assert ubu["hold"] == ["linux-generic", "linux-headers-generic", "linux-image-6.8.0-45-generic",
                           "linux-image-generic", "linux-modules-6.8.0-45-generic"]
    rhel = kernel_hold.kernel_hold_packages("5.14.0-427.13.1.el9_4.x86_64", ["kernel", "kernel-core", "kernel-modules", "bash"],
                                            "dnf")
    assert rhel["versionlock"] == ["kernel-5.14.0-427.13.1.el9_4", "kernel-core-5.14.0-427.13.1.el9_4",
                                   "kernel-modules-5.14.0-427.13.1.el9_4"]


def test_madison_and_dnf_list_parsers():
    madison = ("nvidia-driver-cuda | 620.70.06-1 | http://127.0.0.1:8080 ./ Packages\n"
               "nvidia-driver-cuda | 580.126.20-1 | http://127.0.0.1:8080 ./ Packages\n"
               "libnvidia-ml1 | 580.126.20-1 | http://127.0.0.1:8080 ./ Packages\n")
    found = repository_versions.parse_apt_cache_madison(madison)
    assert found["nvidia-driver-cuda"] == ["620.70.06-1", "580.126.20-1"]
    assert repository_versions.driver_versions_available(found, ["libnvidia-ml1", "nvidia-driver-cuda"]) == ["580.126.20", "620.70.06"]
    dnf = ("Available Packages\n"
           "nvidia-driver-cuda.x86_64   3:580.126.20-1.el9   cuda-rhel9-x86_64\n"
           "nvidia-driver-cuda.x86_64   3:620.70.06-1.el9    cuda-rhel9-x86_64\n")
    assert repository_versions.parse_dnf_list(dnf) == {"nvidia-driver-cuda": ["3:580.126.20-1.el9", "3:620.70.06-1.el9"]}


def test_dpkg_records_feed_the_plan():
    dpkg = ("Desired=Unknown/Install/Remove/Purge/Hold\n"
            "||/ Name            Version      Architecture Description\n"
            "+++-===============-============-============-=================\n"
            "hi  libnvidia-ml1   580.126.20-1 amd64        NVML\n"
            "hi  nvidia-smi      580.126.20-1 amd64        smi\n")
    plan = package_transaction.plan_transaction("debian12", "580", "580.159.03", "open", installed=parse_dpkg_l(dpkg),
                                                available=debian_repo("580.126.20", "580.159.03"))
    assert plan["current_version"] == "580.126.20"
    assert plan["unhold"] == ["libnvidia-ml1", "nvidia-smi"]


def test_local_facts_history_and_last_known_good():
    facts = driver_local_facts.update_local_facts(None, "580.126.20", "580", "2026-11-29T10:00:00Z", "install")
    assert facts["current"]["version"] == "580.126.20" and facts["last_known_good"] is None
    facts = driver_local_facts.update_local_facts(facts, "580.126.20", "580", "2026-11-29T11:00:00Z", "known_good",
                                                  verified_good="580.126.20")
    assert facts["last_known_good"]["version"] == "580.126.20"
    facts = driver_local_facts.update_local_facts(facts, "620.70.06", "620", "2026-11-30T10:00:00Z", "branch_change")
    assert facts["current"]["version"] == "620.70.06"
    assert facts["previous"]["version"] == "580.126.20"
    assert facts["last_known_good"]["version"] == "580.126.20"
    assert [(h["action"], h["from"], h["to"]) for h in facts["history"]] == [
        ("install", None, "580.126.20"), ("known_good", "580.126.20", "580.126.20"),
        ("branch_change", "580.126.20", "620.70.06")]
    same = driver_local_facts.update_local_facts(facts, "620.70.06", "620", "2026-11-30T11:00:00Z", "install")
    assert same["history"] == facts["history"]


@pytest.mark.parametrize("dist,url,line", [
    ("debian12", None, "deb [signed-by=/etc/apt/keyrings/gpufleet-nvidia-driver.asc,"
     "EB693B3035CD5710E231E123A4B469963BF863CC] "
     "https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/ /"),
    ("ubuntu2204", None, "deb [signed-by=/etc/apt/keyrings/gpufleet-nvidia-driver.asc,"
     "EB693B3035CD5710E231E123A4B469963BF863CC] "
     "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64/ /"),
    ("ubuntu2404", "http://mirror.example/cuda/ubuntu2404/x86_64", "deb [signed-by=/etc/apt/keyrings/"
     "gpufleet-nvidia-driver.asc,EB693B3035CD5710E231E123A4B469963BF863CC] http://mirror.example/cuda/ubuntu2404/x86_64/ /"),
])
def test_apt_repository_config(dist, url, line):
    cfg = driver_repository.repository_config(dist, url=url)
    assert cfg["sources_content"].splitlines()[1] == line
    assert "trusted=yes" not in cfg["sources_content"]
    assert cfg["key_url"].endswith("/3bf863cc.pub")


@pytest.mark.parametrize("dist", ["rhel8", "rhel9"])
def test_dnf_repository_config(dist):
    cfg = driver_repository.repository_config(dist)
    assert cfg["fingerprint"] == "610C7B14E068A878070DA4E99CD0A493D42D0685"
    assert cfg["key_url"] == "https://developer.download.nvidia.com/compute/cuda/repos/%s/x86_64/D42D0685.pub" % dist
    assert "baseurl=https://developer.download.nvidia.com/compute/cuda/repos/%s/x86_64/\n" % dist in cfg["repo_content"]
    assert "gpgcheck=1\ngpgkey=file:///etc/pki/rpm-gpg/gpufleet-nvidia-driver.asc\n" in cfg["repo_content"]


def test_nscq_is_skipped_where_the_repository_lacks_it():
    repo = debian_repo("620.70.06")
    del repo["libnvidia-nscq"]
    plan = package_transaction.plan_transaction("debian12", "620", "620.70.06", "open", fabric_manager=True, available=repo)
    assert "nvidia-fabricmanager=620.70.06-1" in plan["install"]
    assert plan["skipped"] == ["libnvidia-nscq"]
    del repo["nvidia-fabricmanager"]
    with pytest.raises(distributions.PlanError):
        package_transaction.plan_transaction("debian12", "620", "620.70.06", "open", fabric_manager=True, available=repo)


def test_a_failed_transaction_leaves_held_packages_that_are_not_installed_and_the_rollback_releases_them():
    """After a failed module build the old pinning package is removed but held again ("hn"), the new set is
    half-configured ("iF"); going back to 580.126.20 must release every such hold before apt runs."""
    dpkg = ("Desired=Unknown/Install/Remove/Purge/Hold\n"
            "||/ Name                       Version      Architecture Description\n"
            "+++-==========================-============-============-=================\n"
            "hn  nvidia-driver-pinning-580  <none>       <none>       (no description available)\n"
            "iF  nvidia-kernel-open-dkms    620.82.01-1  amd64        module\n"
            "ii  nvidia-driver-pinning-620  620-5        all          pin\n"
            "ii  libnvidia-ml1              620.82.01-1  amd64        NVML\n"
            "hi  linux-image-amd64          6.1.158-1    amd64        kernel\n")
    packages = parse_dpkg_l(dpkg)
    assert [p["installed"] for p in packages if p["name"] == "nvidia-driver-pinning-580"] == [False]
    plan = package_transaction.plan_transaction("debian12", "580", "580.126.20", "open", installed=packages,
                                                available=debian_repo("580.126.20", "620.82.01"))
    assert plan["unhold"] == ["nvidia-driver-pinning-580"]
    assert step(plan, "release holds")["argv"] == ["apt-mark", "unhold", "nvidia-driver-pinning-580"]
    assert "nvidia-driver-pinning-580=580-5" in step(plan, "install the driver set")["argv"]
    assert "--allow-downgrades" in step(plan, "install the driver set")["argv"]
    # The kernel's hold is not the driver's to release.
    assert "linux-image-amd64" not in plan["unhold"]


def test_case_34_404_for_the_pinned_version_is_withdrawn_not_an_outage():
    """Field case 34: the repository answered 404 for the pinned packages: stale index or withdrawn version."""
    folder = "34-apt-exact-pin-superseded-404"
    stderr = case(folder, "input-role-72-stderr-lines.txt")
    verdict = package_failures.classify_apt_failure(100, case(folder, "input-role-72-stdout-fragment.txt"), stderr)
    assert (verdict["kind"], verdict["retry"]) == ("withdrawn", False)
    assert "apt-cache madison" in verdict["message"]
    # A repository that cannot be reached is still an outage, and retried.
    outage = package_failures.classify_apt_failure(
        100, "", "E: Failed to fetch http://mirror/pool/x.deb  Temporary failure resolving 'mirror'")
    assert (outage["kind"], outage["retry"]) == ("network", True)


DKMS_FAILED = """\
Setting up nvidia-kernel-open-dkms (580.95.05-1) ...
Loading new nvidia-580.95.05 DKMS files...
Building for 6.1.0-25-amd64
Building initial module for 6.1.0-25-amd64
Error! Bad return status for module build on kernel: 6.1.0-25-amd64 (x86_64)
Consult /var/lib/dkms/nvidia/580.95.05/build/make.log for more information.
dpkg: error processing package nvidia-kernel-open-dkms (--configure):
 installed nvidia-kernel-open-dkms package post-installation script subprocess returned error exit status 10
E: Sub-process /usr/bin/dpkg returned an error code (1)
"""


def test_a_dkms_build_failure_names_the_kernel_the_module_and_its_make_log():
    found = package_failures.classify_apt_failure(100, DKMS_FAILED, "")
    assert (found["kind"], found["retry"]) == ("module_build_failed", False)
    assert found["module_build"] == {"kernel": "6.1.0-25-amd64", "arch": "x86_64", "module": "nvidia",
                                     "version": "580.95.05",
                                     "make_log": "/var/lib/dkms/nvidia/580.95.05/build/make.log"}
    assert found["message"].startswith("apt-get failed (rc 100): the nvidia 580.95.05 kernel module did not build "
                                       "for kernel 6.1.0-25-amd64")
    assert "/var/lib/dkms/nvidia/580.95.05/build/make.log" in found["message"]
    assert package_failures.dkms_build_failure("E: Sub-process /usr/bin/dpkg returned an error code (1)") is None
    assert "module_build" not in package_failures.classify_apt_failure(100, "E: Unable to locate package nvidia-driver", "")
