# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Kernel log parsing: field cases 06, 08, 09, 23 from their real input, and synthetic formats."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log
from ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_log import (
    DEFAULT_INCIDENT_WINDOW_S,
    MAX_MESSAGE_CHARS,
    MAX_XID_KEYS,
    XID_EVENTS_PER_KEY,
    keep_newest,
    parse_kernel_log,
    summarize_xids,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.xid_catalog import XID_CATALOG, classify

CASES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "fixtures", "cases")

EVENT_KEYS = {"pci_bus_id", "xid", "name", "message", "time", "last_time", "wall_time", "epoch_s", "count",
              "incidents", "elided", "severity", "action", "fatal", "known", "pid", "process", "first_line",
              "caused_by_xid", "root_in_log", "classified_by_root"}


def _case(folder, name="input.log"):
    with open(os.path.join(CASES, folder, name), encoding="utf-8") as handle:
        return handle.read()


# ---------------------------------------------------------------- field case 06 (Xid 119 storm)

@pytest.fixture(scope="module")
def case06():
    return parse_kernel_log(_case("06-xid119-gsp-rpc-timeout"))


def test_case06_exactly_five_xid_119_on_9b(case06):
    events = case06["events"]
    assert {e["xid"] for e in events} == {119}
    assert {e["pci_bus_id"] for e in events} == {"0000:9b:00.0"}
    assert sum(e["count"] for e in events) == 5
    summary = summarize_xids(case06)
    assert summary["total"] == 5
    assert summary["by_xid"] == {"119": 5}
    assert summary["by_device"] == {"0000:9b:00.0": 5}


def test_case06_incidents(case06):
    # 16:24:18, :24 and :30 are one incident (6 s apart); 16:27:12 and 16:30:13 stand alone.
    events = case06["events"]
    assert [e["count"] for e in events] == [3, 1, 1]
    assert events[0]["time"] == "Sun Feb 23 16:24:18 2025"
    assert events[0]["last_time"] == "Sun Feb 23 16:24:30 2025"
    assert events[0]["wall_time"] == "Sun Feb 23 16:24:18 2025"
    assert events[0]["epoch_s"] is None
    assert [(e["pid"], e["process"]) for e in events] == [
        (2024380, "nvidia-smi"), (1263500, "cache_mgr_main"), (1240590, "gpud")]
    assert events[0]["message"].startswith("pid=2024380, name=nvidia-smi, Timeout after 6s")
    assert events[0]["first_line"].startswith("[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:9b:00): 119,")


def test_case06_reset_gpu_and_rate_limit(case06):
    for event in case06["events"]:
        assert event["action"] == "reset_gpu"
        assert event["severity"] == "critical"
        assert event["fatal"] is True
        assert event["name"] == "GSP RPC timeout"
        assert set(event) == EVENT_KEYS
    assert case06["rate_limited"] is True
    assert len(case06["rate_limit_lines"]) == 1
    assert "printing 1 of every 30" in case06["rate_limit_lines"][0]
    summary = summarize_xids(case06)
    assert summary["rate_limited"] is True
    assert summary["worst_action"] == "reset_gpu"
    assert summary["any_fatal"] is True and summary["fatal_xids"] == [119]


def test_case06_no_xid_from_tables_or_stack(case06):
    # 43 lines, 5 of them Xids; the RPC tables, stack dump and preamble give nothing.
    assert all(e["first_line"].count("NVRM: Xid") == 1 for e in case06["events"])
    assert case06["api_mismatches"] == []


# ---------------------------------------------------------- field case 08 (13 x3, 109 x2, 31)

@pytest.fixture(scope="module")
def case08():
    return parse_kernel_log(_case("08-xid13-xid31-xid109-same-gpu"))


def test_case08_events(case08):
    events = case08["events"]
    assert [(e["xid"], e["count"]) for e in events] == [(13, 3), (109, 1), (31, 1), (109, 1)]
    assert {e["pci_bus_id"] for e in events} == {"0000:cb:00.0"}
    summary = summarize_xids(case08)
    assert summary["by_xid"] == {"13": 3, "109": 2, "31": 1}
    assert summary["total"] == 6 and summary["incidents"] == 4
    assert summary["rate_limited"] is False


