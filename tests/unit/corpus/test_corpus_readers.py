# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Properties of the nvidia-smi readers over every -q text and -q -x capture of the conformance corpus.

A reader either gives facts or refuses the file with a clear SmiParseError (a published section
without the report around it); every key with a value is read into a field or listed in
``unparsed`` with its key; no field is null where the capture has a number for it; no version keeps
a bracketed annotation; nvidia-smi's own answers (smi-error captures) are facts or evidence."""

from __future__ import annotations

import re
from pathlib import Path
from xml.etree import ElementTree

import pytest
import yaml

from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi_messages
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import assemble_facts
from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import null_if_na
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_text import BANNER, parse_nvidia_smi_text
from ansible_collections.gpufleet.nvidia.plugins.module_utils.smi_xml import (
    IGNORED_KEYS, SmiParseError, parse_nvidia_smi_xml)

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
ENTRIES = yaml.safe_load((CORPUS / "MANIFEST.yml").read_text(encoding="utf-8"))
REPORTS = [e["path"] for e in ENTRIES if e["format"] in ("smi-text", "smi-xml")]
ERRORS = [e["path"] for e in ENTRIES if e["format"] == "smi-error"]
PARTIAL = set(e["path"] for e in ENTRIES if e.get("partial"))
#: -q text captures that hold a whole report (the banner); the others are sections published alone.
TEXT_REPORTS = [p for p in REPORTS if p.endswith(".txt") and BANNER in (CORPUS / p).read_text(encoding="utf-8")]

#: "-q" text key → the fact that holds it, for the numbers a decision reads.
NUMBERS = {
    "Default Power Limit": lambda g: g["power"]["default_limit_w"],
    "Min Power Limit": lambda g: g["power"]["min_limit_w"],
    "Max Power Limit": lambda g: g["power"]["max_limit_w"],
    "Current Power Limit": lambda g: g["power"]["limit_w"],
    "GPU Current Temp": lambda g: g["temperature_c"],
}
_XML_NUMBERS = {"default_power_limit": NUMBERS["Default Power Limit"], "max_power_limit": NUMBERS["Max Power Limit"],
                "current_power_limit": NUMBERS["Current Power Limit"], "gpu_temp": NUMBERS["GPU Current Temp"]}


def test_the_corpus_holds_reports_of_both_formats():
    assert len([p for p in REPORTS if p.endswith(".xml")]) >= 20 and len([p for p in REPORTS if p.endswith(".txt")]) >= 20


def _parse(path):
    text = (CORPUS / path).read_text(encoding="utf-8")
    return text, (parse_nvidia_smi_xml if path.endswith(".xml") else parse_nvidia_smi_text)(text)


@pytest.mark.parametrize("path", REPORTS)
def test_a_report_gives_facts_or_a_clear_refusal(path):
    text = (CORPUS / path).read_text(encoding="utf-8")
    if path.endswith(".txt") and BANNER not in text:
        # A section published without its report (partial): refused, naming what it expected.
        with pytest.raises(SmiParseError, match="NVSMI LOG"):
            parse_nvidia_smi_text(text)
        return
    _text, parsed = _parse(path)
    assert parsed["gpus"] or path in PARTIAL
    version = parsed["driver"]["userspace_version"]
    assert version is None or ("[" not in version and re.match(r"^\d{3}\.\d", version)), version
    cuda = parsed["driver"]["cuda_driver_version"]
    assert cuda is None or "[" not in cuda


def _gpu_sections(text):
    """The -q text of each GPU (from its 'GPU 0000...' line to the next one)."""
    parts = re.split(r"(?m)^GPU [0-9A-Fa-f]{8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.\d\s*$", text)
    return parts[1:]


@pytest.mark.parametrize("path", TEXT_REPORTS)
def test_no_field_is_null_where_the_text_has_a_number(path):
    text = (CORPUS / path).read_text(encoding="utf-8")
    parsed = parse_nvidia_smi_text(text)
    for gpu, section in zip(parsed["gpus"], _gpu_sections(text)):
        for key, field in NUMBERS.items():
            numbers = re.findall(r"(?m)^\s+%s\s*:\s*(\d+(?:\.\d+)?)\b" % re.escape(key), section)
            if numbers:
                assert field(gpu) is not None, "%s: %s has %s in the text, the fact is null" % (path, key, numbers)


