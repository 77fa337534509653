# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Property-based tests (Hypothesis) of every reader and decision the rollout takes from its own files.

For any bytes each reader gives a value or a refusal naming the file, in bounded time; a journal
with one line cut or corrupted loses no finished event before or after it; no accept pattern
accepts an unreadable contract record; an unknown lock holder is never taken over before
``lock_stale_s``. Derandomized (the same inputs in every run) so that CI is stable; the examples
that found a defect are kept as named tests beside each reader (test_state_file.py,
test_run_lease.py, test_scheduler_state.py, test_contract_decision.py, test_rollout_verdict.py).
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import time

from hypothesis import HealthCheck, given, settings, strategies as st

from ansible_collections.gpufleet.nvidia.plugins.module_utils import state_file  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import contract_decision as cd  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_journal, run_lease  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_verdict import rollout_lock  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.scheduler_state import (  # noqa: E402
    MAX_HOSTLIST, expand_hostlist, parse_slurm_show_node)

#: Inputs tried, per property (printed at the end of the module; the report gives the total).
TRIED = {}

FAST = settings(max_examples=300, deadline=2000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
#: Seconds one call of a reader may take on the largest generated input.
BOUND_S = 1.0


def _count(name):
    TRIED[name] = TRIED.get(name, 0) + 1


def teardown_module(_module):
    print("\nhypothesis inputs tried: %d (%s)" % (sum(TRIED.values()), ", ".join(
        "%s %d" % item for item in sorted(TRIED.items()))))


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-2 ** 70, 2 ** 70), st.floats(allow_nan=True),
                     st.text(max_size=20))
_json = st.recursive(_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=8), inner, max_size=4), max_leaves=20)
_hostile_text = st.one_of(
    st.binary(max_size=3000),
    _json.map(lambda v: json.dumps(v).encode("utf-8")),              # NaN / Infinity included
    st.integers(1, 5000).map(lambda n: b'{"a":' * n + b"1" + b"}" * n),  # deep
    st.integers(1, 200000).map(lambda n: b"[" * n),                   # deep and cut
    st.sampled_from([b'{"acquired_at": NaN}', b'{"x": 1e999}', b'{"x": -Infinity}', b"\xef\xbb\xbf{}",
                     b'{"run_id": "a"}\x00', b'{"a": "\xff"}']),
)


@FAST
@given(_hostile_text)
def test_loads_gives_a_value_or_a_refusal_naming_the_file(raw):
    _count("loads")
    started = time.monotonic()
    try:
        value = state_file.loads(raw, "lock.json", None, dict)
    except state_file.Unreadable as exc:
        assert str(exc).startswith("unreadable: lock.json: ") and exc.why
    else:
        assert isinstance(value, dict)
        json.dumps(value, allow_nan=False)   # what was accepted holds no NaN or infinity
    assert time.monotonic() - started < BOUND_S


@FAST
@given(_hostile_text)
def test_read_of_any_file_is_a_value_or_a_named_refusal(raw):
    _count("read")
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "snapshot.json")
        with open(path, "wb") as handle:
            handle.write(raw)
        found = state_file.read(path)
    assert found["exists"] is True
    assert (found["content"] is None) != (found["unreadable"] is None)
    if found["unreadable"]:
        assert found["unreadable"].startswith("unreadable: %s: " % path)


@FAST
@given(st.lists(st.one_of(st.binary(max_size=200), _json.map(lambda v: json.dumps(v).encode())), max_size=12))
def test_journal_lines_each_read_or_counted_with_their_line(lines):
    _count("read_lines")
    raw = b"\n".join(line.replace(b"\n", b" ") for line in lines)
    scanned = state_file.read_lines(raw, "journal.jsonl")
    count = len(state_file.split_lines(raw)[0])
    for entry in scanned["lost"]:
        assert 1 <= entry["line"] <= count
        assert entry["text"].startswith("unreadable: journal.jsonl:%d: " % entry["line"])
    for number, event in scanned["events"]:
        assert 1 <= number <= count and isinstance(event, dict)
    rollout_journal.fold(scanned["events"], scanned["lost"])


_NODES = ("n1", "n2", "n3")
_event = st.one_of(
    st.builds(lambda n: {"event": "started", "node": n, "run_id": "r1"}, st.sampled_from(_NODES)),
    st.builds(lambda n, s: {"event": "finished", "node": n, "status": s, "result": "x"}, st.sampled_from(_NODES),
              st.sampled_from(["done", "failed", "refused"])),
    st.builds(lambda n, k: {"event": k, "node": n}, st.sampled_from(_NODES),
              st.sampled_from(["held", "draining", "drained", "installing", "pending", "resumed", "released"])),
    st.just({"event": "rendered", "step": True}),
)


def _statuses(state):
    return dict((node, value.get("status")) for node, value in state.items())