def test_case08_classification(case08):
    by_xid = {}
    for event in case08["events"]:
        by_xid.setdefault(event["xid"], set()).add((event["action"], event["fatal"]))
    assert by_xid[13] == {("check_application", False)}
    assert by_xid[31] == {("check_application", False)}
    assert by_xid[109] == {("reset_gpu", False)}
    # The application faults are not a driver regression: nothing here stops a rollout.
    assert summarize_xids(case08)["any_fatal"] is False
    assert summarize_xids(case08)["worst_action"] == "reset_gpu"


def test_case08_processes(case08):
    events = case08["events"]
    assert (events[0]["pid"], events[0]["process"]) == (None, None)  # pid='<unknown>'
    assert [(e["pid"], e["process"]) for e in events[1:]] == [
        (1797828, "pt_main_thread"), (626486, "pt_main_thread"), (1158578, "pt_main_thread")]
    assert events[0]["message"].startswith("pid='<unknown>', name=<unknown>, Graphics SM Warp Exception")
    assert events[2]["time"] == "Sat Aug 31 07:06:03 2024"


def test_case08_peermem_and_perf_are_not_xids(case08):
    lines = [e["first_line"] for e in case08["events"]]
    assert not any("peermem" in line or "perf:" in line or "hrtimer" in line for line in lines)


# ------------------------------------------------------------- field case 09 (Xid 63 and 64)

@pytest.fixture(scope="module")
def case09():
    return parse_kernel_log(_case("09-xid63-xid64-row-remapper-training-run"))


def test_case09_events(case09):
    events = case09["events"]
    assert [(e["xid"], e["pci_bus_id"]) for e in events] == [(63, "0000:10:1c.0"), (64, "0000:90:1c.0")]
    assert events[0]["time"] == 680111.646286
    assert events[0]["wall_time"] == "May 19 07:08:57"
    assert events[0]["pid"] == 1850
    assert "reset gpu to activate" in events[0]["message"]
    assert events[1]["time"] == 257087.812628
    assert events[1]["message"] == "..."  # truncated in the source itself


def test_case09_classification(case09):
    xid63, xid64 = case09["events"]
    assert (xid63["action"], xid63["fatal"]) == ("reset_gpu", False)
    assert (xid64["action"], xid64["severity"], xid64["fatal"]) == ("hardware_inspection", "fatal", True)
    summary = summarize_xids(case09)
    assert summary["fatal_xids"] == [64]
    assert summary["worst_action"] == "hardware_inspection"


def test_case09_epoch_from_boot_time():
    result = parse_kernel_log(_case("09-xid63-xid64-row-remapper-training-run"), boot_time=1684000000.0)
    assert result["events"][0]["epoch_s"] == pytest.approx(1684000000.0 + 680111.646286)


# --------------------------------------------------------- field case 23 (API mismatch, no Xid)

def test_case23_api_mismatch_is_not_an_xid():
    text = _case("23-dkms-module-older-than-userspace-api-mismatch", "input-nvidia-all-394-dmesg.log")
    result = parse_kernel_log(text)
    assert result["events"] == []
    assert result["rate_limited"] is False
    [mismatch] = result["api_mismatches"]
    assert mismatch["client"] == "kwin_wayland"
    assert mismatch["pid"] == 1005
    assert mismatch["client_version"] == "595.84"
    assert mismatch["kernel_module_version"] == "595.80"
    assert mismatch["time"] == 9.42467


def test_api_mismatch_without_client_and_without_timestamps():
    text = (
        "NVRM: API mismatch: the client has the version 470.82.01, but\n"
        "NVRM: this kernel module has the version 470.57.02.  Please\n"
        "NVRM: make sure that this kernel module and all NVIDIA driver\n"
        "NVRM: components have the same version.\n"
    )
    [mismatch] = parse_kernel_log(text)["api_mismatches"]
    assert (mismatch["client"], mismatch["pid"]) == (None, None)
    assert (mismatch["client_version"], mismatch["kernel_module_version"]) == ("470.82.01", "470.57.02")
    assert mismatch["time"] is None


# ------------------------------------------------------------------------ synthetic formats

JOURNAL = """\
-- Boot 0f9a3c2b6d7e4e0f8a1b2c3d4e5f6a7b --
Mar 03 10:15:01 gpu-node-17 kernel: NVRM: GPU at PCI:0000:3b:00: GPU-00000000-0000-0000-0000-000000000002
Mar 03 10:15:01 gpu-node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=4242, name=python3, An uncorrectable double bit error (DBE) has been detected on GPU.
Mar 03 10:15:01 gpu-node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 45, pid=4242, name=python3, Ch 00000010
Mar 03 10:15:02 gpu-node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 63, pid=4242, name=python3, Row Remapper: New row marked for remapping, reset gpu to activate.
Mar 03 10:15:40 gpu-node-17 kernel: NVRM: Xid (0000:3B:00.0): 48, pid=4243, name=python3, An uncorrectable double bit error (DBE) has been detected.
Mar 03 10:20:00 gpu-node-17 kernel: NVRM: Xid (PCI:0000:3b:00): 48, pid=4300, name=python3, An uncorrectable double bit error (DBE) has been detected.
"""


