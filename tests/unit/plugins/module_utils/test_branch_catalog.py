# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Branch catalog, releases.json refresh and driver resolution."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_catalog as bc
from ansible_collections.gpufleet.nvidia.plugins.module_utils import cuda_compat
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_resolution as dr
from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_architectures

HERE = os.path.dirname(os.path.abspath(__file__))
RELEASES = os.path.join(HERE, "..", "..", "..", "fixtures", "releases", "releases.json")
TODAY = "2026-11-29"

H100 = [{"index": i, "name": "NVIDIA H100 80GB HBM3", "architecture": "Hopper"} for i in range(8)]
V100 = [{"index": i, "name": "Tesla V100-SXM2-32GB", "architecture": "Volta"} for i in range(8)]
B200 = [{"index": i, "name": "NVIDIA B200", "architecture": "Blackwell"} for i in range(8)]
L40S = [{"index": i, "name": "NVIDIA L40S", "architecture": "Ada Lovelace"} for i in range(4)]


@pytest.fixture()
def catalog():
    return bc.get_catalog()


def test_catalog_as_of_and_branch_classes(catalog):
    assert catalog["as_of"] == "2026-11-29"
    b = catalog["branches"]
    assert (b["535"]["class"], b["535"]["eol"], b["535"]["max_cuda_major"]) == ("ltsb", "2026-06", 12)
    assert (b["570"]["class"], b["570"]["eol"]) == ("pb", "2026-02")
    assert (b["580"]["class"], b["580"]["eol"], b["580"]["max_cuda_major"]) == ("ltsb", "2028-06", 13)
    assert (b["595"]["class"], b["595"]["eol"]) == ("pb", "2027-03")
    assert (b["620"]["class"], b["620"]["eol"], b["620"]["released"]) == ("ltsb", "2029-09", "2026-11-04")
    assert b["620"]["kernel_module_types"] == ["open"]
    assert "volta" in b["580"]["architectures"] and "volta" not in b["595"]["architectures"]
    assert "blackwell" not in b["535"]["architectures"]
    assert b["580"]["versions"][-1] == "580.178.04"
    assert all(catalog["sources"][s] for info in b.values() for s in info["sources"])


def test_eol_status_as_of_2026_11(catalog):
    assert bc.eol_status(catalog, "535", TODAY)["eol"] is True
    assert bc.eol_status(catalog, "570", TODAY)["eol"] is True
    assert bc.eol_status(catalog, "580", TODAY)["eol"] is False
    assert bc.eol_status(catalog, "595", TODAY)["eol"] is False
    assert bc.eol_status(catalog, "620", TODAY)["eol"] is False
    # an end-of-life month still counts as supported to its last day
    assert bc.eol_status(catalog, "535", "2026-06-30")["eol"] is False
    assert bc.eol_status(catalog, "535", "2026-07-01")["eol"] is True
    nfb = bc.eol_status(catalog, "590", TODAY)
    assert nfb["eol"] is True and nfb["superseded_by"] == "610"
    assert bc.eol_status(catalog, "615", TODAY)["eol"] is False


def test_normalize_architecture():
    assert gpu_architectures.normalize_architecture("Hopper") == "hopper"
    assert gpu_architectures.normalize_architecture("Ada Lovelace") == "ada"
    assert gpu_architectures.normalize_architecture(9) == "hopper"
    assert gpu_architectures.normalize_architecture("5") == "volta"
    with pytest.raises(ValueError):
        gpu_architectures.normalize_architecture("Fermi")


def test_h100_ltsb_resolves_to_newest_r620(catalog):
    res = dr.resolve_driver(catalog, "ltsb", H100, TODAY, node="gpu-h100-01")
    assert (res["branch"], res["version"], res["kernel_module_type"]) == ("620", "620.70.06", "open")
    assert res["branch_class"] == "ltsb" and res["eol"] is False
    assert res["gpus"] == "8\u00d7 NVIDIA H100 80GB HBM3 (Hopper)"


