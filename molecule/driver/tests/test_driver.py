"""Testinfra checks of the driver scenario: the exact version, the whole set held and pinned."""

import json
import re

# Newest version of each branch in the simulated fleet's repository (tests/simfleet, pkgbuild).
EXPECTED = {"node01": ("620", "620.82.01", "nvidia-kernel-open-dkms"), "node02": ("580", "580.178.04", "nvidia-kernel-dkms")}


def driver_packages(host):
    out = host.check_output("dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n'")
    found = {}
    for line in out.splitlines():
        status, name, version = line.split()
        if status[1] == "i" and re.match(r"^(nvidia-|libnvidia-|libcuda|firmware-nvidia-)", name):
            found[name] = version
    return found


def test_exact_version_of_the_branch(host):
    branch, version, kernel_package = EXPECTED[host.backend.get_hostname()]
    packages = driver_packages(host)
    assert packages[kernel_package] == "%s-1" % version
    assert {v for n, v in packages.items() if not n.startswith("nvidia-driver-pinning-")} == {"%s-1" % version}
    assert "nvidia-driver-pinning-%s" % branch in packages
    assert host.check_output("modinfo -F version nvidia") == version


def test_fabric_manager_only_on_the_nvswitch_node(host):
    packages = driver_packages(host)
    assert ("nvidia-fabricmanager" in packages) == (host.backend.get_hostname() == "node01")


def test_whole_set_is_held_and_pinned(host):
    _branch, version, _kernel = EXPECTED[host.backend.get_hostname()]
    held = set(host.check_output("apt-mark showhold").split())
    assert set(driver_packages(host)) <= held
    pin = host.file("/etc/apt/preferences.d/gpufleet-nvidia-driver").content_string
    assert "Pin: version %s-*\nPin-Priority: 1001\n" % version in pin
    origin = host.file("/etc/apt/preferences.d/gpufleet-nvidia-origin").content_string
    assert "Pin: release l=NVIDIA CUDA\nPin-Priority: 600\n" in origin


def test_dist_upgrade_touches_no_nvidia_package(host):
    sim = host.check_output("apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    assert not re.search(r"^(Inst|Remv) (nvidia-|libnvidia-|libcuda|firmware-nvidia-)", sim, re.M)


def test_repository_key_pinned_never_trusted(host):
    sources = host.file("/etc/apt/sources.list.d/gpufleet-nvidia-driver.list").content_string
    assert "signed-by=/etc/apt/keyrings/gpufleet-nvidia-driver.asc," in sources
    assert "trusted=yes" not in sources


def test_local_facts_record_the_install(host):
    facts = json.loads(host.file("/etc/ansible/facts.d/gpufleet_driver.fact").content_string)
    _branch, version, _kernel = EXPECTED[host.backend.get_hostname()]
    assert facts["current"]["version"] == version
    assert [h["action"] for h in facts["history"]] == ["install"]
