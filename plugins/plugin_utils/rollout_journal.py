# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout journal: what each step started and how each node ended, append-only, on the controller.

``<report_dir>/journal.jsonl`` holds one JSON object a line, appended under the report
directory's ``fcntl.flock`` (:func:`locked`) and flushed with ``fsync``, so a
controller killed anywhere leaves every line it wrote whole:

* ``{"event": "started", "node", "run_id", "time"}`` — a step admitted the node into its budget
  (before its transaction touched it);
* ``{"event": "finished", "node", "status": "done" | "failed" | "refused", "result",
  "changed", "signature", "implicates_driver", "target", "time", "run_id", "out_of_service"?}``
  — its transaction ended (for a golden or canary node: after its soak and the check after it);
  ``out_of_service``: refused because someone else drained it (it counts against its class's
  capacity budget);
* ``{"event": "held", "node", "time", "contract_changes"?}`` — the node's transaction ended but
  it is still soaking: it stays in flight. A golden node's ``held`` and ``finished`` events carry
  its contract changes (``contract_decision.classify``), which decide its class's canary stage;
* ``{"event": "started", ..., "draining": true}`` (with ``drain_ahead``), or ``{"event":
  "draining", "node", "time"}``: the node's drain was requested; ``{"event": "drained", "node",
  "time"}``: it completed and the node waits for its install admission; ``{"event": "installing",
  "node", "time"}``: its install was admitted (``rollout_budget.phase``). A draining node keeps its
  slot, and a draining canary node holds no stage open (``rollout_budget.stage_gates``). A node
  whose journal says nothing of its drain is taken as installing: it holds its stage open and
  counts in its class's window.
* ``{"event": "released", "node", "time", "run_id"}`` — the rollout stopped before the node's
  install and the node is back in service untouched: it is not started (a later run of the
  rollout may start it again).
* ``{"event": "pending", "node", "time", "run_id"}`` — the node's driver is staged and its
  scheduler reboots it when its jobs end (``node_upgrade_drain: slurm_reboot``): it stays in
  flight, holding its slot, and a later step verifies it; ``{"event": "resumed", "node", "time",
  "run_id"}`` — a step took such a node up again.
* ``{"event": "waiting", "node", "time", "run_id", "for"?: "install" | "drain", "until"?}`` — a pass
  (``rollout_executor: passes``) left the node in flight, waiting in no worker: drained ahead, for
  its install admission (``for`` absent or ``install``), or for its jobs to end (``drain``: the
  scheduler was asked to drain it; ``until``, epoch seconds, is when its drain runs out of time).
  A later pass takes it up (``resumed``).

A node started and not finished is in flight: the next step resumes it first (its transaction
reads its own state on the node and continues, or finds it done). Appending costs the same
whatever the journal's length; reading it is linear in its lines.

