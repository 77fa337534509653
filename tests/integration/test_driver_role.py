# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver role on the simulated fleet: resolution, the exact transaction, pins, refusals.

Each test starts from fresh nodes (``simfleet.reset``). Expected versions are read from the fleet's
repository (its ``Packages`` index), never written down here: "newest R620" is whatever the
repository offers newest in branch 620. Resolution is judged on a fixed date, 2026-11-29, the
catalog's ``as_of``: R535 and R570 are end of life then.
"""

from __future__ import annotations

import json
import re
import urllib.request

import pytest

pytestmark = pytest.mark.fleet

TODAY = "2026-11-29"
ARCH = {"h100": "Hopper", "a100": "Ampere", "l40s": "Ada Lovelace", "v100": "Volta", "b200": "Blackwell"}
GPU_NAME = {"v100": "Tesla V100-SXM2-32GB", "h100": "NVIDIA H100 80GB HBM3"}
NVSWITCH_CLASSES = ("h100", "a100", "b200")

PLAYBOOK = """\
- name: Install and pin the NVIDIA driver
  hosts: all
  gather_facts: false
  vars:
    driver_repo_url: "{{ simfleet_apt_repo_url }}"
    driver_repo_key_src: "{{ simfleet_apt_key_asc_path }}"
    driver_repo_key_fingerprint: "{{ simfleet_apt_key_fingerprint }}"
    driver_pynvml: none
    driver_today: "%(today)s"
    test_gpu_architecture: %(arch)s
    test_nvswitch_classes: %(nvswitch)s
    driver_gpu_architectures: "{{ [test_gpu_architecture[simfleet_gpu_class]] }}"
    driver_fabric_manager: "{{ 'enabled' if simfleet_gpu_class in test_nvswitch_classes else 'disabled' }}"
  roles:
    - role: gpufleet.nvidia.driver
""" % {"today": TODAY, "arch": json.dumps(ARCH), "nvswitch": json.dumps(list(NVSWITCH_CLASSES))}

RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)


def version_key(version):
    return tuple(int(p) for p in version.split("."))


def upstream(version):
    return version.split(":", 1)[-1].rsplit("-", 1)[0]


def run_role(simfleet, tmp_path, node, check=False, diff=False, **variables):
    playbook = tmp_path / "driver.yml"
    playbook.write_text(PLAYBOOK)
    extra = tmp_path / ("vars-%s.json" % node)
    extra.write_text(json.dumps(variables))
    args = ["-l", node, "-e", "@%s" % extra]
    if check:
        args.append("--check")
    if diff:
        args.append("--diff")
    proc = simfleet.playbook(str(playbook), *args, timeout=1200)
    recap = {m.group(1): {"changed": int(m.group(3)), "failed": int(m.group(5)), "unreachable": int(m.group(4))}
             for m in RECAP.finditer(proc.stdout)}
    return proc, recap.get(node, {})


def repo_index(simfleet, node):
    """{package: [upstream versions]} from the fleet repository's Packages index."""
    with urllib.request.urlopen(simfleet.repo_url(node).rstrip("/") + "/Packages", timeout=30) as handle:
        text = handle.read().decode()
    found = {}
    for stanza in text.split("\n\n"):
        fields = dict(re.findall(r"^([A-Za-z-]+): (.*)$", stanza, re.M))
        if "Package" in fields:
            found.setdefault(fields["Package"], []).append(upstream(fields["Version"]))
    return found


def repo_branch_versions(simfleet, node, branch):
    versions = repo_index(simfleet, node).get("libnvidia-ml1", [])
    return sorted((v for v in versions if v.split(".")[0] == branch), key=version_key)


def installed(simfleet, node):
    """{package: upstream version} of installed NVIDIA driver packages."""
    out = simfleet.run(node, "dpkg-query -W -f='${db:Status-Abbrev} ${Package} ${Version}\\n'", check=True).stdout
    result = {}
    for line in out.splitlines():
        parts = line.split()
        driver = re.match(r"^(nvidia-|libnvidia-|libcuda|firmware-nvidia-)", parts[1]) if len(parts) == 3 else None
        if driver and parts[0][1:2] == "i":
            result[parts[1]] = parts[2]
    return result


def held(simfleet, node):
    return set(simfleet.run(node, ["apt-mark", "showhold"], check=True).stdout.split())


def local_facts(simfleet, node):
    proc = simfleet.run(node, ["cat", "/etc/ansible/facts.d/gpufleet_driver.fact"])
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def node_of(simfleet, klass):
    nodes = simfleet.nodes_of(klass)
    if not nodes:
        pytest.skip("no %s node in this fleet (SIMFLEET_TEST_LAYOUT)" % klass)
    return nodes[0]