def test_journalctl_short_format():
    result = parse_kernel_log(JOURNAL)
    assert [(e["xid"], e["count"]) for e in result["events"]] == [(48, 2), (45, 1), (63, 1), (48, 1)]
    first = result["events"][0]
    assert first["pci_bus_id"] == "0000:3b:00.0"  # also for "0000:3B:00.0" without "PCI:"
    assert first["time"] == "Mar 03 10:15:01"
    assert first["last_time"] == "Mar 03 10:15:40"
    assert (first["pid"], first["process"]) == (4242, "python3")
    assert (first["action"], first["fatal"]) == ("reset_gpu", True)
    assert first["first_line"].startswith("Mar 03 10:15:01 gpu-node-17 kernel: NVRM: Xid")
    summary = summarize_xids(result["events"])
    assert summary["by_xid"] == {"48": 3, "45": 1, "63": 1}
    assert summary["fatal_xids"] == [48]


@pytest.mark.parametrize("stamp", ["jun 09 19:26:17", "juin 09 19:26:17", "Jun  9 19:26:17", "JUN 09 19:26:17"])
def test_journalctl_month_in_the_nodes_locale(stamp):
    # journalctl prints LC_TIME's month name: "jun 09" on an es_ES node (NVIDIA/open-gpu-kernel-modules
    # issue 876, corpus kernel-log/open-module-load-r575-575.57.08-rtx5080-laptop-journal.log).
    text = "%s archlinux kernel: NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.\n" % stamp
    event = parse_kernel_log(text)["events"][0]
    assert (event["pci_bus_id"], event["xid"], event["time"]) == ("0000:02:00.0", 79, stamp)
    assert kernel_log.records(text)[0][1] == "NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."
    assert kernel_log._wall_seconds(stamp) == kernel_log._wall_seconds("Jun 09 19:26:17")


def test_dmesg_ctime_names_in_the_nodes_locale_and_an_unknown_month():
    text = "[lun. juin  9 19:26:17 2025] NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.\n"
    record = kernel_log.records(text)[0]
    assert (record[1], record[3]) == ("NVRM: Xid (PCI:0000:01:00): 79, GPU has fallen off the bus.",
                                      "lun. juin  9 19:26:17 2025")
    assert kernel_log._wall_seconds("lun. juin  9 19:26:17 2025") == kernel_log._wall_seconds("Mon Jun  9 19:26:17 2025")
    # A month name outside the table keeps the line read, only its wall time unread.
    assert kernel_log._wall_seconds("xyz 09 19:26:17") is None
    assert parse_kernel_log("xyz 09 19:26:17 n kernel: NVRM: Xid (PCI:0000:01:00): 79, x\n")["events"][0]["xid"] == 79


def test_journalctl_boot_separator_ends_incidents():
    text = (
        "Mar 03 10:15:01 n kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Exception\n"
        "-- Boot 1a2b3c4d5e6f --\n"
        "Mar 03 10:15:30 n kernel: NVRM: Xid (PCI:0000:3b:00): 13, pid=2, name=a, Graphics Exception\n"
    )
    assert [e["count"] for e in parse_kernel_log(text)["events"]] == [1, 1]


def test_journalctl_short_monotonic_and_iso():
    text = (
        "[ 3605.123456] gpu-node-17 kernel: NVRM: Xid (PCI:0000:18:00): 31, pid=77, name=a.out, Ch 00000008, "
        "intr 00000000. MMU Fault: ENGINE GRAPHICS\n"
        "2025-03-03T10:15:01+0000 gpu-node-17 kernel: NVRM: Xid (PCI:0000:19:00): 13, pid=78, name=b.out, "
        "Graphics Exception\n"
    )
    events = parse_kernel_log(text)["events"]
    assert (events[0]["pci_bus_id"], events[0]["xid"], events[0]["time"]) == ("0000:18:00.0", 31, 3605.123456)
    assert (events[1]["pci_bus_id"], events[1]["time"]) == ("0000:19:00.0", "2025-03-03T10:15:01+0000")


