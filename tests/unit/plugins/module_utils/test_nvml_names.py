"""Unit tests for nvml_names: the one table of NVML return codes, compute modes and architectures."""

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import nvml_names


@pytest.mark.parametrize("code, name", [
    (3, "NotSupported"),
    (9, "DriverNotLoaded"),
    (15, "GpuIsLost"),
    (18, "LibRmVersionMismatch"),
    (23, "InsufficientResources"),
    (999, "Unknown"),
    (42, "Error42"),
])
def test_return_code_name(code, name):
    assert nvml_names.return_code_name(code) == name


def test_return_code_name_refuses_a_name():
    with pytest.raises(TypeError, match="integer"):
        nvml_names.return_code_name("18")


def test_named_return_codes_match_nvml_h():
    # nvml.h: NVML_ERROR_NO_PERMISSION = 4, NVML_ERROR_DRIVER_NOT_LOADED = 9,
    # NVML_ERROR_LIBRARY_NOT_FOUND = 12, NVML_ERROR_GPU_IS_LOST = 15, NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    # NVML_ERROR_INSUFFICIENT_RESOURCES = 23.
    assert [nvml_names.RETURN_CODES[c] for c in (
        nvml_names.ERROR_NO_PERMISSION, nvml_names.ERROR_DRIVER_NOT_LOADED, nvml_names.ERROR_LIBRARY_NOT_FOUND,
        nvml_names.ERROR_GPU_IS_LOST, nvml_names.ERROR_LIB_RM_VERSION_MISMATCH, nvml_names.ERROR_INSUFFICIENT_RESOURCES,
        nvml_names.ERROR_UNKNOWN)] == [
        "NoPermission", "DriverNotLoaded", "LibraryNotFound", "GpuIsLost", "LibRmVersionMismatch", "InsufficientResources",
        "Unknown"]


@pytest.mark.parametrize("value, name", [(0, "Default"), (1, "Exclusive_Thread"), (2, "Prohibited"),
                                         (3, "Exclusive_Process"), (7, "Unknown(7)"), (None, None)])
def test_compute_mode_name(value, name):
    assert nvml_names.compute_mode_name(value) == name


@pytest.mark.parametrize("value, name", [(5, "Volta"), (8, "Ada Lovelace"), (9, "Hopper"), (10, "Blackwell"),
                                         (13, "Rubin"), (11, "Unknown(11)"), (None, None)])
def test_architecture_display_name(value, name):
    assert nvml_names.architecture_display_name(value) == name


def test_architectures_are_oldest_first_with_unique_values():
    values = [entry["nvml"] for entry in nvml_names.ARCHITECTURES]
    assert values == sorted(values)
    assert len(set(entry["name"] for entry in nvml_names.ARCHITECTURES)) == len(values)