def assert_pinned_at(simfleet, node, version):
    """Every NVIDIA driver package installed is at ``version`` (the pinning package aside), held, and the
    pin file names that version."""
    packages = installed(simfleet, node)
    driver = {n: v for n, v in packages.items() if not n.startswith("nvidia-driver-pinning-")}
    assert driver, packages
    assert {upstream(v) for v in driver.values()} == {version}, packages
    assert set(packages) <= held(simfleet, node)
    pin = simfleet.run(node, ["cat", "/etc/apt/preferences.d/gpufleet-nvidia-driver"], check=True).stdout
    assert "Pin: version %s-*\nPin-Priority: 1001" % version in pin
    return packages


# ---------------------------------------------------------------------------------------------


def test_check_mode_on_a_fresh_node_shows_the_transaction_and_changes_nothing(simfleet, tmp_path):
    node = node_of(simfleet, "h100")
    simfleet.reset(node)
    newest = repo_branch_versions(simfleet, node, "620")[-1]
    proc, recap = run_role(simfleet, tmp_path, node, check=True, diff=True, driver_branch="ltsb")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "nvidia-driver-cuda=%s-1" % newest in proc.stdout
    assert "nvidia-fabricmanager=%s-1" % newest in proc.stdout
    # The driver_transaction module's --diff: the packages, holds and pin file as the transaction would leave them.
    assert "+package nvidia-driver-cuda %s-1" % newest in proc.stdout
    assert "+package nvidia-kernel-open-dkms %s-1" % newest in proc.stdout
    assert "+hold nvidia-fabricmanager" in proc.stdout
    assert "+  Pin: version %s-*" % newest in proc.stdout
    assert recap["failed"] == 0 and recap["changed"] >= 1
    assert installed(simfleet, node) == {}
    assert held(simfleet, node) == set()
    for path in ("/etc/apt/sources.list.d/gpufleet-nvidia-driver.list", "/etc/apt/preferences.d/gpufleet-nvidia-driver",
                 "/etc/apt/keyrings/gpufleet-nvidia-driver.asc", "/etc/ansible/facts.d/gpufleet_driver.fact"):
        assert simfleet.run(node, ["test", "-e", path]).returncode == 1, path


def test_h100_ltsb_installs_newest_r620_pinned_and_idempotent(simfleet, tmp_path):
    node = node_of(simfleet, "h100")
    simfleet.reset(node)
    newest = repo_branch_versions(simfleet, node, "620")[-1]
    proc, recap = run_role(simfleet, tmp_path, node, driver_branch="ltsb")
    assert proc.returncode == 0, proc.stdout[-4000:]
    packages = assert_pinned_at(simfleet, node, newest)
    assert "nvidia-kernel-open-dkms" in packages and "nvidia-kernel-dkms" not in packages
    assert "nvidia-fabricmanager" in packages  # NVSwitch system: FM at the driver version (field case 11)
    assert "nvidia-driver-pinning-620" in packages
    assert simfleet.run(node, ["modinfo", "-F", "version", "nvidia"], check=True).stdout.strip() == newest
    assert "reboot required" in proc.stdout
    facts = local_facts(simfleet, node)
    assert facts["current"]["version"] == newest and facts["history"][-1]["action"] == "install"
    proc2, recap2 = run_role(simfleet, tmp_path, node, driver_branch="ltsb")
    assert proc2.returncode == 0, proc2.stdout[-4000:]
    assert recap2["changed"] == 0, proc2.stdout[-4000:]


def test_v100_ltsb_resolves_to_r580_proprietary(simfleet, tmp_path):
    node = node_of(simfleet, "v100")
    simfleet.reset(node)
    newest = repo_branch_versions(simfleet, node, "580")[-1]
    proc, _recap = run_role(simfleet, tmp_path, node, driver_branch="ltsb")
    assert proc.returncode == 0, proc.stdout[-4000:]
    packages = assert_pinned_at(simfleet, node, newest)
    assert "nvidia-kernel-dkms" in packages and "nvidia-kernel-open-dkms" not in packages


def test_minor_update_branch_change_and_downgrade_stay_pinned(simfleet, tmp_path):
    node = node_of(simfleet, "h100")
    simfleet.reset(node)
    r580 = repo_branch_versions(simfleet, node, "580")
    r620 = repo_branch_versions(simfleet, node, "620")
    assert len(r580) >= 2 and r620
    steps = [("580", r580[0], "install"), ("580", r580[-1], "upgrade"), ("620", r620[-1], "branch_change"),
             ("580", r580[-1], "downgrade")]
    for branch, version, action in steps:
        proc, _recap = run_role(simfleet, tmp_path, node, driver_branch=branch, driver_version=version)
        assert proc.returncode == 0, "%s %s: %s" % (branch, version, proc.stdout[-4000:])
        packages = assert_pinned_at(simfleet, node, version)
        assert ("nvidia-driver-pinning-620" in packages) == (branch == "620")
        assert simfleet.run(node, ["modinfo", "-F", "version", "nvidia"], check=True).stdout.strip() == version
    facts = local_facts(simfleet, node)
    assert [(h["action"], h["to"]) for h in facts["history"]] == [(a, v) for _b, v, a in steps]
    assert facts["current"]["version"] == r580[-1] and facts["previous"]["version"] == r620[-1]