DMESG_T = """\
[Mon Mar  3 10:15:01 2025] NVRM: Xid (PCI:0000:5e:00): 13, pid=9001, name=train.py, Graphics SM Warp Exception on (GPC 0, TPC 1, SM 0): Out Of Range Address
[Mon Mar  3 10:15:01 2025] NVRM: Xid (PCI:0000:5e:00): 13, pid=9001, name=train.py, Graphics Exception: ESR 0x504648=0x102000e
[Mon Mar  3 10:15:01 2025] NVRM: Xid (PCI:0000:5e:00): 43, pid=9001, name=train.py, Ch 00000020
[Mon Mar  3 10:16:05 2025] NVRM: Xid (PCI:0000:5e:00): 13, pid=9107, name=train.py, Graphics Exception: ESR 0x504648=0x102000e
"""


def test_dmesg_ctime_format():
    result = parse_kernel_log(DMESG_T)
    # 10:16:05 is 64 s after 10:15:01: a new incident with the default 60 s window.
    assert DEFAULT_INCIDENT_WINDOW_S == 60.0
    assert [(e["xid"], e["count"]) for e in result["events"]] == [(13, 2), (43, 1), (13, 1)]
    assert result["events"][0]["time"] == "Mon Mar  3 10:15:01 2025"
    assert result["events"][0]["action"] == "check_application"
    assert result["events"][1]["process"] == "train.py"


def test_incident_window_is_a_parameter():
    assert [e["count"] for e in parse_kernel_log(DMESG_T, incident_window_s=120)["events"]] == [3, 1]


def test_dmesg_iso_raw_and_decode_prefixes():
    text = (
        "2025-03-03T10:15:01,123456+00:00 NVRM: Xid (PCI:0000:af:00): 94, pid=5, name=x, Contained: "
        "SM (0x1). RST: No, D-RST: No\n"
        "<4>[  812.100000] NVRM: Xid (PCI:0000:af:00): 95, pid=6, name=y, Uncontained: LTC TAG (0x2,0x0).\n"
        "kern  :warn  : [  812.200000] NVRM: Xid (PCI:0000:af:00): 95, pid=6, name=y, Uncontained: LTC TAG.\n"
    )
    events = parse_kernel_log(text)["events"]
    assert [(e["xid"], e["count"]) for e in events] == [(94, 1), (95, 2)]
    assert events[0]["time"] == "2025-03-03T10:15:01,123456+00:00"
    assert events[1]["time"] == 812.1 and events[1]["last_time"] == 812.2
    assert (events[1]["action"], events[1]["fatal"]) == ("reset_gpu", True)


def test_dmesg_without_timestamps_folds_consecutive_lines_only():
    text = (
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Exception\n"
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Exception\n"
        "NVRM: Xid (PCI:0000:86:00): 13, pid=2, name=b, Graphics Exception\n"
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Exception\n"
        "NVRM: Xid (PCI:0000:3b:00): 31, pid=1, name=a, MMU Fault\n"
        "NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=a, Graphics Exception\n"
    )
    events = parse_kernel_log(text)["events"]
    # Another device in between does not end an incident; another Xid on the same device does.
    assert [(e["pci_bus_id"], e["xid"], e["count"]) for e in events] == [
        ("0000:3b:00.0", 13, 3), ("0000:86:00.0", 13, 1), ("0000:3b:00.0", 31, 1), ("0000:3b:00.0", 13, 1)]
    assert events[0]["time"] is None


# ----------------------------------------------------------------------- fallen off the bus

def test_fallen_off_the_bus_numbered_and_unnumbered_is_one_xid_79():
    text = (
        "[ 5000.000001] NVRM: Xid (PCI:0000:01:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n"
        "[ 5000.000002] NVRM: GPU 0000:01:00.0: GPU has fallen off the bus.\n"
        "[ 5000.100000] NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 "
        "(Node Reboot Required)\n"
    )
    result = parse_kernel_log(text)
    assert [(e["xid"], e["count"]) for e in result["events"]] == [(79, 1), (154, 1)]
    xid79, xid154 = result["events"]
    assert xid79["pci_bus_id"] == "0000:01:00.0"
    assert (xid79["severity"], xid79["action"], xid79["fatal"]) == ("fatal", "reboot", True)
    assert xid79["last_time"] == 5000.000002
    assert (xid154["action"], xid154["fatal"]) == ("reboot", True)


