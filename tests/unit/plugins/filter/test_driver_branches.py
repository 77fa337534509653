# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side driver branch filters."""

from __future__ import annotations

import os

import pytest
from ansible.errors import AnsibleFilterError

from ansible_collections.gpufleet.nvidia.plugins.filter.driver_branches import FilterModule

F = FilterModule().filters()
HERE = os.path.dirname(os.path.abspath(__file__))
RELEASES = os.path.join(HERE, "..", "..", "..", "fixtures", "releases", "releases.json")
TODAY = "2026-11-29"


def test_filter_names():
    assert sorted(F) == sorted([
        "driver_resolve", "cuda_min_driver", "driver_supports_cuda", "driver_branch", "driver_branch_info",
        "driver_branch_catalog", "driver_distribution", "driver_apt_failure", "driver_signing_key",
        "driver_local_facts", "driver_unattended_upgrades_config", "driver_repository", "driver_verify_module",
        "driver_kernel_hold", "driver_next_local_facts"])


def test_driver_resolve_h100_and_v100():
    h100 = [{"name": "NVIDIA H100 80GB HBM3", "architecture": "Hopper"}] * 8
    v100 = [{"name": "Tesla V100-SXM2-32GB", "architecture": "Volta"}] * 8
    assert F["driver_resolve"](h100, "ltsb", today=TODAY)["version"] == "620.70.06"
    assert F["driver_resolve"](v100, "ltsb", today=TODAY)["version"] == "580.178.04"
    assert F["driver_resolve"](["Hopper"], "580", version="580.126.20", today=TODAY)["kernel_module_type"] == "open"


def test_driver_resolve_refusal_is_a_filter_error():
    with pytest.raises(AnsibleFilterError) as err:
        F["driver_resolve"]([{"name": "Tesla V100-SXM2-32GB", "architecture": "Volta"}], "620", today=TODAY,
                            node="gpu-v100-01")
    assert "node gpu-v100-01 with 1\u00d7 Tesla V100-SXM2-32GB (Volta)" in str(err.value)
    assert "Allowed driver_branch values for these GPUs: ltsb (R580), 580" in str(err.value)


def test_cuda_min_driver():
    assert F["cuda_min_driver"]("12.8") == "570.26"
    assert F["cuda_min_driver"]("13.0") == "580.65.06"
    assert F["cuda_min_driver"]("12.6.2") == "560.35.03"
    assert F["cuda_min_driver"]("13.1", "minor") == "580"
    with pytest.raises(AnsibleFilterError):
        F["cuda_min_driver"]("thirteen")
    assert F["driver_supports_cuda"]("595.45.04", "13.2") is True
    assert F["driver_supports_cuda"]("590.48.01", "13.2") is False


def test_branch_helpers():
    assert F["driver_branch"]("580.126.20") == "580"
    assert F["driver_branch"]("R620") == "620"
    info = F["driver_branch_info"]("535", today=TODAY)
    assert (info["class"], info["eol"], info["eol_date"], info["branch"]) == ("ltsb", True, "2026-06", "535")
    with pytest.raises(AnsibleFilterError):
        F["driver_branch_info"]("999")


def test_catalog_refresh_from_file_text():
    with open(RELEASES) as handle:
        catalog = F["driver_branch_catalog"](handle.read(), retrieved="2026-12-01", source="mirror")
    assert catalog["as_of"] == "2026-12-01" and catalog["refreshed_from"] == "mirror"
    assert F["driver_branch_info"]("620", catalog=catalog, today=TODAY)["versions"] == ["620.70.06"]
    assert F["driver_branch_catalog"]()["as_of"] == "2026-11-29"


def test_distribution():
    assert F["driver_distribution"]({"distribution": "Debian", "distribution_major_version": "12",
                                     "distribution_version": "12.8"}) == "debian12"
    with pytest.raises(AnsibleFilterError):
        F["driver_distribution"]({"distribution": "Fedora", "distribution_major_version": "40"})


def test_apt_failure_and_signing_key():
    verdict = F["driver_apt_failure"]({"rc": 100, "stdout": "", "stderr":
                                       "E: Unable to correct problems, you have held broken packages."})
    assert (verdict["kind"], verdict["retry"]) == ("dependency_conflict", False)
    colons = ("pub:-:3072:1:AAAABBBBCCCCDDDD:1700000000:::-:::scESC::::::23::0:\n"
              "fpr:::::::::0123456789ABCDEF0123456789ABCDEF01234567:\n"
              "uid:-::::1700000000::HASH::simfleet repo::::::::::0:\n"
              "sub:-:3072:1:EEEEFFFF00001111:1700000000::::::e::::::23:\n"
              "fpr:::::::::FFFF456789ABCDEF0123456789ABCDEF0123FFFF:\n")
    ok = F["driver_signing_key"](colons, "0123 4567 89ab cdef 0123  4567 89AB CDEF 0123 4567")
    assert ok["ok"] is True and ok["found"] == ["0123456789ABCDEF0123456789ABCDEF01234567"]
    bad = F["driver_signing_key"](colons, "FFFF456789ABCDEF0123456789ABCDEF0123FFFF")
    assert bad["ok"] is False and "not the pinned" in bad["message"]


def test_local_facts_and_blacklist():
    facts = F["driver_local_facts"]({}, "620.70.06", "620", "2026-11-29T10:00:00Z", "install", None, "open")
    assert facts["current"] == {"version": "620.70.06", "branch": "620", "kernel_module_type": "open",
                                "since": "2026-11-29T10:00:00Z"}
    conf = F["driver_unattended_upgrades_config"](["cuda-toolkit-"])
    assert '    "cuda-toolkit-";' in conf


def test_repository_verify_and_kernel_hold():
    repo = F["driver_repository"]("debian12", "http://127.0.0.1:8080/n1/debian12/x86_64/", "ab cd")
    assert repo["sources_content"].splitlines()[1] == (
        "deb [signed-by=/etc/apt/keyrings/gpufleet-nvidia-driver.asc,ABCD] http://127.0.0.1:8080/n1/debian12/x86_64/ /")
    assert F["driver_verify_module"]("620.70.06", "620.70.06\n")["verdict"] == "ok"
    assert F["driver_verify_module"]("595.84", "595.80\n", "7.0.12-zen1-1-zen")["verdict"] == "broken"
    assert F["driver_verify_module"]("620.70.06", "modinfo: ERROR: Module nvidia not found.\n")["verdict"] == (
        "not_built_for_running_kernel")
    hold = F["driver_kernel_hold"](["linux-image-6.1.0-28-amd64", "linux-image-amd64", "bash"], "6.1.0-28-amd64")
    assert hold["hold"] == ["linux-image-6.1.0-28-amd64", "linux-image-amd64"]
