# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Consumers of ``xid_events`` count right when a storm's events are bounded (elided entries).

The rollout gates (``rollout_verdict``) count fatal Xids from ``xid_events`` and compare counts
before and after a soak; the kernel log parser keeps a bounded number of events per (device, Xid)
and folds the rest into elided entries whose ``count`` carries their lines.
"""

from __future__ import annotations

import json

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import new_facts, new_gpu
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_verdict import (
    fatal_xid_counts,
    healthy,
    new_fatal_xids,
    soak_verdict,
)

VERSION = "620.70.06"
DEVICES = ("18", "28")
XIDS = (79, 13)


def storm(lines):
    """``lines`` Xid lines 70 s apart (each its own incident), over 2 GPUs and Xids 79 (fatal), 13."""
    out = []
    for i in range(lines):
        out.append("[%12.6f] NVRM: Xid (PCI:0000:%s:00): %d, pid=%d, name=python, line %d" % (
            100.0 + 70.0 * i, DEVICES[i % 2], XIDS[(i // 2) % 2], 1000 + i, i))
    return "\n".join(out) + "\n"


def fatal_lines(lines):
    return sum(1 for i in range(lines) if XIDS[(i // 2) % 2] == 79)


def facts(kernel_log_text):
    doc = new_facts("nvml")
    doc["driver"].update(userspace_version=VERSION, loaded_version=VERSION, on_disk_version=VERSION,
                         branch="620", state="ok")
    for index in range(2):
        gpu = new_gpu(index)
        gpu["pci_bus_id"] = "0000:%s:00.0" % DEVICES[index]
        doc["gpus"].append(gpu)
    doc["gpu_count"] = 2
    parsed = kernel_log.parse_kernel_log(kernel_log_text)
    doc["xid_events"] = parsed["events"]
    doc["xid_summary"] = kernel_log.summarize_xids(parsed)
    # What a fact cache gives back.
    return json.loads(json.dumps(doc))


def test_fatal_xid_counts_of_a_bounded_storm_are_exact():
    doc = facts(storm(20000))
    assert len(doc["xid_events"]) <= 4 * (kernel_log.XID_EVENTS_PER_KEY + 1)
    assert fatal_xid_counts(doc) == {"79": fatal_lines(20000)} == {"79": 10000}
    # The summary-only path (events dropped by an old cache) gives the same number.
    assert fatal_xid_counts(dict(doc, xid_events=[])) == {"79": 10000}
    assert fatal_xid_counts(doc, ignore_xids=[79]) == {}
    assert healthy(doc)["flags"] == ["fatal_xid"]


def test_new_fatal_xids_of_a_growing_storm_are_exact():
    before, after = facts(storm(10000)), facts(storm(10061))
    assert new_fatal_xids(before, after, rebooted=False) == {"79": fatal_lines(10061) - fatal_lines(10000)}
    assert new_fatal_xids(before, after, rebooted=False) == {"79": 31}
    assert new_fatal_xids(before, after, rebooted=True) == {"79": fatal_lines(10061)}
    assert new_fatal_xids(after, after, rebooted=False) == {}


def test_soak_verdict_counts_new_xids_of_a_bounded_storm():
    before, after = facts(storm(10000)), facts(storm(10061))
    verdict = soak_verdict(after, before, {"max_new_xids": 60})
    assert verdict["new_xids"] == 61
    assert verdict["new_fatal_xids"] == {"79": 31}
    assert "xid_rate" in verdict["flags"] and "new_fatal_xid" in verdict["flags"]
