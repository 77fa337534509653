# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The kernel_hold role (with the driver role) on the simulated fleet.

The nodes boot the host's kernel and have no kernel package installed. The test gives a node
stand-in kernel packages for its running kernel (``linux-image-<uname -r>``, ``linux-headers-...``
and the ``linux-image-amd64`` meta package) and a signed local repository with a newer meta package
that pulls a newer kernel: without the hold, ``apt-get dist-upgrade`` would install it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess

import pytest

from test_driver_role import PLAYBOOK as DRIVER_PLAYBOOK
from test_driver_role import assert_pinned_at, installed, node_of, repo_branch_versions

pytestmark = pytest.mark.fleet

KERNEL_PLAYBOOK = """\
- name: Hold the kernel
  hosts: all
  gather_facts: false
  roles:
    - role: gpufleet.nvidia.kernel_hold
  post_tasks:
    - name: Keep the result for the test
      ansible.builtin.copy:
        content: "{{ kernel_hold_result | to_json }}"
        dest: /run/kernel_hold_result.json
        mode: "0644"
      changed_when: false
"""

RECAP = re.compile(r"^(\S+)\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=(\d+)\s+failed=(\d+)", re.M)
REPO_IN_NODE = "/srv/gpufleet-kernel-test"


def build_deb(workdir, name, version, depends=None):
    root = os.path.join(workdir, "%s_%s" % (name, version))
    os.makedirs(os.path.join(root, "DEBIAN"))
    os.makedirs(os.path.join(root, "usr", "share", "doc", name))
    with open(os.path.join(root, "usr", "share", "doc", name, "README"), "w") as handle:
        handle.write("stand-in kernel package for the kernel_hold test\n")
    control = ["Package: %s" % name, "Version: %s" % version, "Architecture: all", "Maintainer: test <t@example.invalid>",
               "Section: kernel", "Priority: optional", "Description: stand-in kernel package"]
    if depends:
        control.insert(3, "Depends: %s" % depends)
    with open(os.path.join(root, "DEBIAN", "control"), "w") as handle:
        handle.write("\n".join(control) + "\n")
    out = os.path.join(workdir, "%s_%s_all.deb" % (name, version))
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", root, out], check=True, stdout=subprocess.DEVNULL)
    return out


def give_node_kernel_packages(simfleet, node, tmp_path):
    """Install stand-in packages for the running kernel; offer a newer kernel in a signed repository."""
    kernel = simfleet.run(node, ["uname", "-r"], check=True).stdout.strip()
    work = tmp_path / "kernel-debs"
    old, new = work / "installed", work / "repo"
    old.mkdir(parents=True)
    new.mkdir(parents=True)
    for name, version, depends in [("linux-image-%s" % kernel, "1", None), ("linux-headers-%s" % kernel, "1", None),
                                   ("linux-image-amd64", "1", "linux-image-%s" % kernel)]:
        build_deb(str(old), name, version, depends)
    for name, version, depends in [("linux-image-9.9.9-test-amd64", "1", None),
                                   ("linux-image-amd64", "2", "linux-image-9.9.9-test-amd64"),
                                   ("linux-image-%s" % kernel, "2", None)]:
        build_deb(str(new), name, version, depends)
    gnupg = tmp_path / "gnupg"
    gnupg.mkdir(mode=0o700)
    env = dict(os.environ, GNUPGHOME=str(gnupg))
    subprocess.run(["gpg", "--batch", "--passphrase", "", "--quick-gen-key", "kernel test <kt@example.invalid>",
                    "rsa2048", "sign", "never"], env=env, check=True, capture_output=True)
    packages = subprocess.run(["apt-ftparchive", "packages", "."], cwd=str(new), check=True,
                              capture_output=True, text=True).stdout
    (new / "Packages").write_text(packages)
    release = subprocess.run(["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=kerneltest", "release", "."],
                             cwd=str(new), check=True, capture_output=True, text=True).stdout
    (new / "Release").write_text(release)
    subprocess.run(["gpg", "--batch", "--yes", "--clearsign", "-o", str(new / "InRelease"), str(new / "Release")],
                   env=env, check=True, capture_output=True)
    key = subprocess.run(["gpg", "--armor", "--export"], env=env, check=True, capture_output=True, text=True).stdout
    root = simfleet.root_of(node) + REPO_IN_NODE
    subprocess.run(["mkdir", "-p", root], check=True)
    subprocess.run(["cp", "-r", str(old), str(new), root], check=True)
    with open(os.path.join(root, "key.asc"), "w") as handle:
        handle.write(key)
    simfleet.run(node, "dpkg -i %s/installed/*.deb" % REPO_IN_NODE, check=True)
    simfleet.run(node, "echo 'deb [signed-by=%s/key.asc] file:%s/repo /' > /etc/apt/sources.list.d/kerneltest.list && "
                       "apt-get update -qq" % (REPO_IN_NODE, REPO_IN_NODE), check=True, timeout=300)
    return kernel


