"""Run the gpu_facts module's main() as Ansible does and read the JSON it prints."""

import json
import os
import sys

import pytest
from ansible.module_utils.testing import patch_module_args

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import captures  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.modules import gpu_facts  # noqa: E402


def run_module(args, capsys):
    with patch_module_args(args):
        with pytest.raises(SystemExit) as exit_info:
            gpu_facts.main()
    result = json.loads(capsys.readouterr().out)
    return exit_info.value.code, result


def test_capture_dir_gives_the_case_values(tmp_path, capsys):
    bundle = captures.build("dkms-module-older-than-userspace", str(tmp_path / "bundle"))
    code, result = run_module({"capture_dir": bundle}, capsys)
    assert code == 0
    assert result["changed"] is False
    driver = result["ansible_facts"]["nvidia"]["driver"]
    assert (driver["userspace_version"], driver["on_disk_version"], driver["state"]) == ("595.84", "595.80", "broken")


def test_truncated_xml_fails_naming_the_file(tmp_path, capsys):
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "nvidia-smi-q.xml").write_text("<?xml version=\"1.0\" ?>\n<nvidia_smi_log>\n<gpu id=\"00000000:3B:00.0\">")
    code, result = run_module({"capture_dir": str(bundle)}, capsys)
    assert code == 1
    assert result["failed"] is True
    assert result["file"] == "nvidia-smi-q.xml"
    assert result["msg"].startswith("nvidia-smi-q.xml: ")


def test_missing_capture_dir_is_a_clear_error(tmp_path, capsys):
    code, result = run_module({"capture_dir": str(tmp_path / "nope")}, capsys)
    assert code == 1
    assert "is not a directory" in result["msg"] and "nvidia-smi-q.xml" in result["msg"]


@pytest.mark.skipif(os.path.exists("/proc/driver/nvidia") or os.path.exists("/sys/module/nvidia"),
                    reason="this machine has an NVIDIA driver loaded")
def test_live_host_without_nvidia_driver(capsys):
    code, result = run_module({}, capsys)
    assert code == 0
    facts = result["ansible_facts"]["nvidia"]
    assert facts["source"] == "none"
    assert facts["driver"]["state"] == "not_installed"
    assert facts["gpus"] == [] and facts["gpu_count"] == 0
    assert facts["driver"]["running_kernel"] == os.uname()[2]
