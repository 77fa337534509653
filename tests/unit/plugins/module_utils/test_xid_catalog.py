# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The Xid catalog: coverage, consistency and the classification of the field cases' Xids."""

from __future__ import annotations

import json
import re

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils.xid_catalog import (
    ACTIONS,
    AS_OF,
    NVIDIA_XID_PAGE,
    SEVERITIES,
    XID_CATALOG,
    action_rank,
    classify,
    severity_rank,
)

REQUIRED = [8, 13, 31, 32, 38, 43, 44, 45, 48, 56, 57, 61, 62, 63, 64, 68, 69, 74, 79, 92, 94, 95,
            109, 119, 120, 121, 122, 123, 140, 143] + list(range(144, 151)) + [154]


def test_as_of_is_a_date():
    assert re.match(r"^\d{4}-\d\d-\d\d$", AS_OF)


@pytest.mark.parametrize("xid", REQUIRED)
def test_required_xids_are_catalogued(xid):
    entry = classify(xid)
    assert entry["known"] is True
    assert entry["xid"] == xid
    assert entry["name"] and entry["description"] and entry["mnemonic"]
    assert entry["severity"] in SEVERITIES
    assert entry["action"] in ACTIONS
    assert isinstance(entry["fatal"], bool)
    assert NVIDIA_XID_PAGE in entry["sources"]


@pytest.mark.parametrize("xid", sorted(XID_CATALOG))
def test_entries_are_consistent(xid):
    entry = XID_CATALOG[xid]
    # What needs a reboot or a technician, and what is fatal by severity, stops a rollout.
    if entry["action"] in ("reboot", "hardware_inspection") or entry["severity"] == "fatal":
        assert entry["fatal"] is True
    # Information needs no action and stops nothing.
    if entry["severity"] == "info":
        assert entry["action"] == "ignore" and entry["fatal"] is False
    # A warning never stops a rollout.
    if entry["severity"] == "warning":
        assert entry["fatal"] is False


def test_catalog_is_json_data():
    assert json.loads(json.dumps(XID_CATALOG, sort_keys=True))["79"]["action"] == "reboot"


@pytest.mark.parametrize(
    "xid, severity, action, fatal",
    [
        # Field case 08: application faults, the GPU stays usable.
        (13, "warning", "check_application", False),
        (31, "warning", "check_application", False),
        # Field case 08: context switch timeout, the GPU needs a reset.
        (109, "critical", "reset_gpu", False),
        # Field case 06: GSP RPC timeout, reset, and a rollback signal after an upgrade.
        (119, "critical", "reset_gpu", True),
        # Field case 09: remap pending -> reset; remap failure -> keep out of the pool.
        (63, "warning", "reset_gpu", False),
        (64, "fatal", "hardware_inspection", True),
        (79, "fatal", "reboot", True),
        (48, "critical", "reset_gpu", True),
        (92, "warning", "ignore", False),
        (94, "warning", "check_application", False),
        (95, "critical", "reset_gpu", True),
        (154, "info", "ignore", False),
    ],
)
def test_classification_of_known_xids(xid, severity, action, fatal):
    entry = classify(xid)
    assert (entry["severity"], entry["action"], entry["fatal"]) == (severity, action, fatal)


def test_nvidia_buckets_are_recorded():
    assert classify(119)["mnemonic"] == "GSP_RPC_TIMEOUT"
    assert classify(119)["nvidia_immediate"] == "RESET_GPU"
    assert classify(119)["nvidia_investigatory"] == "INVESTIGATE_SW"
    assert classify(13)["nvidia_immediate"] == "RESTART_APP"
    assert classify(79)["nvidia_immediate"] == "RESTART_BM"


def test_unknown_xid_gets_a_default_entry():
    entry = classify(999)
    assert entry["known"] is False
    assert entry["xid"] == 999
    assert (entry["severity"], entry["action"], entry["fatal"]) == ("warning", "check_application", False)
    assert AS_OF in entry["notes"]


def test_xid_as_text_and_bad_xid():
    assert classify("119")["mnemonic"] == "GSP_RPC_TIMEOUT"
    with pytest.raises(ValueError):
        classify("abc")


def test_classify_returns_a_copy():
    entry = classify(79)
    entry["sources"].append("changed")
    entry["action"] = "ignore"
    assert XID_CATALOG[79]["action"] == "reboot"
    assert "changed" not in XID_CATALOG[79]["sources"]


@pytest.mark.parametrize(
    "message, severity, action, fatal, recovery",
    [
        ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
         "fatal", "reboot", True, "node reboot required"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)",
         "critical", "reset_gpu", False, "gpu reset required"),
        ("GPU recovery action changed from 0x0 (None) to 0x2 (OS Reboot)",
         "fatal", "reboot", True, "os reboot"),
        ("GPU recovery action changed from 0x0 (None) to 0x1 (PF FLR)",
         "critical", "reset_gpu", False, "pf flr"),
        ("GPU recovery action changed from 0x2 (Node Reboot Required) to 0x0 (None)",
         "info", "ignore", False, "none"),
        ("GPU recovery action changed from 0x0 to 0x4",
         "critical", "reset_gpu", False, "drain and reset"),
    ],
)
def test_xid_154_reads_the_recovery_action(message, severity, action, fatal, recovery):
    entry = classify(154, message)
    assert (entry["severity"], entry["action"], entry["fatal"]) == (severity, action, fatal)
    assert entry["recovery_action"] == recovery


def test_nvlink5_fatal_word():
    nonfatal = classify(145, "RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001 0x00000000 0x00000000)")
    fatal = classify(149, "NETIR_MFDE_EVENT Fatal XC0 i0 Link 00 (0x00000014 0x00000001 0x00000000 0x00000000)")
    assert (nonfatal["severity"], nonfatal["action"], nonfatal["fatal"]) == ("warning", "ignore", False)
    assert (fatal["severity"], fatal["action"], fatal["fatal"]) == ("critical", "reset_gpu", True)
    assert classify(146)["fatal"] is True


def test_message_does_not_change_other_xids():
    assert classify(13, "Fatal GPU recovery action changed to 0x2 (Node Reboot Required)")["action"] == "check_application"


def test_ranks():
    assert [severity_rank(s) for s in SEVERITIES] == [0, 1, 2, 3]
    assert action_rank("ignore") < action_rank("check_application") < action_rank("reset_gpu") \
        < action_rank("reboot") < action_rank("hardware_inspection")
    assert severity_rank(None) == -1 and action_rank("bogus") == -1
