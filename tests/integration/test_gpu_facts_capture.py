"""`ansible localhost -m gpufleet.nvidia.gpu_facts -a capture_dir=DIR` on bundles of the field cases."""

import json
import os
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "unit"))

import captures  # noqa: E402  pylint: disable=wrong-import-position

ANSIBLE = os.path.join(os.path.dirname(sys.executable), "ansible")


def ansible_gpu_facts(args):
    env = dict(os.environ, ANSIBLE_STDOUT_CALLBACK="ansible.builtin.default", ANSIBLE_CALLBACK_RESULT_FORMAT="json",
               ANSIBLE_NOCOLOR="1")
    proc = subprocess.run(
        [ANSIBLE, "localhost", "-i", "localhost,", "-c", "local",
         "-e", "ansible_python_interpreter=%s" % sys.executable,
         "-m", "gpufleet.nvidia.gpu_facts", "-a", args],
        env=env, capture_output=True, text=True, timeout=300, check=False)
    # The default callback prints "localhost | SUCCESS => {...}" (or FAILED!) with JSON after "=>".
    payload = proc.stdout.partition("=>")[2]
    assert payload, proc.stdout + proc.stderr
    return proc.returncode, json.loads(payload)


@pytest.mark.parametrize("bundle,expect", [
    ("a100-mig", {"gpu_count": 1, "state": "ok", "userspace": "535.54.03", "mig_devices": 4}),
    ("dkms-module-older-than-userspace", {"gpu_count": None, "state": "broken", "userspace": "595.84",
                                          "on_disk": "595.80"}),
    ("no-module-for-running-kernel", {"gpu_count": None, "state": "broken", "userspace": None}),
    ("xid119-gsp", {"gpu_count": None, "state": None, "userspace": None, "xids": {"119": 5}}),
])
def test_capture_through_the_ansible_cli(tmp_path, bundle, expect):
    directory = captures.build(bundle, str(tmp_path / bundle))
    rc, result = ansible_gpu_facts("capture_dir=%s" % directory)
    assert rc == 0, result
    facts = result["ansible_facts"]["nvidia"]
    assert facts["source"] == "capture"
    assert facts["gpu_count"] == expect["gpu_count"]
    assert facts["driver"]["state"] == expect["state"]
    assert facts["driver"]["userspace_version"] == expect["userspace"]
    if "on_disk" in expect:
        assert facts["driver"]["on_disk_version"] == expect["on_disk"]
    if "mig_devices" in expect:
        assert len(facts["gpus"][0]["mig"]["devices"]) == expect["mig_devices"]
        assert facts["gpus"][0]["utilization_gpu_pct"] is None
    if "xids" in expect:
        assert facts["xid_summary"]["by_xid"] == expect["xids"]


def test_bad_capture_fails_through_the_cli_naming_the_file(tmp_path):
    directory = tmp_path / "bad"
    directory.mkdir()
    (directory / "dmesg.txt").write_bytes(b"\x00\x01\x02binary")
    rc, result = ansible_gpu_facts("capture_dir=%s" % directory)
    assert rc != 0
    assert result["file"] == "dmesg.txt"
    assert result["msg"].startswith("dmesg.txt: ")