def test_fallen_off_the_bus_without_number_counts_as_xid_79():
    text = "[  123.456789] NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.\n"
    [event] = parse_kernel_log(text)["events"]
    assert (event["xid"], event["pci_bus_id"], event["count"]) == (79, "0000:3b:00.0", 1)
    assert event["pid"] is None and event["time"] == 123.456789
    assert event["message"] == "GPU at PCI:0000:3b:00: GPU has fallen off the bus."


def test_fallen_off_the_bus_multi_line_message():
    text = (
        "[  981.300000] NVRM: The NVIDIA GPU 0000:9a:00.0 (PCI ID: 10de:2330) installed in this\n"
        "               NVRM: system has fallen off the bus and is not responding to commands.\n"
        "[  981.400000] NVRM: The NVIDIA GPU 0000:9a:00.0 (PCI ID: 10de:2330) installed in this\n"
        "               NVRM: system has fallen off the bus and is not responding to commands.\n"
        "[  981.500000] nvidia: probe of 0000:9a:00.0 failed with error -1\n"
    )
    [event] = parse_kernel_log(text)["events"]
    assert (event["xid"], event["pci_bus_id"], event["count"]) == (79, "0000:9a:00.0", 2)
    assert "fallen off the bus" in event["message"]
    assert event["first_line"].endswith("installed in this")


def test_fallen_off_the_bus_split_without_timestamps():
    text = "NVRM: The NVIDIA GPU 0000:02:00.0\nhas fallen off the bus and is not responding to commands.\n"
    [event] = parse_kernel_log(text)["events"]
    assert (event["xid"], event["pci_bus_id"]) == (79, "0000:02:00.0")


def test_fallen_off_the_bus_from_other_drivers_is_not_an_xid():
    text = "[  5.0] amdgpu 0000:03:00.0: amdgpu: GPU has fallen off the bus\n"
    assert parse_kernel_log(text)["events"] == []


# ---------------------------------------------------------------------- Xid continuation lines

def test_multi_line_xid_message_is_joined():
    text = (
        "[ 2001.000000] NVRM: Xid (PCI:0000:3b:00): 74, pid=99, name=nccl, NVLink: fatal error detected\n"
        "               NVRM: on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)\n"
        "[ 2001.000100] NVRM: GPU4 GSP RPC buffer contains function 103\n"
    )
    [event] = parse_kernel_log(text)["events"]
    assert event["xid"] == 74
    assert event["message"] == (
        "pid=99, name=nccl, NVLink: fatal error detected on link 4(0x0, 0x0, 0x10000, 0x0, 0x0, 0x0, 0x0)")
    assert (event["action"], event["fatal"]) == ("reset_gpu", True)


# ----------------------------------------------------------------- unknown Xid and worst class

def test_unknown_xid_is_an_event_with_a_default_class():
    [event] = parse_kernel_log("[ 10.0] NVRM: Xid (PCI:0000:3b:00): 999, pid=1, name=x, Something new\n")["events"]
    assert (event["xid"], event["known"], event["name"]) == (999, False, "Unknown Xid 999")
    assert (event["severity"], event["action"], event["fatal"]) == ("warning", "check_application", False)


def test_folded_incident_keeps_the_worst_classification():
    text = (
        "[ 10.0] NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 00 (0x00000004 0x00000001)\n"
        "[ 11.0] NVRM: Xid (PCI:0000:04:00): 145, RLW_REMAP Fatal XC0 i0 Link 00 (0x00000004 0x00000040)\n"
    )
    [event] = parse_kernel_log(text)["events"]
    assert event["count"] == 2
    assert (event["severity"], event["action"], event["fatal"]) == ("critical", "reset_gpu", True)
    assert "Nonfatal" in event["message"]


def test_sxid_and_other_nvidia_lines_are_not_xids():
    text = (
        "[ 1.0] nvidia-nvswitch0: SXid (PCI:0000:05:00.0): 12028, Non-fatal, Link 44 egress non-posted PRIV error\n"
        "[ 1.1] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.95.05\n"
        "[ 1.2] nvidia-peermem nv_get_p2p_free_callback:127 ERROR detected invalid context\n"
        "[ 1.3] NVRM: GPU at PCI:0000:9b:00: GPU-00000000-0000-0000-0000-000000000001\n"
    )
    result = parse_kernel_log(text)
    assert result["events"] == [] and result["rate_limited"] is False


# --------------------------------------------------------------------------- rate limiting

