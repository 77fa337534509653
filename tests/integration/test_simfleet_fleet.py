"""The simulated fleet as Ansible and apt see it: SSH, inventory, reboot, the signed repository."""

from __future__ import annotations

import os
import re
import shutil

import pytest

pytestmark = pytest.mark.fleet


def test_ansible_ping_reaches_every_node(simfleet):
    proc = simfleet.ansible("all", "ansible.builtin.ping")
    assert proc.returncode == 0, proc.stdout
    pong = set(re.findall(r"^(\S+) \| SUCCESS => .*?\"ping\": \"pong\"", proc.stdout, re.M | re.S))
    assert pong == set(simfleet.nodes)


def test_inventory_has_a_group_per_gpu_class(simfleet):
    inv = simfleet.inventory_list()
    for node, klass in simfleet.classes.items():
        assert node in inv["gpu_" + klass]["hosts"]
        hostvars = inv["_meta"]["hostvars"][node]
        assert hostvars["ansible_host"] == "127.0.0.1"
        assert hostvars["ansible_port"] == simfleet.ports[node]
        assert hostvars["simfleet_gpu_class"] == klass
        assert hostvars["simfleet_apt_repo_url"] == simfleet.repo_url(node)
        assert hostvars["ansible_user"] == "root"
        assert hostvars["simfleet_apt_key_fingerprint"] == simfleet.apt_key_fingerprint
    assert sorted(inv["simfleet"]["children"]) == sorted({"gpu_" + k for k in simfleet.classes.values()})


def test_status_json_lists_running_nodes(simfleet):
    st = simfleet.status()
    assert [n["name"] for n in st["nodes"]] == simfleet.nodes
    assert {n["state"] for n in st["nodes"]} == {"running"}
    assert st["repo"]["state"] == "running"
    for n in st["nodes"]:
        assert re.fullmatch(r"[0-9a-f-]{36}", n["boot_id"])
        assert n["supervisor_pid"] and n["nspawn_pid"] and n["init_pid"]


def test_each_node_has_its_own_identity(simfleet):
    seen_ids = set()
    for node in simfleet.nodes:
        proc = simfleet.run(node, "hostname; cat /etc/machine-id; systemctl is-system-running --wait", check=True)
        hostname, machine_id, running = proc.stdout.split()[:3]
        assert hostname == node
        assert running == "running"
        seen_ids.add(machine_id)
    assert len(seen_ids) == len(simfleet.nodes)


def test_ansible_reboot_gives_every_node_a_new_boot_id(simfleet, tmp_path):
    before = {n: simfleet.boot_id(n) for n in simfleet.nodes}
    playbook = tmp_path / "reboot.yml"
    playbook.write_text(
        "- name: Reboot the fleet\n"
        "  hosts: all\n"
        "  gather_facts: false\n"
        "  tasks:\n"
        "    - name: Reboot\n"
        "      ansible.builtin.reboot:\n"
        "        reboot_timeout: 120\n"
        "    - name: Read the boot id\n"
        "      ansible.builtin.command: cat /proc/sys/kernel/random/boot_id\n"
        "      register: boot_id\n"
        "      changed_when: false\n"
        "    - name: Show it\n"
        "      ansible.builtin.debug:\n"
        "        msg: \"BOOT {{ inventory_hostname }} {{ boot_id.stdout }}\"\n"
    )
    proc = simfleet.playbook(str(playbook))
    assert proc.returncode == 0, proc.stdout
    reported = dict(re.findall(r"BOOT (\S+) ([0-9a-f-]{36})", proc.stdout))
    assert set(reported) == set(simfleet.nodes)
    for node in simfleet.nodes:
        assert reported[node] != before[node]
        assert simfleet.boot_id(node) == reported[node]


def _packages_index(simfleet) -> list[dict]:
    from simfleet import aptrepo  # pylint: disable=import-outside-toplevel

    return aptrepo.package_index(simfleet.dir)


def _installable(index: list[dict]) -> dict:
    """A package without dependencies (a pinning package when there is one)."""
    free = [p for p in index if not p.get("Depends") and not p.get("Pre-Depends")]
    assert free, "the repository has no package without dependencies"
    pinning = [p for p in free if p["Package"].startswith("nvidia-driver-pinning-")]
    return (pinning or free)[0]


def test_apt_installs_from_the_signed_repository(simfleet):
    node = simfleet.nodes[-1]
    # Earlier tests in the session may have installed and held a driver on this node; apt must be
    # judged on a fresh node, where nothing is held.
    simfleet.reset(node)
    pkg = _installable(_packages_index(simfleet))
    keyring = "/usr/share/keyrings/simfleet-test.gpg"
    sources = "/etc/apt/sources.list.d/simfleet-test.list"
    only_this = ["-o", "Dir::Etc::sourcelist=" + sources, "-o", "Dir::Etc::sourceparts=-"]
    shutil.copyfile(simfleet.apt_key_path, os.path.join(simfleet.root_of(node), keyring.lstrip("/")))
    try:
        simfleet.run(node, ["sh", "-c", "echo 'deb [signed-by=%s] %s /' > %s" % (keyring, simfleet.repo_url(node), sources)], check=True)
        update = simfleet.run(node, ["apt-get", "update"] + only_this, check=True)
        assert "InRelease" in update.stdout and "NO_PUBKEY" not in update.stdout + update.stderr
        simfleet.run(node, ["apt-get", "install", "-y", "--no-install-recommends", pkg["Package"]] + only_this, check=True)
        installed = simfleet.run(node, ["dpkg-query", "-W", "-f", "${Version}", pkg["Package"]], check=True).stdout
        assert installed == pkg["Version"]
        policy = simfleet.run(node, ["apt-cache", "policy", pkg["Package"]] + only_this, check=True).stdout
        assert simfleet.repo_url(node).rstrip("/") in policy

        # The same repository with another key is refused: the signature is what apt trusts.
        simfleet.run(node, ["sh", "-c", "echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s /' > %s"
                            % (simfleet.repo_url(node), sources)], check=True)
        refused = simfleet.run(node, ["apt-get", "update"] + only_this)
        assert "NO_PUBKEY" in refused.stdout + refused.stderr or "not signed" in refused.stdout + refused.stderr
    finally:
        simfleet.run(node, ["sh", "-c", "apt-get purge -y -q %s >/dev/null 2>&1; rm -f %s %s; rm -rf /var/lib/apt/lists/127.0.0.1*"
                            % (pkg["Package"], keyring, sources)])


def test_repo_unreachable_cuts_off_one_node(simfleet):
    cut, other = simfleet.nodes[0], simfleet.nodes[1]
    url = "%sInRelease" % simfleet.repo_url(cut)
    fetch = "import sys, urllib.request; urllib.request.urlopen(sys.argv[1], timeout=10); print('fetched')"
    assert simfleet.run(cut, ["python3", "-c", fetch, url]).stdout.strip() == "fetched"
    simfleet.fault(cut, "repo_unreachable")
    try:
        refused = simfleet.run(cut, ["python3", "-c", fetch, url])
        assert refused.returncode != 0 and "fetched" not in refused.stdout
        assert simfleet.run(other, ["python3", "-c", fetch, "%sInRelease" % simfleet.repo_url(other)]).stdout.strip() == "fetched"
    finally:
        simfleet.fault(cut, "clear")
    assert simfleet.run(cut, ["python3", "-c", fetch, url]).stdout.strip() == "fetched"
