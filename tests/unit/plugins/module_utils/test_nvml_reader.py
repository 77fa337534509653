"""The NVML reader against the NVML test double: the simulated fleet's drop-in pynvml.

The double is the real nvidia-ml-py module's classes and constants over a simulated library
that serves a node root laid out in a temporary directory (``SIMGPU_ROOT``), with the
behaviour of real GPUs: per-field NotSupported, LibRmVersionMismatch while the loaded module
differs from the userspace library, DriverNotLoaded without a loaded module, GpuIsLost for a
GPU that fell off the bus. The same node is also read through the simulated ``nvidia-smi -q -x``
so that both backends are held to the same values.
"""

import importlib
import io
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from simnode import fault  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu import load_pynvml as load_sim_pynvml  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import boot_node_root, initial_state, write_node_root  # noqa: E402  pylint: disable=wrong-import-position

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import read_nvml  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import parse_nvidia_smi_xml  # noqa: E402


@pytest.fixture(name="node")
def fixture_node(tmp_path, monkeypatch):
    """Lay out a booted node of a GPU class; return (root, pynvml double)."""

    def make(profile="h100", boot=True, **kwargs):
        root = str(tmp_path / "root")
        write_node_root(root, initial_state(profile, "node-%s" % profile), **kwargs)
        if boot:
            boot_node_root(root)
        monkeypatch.setenv("SIMGPU_ROOT", root)
        monkeypatch.delenv("SIMGPU_FAKE_UID", raising=False)
        return root, load_sim_pynvml()

    return make


def smi_xml(root):
    out = io.StringIO()
    code = importlib.import_module("simgpu.smi").main(["-q", "-x"], root=root, stdout=out, stderr=io.StringIO())
    assert code == 0, out.getvalue()
    return out.getvalue()


def test_h100_node_reads_every_gpu(node):
    _root, nvml = node("h100", userspace_version="580.126.20")
    result = read_nvml(nvml)
    assert result["init_error"] is None
    assert result["driver"]["userspace_version"] == "580.126.20"
    assert result["device_count"] == 8 and len(result["gpus"]) == 8
    gpu = result["gpus"][0]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3"
    assert gpu["architecture"] == "Hopper"
    assert (gpu["power"]["default_limit_w"], gpu["power"]["min_limit_w"], gpu["power"]["max_limit_w"]) == \
        (700.0, 200.0, 700.0)
    assert gpu["power"]["limit_w"] == gpu["power"]["enforced_limit_w"] == 700.0
    assert gpu["pci_bus_id"].startswith("0000:") and gpu["pci_bus_id"].endswith(".0")
    assert gpu["readable"] is True
    # Hopper replaced page retirement by row remapping: NVML says NotSupported, nothing else is missing.
    assert gpu["retired_pages"]["single_bit_ecc"] is None
    assert gpu["remapped_rows"]["pending"] is False
    assert {n["field"] for n in result["unsupported"]} <= {
        "retired_pages.single_bit_ecc", "retired_pages.double_bit_ecc", "retired_pages.pending"}


def test_not_supported_field_is_null_for_that_gpu_only(node):
    root, nvml = node("h100")
    fault(root, "nvml_not_supported", {"field": "power_limit", "gpu": 3})
    result = read_nvml(nvml)
    assert result["gpus"][3]["power"]["limit_w"] is None
    assert result["gpus"][3]["power"]["max_limit_w"] is None
    assert result["gpus"][2]["power"]["limit_w"] == 700.0
    notes = [n for n in result["unsupported"] if not n["field"].startswith("retired_pages")]
    assert {n["error"] for n in notes} == {"NotSupported"}
    assert {n["gpu"] for n in notes} == {3}
    assert "nvmlDeviceGetPowerManagementLimit" in {n["call"] for n in notes}


def test_version_mismatch_is_reported_not_raised(node):
    _root, nvml = node("a100", boot=False, userspace_version="580.126.20", module_version="580.126.20",
                       loaded_version="580.105.08")
    result = read_nvml(nvml)
    assert result["init_error"] == "LibRmVersionMismatch"
    assert result["gpus"] == []
    facts = assemble_facts({"nvml": result, "sys_module_version": "580.105.08\n",
                            "modinfo": "version:        580.126.20\n", "dpkg_l": ""})
    assert facts["driver"]["state"] == "reboot_pending"
    assert (facts["driver"]["loaded_version"], facts["driver"]["on_disk_version"]) == ("580.105.08", "580.126.20")


def test_driver_not_loaded(node):
    _root, nvml = node("l40s", boot=False, loaded=False)
    result = read_nvml(nvml)
    assert result["init_error"] == "DriverNotLoaded"
    facts = assemble_facts({"nvml": result, "modinfo": "version:        580.126.20\n",
                            "dpkg_l": "ii  libnvidia-ml1:amd64  580.126.20-1  amd64  NVIDIA Management Library\n"})
    assert facts["driver"]["state"] == "not_loaded"


def test_open_module_does_not_load_on_volta(node):
    _root, nvml = node("v100", flavor="open")
    assert read_nvml(nvml)["init_error"] == "DriverNotLoaded"


def test_one_lost_gpu_out_of_eight_marks_that_gpu_only(node):
    root, nvml = node("h100")
    fault(root, "gpu_lost", {"gpu": 5, "when": "now"})
    result = read_nvml(nvml)
    assert result["device_count"] == 8
    lost = [g["index"] for g in result["gpus"] if not g["readable"]]
    assert lost == [5]
    assert result["gpus"][5]["errors"] == ["GpuIsLost"]
    assert all(g["name"] == "NVIDIA H100 80GB HBM3" for i, g in enumerate(result["gpus"]) if i != 5)


@pytest.mark.parametrize("profile", ["h100", "a100", "l40s", "v100", "b200"])
def test_nvml_and_nvidia_smi_backends_agree(node, profile):
    # Open kernel modules do not drive Volta: the V100 node runs the proprietary flavour.
    root, nvml = node(profile, flavor="proprietary" if profile == "v100" else "open")
    by_nvml = read_nvml(nvml)
    by_smi = parse_nvidia_smi_xml(smi_xml(root))
    assert by_smi["driver"]["userspace_version"] == by_nvml["driver"]["userspace_version"]
    assert len(by_smi["gpus"]) == len(by_nvml["gpus"])
    for left, right in zip(by_nvml["gpus"], by_smi["gpus"]):
        for key in ("uuid", "name", "serial", "pci_bus_id", "persistence_mode", "compute_mode", "temperature_c"):
            assert left[key] == right[key], key
        for key in ("limit_w", "default_limit_w", "enforced_limit_w", "min_limit_w", "max_limit_w"):
            assert left["power"][key] == right["power"][key], key
        assert left["ecc"]["mode_current"] == right["ecc"]["mode_current"]
        assert left["mig"]["mode_current"] == right["mig"]["mode_current"]
        assert left["pcie"] == right["pcie"]
        assert left["memory"]["total_mib"] == right["memory"]["total_mib"]