@pytest.mark.parametrize(
    "line, limited",
    [
        ("[ 50.0] nv_printf: 12 callbacks suppressed", True),
        ("[ 50.0] NVRM: os_dump_stack: 3 callbacks suppressed", True),
        ("[ 50.0] __ratelimit: 7 callbacks suppressed", True),
        ("[ 50.0] printk: 42 messages suppressed.", True),
        ("[ 50.0] NVRM: Rate limiting GSP RPC error prints for GPU at PCI:0000:9b:00 (printing 1 of every 30).", True),
        ("[ 50.0] net_ratelimit: 23807 callbacks suppressed", False),
        ("[ 50.0] quiet_error: 48 callbacks suppressed", False),
    ],
)
def test_rate_limit_lines(line, limited):
    result = parse_kernel_log(line + "\n")
    assert result["rate_limited"] is limited
    assert result["rate_limit_lines"] == ([line] if limited else [])


def test_summary_of_nothing_and_override():
    summary = summarize_xids([])
    assert summary == {"total": 0, "incidents": 0, "by_xid": {}, "by_device": {}, "worst_severity": None,
                       "worst_action": None, "any_fatal": False, "fatal_xids": [], "rate_limited": False,
                       "elided_incidents": 0, "dropped_lines": 0, "per_device_xid": []}
    assert summarize_xids([], rate_limited=True)["rate_limited"] is True


def test_summary_of_unknown_device():
    text = "[ 9.0] NVRM: GPU has fallen off the bus.\n"
    result = parse_kernel_log(text)
    assert result["events"][0]["pci_bus_id"] is None
    assert summarize_xids(result)["by_device"] == {"unknown": 1}


def test_result_is_json_serialisable():
    result = parse_kernel_log(_case("06-xid119-gsp-rpc-timeout"))
    assert json.loads(json.dumps(result))["events"][0]["pci_bus_id"] == "0000:9b:00.0"


def test_empty_and_none_text():
    assert parse_kernel_log("")["events"] == []
    assert parse_kernel_log(None)["events"] == []


# ------------------------------------------------- bounds, linear time, newest part of a log

