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

A node started and not finished is in flight: the next step resumes it first (its transaction
reads its own state on the node and continues, or finds it done). Appending costs the same
whatever the journal's length; reading it is linear in its lines.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional

JOURNAL = "journal.jsonl"


@contextlib.contextmanager
def locked(directory: str) -> Iterator[None]:
    """Hold an exclusive ``fcntl.flock`` on ``<directory>/.lock`` (I/O: creates the directory)."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def append(directory: str, event: Mapping[str, Any]) -> None:
    """Append one event (I/O: creates the directory; ``fsync`` before the lock is released)."""
    with locked(directory):
        append_in_lock(directory, event)


def append_in_lock(directory: str, event: Mapping[str, Any]) -> None:
    """Append one event while the caller holds :func:`locked` on ``directory`` (I/O)."""
    with open(os.path.join(directory, JOURNAL), "a", encoding="utf-8") as handle:
        handle.write(json.dumps(dict(event), sort_keys=True) + "\n")
        handle.flush()
        os.fsync(handle.fileno())


def fold_lines(lines: Any) -> Dict[str, Dict[str, Any]]:
    """Fold journal lines into the state of each node.

    :param lines: an iterable of text lines (a line that is not a whole JSON object is skipped:
        only the last line of a killed writer can be cut, and it said nothing yet).
    :returns: ``{node: {"status": "in_flight" | "done" | "failed" | "refused", "started_at",
        "finished_at", "result", "changed", "signature", "implicates_driver", "target",
        "run_id", "draining"?, "drained"?, "pending"?, "contract_changes"?}}``; nodes the journal never named are absent (not started);
        ``pending`` is true for a node in flight that waits for its scheduler's reboot.
    """
    state = {}  # type: Dict[str, Dict[str, Any]]
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict) or not isinstance(event.get("node"), str):
            continue
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
            node.pop("draining", None)
            node.pop("drained", None)
            if "contract_changes" in event:
                # Kept as written (even corrupt): contract_decision.checked_changes reads it, fail closed.
                node["contract_changes"] = event["contract_changes"]
        elif kind in ("draining", "drained", "installing") and node.get("status") == "in_flight":
            node["draining"] = kind == "draining"
            node["drained"] = kind == "drained"
        elif kind == "pending":
            node.update({"status": "in_flight", "pending": True})
            node.pop("draining", None)
            node.pop("drained", None)
        elif kind == "resumed":
            node.pop("pending", None)
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
            node["finished_at"] = event.get("time")
    return state


def read(directory: str) -> Dict[str, Dict[str, Any]]:
    """The state of each node named in ``<directory>/journal.jsonl`` (I/O; ``{}`` when absent)."""
    try:
        with open(os.path.join(directory, JOURNAL), "r", encoding="utf-8") as handle:
            return fold_lines(handle)
    except (IOError, OSError):
        return {}


def fleet_state(plan: Mapping[str, Any], journal: Mapping[str, Mapping[str, Any]]) -> List[Dict[str, Any]]:
    """The nodes for ``rollout_budget.decide``: the plan's nodes (in order) with their journal state.

    :param plan: ``plan.json`` (``nodes``: ``[{"name", "stage", "class", "domain"}]``).
    :param journal: :func:`read`.
    :returns: ``[{"name", "stage", "class", "domain", "status", "signature"?,
        "implicates_driver"?, "target"?, "changed"?, "finished_at"?, "draining"?, "drained"?, "contract_changes"?}]``.
    """
    nodes = []
    for node in plan.get("nodes") or []:
        state = journal.get(node["name"]) or {}
        row = dict(node)
        row["status"] = state.get("status") or "pending"
        for key in ("signature", "implicates_driver", "target", "changed", "finished_at", "result", "out_of_service",
                    "draining", "drained"):
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
    except those pending (:func:`pending`).

    At the end of a step every host of the step has ended its play, so a node of the step still
    in flight lost its connection or failed outside its transaction's rescue: it has no record.
    """
    return [n for n in nodes if (journal.get(n) or {}).get("status") == "in_flight"
            and not (journal.get(n) or {}).get("pending")]


def pending(journal: Mapping[str, Mapping[str, Any]], nodes: Any) -> List[str]:
    """The nodes among ``nodes`` in flight that wait for a reboot their scheduler runs (a ``pending``
    event, not followed by ``resumed`` or ``finished``): recorded, holding their slot."""
    return [n for n in nodes if (journal.get(n) or {}).get("status") == "in_flight"
            and (journal.get(n) or {}).get("pending")]


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
        try:
            with open(os.path.join(directory, "plan.json"), "r", encoding="utf-8") as handle:
                plan = json.load(handle)
            other = plan.get("rollout_id")
            age = now - max(os.stat(os.path.join(directory, f)).st_mtime for f in ("plan.json", JOURNAL)
                            if os.path.exists(os.path.join(directory, f)))
        except (OSError, ValueError, AttributeError):
            continue
        overlap = sorted(set(nodes) & set(n.get("name") for n in plan.get("nodes") or [] if isinstance(n, dict)))
        if other == rollout_id or not overlap:
            continue
        journal = read(directory)
        flying = sorted(n for n, s in journal.items() if s.get("status") == "in_flight")
        runs = sorted(set(journal[n].get("run_id") or "" for n in flying) | set((plan.get("runs") or [])[-1:]))
        for run_id in runs:
            live = alive(run_id)
            if live or (live is None and age <= stale_s):
                found.append({"rollout_id": other, "report_dir": directory, "overlap": overlap, "in_flight": flying,
                              "run_id": run_id, "age_s": round(age, 1)})
                break
    return found
