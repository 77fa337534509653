"""Testinfra checks of the simfleet scenario, over SSH through molecule's inventory."""

import json


def test_node_is_a_booted_debian_12(host):
    assert host.system_info.distribution == "debian"
    assert host.system_info.release.split(".")[0] == "12"
    assert host.run("systemctl is-system-running").stdout.strip() == "running"


def test_converge_left_its_marker(host):
    marker = host.file("/etc/simfleet-molecule-marker")
    assert marker.is_file
    assert marker.mode == 0o644
    assert marker.content_string == "converged on %s\n" % host.backend.get_hostname()


def test_node_has_the_gpus_of_its_class(host):
    state = json.loads(host.file("/var/lib/simgpu/state.json").content_string)
    expected = {"node01": ("h100", "NVIDIA H100 80GB HBM3"), "node02": ("v100", "Tesla V100-SXM2-32GB")}
    profile, name = expected[host.backend.get_hostname()]
    assert state["profile"] == profile
    assert {gpu["name"] for gpu in state["gpus"]} == {name}
    assert len(state["gpus"]) == 8
    assert host.service("simgpu-boot").is_enabled
