"""The conformance corpus (tests/fixtures/corpus/) and its MANIFEST.yml agree, and the corpus has the
coverage that issue 28 asks for: at least 60 captures, at least 8 driver branches between R470 and R620,
at least 10 GPU models, every entry with its source, driver version, branch, GPU model and format."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

CORPUS = Path(__file__).resolve().parents[2] / "fixtures" / "corpus"
MANIFEST = CORPUS / "MANIFEST.yml"
NOT_CAPTURES = {"README.md", "MANIFEST.yml"}

FORMATS = {"smi-xml", "smi-text", "smi-csv", "kernel-log", "lspci", "smi-error"}
REQUIRED = {"path", "source", "driver_version", "branch", "gpu_model", "format"}
OPTIONAL = {"note", "partial", "pair"}
# Linux 3-part (535.129.03), Linux 2-part (470.74, 595.80) and Windows (536.40) driver versions.
VERSION = re.compile(r"^[3-9]\d{2}\.\d{2,3}(\.\d{2})?$")
BRANCH = re.compile(r"^R(\d{3})$")

MIN_CAPTURES = 60
MIN_BRANCHES = 8
MIN_MODELS = 10
BRANCH_RANGE = (470, 620)


@pytest.fixture(scope="module")
def entries():
    data = yaml.safe_load(MANIFEST.read_text(encoding="utf-8"))
    assert isinstance(data, list), "MANIFEST.yml must be a YAML list of entries"
    assert all(isinstance(e, dict) for e in data), "every manifest entry must be a mapping"
    return data


def _files_on_disk():
    return sorted(
        p.relative_to(CORPUS).as_posix()
        for p in CORPUS.rglob("*")
        if p.is_file() and p.relative_to(CORPUS).as_posix() not in NOT_CAPTURES
    )


def _branches_in_range(entries):
    found = set()
    for e in entries:
        m = BRANCH.match(e["branch"] or "")
        if m and BRANCH_RANGE[0] <= int(m.group(1)) <= BRANCH_RANGE[1]:
            found.add(e["branch"])
    return found


def test_keys_required_and_known(entries):
    for e in entries:
        missing = REQUIRED - e.keys()
        unknown = e.keys() - REQUIRED - OPTIONAL
        assert not missing, f"{e.get('path')}: missing keys {sorted(missing)}"
        assert not unknown, f"{e.get('path')}: unknown keys {sorted(unknown)}"
        assert isinstance(e["source"], str) and len(e["source"]) >= 20, f"{e['path']}: source too short"
        if "partial" in e:
            assert e["partial"] is True, f"{e['path']}: partial is only written when true"


def test_paths_unique_and_files_exist_non_empty(entries):
    paths = [e["path"] for e in entries]
    assert len(paths) == len(set(paths)), "a path is listed twice"
    for rel in paths:
        f = CORPUS / rel
        assert f.is_file(), f"{rel}: listed but missing"
        assert f.stat().st_size > 0, f"{rel}: empty file"


def test_every_file_is_in_the_manifest(entries):
    listed = {e["path"] for e in entries}
    unlisted = [f for f in _files_on_disk() if f not in listed]
    assert not unlisted, f"files not in MANIFEST.yml: {unlisted}"


def test_format_allowed_and_matches_directory(entries):
    for e in entries:
        assert e["format"] in FORMATS, f"{e['path']}: format {e['format']!r}"
        assert e["path"].split("/", 1)[0] == e["format"], f"{e['path']}: not under {e['format']}/"


def test_driver_version_and_branch(entries):
    for e in entries:
        dv, branch = e["driver_version"], e["branch"]
        if dv is None:
            assert branch is None, f"{e['path']}: branch without a driver version"
            assert e.get("note"), f"{e['path']}: driver_version null needs a note saying why"
            continue
        assert isinstance(dv, str) and VERSION.match(dv), f"{e['path']}: driver_version {dv!r}"
        m = BRANCH.match(branch or "")
        assert m, f"{e['path']}: branch {branch!r}"
        # The branch is the major number, or for Windows numbering the Linux branch just below it
        # (513.46 -> R510, 536.40 -> R535, 591.86 -> R590).
        major = int(dv.split(".")[0])
        assert 0 <= major - int(m.group(1)) < 5, f"{e['path']}: {dv} is not on {branch}"


def test_gpu_model_named_or_explained(entries):
    for e in entries:
        if e["gpu_model"] is None:
            assert e.get("note"), f"{e['path']}: gpu_model null needs a note"
        else:
            assert isinstance(e["gpu_model"], str) and e["gpu_model"].strip() == e["gpu_model"] != ""


def test_pair_points_at_an_entry_that_points_back(entries):
    by_path = {e["path"]: e for e in entries}
    pairs = [e for e in entries if "pair" in e]
    assert pairs, "no pair recorded"
    for e in pairs:
        other = by_path.get(e["pair"])
        assert other is not None, f"{e['path']}: pair {e['pair']} is not an entry"
        assert other["path"] != e["path"], f"{e['path']}: paired with itself"
        assert other.get("pair") == e["path"], f"{e['pair']} does not pair back with {e['path']}"
        assert other["format"] != e["format"], f"{e['path']}: a pair is two formats of one state"


def test_capture_count(entries):
    assert len(entries) >= MIN_CAPTURES, f"{len(entries)} captures, issue 28 asks for >= {MIN_CAPTURES}"


def test_branch_count_between_r470_and_r620(entries):
    found = _branches_in_range(entries)
    assert len(found) >= MIN_BRANCHES, f"branches {sorted(found)}: issue 28 asks for >= {MIN_BRANCHES}"
    assert {"R470", "R535", "R580", "R610"} <= found, f"branches {sorted(found)}"


def test_gpu_model_count(entries):
    models = {e["gpu_model"] for e in entries if e["gpu_model"]}
    assert len(models) >= MIN_MODELS, f"{len(models)} GPU models, issue 28 asks for >= {MIN_MODELS}"


def test_every_format_is_present(entries):
    assert {e["format"] for e in entries} == FORMATS


def test_file_content_matches_format(entries):
    """A cheap sanity check that each file is what its format says (catches a file filed in the wrong
    directory or a manifest line pointing at the wrong file)."""
    for e in entries:
        text = (CORPUS / e["path"]).read_text(encoding="utf-8", errors="replace")
        fmt = e["format"]
        if fmt == "smi-xml":
            assert "<nvidia_smi_log>" in text and "</nvidia_smi_log>" in text, e["path"]
        elif fmt == "smi-csv":
            header = text.splitlines()[0]
            assert "driver_version" in header and "name" in header, e["path"]
        elif fmt == "smi-text":
            assert "NVSMI LOG" in text or re.search(r"^\s+\S.*\s+: ", text, re.M), e["path"]
        elif fmt == "kernel-log":
            assert re.search(r"NVRM|nvidia|Xid", text), e["path"]
        elif fmt == "lspci":
            assert "NVIDIA" in text or "LnkSta" in text, e["path"]


def test_driver_version_printed_in_capture_when_not_partial(entries):
    """For complete nvidia-smi captures the manifest's driver version is the one the file prints."""
    for e in entries:
        if e["format"] not in {"smi-xml", "smi-text", "smi-csv"} or e.get("partial") or not e["driver_version"]:
            continue
        text = (CORPUS / e["path"]).read_text(encoding="utf-8", errors="replace")
        assert e["driver_version"] in text, f"{e['path']}: {e['driver_version']} not in the file"
