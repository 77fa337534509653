"""Testinfra checks of the kernel_hold scenario."""

import json


def kernel(host):
    return host.check_output("uname -r")


def test_running_kernel_and_meta_package_held(host):
    held = set(host.check_output("apt-mark showhold").split())
    assert {"linux-image-%s" % kernel(host), "linux-image-amd64", "linux-headers-%s" % kernel(host)} <= held


def test_record_names_only_what_the_role_held(host):
    record = json.loads(host.file("/etc/ansible/facts.d/gpufleet_kernel_hold.fact").content_string)
    assert record["held_by_role"] == sorted(["linux-image-%s" % kernel(host), "linux-image-amd64"])
    assert record["running_kernel"] == kernel(host)


def test_unattended_upgrades_blacklist(host):
    conf = host.file("/etc/apt/apt.conf.d/51gpufleet-kernel-hold").content_string
    for entry in ("linux-image-", "linux-headers-", "nvidia-", "libnvidia-", "libcuda"):
        assert '    "%s";' % entry in conf
    dump = host.check_output("apt-config dump Unattended-Upgrade::Package-Blacklist")
    assert '"linux-image-"' in dump and '"libnvidia-"' in dump