@settings(max_examples=300, deadline=2000, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_event, min_size=1, max_size=10), st.data())
def test_one_cut_or_corrupt_line_loses_no_finished_event_before_or_after_it(events, data):
    _count("journal_damage")
    events = [dict(e, time=float(i)) for i, e in enumerate(events)]
    damaged = data.draw(st.integers(0, len(events) - 1), label="damaged line")
    how = data.draw(st.sampled_from(["cut", "corrupt", "glued"]), label="how")
    line = json.dumps(events[damaged], sort_keys=True).encode()
    expected = rollout_journal.fold([(i + 1, e) for i, e in enumerate(events) if i != damaged])
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, rollout_journal.JOURNAL)
        for event in events[:damaged]:
            rollout_journal.append(directory, event)
        if how == "cut":      # the writer died mid-line; the next run appends the rest
            cut = data.draw(st.integers(1, len(line) - 1), label="cut at")
            with open(path, "ab") as handle:
                handle.write(line[:cut])
            for event in events[damaged + 1:]:
                rollout_journal.append(directory, event)
        elif how == "corrupt":  # the line overwritten by bytes that are not an event
            garbage = data.draw(st.binary(min_size=1, max_size=80).filter(
                lambda b: b"\n" not in b and b"{" not in b), label="garbage")
            with open(path, "ab") as handle:
                handle.write(garbage + b"\n")
            for event in events[damaged + 1:]:
                rollout_journal.append(directory, event)
        else:                  # an older writer glued the next event onto the cut line
            cut = data.draw(st.integers(1, len(line) - 1), label="cut at")
            rest = b"".join(json.dumps(e, sort_keys=True).encode() + b"\n" for e in events[damaged + 1:])
            with open(path, "ab") as handle:
                handle.write(line[:cut] + rest)
        read = rollout_journal.read_journal(directory)
    got = read["nodes"]
    assert read["unreadable"] is None
    victim = events[damaged].get("node")
    for node in set(expected) | set(got):
        if node == victim and got.get(node, {}).get("ambiguous"):
            # What the lost line said is unknown: in flight and flagged, never done or lost.
            assert got[node]["status"] == "in_flight"
            continue
        assert _statuses({node: got.get(node, {})}) == _statuses({node: expected.get(node, {})}), (node, how)
    assert len(read["lost"]) <= 1   # only the damaged line


_pattern = st.text(alphabet="*?[]!-_abcdelnortu", min_size=1, max_size=12)


@FAST
@given(st.lists(_pattern, min_size=1, max_size=4),
       st.one_of(_json, st.just([{"field": cd.UNREADABLE, "decision": "accepted"}]), st.just("corrupt")))
def test_no_accept_pattern_ever_accepts_an_unreadable_record(patterns, record):
    _count("accept")
    changes = [cd.unreadable("the record")] if not isinstance(record, list) else record
    for change in cd.resolve(changes, patterns):
        if change["field"] == cd.UNREADABLE:
            assert change["decision"] == "unexplained"


_lock_value = st.one_of(_scalars, st.just(float("nan")), st.just(float("inf")), st.just("/proc/self/stat"))
_lock = st.fixed_dictionaries({}, optional={
    "rollout_id": _lock_value, "run_id": st.one_of(_lock_value, st.just("x-1-1"), st.just("../../x")),
    "controller": st.one_of(_lock_value, st.just(run_lease.run_identity()["controller"])),
    "pid": st.one_of(_lock_value, st.integers(-5, 2 ** 40)), "acquired_at": st.one_of(_lock_value, st.floats()),
    "lease": _lock_value})
_OWNER = {"rollout_id": "ltsb", "run_id": "ctl-100-5", "controller": "ctl", "pid": 100}


@FAST
@given(_lock, st.floats(0, 1e6))
def test_an_unknown_holder_is_never_taken_over_before_lock_stale_s(lock, stale_s):
    _count("lock")
    with tempfile.TemporaryDirectory() as runs:
        probe = run_lease.probe_holder(lock, runs, now=1000.0)
    assert probe["alive"] in (True, False, None) and probe["reason"]
    if probe["alive"] is None:
        decision = rollout_lock(lock, _OWNER, 1000.0, stale_s, None, False, probe["reason"])
        if decision["takeover"]:
            age = 1000.0 - float(lock["acquired_at"])
            assert math.isfinite(age) and age > stale_s > 0


@FAST
@given(st.one_of(st.text(alphabet="[]0123456789-,ab", max_size=40),
                 st.builds(lambda a, b, c: "n[0-%d][0-%d]x[1-%d]" % (a, b, c), st.integers(0, 10 ** 6),
                           st.integers(0, 10 ** 6), st.integers(1, 10 ** 6))))
def test_a_hostlist_is_expanded_or_refused_before_it_is_built(text):
    _count("hostlist")
    started = time.monotonic()
    try:
        names = expand_hostlist(text)
    except ValueError as exc:
        assert "hostlist" in str(exc)
    else:
        assert len(names) <= MAX_HOSTLIST
    assert time.monotonic() - started < BOUND_S


@FAST
@given(st.one_of(st.text(max_size=300), st.builds(
    lambda head, reason, tail: "NodeName=n1 State=%s Reason=%s%s" % (head, reason, tail),
    st.text(alphabet="ABCDEIGLNRMX+", max_size=20), st.text(max_size=60),
    st.sampled_from(["", " [slurm@t]", " Comment=x", " State=IDLE", " [a@b] State=IDLE"]))))
def test_scontrol_output_is_parsed_or_refused(text):
    _count("scontrol")
    try:
        node = parse_slurm_show_node(text, None)
    except ValueError as exc:
        assert "scontrol show node" in str(exc)
    else:
        assert node["drain_kind"] in (None, "gpu_count", "scheduler", "operator")
        assert node["out_of_service"] is (node["drain_kind"] is not None)
        if text.startswith("NodeName=n1 State="):
            # Whatever the reason holds, the state is the node's own field.
            own = [p for p in text.split("State=", 1)[1].split(" ", 1)[0].upper().split("+") if p]
            assert node["state"] == (own[0] if own else None) and node["flags"] == own[1:]


@FAST
@given(st.text(min_size=1, max_size=60), st.text(min_size=1, max_size=60))
def test_one_file_name_rule_never_names_another_path_and_keeps_names_apart(first, second):
    _count("file_name")
    for name in (first, second):
        quoted = state_file.file_name(name)
        assert "/" not in quoted and "\x00" not in quoted and quoted not in (".", "..") and len(quoted) <= 200
        assert not quoted.startswith(".")
    if first != second:
        assert state_file.file_name(first) != state_file.file_name(second)
