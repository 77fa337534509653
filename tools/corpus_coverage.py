"""Print the field-coverage table of the conformance corpus: which facts each format gives, and on which branches.

Usage (from the repository root, with the project's virtualenv Python)::

    python tools/corpus_coverage.py

It reads tests/fixtures/corpus/MANIFEST.yml, turns every -q text, -q -x and kernel-log capture into facts
(``facts_assemble.assemble_facts`` on a one-file bundle) and prints, per fact, the formats and the
driver branches of the captures where it was not null. docs/facts.md holds its output; a unit test
keeps the two equal.
"""

from __future__ import annotations

import os
import sys

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "tests", "fixtures", "corpus")
_FILES = {"smi-text": "nvidia-smi-q.txt", "smi-xml": "nvidia-smi-q.xml", "kernel-log": "dmesg.txt"}

#: fact → how to read it from a facts document (true when present and not null).
FIELDS = (
    ("driver.userspace_version", lambda f: f["driver"]["userspace_version"]),
    ("driver.cuda_driver_version", lambda f: f["driver"]["cuda_driver_version"]),
    ("gpus[].uuid", lambda f: any(g.get("uuid") for g in f["gpus"])),
    ("gpus[].serial", lambda f: any(g.get("serial") for g in f["gpus"])),
    ("gpus[].pci_bus_id", lambda f: any(g.get("pci_bus_id") for g in f["gpus"])),
    ("gpus[].vbios_version", lambda f: any(g.get("vbios_version") for g in f["gpus"])),
    ("gpus[].persistence_mode", lambda f: any(g.get("persistence_mode") is not None for g in f["gpus"])),
    ("gpus[].power.limit_w", lambda f: any(g["power"].get("limit_w") is not None for g in f["gpus"])),
    ("gpus[].power.default_limit_w", lambda f: any(g["power"].get("default_limit_w") is not None for g in f["gpus"])),
    ("gpus[].power.max_limit_w", lambda f: any(g["power"].get("max_limit_w") is not None for g in f["gpus"])),
    ("gpus[].ecc.mode_current", lambda f: any((g.get("ecc") or {}).get("mode_current") is not None for g in f["gpus"])),
    ("gpus[].remapped_rows", lambda f: any(v is not None for g in f["gpus"] for v in (g.get("remapped_rows") or {}).values())),
    ("gpus[].mig.mode_current", lambda f: any((g.get("mig") or {}).get("mode_current") is not None for g in f["gpus"])),
    ("gpus[].mig.devices", lambda f: any((g.get("mig") or {}).get("devices") for g in f["gpus"])),
    ("gpus[].clocks.sm_mhz", lambda f: any((g.get("clocks") or {}).get("sm_mhz") is not None for g in f["gpus"])),
    ("gpus[].clocks_event_reasons", lambda f: any(g.get("clocks_event_reasons") is not None for g in f["gpus"])),
    ("gpus[].temperature_c", lambda f: any(g.get("temperature_c") is not None for g in f["gpus"])),
    ("gpus[].pcie.gen_current", lambda f: any((g.get("pcie") or {}).get("gen_current") is not None for g in f["gpus"])),
    ("gpus[].fabric.state", lambda f: any((g.get("fabric") or {}).get("state") for g in f["gpus"])),
    ("xid_events", lambda f: f["xid_events"]),
    ("sxid_events", lambda f: f.get("sxid_events")),
    ("driver_messages", lambda f: f.get("driver_messages")),
    ("kernel_log_gpus", lambda f: f.get("kernel_log_gpus")),
    ("kernel_log_unrecognised (any line)", lambda f: (f.get("kernel_log_unrecognised") or {}).get("count")),
    ("unparsed (any key)", lambda f: (f.get("unparsed") or {}).get("count")),
)


def coverage(corpus=CORPUS):
    """``{fact: {format: set of branches ("?" for a capture whose version is unknown)}}`` over the corpus."""
    from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import CaptureError, assemble_facts

    with open(os.path.join(corpus, "MANIFEST.yml"), encoding="utf-8") as handle:
        entries = yaml.safe_load(handle)
    seen = dict((name, {}) for name, _get in FIELDS)
    for entry in entries:
        target = _FILES.get(entry["format"])
        if target is None:
            continue
        with open(os.path.join(corpus, entry["path"]), "rb") as handle:
            raw = handle.read()
        try:
            facts = assemble_facts({target: raw}, capture=True)
        except CaptureError:
            continue
        for name, get in FIELDS:
            if get(facts):
                seen[name].setdefault(entry["format"], set()).add(entry.get("branch") or "?")
    return seen


def markdown_table(corpus=CORPUS):
    """The table as docs/facts.md shows it."""
    seen = coverage(corpus)
    rows = ["| fact | -q text | -q -x XML | kernel log |", "|---|---|---|---|"]

    def cell(branches):
        if not branches:
            return "—"
        known = sorted(b for b in branches if b != "?")
        return ", ".join(known + (["unknown version"] if "?" in branches else []))

    for name, _get in FIELDS:
        formats = seen[name]
        cells = [cell(formats.get(fmt)) for fmt in ("smi-text", "smi-xml", "kernel-log")]
        rows.append("| `%s` | %s | %s | %s |" % tuple([name] + cells))
    return "\n".join(rows)


if __name__ == "__main__":
    sys.path.insert(0, os.path.join(REPO, ".build", "collections"))
    print(markdown_table())
