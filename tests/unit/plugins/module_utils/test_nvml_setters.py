# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tests for setter result classification (field cases 13, 14 and 15)."""

import os

import pynvml
import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_permission import (
    cap_effective_has,
    in_container,
    permission_message,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_session import call_setter, run_with_nvml
from ansible_collections.gpufleet.nvidia.plugins.module_utils.setter_outcome import (
    FATAL_OUTCOMES,
    outcome_of_error,
    setter_result,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_messages import classify_smi_output

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures", "cases")


def _read(case, name):
    with open(os.path.join(FIXTURES, case, name), encoding="utf-8") as handle:
        return handle.read()


CASE14 = "14-nvml-setters-not-supported-vs-permissions"


# --- field case 14: classification of nvidia-smi setter output -----------------------------------

def test_case14_power_insufficient_permissions_is_a_permission_failure():
    found = classify_smi_output(_read(CASE14, "input-power-insufficient-permissions.txt"))
    assert found == [{
        "pci_bus_id": "0000:01:00.0",
        "status": "no_permission",
        "message": "Failed to set power management limit for GPU 00000000:01:00.0: Insufficient Permissions",
        "range_w": None,
    }]


def test_case14_power_not_supported_is_unsupported_despite_all_done():
    text = _read(CASE14, "input-power-not-supported.txt")
    assert text.rstrip().endswith("All done.")
    found = classify_smi_output(text)
    assert [(entry["pci_bus_id"], entry["status"]) for entry in found] == [("0000:01:00.0", "unsupported")]


def test_case14_ecc_not_supported_with_four_digit_domain():
    found = classify_smi_output(_read(CASE14, "input-ecc-not-supported.txt"))
    assert [(entry["pci_bus_id"], entry["status"]) for entry in found] == [("0000:03:00.0", "unsupported")]


def test_case14_nvml_errors_map_to_the_same_outcomes():
    assert outcome_of_error("NoPermission") == "no_permission"
    assert outcome_of_error("NotSupported") == "unsupported"
    assert outcome_of_error("FunctionNotFound") == "unsupported"
    assert outcome_of_error("InUse") == "in_use"
    assert outcome_of_error("LibRmVersionMismatch") == "driver_error"
    assert outcome_of_error("SomethingNew") == "failed"
    assert outcome_of_error(None) is None


def test_case14_not_supported_power_setter_never_reports_changed():
    # nvidia-smi said "All done."; NVML said NotSupported; the read-back did not move.
    result = setter_result("power_limit_w", 175.0, None, None, error="NotSupported")
    assert result["status"] == "unsupported"
    assert result["changed"] is False


def test_case14_permission_failure_never_reports_changed_and_is_fatal():
    result = setter_result("power_limit_w", 120.0, 150.0, 150.0, error="NoPermission")
    assert (result["status"], result["changed"]) == ("no_permission", False)
    assert result["status"] in FATAL_OUTCOMES


def test_case14_root_in_a_container_needs_cap_sys_admin():
    message = permission_message("the power limit of GPU 0 (0000:01:00.0)", euid=0, container=True,
                                 cap_sys_admin=False)
    assert "CAP_SYS_ADMIN" in message and "--cap-add=SYS_ADMIN" in message
    assert "the power limit of GPU 0 (0000:01:00.0)" in message


def test_permission_message_for_a_non_root_user_asks_for_become():
    message = permission_message("persistence mode of GPU 1", euid=1000, container=False, cap_sys_admin=False)
    assert "become: true" in message and "uid 1000" in message


def test_cap_sys_admin_is_read_from_capeff():
    full = "Name:\tpython3\nCapEff:\t000001ffffffffff\n"
    docker_default = "Name:\tpython3\nCapEff:\t00000000a80425fb\n"  # docker's default set: no SYS_ADMIN
    assert cap_effective_has(full) is True
    assert cap_effective_has(docker_default) is False
    assert cap_effective_has("Name:\tx\n") is None


def test_container_evidence():
    assert in_container("0::/system.slice/docker-3f2a.scope\n") is True
    assert in_container("12:pids:/kubepods/besteffort/pod1\n") is True
    assert in_container("0::/init.scope\n") is False
    assert in_container(marker_files=["/.dockerenv"]) is True


# --- field case 15: read-back compares the enforced value; out-of-range message ----------------

def test_case15_requested_700_enforced_500_is_not_in_effect():
    result = setter_result("power_limit_w", 700.0, 650.0, 700.0, enforced_after=500.0)
    assert result["status"] == "not_in_effect"
    assert result["changed"] is True  # the requested limit did move 650 -> 700
    assert "700" in result["message"] and "500" in result["message"]


def test_case15_out_of_range_message_gives_the_range():
    text = _read("15-power-limit-range-and-enforced-vs-requested", "input.txt")
    found = classify_smi_output(text)
    assert found == [{
        "pci_bus_id": "0000:06:00.0",
        "status": "invalid_value",
        "message": found[0]["message"],
        "range_w": [200.0, 700.0],
    }]
    assert "50.00 W" in found[0]["message"]


# --- field case 13: a reset refused "In use by another client" on 4 GPUs -----------------------

def test_case13_reset_refusals_name_four_gpus():
    found = classify_smi_output(_read("13-mig-reset-blocked-by-nvidia-drm", "input.txt"))
    assert [entry["pci_bus_id"] for entry in found] == ["0000:01:00.0", "0000:47:00.0", "0000:81:00.0",
                                                        "0000:c2:00.0"]
    assert set(entry["status"] for entry in found) == {"in_use"}


# --- read-back rules ----------------------------------------------------------------------------

def test_success_without_read_back_movement_is_failed_not_changed():
    result = setter_result("persistence_mode", True, False, False)
    assert (result["status"], result["changed"]) == ("failed", False)
    assert "reads back False" in result["message"]


def test_applied_only_when_read_back_moved_to_wanted():
    result = setter_result("persistence_mode", True, False, True)
    assert (result["status"], result["changed"]) == ("applied", True)


def test_nothing_called_is_ok_and_unchanged():
    result = setter_result("compute_mode", "default", "default", "default", called=False)
    assert (result["status"], result["changed"]) == ("ok", False)


def test_ecc_change_is_pending_reboot():
    # pending moved False -> True, current still False
    result = setter_result("ecc_mode", True, False, True, current_after=False, pending_requires="reboot")
    assert (result["status"], result["changed"]) == ("pending_reboot", True)


def test_watts_compare_at_milliwatt_precision():
    result = setter_result("power_limit_w", 297.5, 350.0, 297.5)
    assert result["status"] == "applied"
    assert setter_result("power_limit_w", 297.5, 350.0, 297.0)["status"] == "failed"


# --- call_setter against the real pynvml error classes -----------------------------------------

class _FakeNvml(object):
    NVMLError = pynvml.NVMLError

    def __init__(self, code=None):
        self.code = code
        self.calls = []

    def nvmlDeviceSetPersistenceMode(self, handle, mode):
        self.calls.append((handle, mode))
        if self.code is not None:
            raise pynvml.NVMLError(self.code)


@pytest.mark.parametrize("code, name", [
    (pynvml.NVML_ERROR_NO_PERMISSION, "NoPermission"),
    (pynvml.NVML_ERROR_NOT_SUPPORTED, "NotSupported"),
    (pynvml.NVML_ERROR_IN_USE, "InUse"),
])
def test_call_setter_names_the_nvml_error(code, name):
    fake = _FakeNvml(code)
    assert call_setter(fake, "nvmlDeviceSetPersistenceMode", "h0", 1) == name
    assert fake.calls == [("h0", 1)]


def test_call_setter_success_and_missing_function():
    fake = _FakeNvml()
    assert call_setter(fake, "nvmlDeviceSetPersistenceMode", "h0", 0) is None
    assert call_setter(fake, "nvmlDeviceSetSomethingNew", "h0") == "FunctionNotFound"


class _Failed(Exception):
    pass


class _Module:
    """What run_with_nvml needs of an AnsibleModule: fail_json that ends the run."""

    def __init__(self):
        self.failure = None

    def fail_json(self, **kwargs):
        self.failure = kwargs
        raise _Failed()


class _Nvml:
    NVMLError = pynvml.NVMLError

    def __init__(self, init_error=None):
        self.init_error = init_error
        self.calls = []

    def nvmlInit(self):
        self.calls.append("init")
        if self.init_error is not None:
            raise self.init_error

    def nvmlShutdown(self):
        self.calls.append("shutdown")


def test_run_with_nvml_starts_runs_and_shuts_down_even_when_the_body_fails():
    nvml = _Nvml()
    assert run_with_nvml(_Module(), nvml, lambda module, lib: {"changed": lib is nvml}) == {"changed": True}
    assert nvml.calls == ["init", "shutdown"]

    def body(module, lib):
        raise RuntimeError("setter crashed")

    nvml = _Nvml()
    with pytest.raises(RuntimeError, match="setter crashed"):
        run_with_nvml(_Module(), nvml, body)
    assert nvml.calls == ["init", "shutdown"]


@pytest.mark.parametrize("error, name, words", [
    (pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED), "DriverNotLoaded", "kernel module is not loaded"),
    (pynvml.NVMLError(pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH), "LibRmVersionMismatch", "reboot the node"),
    (OSError("libnvidia-ml.so.1: cannot open shared object file"), "LibraryNotFound", "NVML could not start"),
])
def test_run_with_nvml_fails_the_module_with_the_init_error(error, name, words):
    module, nvml, ran = _Module(), _Nvml(error), []
    with pytest.raises(_Failed):
        run_with_nvml(module, nvml, lambda m, lib: ran.append(1))
    assert module.failure["nvml_error"] == name
    assert words in module.failure["msg"]
    assert ran == [] and nvml.calls == ["init"]


def test_run_with_nvml_without_pynvml_names_the_package():
    module = _Module()
    with pytest.raises(_Failed):
        run_with_nvml(module, None, lambda m, lib: {})
    assert "nvidia-ml-py" in module.failure["msg"]
