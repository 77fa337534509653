# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader and writer of the rollout's state files (module_utils.state_file), with the
hostile inputs that found each defect kept as named cases."""

from __future__ import annotations

import json
import os
import stat

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import state_file
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_journal


@pytest.mark.parametrize("raw, why", [
    (b'{"acquired_at": NaN}', "holds NaN, not a number JSON allows"),
    (b'{"acquired_at": Infinity}', "holds Infinity, not a number JSON allows"),
    (b'{"acquired_at": -Infinity}', "holds -Infinity, not a number JSON allows"),
    (b'{"acquired_at": 1e400}', "holds 1e400, a number too large for a float"),
    (b'{"a": ' * 200 + b"1" + b"}" * 200, "JSON nested deeper than 64 levels"),
    (b"[" * 50000 + b"]" * 50000, "JSON nested deeper than 64 levels"),
    (b'{"node": "n1"}\xff', "not UTF-8 text (byte 14)"),
    (b"[]", "holds a JSON array, not object"),
])
def test_loads_refuses_what_json_allows_in_python_naming_the_file_and_line(raw, why):
    with pytest.raises(state_file.Unreadable) as caught:
        state_file.loads(raw, "journal.jsonl", 7)
    assert str(caught.value) == "unreadable: journal.jsonl:7: %s" % why
    assert caught.value.where == "journal.jsonl" and caught.value.line == 7


def test_loads_keeps_a_deep_but_allowed_value_and_finite_numbers():
    value = state_file.loads(b'{"a": ' * 63 + b"1.5" + b"}" * 63, "x")
    depth = 0
    while isinstance(value, dict):
        value, depth = value["a"], depth + 1
    assert (depth, value) == (63, 1.5)


def test_write_atomic_replaces_a_planted_link_and_never_writes_its_target(tmp_path):
    target = tmp_path / "victim"
    target.write_text("precious\n")
    planted = tmp_path / "drain_estimates.json"
    planted.symlink_to(target)
    (tmp_path / "drain_estimates.json.tmp").symlink_to(target)  # the old fixed temporary name, planted
    state_file.write_atomic(str(planted), '{"ends": {}}')
    assert target.read_text() == "precious\n"
    assert not planted.is_symlink() and planted.read_text() == '{"ends": {}}'
    assert stat.S_IMODE(planted.stat().st_mode) == 0o600
    assert sorted(p.name for p in tmp_path.iterdir()) == ["drain_estimates.json", "drain_estimates.json.tmp", "victim"]


def test_private_dir_is_made_0700_and_a_writable_one_is_refused_with_the_fix(tmp_path):
    made = tmp_path / "report"
    state_file.private_dir(str(made))
    assert stat.S_IMODE(made.stat().st_mode) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with pytest.raises(state_file.UnsafeDirectory) as caught:
        state_file.private_dir(str(shared))
    assert str(caught.value) == "state directory %s is writable by others (mode 0777): run chmod go-w %s" % (
        shared, shared)
    shared.chmod(0o775)
    with pytest.raises(state_file.UnsafeDirectory, match="writable by its group"):
        state_file.private_dir(str(shared))
    shared.chmod(0o755)
    assert state_file.private_dir(str(shared)) == str(shared)   # readable by others is fine
    (tmp_path / "file").write_text("")
    with pytest.raises(state_file.UnsafeDirectory, match="is not a directory"):
        state_file.private_dir(str(tmp_path / "file"))


def test_a_lease_path_that_is_a_directory_or_proc_file_is_read_without_an_exception(tmp_path):
    assert state_file.read(str(tmp_path))["unreadable"] == "unreadable: %s: a directory" % tmp_path
    found = state_file.read("/proc/self/stat")
    assert found["content"] is None and found["unreadable"].startswith("unreadable: /proc/self/stat: not JSON")


def test_a_cut_line_loses_only_itself_and_the_failure_after_it_counts(tmp_path):
    directory = str(tmp_path)
    rollout_journal.append(directory, {"event": "started", "node": "n1", "time": 1.0})
    rollout_journal.append(directory, {"event": "started", "node": "n2", "time": 2.0})
    with open(os.path.join(directory, "journal.jsonl"), "ab") as handle:
        handle.write(b'{"event": "held", "node": "n2", "ti')          # a full disk cut this line
    assert rollout_journal.append_in_lock(directory, {"event": "finished", "node": "n1", "status": "failed",
                                                      "result": "rolled_back", "time": 4.0}) is True
    read = rollout_journal.read_journal(directory)
    assert read["nodes"]["n1"]["status"] == "failed" and read["nodes"]["n1"]["result"] == "rolled_back"
    assert read["nodes"]["n2"]["status"] == "in_flight"
    assert read["nodes"]["n2"]["ambiguous"].startswith("unreadable: journal.jsonl:3: not JSON")
    assert [(e["line"], e.get("node")) for e in read["lost"]] == [(3, "n2")]


def test_a_glued_line_of_an_older_writer_gives_its_whole_event_back(tmp_path):
    glued = (b'{"event": "started", "node": "n1", "run_id": "r"' +
             json.dumps({"event": "finished", "node": "n1", "status": "failed", "result": "flagged", "time": 3.0},
                        sort_keys=True).encode() + b"\n")
    (tmp_path / "journal.jsonl").write_bytes(b'{"event": "started", "node": "n0", "time": 0.5}\n' + glued)
    read = rollout_journal.read_journal(str(tmp_path))
    assert read["nodes"]["n1"]["status"] == "failed" and "ambiguous" not in read["nodes"]["n1"]
    assert read["lost"][0]["line"] == 2 and read["lost"][0]["why"].startswith("cut short, followed by a whole event")


def test_a_non_utf8_byte_and_a_garbage_line_in_the_middle_are_counted_not_fatal(tmp_path):
    lines = [b'{"event": "started", "node": "a", "time": 1}', b'{"event": "started", "node": "b", "x": "\xff"}',
             b"garbage", b'{"event": "finished", "node": "a", "status": "done", "time": 2}']
    (tmp_path / "journal.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    read = rollout_journal.read_journal(str(tmp_path))
    assert read["nodes"]["a"]["status"] == "done"
    assert read["nodes"]["b"]["status"] == "in_flight" and read["nodes"]["b"]["ambiguous"].startswith(
        "unreadable: journal.jsonl:2: not UTF-8 text (byte 40)")
    assert [e["line"] for e in read["lost"]] == [2, 3]
    assert read["lines"][1].endswith('"\ufffd"}')
    assert rollout_journal.lost_summary(read["lost"]).startswith("2 lines of journal.jsonl cannot be read (lines 2, 3)")


def test_a_journal_that_is_a_link_is_refused_by_name(tmp_path):
    (tmp_path / "elsewhere").write_text("")
    (tmp_path / "journal.jsonl").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(state_file.Unreadable) as caught:
        rollout_journal.read(str(tmp_path))
    assert str(caught.value) == "unreadable: %s: a symbolic link, not the file itself" % (tmp_path / "journal.jsonl")
    with pytest.raises(OSError):
        rollout_journal.append(str(tmp_path), {"event": "started", "node": "x"})
    assert (tmp_path / "elsewhere").read_text() == ""


@pytest.mark.parametrize("name, expected", [
    ("gpu01", "gpu01"), ("../x", "%2E.%2Fx"), ("..", "%2E."), ("a/b", "a%2Fb"), ("2001:db8::1", "2001%3Adb8%3A%3A1"),
    ("n%41", "n%2541"),
])
def test_one_file_name_rule_names_no_other_path(name, expected):
    assert state_file.file_name(name) == expected
    assert "/" not in state_file.file_name(name) and state_file.file_name(name) not in (".", "..")