def run(simfleet, tmp_path, node, playbook_text, name, **variables):
    playbook = tmp_path / name
    playbook.write_text(playbook_text)
    extra = tmp_path / ("vars-%s" % name)
    extra.write_text(json.dumps(variables))
    proc = simfleet.playbook(str(playbook), "-l", node, "-e", "@%s" % extra, timeout=1200)
    recap = {m.group(1): int(m.group(3)) for m in RECAP.finditer(proc.stdout)}
    result = simfleet.run(node, "cat /run/kernel_hold_result.json 2>/dev/null && rm -f /run/kernel_hold_result.json")
    return proc, recap.get(node), json.loads(result.stdout) if result.stdout.strip() else None


def upgrades(simfleet, node):
    sim = simfleet.run(node, "apt-get -s -o Debug::NoLocking=1 dist-upgrade", check=True).stdout
    return re.findall(r"^Inst (\S+)", sim, re.M)


def test_kernel_and_driver_stay_put(simfleet, tmp_path):
    node = node_of(simfleet, "a100")
    simfleet.reset(node)
    kernel = give_node_kernel_packages(simfleet, node, tmp_path)
    assert "linux-image-amd64" in upgrades(simfleet, node)  # the hazard: a meta package pulling a new kernel
    oldest = repo_branch_versions(simfleet, node, "580")[0]
    proc, _changed, _result = run(simfleet, tmp_path, node, DRIVER_PLAYBOOK, "driver.yml", driver_branch="580",
                                  driver_version=oldest)
    assert proc.returncode == 0, proc.stdout[-4000:]
    simfleet.run(node, ["apt-mark", "hold", "linux-headers-%s" % kernel], check=True)  # an administrator's hold
    proc, changed, result = run(simfleet, tmp_path, node, KERNEL_PLAYBOOK, "kernel.yml")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert result["running_kernel"] == kernel
    assert result["held"] == sorted(["linux-headers-%s" % kernel, "linux-image-%s" % kernel, "linux-image-amd64"])
    assert result["held_by_role"] == sorted(["linux-image-%s" % kernel, "linux-image-amd64"])
    assert result["held_before_by_others"] == ["linux-headers-%s" % kernel]
    pending = upgrades(simfleet, node)
    assert not [p for p in pending if re.match(r"^(linux-|nvidia-|libnvidia-|libcuda|firmware-nvidia-)", p)], pending
    simfleet.run(node, "printf '%s\\n' 'Unattended-Upgrade::Origins-Pattern { \"origin=NVIDIA\"; \"origin=kerneltest\"; };'"
                       " > /etc/apt/apt.conf.d/52test-allow-origins", check=True)
    dry = simfleet.run(node, "unattended-upgrade --dry-run -d 2>&1", timeout=300)
    assert dry.returncode == 0, dry.stdout[-3000:]
    assert not re.search(r"(Packages that will be upgraded|pkgs that look like they should be upgraded):[^\n]*"
                         r"(linux-|nvidia|libcuda)", dry.stdout), dry.stdout[-3000:]
    conf = simfleet.run(node, ["cat", "/etc/apt/apt.conf.d/51gpufleet-kernel-hold"], check=True).stdout
    assert '"linux-image-";' in conf and '"libnvidia-";' in conf
    assert_pinned_at(simfleet, node, oldest)
    proc, changed, _result = run(simfleet, tmp_path, node, KERNEL_PLAYBOOK, "kernel.yml")
    assert proc.returncode == 0 and changed == 0, proc.stdout[-4000:]

    proc, _changed, result = run(simfleet, tmp_path, node, KERNEL_PLAYBOOK, "kernel.yml", kernel_hold_state="absent")
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert result["released"] == sorted(["linux-image-%s" % kernel, "linux-image-amd64"])
    now_held = set(simfleet.run(node, ["apt-mark", "showhold"], check=True).stdout.split())
    assert "linux-headers-%s" % kernel in now_held  # the administrator's hold stays
    assert not {"linux-image-%s" % kernel, "linux-image-amd64"} & now_held
    assert simfleet.run(node, ["test", "-e", "/etc/apt/apt.conf.d/51gpufleet-kernel-hold"]).returncode == 1
    assert "linux-image-amd64" in upgrades(simfleet, node)
    assert installed(simfleet, node)  # the driver stays installed and held: kernel_hold released only its own
