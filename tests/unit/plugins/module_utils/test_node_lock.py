# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The node's rollout lock: untrusted state files, compare-and-swap between real processes, release."""

from __future__ import annotations

import json
import multiprocessing
import os

from ansible_collections.gpufleet.nvidia.plugins.module_utils import node_lock
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_verdict import rollout_lock

OWNER = {"rollout_id": "driver-ltsb", "run_id": "ctl-1-1", "controller": "ctl", "pid": 11}
OTHER = {"rollout_id": "driver-620", "run_id": "ctl2-2-2", "controller": "ctl2", "pid": 22}


def lock_of(owner, at=100.0):
    return dict(owner, acquired_at=at)


def test_absent_file(tmp_path):
    assert node_lock.read_state(str(tmp_path / "lock.json")) == {
        "exists": False, "content": None, "unreadable": None, "identity": None}


def test_valid_lock_is_parsed_with_its_identity(tmp_path):
    path = tmp_path / "lock.json"
    raw = json.dumps(lock_of(OTHER)).encode()
    path.write_bytes(raw)
    state = node_lock.read_state(str(path))
    assert state["content"]["run_id"] == "ctl2-2-2"
    assert state["unreadable"] is None
    assert state["identity"] == node_lock.identity(raw) and state["identity"].startswith("sha256:")


def test_corrupt_files_say_why_and_are_never_an_exception(tmp_path):
    cases = {
        b'{"rollout_id": "x", "run_id"': ": not JSON (Expecting ':' delimiter",
        b"[1, 2]": ": holds a JSON array, not object",
        b'"text"': ": holds a JSON string, not object",
        b"\xff\xfe\x00garbage": ": not UTF-8 text (byte 0)",
        b"": ": not JSON (Expecting value",
        b'{"acquired_at": NaN}': ": holds NaN, not a number JSON allows",
        b'{"acquired_at": 1e999}': ": holds 1e999, a number too large for a float",
        b"[" * 100 + b"]" * 100: ": JSON nested deeper than 64 levels",
        b"[" * 100000 + b"]" * 100000: ": JSON nested deeper than 64 levels",
        b"{" + b" " * node_lock.MAX_STATE_BYTES + b"}": ": larger than %d bytes" % node_lock.MAX_STATE_BYTES,
    }
    for raw, words in cases.items():
        path = tmp_path / "lock.json"
        path.write_bytes(raw)
        state = node_lock.read_state(str(path))
        assert state["exists"] is True and state["content"] is None, raw[:20]
        assert state["unreadable"].startswith("unreadable: %s: " % path) and words in state["unreadable"], (
            raw[:20], state)
        assert state["identity"] is not None


def test_directory_link_and_fifo_are_not_read(tmp_path):
    directory = tmp_path / "as-dir"
    directory.mkdir()
    assert node_lock.read_state(str(directory))["unreadable"] == "unreadable: %s: a directory" % directory
    secret = tmp_path / "secret"
    secret.write_text('{"run_id": "from a link"}')
    link = tmp_path / "link.json"
    link.symlink_to(secret)
    state = node_lock.read_state(str(link))
    assert state["content"] is None and state["unreadable"] == "unreadable: %s: a symbolic link, not the file itself" % link
    fifo = tmp_path / "fifo.json"
    os.mkfifo(str(fifo))
    assert node_lock.read_state(str(fifo))["unreadable"] == "unreadable: %s: not a regular file" % fifo  # no block


def test_acquire_a_free_lock_then_a_second_taker_is_refused_naming_the_holder(tmp_path):
    path = str(tmp_path / "rollout" / "lock.json")
    first = node_lock.acquire(path, lock_of(OWNER), None)
    assert first["acquired"] is True and first["changed"] is True
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    second = node_lock.acquire(path, lock_of(OTHER), None)  # decided on "free", but it no longer is
    assert second["acquired"] is False
    assert "now held by rollout driver-ltsb (run ctl-1-1, controller ctl, pid 11)" in second["reason"]
    assert node_lock.read_state(path)["content"]["run_id"] == "ctl-1-1"


def test_acquire_replaces_only_the_file_the_decision_was_made_on(tmp_path):
    path = tmp_path / "lock.json"
    path.write_bytes(b"corrupt{")
    seen = node_lock.read_state(str(path))["identity"]
    taken = node_lock.acquire(str(path), lock_of(OWNER), seen)
    assert taken["acquired"] is True
    assert json.loads(path.read_text())["run_id"] == "ctl-1-1"
    # The same call again (the file is now ours, not "corrupt{"): refused, nothing written.
    again = node_lock.acquire(str(path), lock_of(OTHER), seen)
    assert again["acquired"] is False and json.loads(path.read_text())["run_id"] == "ctl-1-1"