@pytest.mark.parametrize("path", [p for p in REPORTS if p.endswith(".xml")])
def test_no_xml_field_is_null_where_the_element_has_a_number(path):
    text, parsed = _parse(path)
    root = ElementTree.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", text))
    for gpu, element in zip(parsed["gpus"], root.findall("gpu")):
        for tag, field in _XML_NUMBERS.items():
            numbers = [n.text for n in element.iter(tag) if n.text and re.match(r"^\s*\d", n.text)]
            if numbers:
                assert field(gpu) is not None, "%s: <%s> holds %s, the fact is null" % (path, tag, numbers)


@pytest.mark.parametrize("path", [p for p in REPORTS if p.endswith(".xml")])
def test_every_xml_value_is_read_or_listed_unparsed(path):
    text, parsed = _parse(path)
    root = ElementTree.fromstring(re.sub(r"<!DOCTYPE[^>]*>", "", text))
    unparsed = parsed["unparsed"]
    assert unparsed["count"] == len(unparsed["keys"]) or len(unparsed["keys"]) == 256
    listed = set((k["gpu"], k["key"]) for k in unparsed["keys"])
    for entry in unparsed["keys"]:
        assert entry["format"] == "smi-xml" and null_if_na(entry["value"]) is not None
        assert entry["key"].split("/", 1)[0] not in IGNORED_KEYS
    # An element of a layout no rule knows is listed, not dropped: add one and it shows up.
    gpu = root.find("gpu")
    if gpu is None:
        return
    ElementTree.SubElement(gpu, "new_r700_thing").text = "42 W"
    again = parse_nvidia_smi_xml(ElementTree.tostring(root, encoding="unicode"))
    assert any(k["key"] == "new_r700_thing" and k["value"] == "42 W" for k in again["unparsed"]["keys"])
    assert again["unparsed"]["count"] == unparsed["count"] + 1
    assert listed <= set((k["gpu"], k["key"]) for k in again["unparsed"]["keys"]) or len(listed) >= 255


@pytest.mark.parametrize("path", TEXT_REPORTS)
def test_every_text_key_is_read_or_listed_unparsed(path):
    text = (CORPUS / path).read_text(encoding="utf-8")
    lines = text.splitlines()
    first_gpu = next((i for i, line in enumerate(lines) if re.match(r"^GPU [0-9A-Fa-f]{8}:", line)), None)
    if first_gpu is None:
        return
    lines.insert(first_gpu + 1, "    New R700 Thing                                     : 42 W")
    before = parse_nvidia_smi_text(text)["unparsed"]
    after = parse_nvidia_smi_text("\n".join(lines) + "\n")["unparsed"]
    assert any(k["key"] == "new_r700_thing" and k["value"] == "42 W" and k["format"] == "smi-text"
               for k in after["keys"])
    assert after["count"] == before["count"] + 1


@pytest.mark.parametrize("path", ERRORS)
def test_nvidia_smi_answers_are_facts_or_named_refusals(path):
    raw = (CORPUS / path).read_bytes()
    text = raw.decode("utf-8")
    answer = smi_messages.parse_smi_answers(text)
    failure = smi_messages.parse_nvidia_smi_error(text)
    if answer["answered"] or failure["nvml_error"]:
        facts = assemble_facts({"nvidia-smi-q.txt": raw}, capture=True)
        assert facts["health"]["state"] in ("healthy", "degraded", "unknown", "unhealthy")
        if answer["no_devices"]:
            assert facts["gpu_count"] == 0
        for entry in answer["unreadable"]:
            assert [g["readable"] for g in facts["gpus"] if g["pci_bus_id"] == entry["pci_bus_id"]] == [False]
        if failure["nvml_error"]:
            assert facts["nvml_error"] == failure["nvml_error"]
    else:
        # A setter's message (nvidia-smi -pl / -e), not a -q answer: a clear refusal naming the file.
        from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import CaptureError
        with pytest.raises(CaptureError, match="nvidia-smi-q.txt"):
            assemble_facts({"nvidia-smi-q.txt": raw}, capture=True)


def test_docs_facts_field_coverage_table_is_what_the_corpus_gives():
    import importlib.util

    spec = importlib.util.spec_from_file_location("corpus_coverage", CORPUS.parents[2] / "tools" / "corpus_coverage.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    table = tool.markdown_table(str(CORPUS))
    assert "| `gpus[].power.limit_w` |" in table and "R610" in table
    assert table in (CORPUS.parents[2] / "docs" / "facts.md").read_text(encoding="utf-8")