def _storm(lines, start=0, devices=("3b", "5e"), xids=(79, 13), gap_s=70.0):
    """Xid lines 70 s apart (each its own incident), cycling over devices, then Xids."""
    out = []
    for i in range(start, start + lines):
        bus = devices[i % len(devices)]
        xid = xids[(i // len(devices)) % len(xids)]
        out.append("[%12.6f] NVRM: Xid (PCI:0000:%s:00): %d, pid=%d, name=python, line %d"
                   % (100.0 + gap_s * i, bus, xid, 1000 + i, i))
    return "\n".join(out) + "\n"


def _storm_key(i, devices=("3b", "5e"), xids=(79, 13)):
    return "0000:%s:00.0" % devices[i % len(devices)], xids[(i // len(devices)) % len(xids)]


def test_xid_storm_is_bounded_and_counts_stay_exact():
    lines = 20000
    result = parse_kernel_log(_storm(lines))
    events = result["events"]
    # 4 (device, Xid) pairs of 5,000 incidents: the first, the newest 7 and one elided entry each.
    assert XID_EVENTS_PER_KEY == 8
    assert len(events) == 4 * (XID_EVENTS_PER_KEY + 1)
    assert len(json.dumps(events)) < 64 * 1024
    per_key = {}
    for event in events:
        assert set(event) == EVENT_KEYS
        key = (event["pci_bus_id"], event["xid"])
        per_key.setdefault(key, []).append(event)
    assert sorted(per_key) == [("0000:3b:00.0", 13), ("0000:3b:00.0", 79), ("0000:5e:00.0", 13), ("0000:5e:00.0", 79)]
    for key, kept in per_key.items():
        indexes = [i for i in range(lines) if _storm_key(i) == key]
        assert sum(e["count"] for e in kept) == len(indexes) == 5000
        assert sum(e["incidents"] for e in kept) == 5000
        first, elided, newest = kept[0], kept[1], kept[2:]
        # The first incident, with every field of an event.
        assert (first["elided"], first["count"], first["incidents"]) == (False, 1, 1)
        assert first["time"] == 100.0 + 70.0 * indexes[0]
        assert first["pid"] == 1000 + indexes[0] and first["process"] == "python"
        assert first["message"] == "pid=%d, name=python, line %d" % (1000 + indexes[0], indexes[0])
        # The newest 7, one by one, in log order.
        assert [e["time"] for e in newest] == [100.0 + 70.0 * i for i in indexes[-7:]]
        assert all(not e["elided"] and e["count"] == 1 for e in newest)
        # The 4,992 in between: one entry with their counts and the first and last time.
        assert elided["elided"] is True
        assert (elided["count"], elided["incidents"]) == (4992, 4992)
        assert elided["time"] == 100.0 + 70.0 * indexes[1]
        assert elided["last_time"] == 100.0 + 70.0 * indexes[-8]
        assert elided["message"] == "pid=%d, name=python, line %d" % (1000 + indexes[1], indexes[1])
        assert elided["fatal"] is (key[1] == 79)
    summary = summarize_xids(result)
    assert summary["total"] == lines and summary["incidents"] == lines
    assert summary["by_xid"] == {"79": 10000, "13": 10000}
    assert summary["by_device"] == {"0000:3b:00.0": 10000, "0000:5e:00.0": 10000}
    assert summary["elided_incidents"] == 4 * 4992
    assert summary["dropped_lines"] == 0
    assert summary["fatal_xids"] == [79]
    [pair] = [p for p in summary["per_device_xid"] if (p["pci_bus_id"], p["xid"]) == ("0000:5e:00.0", 79)]
    indexes = [i for i in range(lines) if _storm_key(i) == ("0000:5e:00.0", 79)]
    assert pair == {
        "pci_bus_id": "0000:5e:00.0", "xid": 79, "count": 5000, "incidents": 5000, "fatal": True,
        "first_time": 100.0 + 70.0 * indexes[0],
        "first_message": "pid=%d, name=python, line %d" % (1000 + indexes[0], indexes[0]),
        "last_time": 100.0 + 70.0 * indexes[-1],
        "last_message": "pid=%d, name=python, line %d" % (1000 + indexes[-1], indexes[-1]),
    }


def test_folded_storm_lines_keep_their_count_when_elided():
    # 30 incidents of 100 lines each (1 s apart inside, 120 s between incidents).
    lines = []
    for incident in range(30):
        for line in range(100):
            lines.append("[%12.6f] NVRM: Xid (PCI:0000:3b:00): 119, pid=7, name=gpud, Timeout after 6s"
                         % (1000.0 + incident * 220.0 + line))
    result = parse_kernel_log("\n".join(lines) + "\n")
    events = result["events"]
    assert len(events) == XID_EVENTS_PER_KEY + 1
    assert sum(e["count"] for e in events) == 3000
    assert [e["count"] for e in events] == [100, 2200] + [100] * 7
    assert events[1]["incidents"] == 22 and events[1]["elided"] is True
    assert summarize_xids(result)["incidents"] == 30


def test_fatal_and_nonfatal_incidents_of_one_xid_are_elided_apart():
    # Xid 145 is fatal or not by the driver's word: the counts of each stay exact after eliding.
    lines = ["[%12.6f] NVRM: Xid (PCI:0000:3b:00): 145, pid=1, name=x, %s link error"
             % (100.0 + 100.0 * i, "Fatal" if i % 3 == 0 else "Nonfatal") for i in range(300)]
    result = parse_kernel_log("\n".join(lines) + "\n")
    events = result["events"]
    assert len(events) <= XID_EVENTS_PER_KEY + 2
    assert sum(e["count"] for e in events if e["fatal"]) == 100
    assert sum(e["count"] for e in events if not e["fatal"]) == 200
    assert sorted(e["fatal"] for e in events if e["elided"]) == [False, True]


def test_more_device_xid_pairs_than_kept_fold_per_xid():
    # 300 devices, each with one fatal Xid 79: the first 128 are kept, the others fold into one entry.
    lines = ["[%12.6f] NVRM: Xid (PCI:0000:%02x:%02x): 79, pid=1, name=x, GPU has fallen off the bus."
             % (10.0 + i, i // 32, i % 32) for i in range(300)]
    # Then 200 unknown Xid numbers on those devices: more (Xid, fatal) pairs than kept; only counted.
    lines += ["[%12.6f] NVRM: Xid (PCI:0000:09:%02x): %d, pid=1, name=x, ?" % (1000.0 + i, i % 32, 2000 + i)
              for i in range(200)]
    result = parse_kernel_log("\n".join(lines) + "\n")
    events = result["events"]
    assert len(events) <= MAX_XID_KEYS * (XID_EVENTS_PER_KEY + 2) + MAX_XID_KEYS
    kept = [e for e in events if not e["elided"]]
    assert len(kept) == MAX_XID_KEYS
    [folded] = [e for e in events if e["elided"] and e["xid"] == 79]
    assert folded["pci_bus_id"] is None
    assert (folded["count"], folded["incidents"]) == (300 - MAX_XID_KEYS, 300 - MAX_XID_KEYS)
    assert sum(e["count"] for e in events if e["xid"] == 79) == 300
    unknown = [e for e in events if e["xid"] >= 2000]
    assert len(unknown) == MAX_XID_KEYS - 1
    assert result["dropped_lines"] == 200 - (MAX_XID_KEYS - 1)
    summary = summarize_xids(result)
    assert summary["dropped_lines"] == 200 - (MAX_XID_KEYS - 1)
    assert summary["total"] + summary["dropped_lines"] == 500


def test_long_messages_are_cut():
    text = "[ 5.0] NVRM: Xid (PCI:0000:3b:00): 13, pid=1, name=x, " + "A" * 5000 + "\n"
    [event] = parse_kernel_log(text)["events"]
    assert len(event["message"]) == MAX_MESSAGE_CHARS and event["message"].endswith("...")
    assert len(event["first_line"]) == MAX_MESSAGE_CHARS
    assert event["message"].startswith("pid=1, name=x, AAAA")


def test_classification_depends_on_the_message_only_where_the_parser_remembers_it():
    # kernel_log remembers one class per Xid number except for 154 and 144-150 (classify's contract).
    messages = ("Fatal", "Nonfatal", "recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)",
                "pid=1, name=x, Ch 00000010")
    for xid in XID_CATALOG:
        if xid == 154 or 144 <= xid <= 150:
            continue
        assert all(classify(xid, message) == classify(xid, None) for message in messages), xid


class _CountingList(list):
    """A list that counts the elements its slices copy."""

    def __init__(self, items):
        super(_CountingList, self).__init__(items)
        self.copied = 0

    def __getitem__(self, item):
        result = list.__getitem__(self, item)
        if isinstance(item, slice):
            self.copied += len(result)
        return result


def test_each_record_is_looked_at_a_bounded_number_of_times(monkeypatch):
    # The old parser copied the rest of the log for every line (records[index + 1:]): quadratic.
    made = []
    original = kernel_log._records

    def counting(text):
        records = _CountingList(original(text))
        made.append(records)
        return records

    monkeypatch.setattr(kernel_log, "_records", counting)
    lines = 5000
    text = "".join("[%12.6f] usb 1-%d: new high-speed USB device number %d\n" % (i * 0.01, i % 9, i)
                   for i in range(lines))
    parse_kernel_log(text)
    assert made[0].copied <= 4 * lines


def test_a_long_multi_line_message_is_joined_in_linear_time(monkeypatch):
    # One stamped line and N continuation lines: the old parser rebuilt the message text for every
    # continuation line, N texts of growing length (quadratic); counted here as characters stored.
    stored = []

    class CountingRecord(kernel_log._Record):
        def __setattr__(self, name, value):
            if name == "text":
                stored.append(len(value))
            super(CountingRecord, self).__setattr__(name, value)

    monkeypatch.setattr(kernel_log, "_Record", CountingRecord)
    lines = 5000
    text = "[    1.000000] NVRM: loading\n" + "".join("  continuation %d of one message\n" % i for i in range(lines))
    [record] = kernel_log._records(text)
    assert record.text.startswith("NVRM: loading continuation 0 of one message continuation 1 ")
    assert record.text.endswith("continuation %d of one message" % (lines - 1))
    assert sum(stored) <= 2 * len(text)


def test_keep_newest_keeps_whole_newest_lines():
    text = "old 1\nold 2\nnew 3\nnew 4\n"
    assert keep_newest(text, 100) == (text, 0)
    assert keep_newest(text, 12) == ("new 3\nnew 4\n", 12)
    assert keep_newest(text, 14) == ("new 3\nnew 4\n", 12)  # "2\nnew 3..." starts inside a line
    assert keep_newest(text.encode(), 12) == (b"new 3\nnew 4\n", 12)
    assert keep_newest("no newline at all", 5) == ("", 17)
    assert keep_newest(None, 5) == (None, 0)
    with pytest.raises(ValueError):
        keep_newest(text, 0)


def test_api_mismatch_does_not_read_on_into_a_later_message():
    text = (
        "[    7.039052] NVRM: API mismatch: the client has the version 352.79, but\n"
        "[    9.000001] NVRM: this kernel module has the version 361.42.  Please\n"
    )
    assert parse_kernel_log(text)["api_mismatches"] == []