def _race(path, owner, barrier, results):
    seen = node_lock.read_state(path)["identity"]  # both read "absent"
    barrier.wait()
    results.put((owner["run_id"], node_lock.acquire(path, lock_of(owner), seen)["acquired"]))


def test_two_processes_that_both_saw_a_free_lock_exactly_one_takes_it(tmp_path):
    context = multiprocessing.get_context("fork")
    for attempt in range(10):
        path = str(tmp_path / ("lock-%d.json" % attempt))
        barrier, results = context.Barrier(2), context.Queue()
        workers = [context.Process(target=_race, args=(path, owner, barrier, results)) for owner in (OWNER, OTHER)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(30)
        outcome = dict(results.get(timeout=5) for worker in workers)
        assert sorted(outcome.values()) == [False, True], outcome
        winner = [run for run, won in outcome.items() if won][0]
        assert node_lock.read_state(path)["content"]["run_id"] == winner


def test_release_removes_only_this_runs_lock(tmp_path):
    path = str(tmp_path / "lock.json")
    node_lock.acquire(path, lock_of(OTHER), None)
    kept = node_lock.release(path, OWNER["run_id"])
    assert kept["released"] is False and "run ctl2-2-2" in kept["reason"] and os.path.exists(path)
    assert node_lock.release(path, OTHER["run_id"])["changed"] is True and not os.path.exists(path)
    assert node_lock.release(path, OTHER["run_id"]) == {"released": True, "changed": False, "found": None, "reason": None}
    node_lock.acquire(path, lock_of(OTHER), None)
    assert node_lock.release(path, OWNER["run_id"], force=True)["released"] is True and not os.path.exists(path)


def test_several_state_files_at_once_each_by_name(tmp_path):
    lock = tmp_path / "lock.json"
    node_lock.acquire(str(lock), lock_of(OTHER), None)
    (tmp_path / "flag.fact").write_bytes(b"not json")
    (tmp_path / "snapshot.json").mkdir()
    secret = tmp_path / "drain.json"
    secret.write_text("{}")
    secret.chmod(0)
    files = node_lock.read_states({"lock": str(lock), "flag": str(tmp_path / "flag.fact"),
                                   "snapshot": str(tmp_path / "snapshot.json"), "driver": str(tmp_path / "none.fact"),
                                   "drain": str(secret)})
    assert sorted(files) == ["drain", "driver", "flag", "lock", "snapshot"]
    assert files["lock"]["content"]["pid"] == 22 and files["lock"]["identity"].startswith("sha256:")
    assert files["flag"]["content"] is None and files["flag"]["unreadable"].startswith(
        "unreadable: %s: not JSON" % (tmp_path / "flag.fact"))
    assert files["snapshot"]["unreadable"] == "unreadable: %s: a directory" % (tmp_path / "snapshot.json")
    assert files["driver"] == {"exists": False, "content": None, "unreadable": None, "identity": None}
    if os.geteuid() != 0:  # root reads a mode-0 file
        assert files["drain"]["unreadable"] == "unreadable: %s: cannot be opened (Permission denied)" % secret


def test_boot_id_is_read_and_a_missing_one_is_none(tmp_path):
    (tmp_path / "boot_id").write_text("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n")
    assert node_lock.read_boot_id(str(tmp_path / "boot_id")) == "0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"
    assert node_lock.read_boot_id(str(tmp_path / "absent")) is None


def test_unreadable_lock_is_refused_with_its_reason_and_taken_over_on_break():
    reason = "/var/lib/gpufleet/rollout/lock.json is not JSON (Expecting value: line 1 column 1 (char 0))"
    refused = rollout_lock(reason, OWNER, 200.0)
    assert refused["ok"] is False and refused["flags"] == ["lock_unreadable"]
    assert refused["reasons"] == [reason + ": inspect and remove it, or set node_upgrade_lock_break=true to take "
                                           "the node over"]
    taken = rollout_lock(reason, OWNER, 200.0, break_lock=True)
    assert taken["ok"] is True and taken["takeover"] is True and taken["lock"]["run_id"] == "ctl-1-1"
