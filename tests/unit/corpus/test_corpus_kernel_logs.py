# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Properties of the kernel-log readers over every kernel log of the conformance corpus.

Nothing an NVIDIA module printed is dropped without a word: every such line is taken by a reader,
known as informational, read as an error's context, or listed as unrecognised; every numbered Xid
line becomes an event of its GPU and Xid; every SXid line an SXid event; and the readers never
raise, whatever the capture's format (dmesg, dmesg -x, ISO, ctime, /dev/kmsg, journalctl, syslog,
Talos)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.module_utils import kernel_log, kernel_log_coverage, nvswitch_log
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
MANIFEST = CORPUS / "MANIFEST.yml"
XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9a-fA-F:.]+)\): (?P<xid>\d+)")
SXID = re.compile(r"SXid \((?:PCI:)?(?P<bus>[0-9a-fA-F:.]+)\): (?P<sxid>\d+)")


def _kernel_logs():
    entries = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    logs = [e["path"] for e in entries if e["format"] == "kernel-log"]
    assert len(logs) >= 15, "the corpus should hold the kernel logs it lists"
    return logs


LOGS = _kernel_logs()


@pytest.mark.parametrize("path", LOGS)
def test_every_nvidia_line_is_accounted_for(path):
    text = (CORPUS / path).read_text(encoding="utf-8", errors="replace")
    found = kernel_log_coverage.unrecognised_lines(text)
    assert found["nvidia_lines"] > 0, "%s: no NVIDIA line found: a line format the reader does not know" % path
    assert found["nvidia_lines"] == (found["read_lines"] + found["informational_lines"] + found["context_lines"]
                                     + found["count"])
    assert len(found["lines"]) == min(found["count"], kernel_log_coverage.MAX_LINES)


@pytest.mark.parametrize("path", LOGS)
def test_every_numbered_xid_and_sxid_line_becomes_an_event(path):
    text = (CORPUS / path).read_text(encoding="utf-8", errors="replace")
    raw = set((normalize_pci_bus_id(m.group("bus")), int(m.group("xid"))) for m in XID.finditer(text))
    events = kernel_log.parse_kernel_log(text)["events"]
    assert set((e["pci_bus_id"], e["xid"]) for e in events) >= raw
    numbered = len(XID.findall(text))
    assert kernel_log.summarize_xids(events)["total"] >= numbered
    raw_sxids = set((normalize_pci_bus_id(m.group("bus")), int(m.group("sxid"))) for m in SXID.finditer(text))
    assert set((e["pci_bus_id"], e["sxid"]) for e in nvswitch_log.parse_sxids(text)) == raw_sxids


@pytest.mark.parametrize("path", LOGS)
def test_a_bundle_of_the_log_gives_facts_with_a_verdict(path):
    facts = assemble_facts({"dmesg.txt": (CORPUS / path).read_bytes()}, capture=True)
    health = facts["health"]
    assert health["state"] in ("healthy", "degraded", "unknown", "unhealthy")
    assert health["healthy"] is (health["state"] == "healthy")
    # An error line no rule reads never leaves the node healthy.
    if facts["kernel_log_unrecognised"]["error_count"]:
        assert health["state"] in ("unknown", "unhealthy")


def test_the_corpus_right_values_of_its_field_cases():
    # Field case 37 and 38's logs, as the corpus keeps them.
    by_name = dict((Path(p).name, p) for p in LOGS)
    sxid = assemble_facts({"dmesg.txt": (CORPUS / by_name["xid79-fallen-off-bus-sxid20034-nvswitch.log"]).read_bytes()},
                          capture=True)
    assert sum(e["fatal_records"] for e in sxid["sxid_events"]) == 4
    assert [p["kind"] for p in sxid["health"]["problems"]] == ["nvswitch_fatal"]
    gsp = assemble_facts({"dmesg.txt": (CORPUS / by_name["gsp-wpr2-already-up-rminitadapter-server.log"]).read_bytes()},
                         capture=True)
    assert [(m["kind"], m["pci_bus_id"]) for m in gsp["driver_messages"]] == [("gpu_init_failed", "0000:a1:00.0")]
    follow = kernel_log.parse_kernel_log((CORPUS / by_name["xid45-after-xid145-xid149-journal.log"]).read_text())
    assert set(e["caused_by_xid"] for e in follow["events"]) == {145, 149}