def test_pins_hold_against_dist_upgrade_and_unattended_upgrades(simfleet, tmp_path):
    """An older R580 stays put although newer R580 and R620 packages are in the repository."""
    node = node_of(simfleet, "l40s")
    simfleet.reset(node)
    oldest = repo_branch_versions(simfleet, node, "580")[0]
    proc, _recap = run_role(simfleet, tmp_path, node, driver_branch="580", driver_version=oldest)
    assert proc.returncode == 0, proc.stdout[-4000:]
    before = assert_pinned_at(simfleet, node, oldest)
    sim = simfleet.run(node, "apt-get -s -o Debug::NoLocking=1 dist-upgrade", check=True).stdout
    assert not re.search(r"^(Inst|Remv|Conf) (nvidia-|libnvidia-|libcuda|firmware-nvidia-|linux-)", sim, re.M), sim
    # Let unattended-upgrades consider the driver repository at all, then show it leaves the set alone.
    simfleet.run(node, "printf '%s\\n' 'Unattended-Upgrade::Origins-Pattern { \"origin=NVIDIA\"; };' "
                       "> /etc/apt/apt.conf.d/52test-allow-nvidia-origin", check=True)
    dry = simfleet.run(node, "unattended-upgrade --dry-run -d 2>&1", timeout=300)
    assert dry.returncode == 0, dry.stdout[-3000:]
    assert not re.search(r"(Packages that will be upgraded|pkgs that look like they should be upgraded):[^\n]*"
                         r"(nvidia|libcuda)", dry.stdout), dry.stdout[-3000:]
    assert installed(simfleet, node) == before


@pytest.mark.parametrize("branch", ["595", "620"])
def test_v100_newer_branches_refused_naming_the_gpus(simfleet, tmp_path, branch):
    node = node_of(simfleet, "v100")
    simfleet.reset(node)
    proc, _recap = run_role(simfleet, tmp_path, node, driver_branch="ltsb")
    assert proc.returncode == 0, proc.stdout[-4000:]
    simfleet.reboot(node)  # the module loads: NVML now names the GPUs
    before = installed(simfleet, node)
    proc, recap = run_role(simfleet, tmp_path, node, driver_branch=branch)
    assert proc.returncode != 0 and recap.get("failed") == 1
    assert "8\u00d7 %s (Volta)" % GPU_NAME["v100"] in proc.stdout
    assert "R580 is the last branch for Volta" in proc.stdout
    assert "ltsb (R580)" in proc.stdout
    assert installed(simfleet, node) == before


def test_blackwell_proprietary_refused(simfleet, tmp_path):
    b200 = simfleet.nodes_of("b200")
    node = b200[0] if b200 else node_of(simfleet, "a100")
    simfleet.reset(node)
    proc, _recap = run_role(simfleet, tmp_path, node, driver_branch="580", driver_kernel_module_type="proprietary",
                            driver_gpu_architectures=["Blackwell"])
    assert proc.returncode != 0
    assert "proprietary kernel modules do not support Blackwell" in proc.stdout
    assert installed(simfleet, node) == {}


@pytest.mark.parametrize("branch", ["535", "570"])
def test_eol_branch_refused_then_installed_when_allowed(simfleet, tmp_path, branch):
    node = node_of(simfleet, "a100")
    simfleet.reset(node)
    newest = repo_branch_versions(simfleet, node, branch)[-1]
    proc, _recap = run_role(simfleet, tmp_path, node, driver_branch=branch)
    assert proc.returncode != 0
    assert "R%s is end of life since" % branch in proc.stdout and "driver_allow_eol" in proc.stdout
    assert installed(simfleet, node) == {}
    proc, _recap = run_role(simfleet, tmp_path, node, driver_branch=branch, driver_allow_eol=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    packages = assert_pinned_at(simfleet, node, newest)
    assert "nvidia-fabricmanager-%s" % branch in packages or "nvidia-fabricmanager" in packages


def test_version_not_in_repository_refused(simfleet, tmp_path):
    node = node_of(simfleet, "l40s")
    simfleet.reset(node)
    offered = repo_branch_versions(simfleet, node, "580")
    missing = next(v for v in ("580.65.06", "580.82.07", "580.95.05", "580.105.08", "580.1.1") if v not in offered)
    proc, _recap = run_role(simfleet, tmp_path, node, driver_branch="580", driver_version=missing)
    assert proc.returncode != 0
    assert "driver_version %s is not in the repository" % missing in proc.stdout
    assert ", ".join(offered) in proc.stdout
    assert installed(simfleet, node) == {}