def test_h100_ltsb_takes_newest_version_in_repository(catalog):
    repo = ["580.126.20", "580.159.03", "620.70.06", "620.82.01"]
    res = dr.resolve_driver(catalog, "ltsb", H100, TODAY, available_versions=repo)
    assert res["version"] == "620.82.01"
    assert res["version_source"] == "repository" and res["in_catalog"] is False
    assert "not in the catalog" in res["warnings"][0]


def test_v100_ltsb_resolves_to_r580_proprietary(catalog):
    res = dr.resolve_driver(catalog, "ltsb", V100, TODAY)
    assert (res["branch"], res["version"], res["kernel_module_type"]) == ("580", "580.178.04", "proprietary")


def test_l40s_pb_resolves_to_r595(catalog):
    res = dr.resolve_driver(catalog, "pb", L40S, TODAY)
    assert (res["branch"], res["version"]) == ("595", "595.91.07")


@pytest.mark.parametrize("branch", ["595", "620", "R620"])
def test_v100_refused_after_r580_naming_gpus(catalog, branch):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, branch, V100, TODAY, node="gpu-v100-01")
    assert err.value.code == "architecture_unsupported"
    msg = str(err.value)
    assert "gpu-v100-01" in msg and "8\u00d7 Tesla V100-SXM2-32GB (Volta)" in msg
    assert "R580 is the last branch for Volta" in msg
    assert err.value.allowed == ["ltsb (R580)", "580"]


def test_b200_proprietary_refused(catalog):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "580", B200, TODAY, kernel_module_type="proprietary")
    assert err.value.code == "proprietary_unsupported"
    assert "NVIDIA B200 (Blackwell)" in str(err.value)
    assert "proprietary kernel modules do not support Blackwell" in str(err.value)


def test_proprietary_refused_on_r620_even_for_hopper(catalog):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "620", H100, TODAY, kernel_module_type="proprietary")
    assert err.value.code == "proprietary_unsupported"
    assert "R620 ships open kernel modules only" in str(err.value)


def test_open_refused_before_turing(catalog):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "580", V100, TODAY, kernel_module_type="open")
    assert err.value.code == "open_unsupported"
    assert "open kernel modules need Turing or later, not Volta" in str(err.value)


@pytest.mark.parametrize("branch,newest", [("535", "535.274.02"), ("570", "570.211.01")])
def test_eol_branches_refused_unless_allowed(catalog, branch, newest):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, branch, H100, TODAY)
    assert err.value.code == "eol"
    assert "driver_allow_eol" in str(err.value)
    res = dr.resolve_driver(catalog, branch, H100, TODAY, allow_eol=True)
    assert res["version"] == newest and res["eol"] is True
    assert "end of life since" in res["warnings"][0]


def test_version_not_in_repository_refused(catalog):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "580", H100, TODAY, version="580.105.08",
                          available_versions=["580.126.20", "580.159.03", "620.70.06"])
    assert err.value.code == "version_not_in_repository"
    assert "The repository offers for R580: 580.126.20, 580.159.03." in str(err.value)


def test_version_not_in_branch_refused(catalog):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "580", H100, TODAY, version="595.71.05")
    assert err.value.code == "version_not_in_branch"
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "ltsb", H100, TODAY, version="595.71.05")
    assert err.value.code == "version_not_in_branch"
    assert "a Production Branch, not a Long Term Support Branch" in str(err.value)


def test_exact_version_downgrade_target_accepted(catalog):
    res = dr.resolve_driver(catalog, "580", H100, TODAY, version="580.126.20",
                            available_versions=["580.126.20", "580.159.03", "620.70.06"])
    assert (res["branch"], res["version"], res["version_source"]) == ("580", "580.126.20", "request")
    assert res["kernel_module_type"] == "open"