A journal can be damaged: its last line cut (a full disk, a copy taken mid-write), a line
overwritten. It never loses more than the damaged line: appending ends a cut last line first
(``state_file.append_line``), so the next event is a line of its own; reading
(``state_file.read_lines``) reads every line on its own (UTF-8, JSON, bounded), gives back a
whole event glued onto a cut line by an older writer, and counts the lines it cannot read
(:func:`read_journal`'s ``lost``: each ``unreadable: journal.jsonl:<line>: <why>``), which the
step's output and the reports show. A node named by a lost line after its last readable event
is ambiguous: it is in flight (the next step resumes it: its transaction finds what happened)
and flagged (``journal_lost``), never silently done, failed or not started.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from ansible_collections.gpufleet.nvidia.plugins.module_utils import state_file

JOURNAL = "journal.jsonl"


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``<directory>/.lock``.

    I/O: creates the directory 0700 (``state_file.private_dir``).
    :raises state_file.UnsafeDirectory: the directory exists and others can write it (the message
        gives the fix).
    :raises OSError: the directory or its lock file cannot be made.
    """
    state_file.private_dir(directory)
    fd = os.open(os.path.join(directory, ".lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def append(directory: str, event: Mapping[str, Any]) -> None:
    """Append one event (I/O: creates the directory; ``fsync`` before the lock is released)."""
    with locked(directory):
        append_in_lock(directory, event)


def append_in_lock(directory: str, event: Mapping[str, Any]) -> bool:
    """Append one event while the caller holds :func:`locked` on ``directory`` (I/O; ``fsync``).

    A cut last line is ended first, so that only it is lost (``state_file.append_line``).
    :returns: whether a cut last line was ended.
    :raises ValueError: an event that JSON cannot hold (a NaN, an infinity, a non-text key).
    :raises OSError: the journal cannot be written (a symbolic link in its place: ``ELOOP``).
    """
    line = json.dumps(dict(event), sort_keys=True, allow_nan=False).encode("utf-8")
    return state_file.append_line(os.path.join(directory, JOURNAL), line)


def _as_bytes(lines: Iterable[Union[str, bytes]]) -> bytes:
    parts = []
    for line in lines:
        raw = line if isinstance(line, bytes) else str(line).encode("utf-8", "surrogateescape")
        parts.append(raw.rstrip(b"\n"))
    return b"\n".join(parts) + (b"\n" if parts else b"")


def fold_lines(lines: Iterable[Union[str, bytes]]) -> Dict[str, Dict[str, Any]]:
    """Fold journal lines into the state of each node (:func:`fold` of ``state_file.read_lines``).

    :param lines: text or byte lines (one event each), in order.
    :returns: :func:`fold`'s state.
    """
    scanned = state_file.read_lines(_as_bytes(lines), JOURNAL)
    return fold(scanned["events"], scanned["lost"])


def _not_waiting(node: Dict[str, Any]) -> None:
    for key in ("waiting", "waiting_for", "waiting_until"):
        node.pop(key, None)


def fold(events: Sequence[Tuple[int, Mapping[str, Any]]],
         lost: Sequence[Mapping[str, Any]] = ()) -> Dict[str, Dict[str, Any]]:
    """Fold journal events into the state of each node.

    :param events: ``[(line number, event)]`` in order (``state_file.read_lines``'s ``events``);
        an event without a text ``node`` names no node.
    :param lost: the lines that could not be read (``state_file.read_lines``'s ``lost``: ``line``,
        ``text``, ``node`` when the damaged line names one).
    :returns: ``{node: {"status": "in_flight" | "done" | "failed" | "refused", "started_at",
        "finished_at", "result", "changed", "signature", "implicates_driver", "target",
        "run_id", "draining"?, "drained"?, "pending"?, "waiting"?, "waiting_for"?, "waiting_until"?,
        "held"? (its soak runs), "contract_changes"?, "journal_lost"?: [text], "ambiguous"?: text}}``;
        nodes the journal never named are absent (not started); ``pending`` is true for a node in
        flight that waits for its scheduler's reboot, ``waiting`` for one a pass left waiting:
        ``waiting_for`` ``install`` (drained ahead, for its install admission) or ``drain`` (for its
        jobs to end, ``draining``; ``waiting_until``: epoch seconds its drain runs out of time). A node a
        lost line names after its last readable event is ``in_flight`` with ``ambiguous`` (that
        line's ``unreadable: ...``); ``journal_lost`` lists every lost line that names it.
    """
    state = {}  # type: Dict[str, Dict[str, Any]]
    last = {}  # type: Dict[str, int]
    for number, event in events:
        if not isinstance(event, Mapping) or not isinstance(event.get("node"), str):
            continue
        last[event["node"]] = number
        node = state.setdefault(event["node"], {})
        kind = event.get("event")
        if kind == "started":
            node.clear()
            node.update({"status": "in_flight", "started_at": event.get("time"), "run_id": event.get("run_id")})
            if event.get("draining") is True:
                node["draining"] = True
        elif kind == "released":
            # Back in service untouched (the rollout stopped before its install): not started.
            state.pop(event["node"], None)
        elif kind == "held":
            node["status"] = "in_flight"
            node["held"] = True
            node.pop("draining", None)
            node.pop("drained", None)
            if "contract_changes" in event:
                # Kept as written (even corrupt): contract_decision.checked_changes reads it, fail closed.
                node["contract_changes"] = event["contract_changes"]
        elif kind in ("draining", "drained", "installing") and node.get("status") == "in_flight":
            node["draining"] = kind == "draining"
            node["drained"] = kind == "drained"
            if kind == "installing":
                _not_waiting(node)
        elif kind == "pending":
            node.update({"status": "in_flight", "pending": True})
            node.pop("draining", None)
            node.pop("drained", None)
        elif kind == "waiting" and node.get("status") == "in_flight":
            node["waiting"] = True
            if event.get("for") == "drain":
                node.update({"waiting_for": "drain", "draining": True, "drained": False})
                until = event.get("until")
                if isinstance(until, (int, float)) and not isinstance(until, bool):
                    node["waiting_until"] = until
            else:
                node["waiting_for"] = "install"
                node.pop("waiting_until", None)
        elif kind == "resumed":
            node.pop("pending", None)
            _not_waiting(node)
        elif kind == "finished" and event.get("status") in ("done", "failed", "refused"):
            for key in ("status", "result", "changed", "signature", "implicates_driver", "target", "run_id",
                        "out_of_service"):
                node[key] = event.get(key)
            if "contract_changes" in event:
                # Kept as written (even corrupt): contract_decision.checked_changes reads it, fail closed.
                node["contract_changes"] = event["contract_changes"]
            node.pop("draining", None)
            node.pop("drained", None)
            node.pop("pending", None)
            _not_waiting(node)
            node.pop("held", None)
            node["finished_at"] = event.get("time")
    for entry in lost:
        name = entry.get("node")
        if not isinstance(name, str):
            continue
        node = state.setdefault(name, {})
        node.setdefault("journal_lost", []).append(entry.get("text"))
        if int(entry.get("line") or 0) > last.get(name, 0):
            # What the lost line said of the node is unknown: it may have started, finished or failed.
            node["status"] = "in_flight"
            node["ambiguous"] = entry.get("text")
    return state


def read_journal(directory: str) -> Dict[str, Any]:
    """Read ``<directory>/journal.jsonl`` whole, damaged or not (I/O).

    :returns: ``{"nodes": :func:`fold`, "events": ``[(line number, event)]`` (the readable
        ones, ``state_file.read_lines``), "lines": [text lines, a line that is not UTF-8 with its
        bad bytes replaced], "lost": [{"line", "why", "text", "node"?}], "cut_tail": bool,
        "unreadable": "unreadable: <path>: <why>" | None}``: ``unreadable`` when the file itself
        cannot be read (a link, a directory, larger than ``state_file.MAX_JOURNAL_BYTES``): then
        nothing of it is used. An absent journal is empty. Never raises.
    """
    path = os.path.join(directory, JOURNAL)
    empty = {"nodes": {}, "events": [], "lines": [], "lost": [], "cut_tail": False, "unreadable": None}
    try:
        raw = state_file.read_bytes(path, state_file.MAX_JOURNAL_BYTES)
    except state_file.Unreadable as exc:
        return dict(empty, unreadable=exc.text())
    if raw is None:
        return empty
    if len(raw) > state_file.MAX_JOURNAL_BYTES:
        return dict(empty, unreadable=state_file.Unreadable(
            path, "larger than %d bytes" % state_file.MAX_JOURNAL_BYTES).text())
    scanned = state_file.read_lines(raw, JOURNAL)
    lines, _cut = state_file.split_lines(raw)
    return {"nodes": fold(scanned["events"], scanned["lost"]), "events": scanned["events"],
            "lines": [line.decode("utf-8", "replace") for line in lines],
            "lost": scanned["lost"], "cut_tail": scanned["cut_tail"], "unreadable": None}


def read(directory: str) -> Dict[str, Dict[str, Any]]:
    """The state of each node named in ``<directory>/journal.jsonl`` (I/O; ``{}`` when absent).

    :raises state_file.Unreadable: the journal exists and cannot be read at all (a link, a
        directory, too large): deciding as if it were empty would start nodes again.
    """
    found = read_journal(directory)
    if found["unreadable"]:
        raise state_file.Unreadable(os.path.join(directory, JOURNAL), found["unreadable"].split(": ", 2)[-1])
    return found["nodes"]


def lost_summary(lost: Sequence[Mapping[str, Any]], limit: int = 5) -> Optional[str]:
    """One sentence for the step output and the reports: how many journal lines were lost and where.

    :returns: e.g. ``"2 lines of journal.jsonl cannot be read (lines 4, 9): unreadable:
        journal.jsonl:4: not JSON (...)"``, or ``None`` when none was lost.
    """
    if not lost:
        return None
    numbers = [str(entry.get("line")) for entry in lost]
    shown = ", ".join(numbers[:limit]) + (", ..." if len(numbers) > limit else "")
    return "%d line%s of %s cannot be read (line%s %s): %s" % (
        len(lost), "s" if len(lost) > 1 else "", JOURNAL, "s" if len(lost) > 1 else "", shown,
        "; ".join(str(entry.get("text")) for entry in lost[:2]))


def fleet_state(plan: Mapping[str, Any], journal: Mapping[str, Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The nodes for ``rollout_budget.decide``: the plan's nodes (in order) with their journal state.

    :param plan: ``plan.json`` (``nodes``: ``[{"name", "stage", "class", "domain"}]``).
    :param journal: :func:`read`.
    :returns: ``[{"name", "stage", "class", "domain", "status", "signature"?,
        "implicates_driver"?, "target"?, "changed"?, "finished_at"?, "draining"?, "drained"?, "pending"?,
        "waiting"?, "waiting_for"?, "waiting_until"?, "contract_changes"?, "journal_lost"?, "ambiguous"?}]``.
    """
    nodes = []
    for node in plan.get("nodes") or []:
        state = journal.get(node["name"]) or {}
        row = dict(node)
        row["status"] = state.get("status") or "pending"
        for key in ("signature", "implicates_driver", "target", "changed", "finished_at", "result", "out_of_service",
                    "draining", "drained", "pending", "waiting", "waiting_for", "waiting_until", "journal_lost",
                    "ambiguous"):
            if state.get(key) is not None:
                row[key] = state[key]
        if "contract_changes" in state:
            row["contract_changes"] = state["contract_changes"]
        nodes.append(row)
    return nodes


def status_of(result: str) -> str:
    """The journal status of a rollout report result (``upgraded`` → ``done``, ...)."""
    if result in ("upgraded", "skipped"):
        return "done"
    if result == "refused":
        return "refused"
    return "failed"


def unfinished(journal: Mapping[str, Mapping[str, Any]], nodes: Any) -> List[str]:
    """The nodes among ``nodes`` that the journal still has in flight (started or held, not finished),
    except those pending (:func:`pending`) or waiting for their install admission (``waiting``).

    At the end of a step every host of the step has ended its play, so a node of the step still
    in flight lost its connection or failed outside its transaction's rescue: it has no record.
    """
    return [n for n in nodes if (journal.get(n) or {}).get("status") == "in_flight"
            and not (journal.get(n) or {}).get("pending") and not (journal.get(n) or {}).get("waiting")]


def pending(journal: Mapping[str, Mapping[str, Any]], nodes: Any) -> List[str]:
    """The nodes among ``nodes`` in flight that wait for a reboot their scheduler runs (a ``pending``
    event, not followed by ``resumed`` or ``finished``): recorded, holding their slot."""
    return [n for n in nodes if (journal.get(n) or {}).get("status") == "in_flight"
            and (journal.get(n) or {}).get("pending")]


def waiting(journal: Mapping[str, Mapping[str, Any]], nodes: Any) -> List[str]:
    """The nodes among ``nodes`` in flight that a pass left waiting, for their install admission or
    their drain (a ``waiting`` event, not followed by ``resumed``, ``installing`` or ``finished``)."""
    return [n for n in nodes if (journal.get(n) or {}).get("status") == "in_flight"
            and (journal.get(n) or {}).get("waiting")]


def passes(events: Sequence[Tuple[int, Mapping[str, Any]]], run_id: Optional[str] = None) -> List[Dict[str, Any]]:
    """The passes the journal recorded (``pass`` events), of ``run_id`` only when given.

    :param events: :func:`read_journal`'s ``events``.
    :returns: ``[{"pass": int, "run_id", "time": epoch s, "hosts": [names], "states": {state: count}}]``
        in journal order; an event whose fields are not of these types is left out.
    """
    out = []
    for _number, event in events:
        if not isinstance(event, Mapping) or event.get("event") != "pass":
            continue
        if run_id is not None and event.get("run_id") != run_id:
            continue
        hosts, states, stamp = event.get("hosts"), event.get("states"), event.get("time")
        if not isinstance(hosts, list) or not isinstance(states, Mapping) or isinstance(stamp, bool) \
                or not isinstance(stamp, (int, float)):
            continue
        out.append({"pass": event.get("pass"), "run_id": event.get("run_id"), "time": float(stamp),
                    "hosts": [str(h) for h in hosts], "states": dict(states)})
    return out


def concurrent_rollouts(parent: str, rollout_id: str, nodes: Any, now: float, stale_s: float,
                        alive: Callable[[str], Optional[bool]]) -> List[Dict[str, Any]]:
    """Other rollouts under ``parent`` (the directory holding each rollout's report directory) that run
    now on any of ``nodes``.

    A rollout is running when the run that started one of its nodes in flight, or its latest run
    (``plan.json`` ``runs``), is alive: ``alive(run_id)`` true (a run of this controller whose process runs), or unknown
    (``None``: another controller's run) and its plan or journal written within ``stale_s`` seconds.
    A rollout whose runs are all gone is not running: it is resumed by its own next run.

    :param parent: e.g. ``gpufleet-reports/rollout``; rollouts are its subdirectories with a
        ``plan.json`` (I/O: lists it, reads each journal).
    :param rollout_id: this rollout (not counted).
    :param nodes: this rollout's node names; a rollout on other nodes only is not counted.
    :returns: ``[{"rollout_id", "report_dir", "overlap": [node], "in_flight": [node], "run_id", "age_s"}]``.
    """
    found = []
    try:
        names = sorted(os.listdir(parent))
    except OSError:
        return found
    for name in names:
        directory = os.path.join(parent, name)
        plan = state_file.read(os.path.join(directory, "plan.json"))["content"]
        if not isinstance(plan, dict):
            continue
        try:
            other = plan.get("rollout_id")
            age = now - max(os.stat(os.path.join(directory, f)).st_mtime for f in ("plan.json", JOURNAL)
                            if os.path.exists(os.path.join(directory, f)))
        except (OSError, ValueError):
            continue
        listed = plan.get("nodes") if isinstance(plan.get("nodes"), list) else []
        overlap = sorted(set(nodes) & set(n.get("name") for n in listed if isinstance(n, dict)
                                          and isinstance(n.get("name"), str)))
        if other == rollout_id or not overlap:
            continue
        journal = read_journal(directory)["nodes"]
        flying = sorted(n for n, s in journal.items() if s.get("status") == "in_flight")
        latest = list(state_file.iter_names(plan.get("runs")))[-1:]
        runs = sorted(set(str(journal[n].get("run_id") or "") for n in flying) | set(latest))
        for run_id in runs:
            live = alive(run_id)
            if live or (live is None and age <= stale_s):
                found.append({"rollout_id": other, "report_dir": directory, "overlap": overlap, "in_flight": flying,
                              "run_id": run_id, "age_s": round(age, 1)})
                break
    return found
