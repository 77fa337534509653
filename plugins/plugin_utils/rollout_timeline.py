# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout over time, from its journal (``rollout_journal``): nodes per state, and each node's step.

The journal says when a node was admitted (``started``) and when its transaction ended
(``finished``, with ``done`` / ``failed`` / ``refused``); ``rollout_report.render`` adds a
``{"event": "rendered", "time", "step": bool}`` line at the end of each step (no ``node``, so the
fold of node states skips it). Pure functions over the journal's lines.
"""

from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, Mapping, Optional

#: States of a node over time, in the order they stack in the timeline.
STATES = ("done", "failed", "refused", "in_flight", "pending")


def parse(lines: Iterable[str]) -> List[Dict[str, Any]]:
    """The journal's events with a numeric ``time``, in journal order (a line that is not a JSON
    object is skipped: only the last line of a killed writer can be cut)."""
    out = []
    for line in lines:
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("time"), (int, float)):
            out.append(event)
    return out


def timeline(events: List[Mapping[str, Any]], planned: int, max_points: int = 400) -> Dict[str, Any]:
    """Nodes per state over time (linear in the events).

    :param events: :func:`parse` of the journal's lines.
    :param planned: nodes in the plan (those the journal never named are ``pending``).
    :param max_points: at most this many points; a longer journal is sampled at even times (the
        state at each sample time, as a step function is).
    :returns: ``{"start", "end" (epoch s, None without events), "points": [{"time" (epoch s),
        "counts": {state: n}}]}``, a point per event time (the state after its events).
    """
    events = sorted(events, key=lambda e: e["time"])
    state = {}  # type: Dict[str, str]
    counts = dict((name, 0) for name in STATES)
    points = []  # type: List[Dict[str, Any]]
    for event in events:
        node = event.get("node")
        if not isinstance(node, str):
            continue
        kind = event.get("event")
        if kind in ("started", "held"):
            now = "in_flight"
        elif kind == "finished" and event.get("status") in ("done", "failed", "refused"):
            now = event["status"]
        else:
            continue
        if node in state:
            counts[state[node]] -= 1
        state[node] = now
        counts[now] += 1
        counts["pending"] = max(0, planned - len(state))
        if points and points[-1]["time"] == event["time"]:
            points.pop()
        points.append({"time": event["time"], "counts": dict(counts)})
    if len(points) > max_points > 1:
        start, end = points[0]["time"], points[-1]["time"]
        sampled, at = [], 0
        for i in range(max_points):
            when = start + (end - start) * i / (max_points - 1)
            while at + 1 < len(points) and points[at + 1]["time"] <= when:
                at += 1
            sampled.append({"time": when, "counts": points[at]["counts"]})
        points = sampled
    return {"start": points[0]["time"] if points else None, "end": points[-1]["time"] if points else None,
            "points": points}


def steps(events: List[Mapping[str, Any]]) -> Dict[str, int]:
    """``{node: step}``: the step (1, 2, ...) in which each node was last admitted.

    :param events: :func:`parse` of the journal's lines.

    A step ends at a ``rendered`` line with ``step`` true (``rollout_report.render`` at the end of
    a step); a node admitted after the n-th such line was admitted in step n + 1. Steps count over
    every run of the rollout, in journal order.
    """
    out = {}  # type: Dict[str, int]
    ended = 0
    for event in events:
        if event.get("event") == "rendered" and event.get("step"):
            ended += 1
        elif event.get("event") == "started" and isinstance(event.get("node"), str):
            out[event["node"]] = ended + 1
    return out


def svg_paths(line: Mapping[str, Any], width: float, height: float) -> Dict[str, Any]:
    """The stacked areas of a :func:`timeline` as SVG path data, for a ``width`` × ``height`` box.

    :returns: ``{"areas": [{"state", "d"}], "ticks": [{"x", "label"}] (elapsed time), "max": nodes}``;
        ``areas`` is empty without points. x is time from the start (a step after each event),
        y the count of nodes (all planned nodes fill the height).
    """
    points = line.get("points") or []
    if not points:
        return {"areas": [], "ticks": [], "max": 0}
    # The last state is drawn for a twentieth of the span after the last event (at least a second).
    start = line["start"]
    end = line["end"] + max(1.0, (line["end"] - start) / 20.0)
    span = float(end - start)
    total = max(sum(p["counts"].values()) for p in points) or 1

    def x(when):
        return round(width * (when - start) / span, 2)

    def y(value):
        return round(height - height * value / float(total), 2)
    areas = []
    below = [0] * len(points)
    for name in STATES:
        top = [below[i] + points[i]["counts"].get(name, 0) for i in range(len(points))]
        if any(top[i] != below[i] for i in range(len(points))):
            upper, lower = [], []
            for i, point in enumerate(points):
                nxt = points[i + 1]["time"] if i + 1 < len(points) else end
                upper += ["%s,%s" % (x(point["time"]), y(top[i])), "%s,%s" % (x(nxt), y(top[i]))]
                lower += ["%s,%s" % (x(point["time"]), y(below[i])), "%s,%s" % (x(nxt), y(below[i]))]
            areas.append({"state": name, "d": "M" + " L".join(upper + list(reversed(lower))) + " Z"})
        below = top
    ticks = []
    for i in range(5):
        offset = span * i / 4
        ticks.append({"x": round(width * i / 4, 2), "label": _elapsed(offset)})
    return {"areas": areas, "ticks": ticks, "max": total}


def _elapsed(seconds: Optional[float]) -> str:
    seconds = int(round(seconds or 0))
    if seconds < 600:
        return "%d s" % seconds
    if seconds < 7200:
        return "%d min" % (seconds // 60)
    return "%.1f h" % (seconds / 3600.0)