def test_nfb_without_known_version_is_refused_then_resolved_from_repository(catalog):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "nfb", H100, TODAY)
    assert err.value.code == "no_branch"
    assert "R615 has no version in the catalog" in str(err.value)
    res = dr.resolve_driver(catalog, "nfb", H100, TODAY, available_versions=["615.44.02", "620.70.06"])
    assert (res["branch"], res["version"]) == ("615", "615.44.02")


def test_mixed_volta_and_blackwell_has_no_flavour(catalog):
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "580", V100[:1] + B200[:1], TODAY)
    assert err.value.code == "flavour_conflict"


def test_declared_architectures_when_no_gpu_facts(catalog):
    res = dr.resolve_driver(catalog, "ltsb", [], TODAY, declared_architectures=["Volta"])
    assert (res["branch"], res["architecture_source"]) == ("580", "declared")
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "ltsb", H100, TODAY, declared_architectures=["volta"])
    assert err.value.code == "bad_request"
    with pytest.raises(bc.ResolutionError) as err:
        dr.resolve_driver(catalog, "ltsb", [], TODAY)
    assert err.value.code == "unknown_architecture"


def test_refresh_from_releases_fixture(catalog):
    with open(RELEASES) as handle:
        text = handle.read()
    refreshed = bc.refresh_from_releases(text, catalog, retrieved="2026-11-30", source="releases.json")
    assert refreshed["as_of"] == "2026-11-30"
    assert refreshed["branches"]["595"]["class"] == "pb"
    assert refreshed["branches"]["620"]["versions"] == ["620.70.06"]
    assert refreshed["branches"]["580"]["versions"][-1] == "580.178.04"
    assert refreshed["branches"]["535"]["eol"] == "2026-06"  # kept: not in releases.json
    assert catalog["as_of"] == "2026-11-29"  # input untouched


def test_refresh_adds_unknown_branch_with_inherited_capabilities(catalog):
    doc = json.loads(open(RELEASES).read())
    doc["625"] = {"type": "production branch",
                  "driver_info": [{"release_version": "625.20.01", "release_date": "2027-02-10"}]}
    refreshed = bc.refresh_from_releases(doc, catalog)
    new = refreshed["branches"]["625"]
    assert new["inferred"] is True and new["class"] == "pb"
    assert new["kernel_module_types"] == ["open"] and "volta" not in new["architectures"]
    res = dr.resolve_driver(refreshed, "pb", H100, "2027-03-01")
    assert res["version"] == "625.20.01"


def test_refresh_rejects_wrong_shape(catalog):
    with pytest.raises(ValueError):
        bc.refresh_from_releases("[1, 2]", catalog)
    with pytest.raises(ValueError):
        bc.refresh_from_releases("{not json", catalog)


@pytest.mark.parametrize("toolkit,driver", [
    ("13.0", "580.65.06"), ("13.0.2", "580.95.05"), ("13.2", "595.45.04"), ("13.2.1", "595.58.03"),
    ("12.8", "570.26"), ("12.2.2", "535.104.05"), ("12.2", "535.54.03"), ("11.8", "520.61.05"),
    ("11.0", "450.51.05"), ("13.3", "610.43.02"),
])
def test_cuda_minimum_driver(toolkit, driver):
    assert cuda_compat.cuda_minimum_driver(toolkit)["minimum_driver"] == driver


def test_cuda_minor_compat_and_limits():
    assert cuda_compat.cuda_minimum_driver("12.4", mode="minor")["minimum_driver"] == "525"
    assert cuda_compat.cuda_minimum_driver("13.5", mode="minor")["minimum_driver"] == "580"
    with pytest.raises(ValueError):
        cuda_compat.cuda_minimum_driver("14.0")
    assert cuda_compat.driver_supports_cuda("580.126.20", "13.0") is True
    assert cuda_compat.driver_supports_cuda("575.57.08", "13.0") is False
