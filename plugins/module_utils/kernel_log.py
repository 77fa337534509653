# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Read NVIDIA Xid events (and a few other NVRM facts) out of kernel log text.

Pure functions: they take the text of a kernel log and return dicts; reading the log
(``dmesg``, ``journalctl -k``, a captured ``dmesg.txt``) is the caller's job.

Accepted line formats (mixed freely):

- ``dmesg``: ``[ 1234.567890] NVRM: ...`` (seconds since boot), also ``dmesg -r``
  (``<4>[ ...]``) and ``dmesg -x`` (``kern  :err   : [ ...]``);
- ``dmesg -t`` / ``--notime``: no prefix at all;
- ``dmesg -T`` / ``--ctime``: ``[Sun Feb 23 16:24:18 2025] NVRM: ...``;
- ``dmesg --time-format iso``: ``2025-02-23T16:24:18,123456+00:00 NVRM: ...``;
- ``journalctl -k`` (``short``, ``short-precise``, ``short-iso``, ``short-full``) and syslog
  files: ``Feb 23 16:24:18 host kernel: NVRM: ...``, with or without the kernel's own
  ``[ 1234.567890]`` after ``kernel:``; ``journalctl -o short-monotonic``:
  ``[ 1234.567890] host kernel: NVRM: ...``. Such a line may itself be wrapped in text
  (an alerting system's "Error: May 19 07:08:57 host kernel: ..."), which is skipped;
- ``journalctl`` boot separators (``-- Boot 3f2a... --``, ``-- Reboot --``).

A message the kernel printed as several lines (one ``printk`` with newlines, as the NVIDIA driver
does for "API mismatch" and some "fallen off the bus" messages) shows its second and later lines
without a timestamp. A line without a timestamp is a continuation of the line before when it is
indented or when that line had a timestamp; its ``NVRM:`` prefix is dropped and the text joined.

Xid lines: ``NVRM: Xid (PCI:0000:9b:00): 119, pid=2024380, name=nvidia-smi, <message>``. The bus
id may lack ``PCI:``, the domain or the function; it is normalised to ``0000:9b:00.0``
(:func:`facts_model.normalize_pci_bus_id`). ``GPU has fallen off the bus`` without an Xid number
(``NVRM: GPU at PCI:0000:3b:00: GPU has fallen off the bus.``, ``NVRM: GPU 0000:3b:00.0: GPU has
fallen off the bus.``, ``NVRM: The NVIDIA GPU 0000:3b:00.0 (PCI ID: 10de:2330) installed in this
system has fallen off the bus ...``) counts as Xid 79. Xid numbers come from NVIDIA's Xid
documentation (https://docs.nvidia.com/deploy/xid-errors/); the line format from the NVIDIA
kernel driver's log output, as seen in field cases 06, 08, 09 and 23.

Incidents: lines of the same Xid on the same device fold into one event, with ``count``, while
each follows the previous one within ``incident_window_s`` seconds (default
:data:`DEFAULT_INCIDENT_WINDOW_S`, 60 s; a storm of lines 6 s apart stays one event however long
it lasts). When the lines carry no time, lines fold while no other Xid on the same device came in
between. A boot separator ends every incident. An unnumbered "fallen off the bus" line next to a
numbered Xid 79 of the same device is the same failure told twice and does not add to ``count``.

Rate limiting: when the kernel or the driver says it dropped messages, the counts are lower
bounds. Recognised: the driver's own ``NVRM: Rate limiting ... prints ...`` line, ``<function>:
N callbacks suppressed`` where the function is NVIDIA's (``nv*``, ``NVRM``, ``nvidia*``, ``os_*``)
or the kernel's shared limiter (``__ratelimit``, ``printk_ratelimit``, ``printk``), and ``printk:
N messages suppressed``. "callbacks suppressed" lines of other subsystems (``net_ratelimit``,
``quiet_error``, ...) say nothing about NVIDIA messages and are not counted.

Compatible with Python 3.9; standard library only.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Dict, Iterable, List, Optional, Tuple, Union

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id
from ansible_collections.gpufleet.nvidia.plugins.module_utils.xid_catalog import (
    ACTIONS,
    SEVERITIES,
    action_rank,
    classify,
    severity_rank,
)

DEFAULT_INCIDENT_WINDOW_S = 60.0

_MON = r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)"
_DOW = r"(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)"
_ISO_TIME = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
_MONTHS = {m: i + 1 for i, m in enumerate(
    ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"))}

# "<wall time> <host> kernel: " (journalctl -k short*, syslog), searched anywhere in the line.
_SYSLOG = re.compile(
    r"(?:^|\s)(?P<wall>" + _MON + r" {1,2}\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?"
    r"|" + _DOW + r" \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Za-z][\w+-]*)?"
    r"|" + _ISO_TIME + r")"
    r" (?P<host>\S+) kernel: "
)
_MONO = re.compile(r"^\[\s*(?P<mono>\d+\.\d+)\]\s?")
_CTIME = re.compile(r"^\[(?P<wall>" + _DOW + " " + _MON + r" {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4})\]\s?")
_ISO = re.compile(r"^(?P<wall>" + _ISO_TIME + r")\s")
_LEVEL = re.compile(r"^<\d+>")
_DECODE = re.compile(r"^[a-z]+\s*:[a-z]+\s*: ")
_KERNEL_TAG = re.compile(r"^\S+ kernel: ")
_BOOT_MARK = re.compile(r"^-- (?:Boot [0-9a-f]+|Reboot) --")

_XID = re.compile(r"NVRM: Xid \((?P<bus>[^)]*)\)\s*:\s*(?P<xid>\d+)\b,?\s*(?P<msg>.*)$")
_PID = re.compile(r"^pid=['\"]?(?P<pid><unknown>|\d+)['\"]?\s*(?:,\s*|$)")
_NAME = re.compile(r"^name=(?P<name>[^,]*?)\s*(?:,\s*|$)")
_FALLEN = re.compile(r"fallen off the bus", re.IGNORECASE)
_GPU_BUS = re.compile(
    r"GPU (?:at )?(?:PCI:)?(?P<bus>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\b")
_NV_RATE = re.compile(r"NVRM:.*\brate[- ]limit", re.IGNORECASE)
_CALLBACKS = re.compile(r"(?P<func>[\w.$-]+): \d+ callbacks suppressed")
_NV_FUNC = re.compile(r"^(?:nv|os_|_nv|NVRM|__ratelimit$|printk_ratelimit$|printk$)", re.IGNORECASE)
_PRINTK_SUPPRESSED = re.compile(r"\bprintk: \d+ messages suppressed")
_API_MISMATCH = re.compile(
    r"API mismatch: the client(?: '(?P<client>[^']*)' \(pid (?P<pid>\d+)\))?\s+has the version "
    r"(?P<client_version>\d[\d.]*\d),?\s+but\s+this kernel module has the version "
    r"(?P<kernel_version>\d[\d.]*\d)")

EventDict = Dict[str, Any]


class _Record:
    """One kernel message: its first physical line plus continuation lines."""

    __slots__ = ("first_line", "text", "mono", "wall", "stamped", "marker", "has_nvrm")

    def __init__(self, first_line: str, text: str, mono: Optional[float], wall: Optional[str],
                 stamped: bool, marker: bool) -> None:
        self.first_line = first_line
        self.text = text
        self.mono = mono
        self.wall = wall
        self.stamped = stamped
        self.marker = marker
        self.has_nvrm = "NVRM" in text

    def add(self, continuation: str) -> None:
        piece = continuation.strip()
        if piece.startswith("NVRM:"):
            self.has_nvrm = True
            piece = piece[len("NVRM:"):].strip()
        if piece:
            self.text = "%s %s" % (self.text, piece) if self.text else piece


def _split_prefix(line: str) -> Tuple[Optional[float], Optional[str], str, bool]:
    """Return (seconds since boot, printed wall time, message text, had a time prefix)."""
    rest = _DECODE.sub("", _LEVEL.sub("", line, count=1), count=1)
    mono = None  # type: Optional[float]
    wall = None  # type: Optional[str]
    syslog = _SYSLOG.search(rest)
    if syslog:
        wall = syslog.group("wall")
        rest = rest[syslog.end():]
    else:
        match = _MONO.match(rest)
        if match:
            mono = float(match.group("mono"))
            rest = _KERNEL_TAG.sub("", rest[match.end():], count=1)
        else:
            match = _CTIME.match(rest) or _ISO.match(rest)
            if match:
                wall = match.group("wall")
                rest = rest[match.end():]
    if mono is None:
        match = _MONO.match(rest)
        if match:
            mono = float(match.group("mono"))
            rest = rest[match.end():]
    return mono, wall, rest.strip(), (mono is not None or wall is not None)


def _records(text: str) -> List[_Record]:
    records = []  # type: List[_Record]
    for raw in (text or "").splitlines():
        line = raw.rstrip("\r\n")
        if not line.strip():
            continue
        if _BOOT_MARK.match(line.strip()):
            records.append(_Record(line, "", None, None, False, True))
            continue
        mono, wall, rest, stamped = _split_prefix(line)
        previous = records[-1] if records else None
        if (not stamped and previous is not None and not previous.marker
                and (line[:1].isspace() or previous.stamped)):
            previous.add(line)
            continue
        records.append(_Record(line, rest, mono, wall, stamped, False))
    return records


def _wall_seconds(wall: Optional[str]) -> Optional[float]:
    """Seconds of a printed wall time, for differences only (year 2000 when none is printed)."""
    if not wall:
        return None
    text = wall.strip()
    try:
        match = re.match(_DOW + " (" + _MON + r") {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})$", text)
        if match:
            stamp = datetime(int(match.group(6)), _MONTHS[match.group(1)], int(match.group(2)),
                             int(match.group(3)), int(match.group(4)), int(match.group(5)))
            return (stamp - datetime(1970, 1, 1)).total_seconds()
        match = re.match("(" + _MON + r") {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d)(\.\d+)?$", text)
        if match:
            stamp = datetime(2000, _MONTHS[match.group(1)], int(match.group(2)),
                             int(match.group(3)), int(match.group(4)), int(match.group(5)))
            return (stamp - datetime(1970, 1, 1)).total_seconds() + float(match.group(6) or 0)
        match = re.search(r"(\d{4}-\d\d-\d\d)[T ](\d\d:\d\d:\d\d)([.,]\d+)?(Z|[+-]\d\d:?\d\d)?", text)
        if match:
            stamp = datetime.strptime(match.group(1) + " " + match.group(2), "%Y-%m-%d %H:%M:%S")
            seconds = (stamp - datetime(1970, 1, 1)).total_seconds()
            seconds += float((match.group(3) or "0").replace(",", ".") or 0)
            zone = match.group(4)
            if zone and zone != "Z":
                sign = -1 if zone[0] == "-" else 1
                digits = zone[1:].replace(":", "")
                seconds -= sign * (int(digits[:2]) * 3600 + int(digits[2:4]) * 60)
            return seconds
    except ValueError:
        return None
    return None


def _bus_id(raw: Optional[str]) -> Optional[str]:
    if raw is None:
        return None
    text = raw.strip()
    normalised = normalize_pci_bus_id(text)
    if normalised is not None:
        return normalised
    text = re.sub(r"^PCI:", "", text, flags=re.IGNORECASE).lower()
    return text or None


def _pid_and_process(message: str) -> Tuple[Optional[int], Optional[str]]:
    pid = None  # type: Optional[int]
    process = None  # type: Optional[str]
    rest = message
    match = _PID.match(rest)
    if match:
        if match.group("pid").isdigit():
            pid = int(match.group("pid"))
        rest = rest[match.end():]
        match = _NAME.match(rest)
        if match:
            name = match.group("name").strip()
            if name and name not in ("<unknown>", "'<unknown>'"):
                process = name
    return pid, process


def _is_rate_limit(text: str) -> bool:
    if _NV_RATE.search(text) or _PRINTK_SUPPRESSED.search(text):
        return True
    match = _CALLBACKS.search(text)
    if match:
        return bool(_NV_FUNC.match(match.group("func")) or "NVRM" in text[:match.start()])
    return False


def _time_of(record: _Record) -> Union[float, str, None]:
    if record.mono is not None:
        return record.mono
    return record.wall


def _clock_of(record: _Record) -> Tuple[Optional[str], Optional[float]]:
    """(kind, seconds) used to compare two lines' times: monotonic or wall, never mixed."""
    if record.mono is not None:
        return "mono", record.mono
    seconds = _wall_seconds(record.wall)
    if seconds is not None:
        return "wall", seconds
    return None, None


def _apply_class(event: EventDict, entry: Dict[str, Any]) -> None:
    event["name"] = entry["name"]
    event["severity"] = entry["severity"]
    event["action"] = entry["action"]
    event["fatal"] = entry["fatal"]
    event["known"] = entry["known"]


class _Incidents:
    """Folds Xid lines into events per (device, Xid) and incident."""

    def __init__(self, window_s: float, boot_time: Optional[float]) -> None:
        self.window_s = window_s
        self.boot_time = boot_time
        self.events = []  # type: List[EventDict]
        self._open = {}  # type: Dict[Tuple[Optional[str], int], Dict[str, Any]]
        self._last_on_device = {}  # type: Dict[Optional[str], Tuple[Optional[str], int]]

    def reset(self) -> None:
        self._open = {}
        self._last_on_device = {}

    def _folds(self, key: Tuple[Optional[str], int], state: Dict[str, Any], record: _Record) -> bool:
        kind, seconds = _clock_of(record)
        if kind is not None and kind == state["clock"] and state["seconds"] is not None:
            return abs(seconds - state["seconds"]) <= self.window_s
        return self._last_on_device.get(key[0]) == key

    def add(self, bus: Optional[str], xid: int, message: str, record: _Record, numbered: bool) -> None:
        key = (bus, xid)
        state = self._open.get(key)
        kind, seconds = _clock_of(record)
        if state is not None and self._folds(key, state, record):
            event = state["event"]
            if numbered:
                state["numbered"] += 1
            else:
                state["unnumbered"] += 1
            event["count"] = state["numbered"] or state["unnumbered"]
            event["last_time"] = _time_of(record)
            if kind is not None:
                state["clock"], state["seconds"] = kind, seconds
            if numbered and not state["had_numbered"]:
                # The numbered line carries the driver's own message: prefer it.
                state["had_numbered"] = True
                event["message"] = message
            entry = classify(xid, message)
            if severity_rank(entry["severity"]) > severity_rank(event["severity"]):
                _apply_class(event, entry)
        else:
            pid, process = _pid_and_process(message) if numbered else (None, None)
            time = _time_of(record)
            event = {
                "pci_bus_id": bus,
                "xid": xid,
                "name": None,
                "message": message,
                "time": time,
                "last_time": time,
                "wall_time": record.wall,
                "epoch_s": (round(self.boot_time + record.mono, 6)
                            if self.boot_time is not None and record.mono is not None else None),
                "count": 1,
                "severity": None,
                "action": None,
                "fatal": None,
                "known": None,
                "pid": pid,
                "process": process,
                "first_line": record.first_line.strip(),
            }
            _apply_class(event, classify(xid, message))
            self.events.append(event)
            self._open[key] = {
                "event": event,
                "clock": kind,
                "seconds": seconds,
                "numbered": 1 if numbered else 0,
                "unnumbered": 0 if numbered else 1,
                "had_numbered": numbered,
            }
        self._last_on_device[bus] = key


def _fallen_off_bus(record: _Record, previous: Optional[_Record]) -> Optional[Tuple[Optional[str], str]]:
    """(bus id or None, message) when the record says a GPU fell off the bus without an Xid number."""
    if not _FALLEN.search(record.text):
        return None
    previous_nvrm = previous is not None and not previous.marker and previous.has_nvrm
    if not record.has_nvrm and not previous_nvrm:
        return None
    match = _GPU_BUS.search(record.text)
    if match is None and previous_nvrm and not _XID.search(previous.text):
        match = _GPU_BUS.search(previous.text)
    message = re.sub(r"^NVRM:\s*", "", record.text)
    return (_bus_id(match.group("bus")) if match else None), message


def _api_mismatch(record: _Record, following: List[_Record]) -> Optional[Dict[str, Any]]:
    if "API mismatch" not in record.text:
        return None
    text = record.text
    match = _API_MISMATCH.search(text)
    for extra in following[:4]:
        if match is not None or extra.stamped or extra.marker:
            break
        text = "%s %s" % (text, re.sub(r"^NVRM:\s*", "", extra.text))
        match = _API_MISMATCH.search(text)
    if match is None:
        return None
    return {
        "client": match.group("client"),
        "pid": int(match.group("pid")) if match.group("pid") else None,
        "client_version": match.group("client_version"),
        "kernel_module_version": match.group("kernel_version"),
        "time": _time_of(record),
        "wall_time": record.wall,
        "first_line": record.first_line.strip(),
    }


def parse_kernel_log(text: str, boot_time: Optional[float] = None,
                     incident_window_s: float = DEFAULT_INCIDENT_WINDOW_S) -> Dict[str, Any]:
    """Parse kernel log text into Xid events, folded per device and incident.

    :param text: kernel log text: ``dmesg`` (any of the formats in the module docstring),
        ``journalctl -k`` output or a syslog extract. Lines that are not NVIDIA Xid messages
        (other NVRM messages, ``nvidia-peermem``, ``perf``, stack dumps) produce no event.
    :param boot_time: the boot time as seconds since the epoch (``/proc/stat`` ``btime``), or
        ``None``. When given, events whose line has a seconds-since-boot stamp get ``epoch_s``.
    :param incident_window_s: seconds between two lines of the same Xid on the same device
        that still fold into one event (see the module docstring), default 60.
    :returns: ``{"events": [event, ...], "rate_limited": bool, "rate_limit_lines": [str],
        "api_mismatches": [mismatch, ...], "incident_window_s": float}``. Events are in the
        order of their first line; each is ``{"pci_bus_id": "0000:9b:00.0" | None, "xid": int,
        "name": str, "message": str, "time": float (seconds since boot) | str (the printed wall
        time, when the line has no seconds-since-boot stamp) | None, "last_time": same for the
        incident's last line, "wall_time": str | None, "epoch_s": float | None, "count": int
        (lines folded; a lower bound when ``rate_limited``), "severity": str, "action": str,
        "fatal": bool, "known": bool, "pid": int | None, "process": str | None (the process
        the driver named), "first_line": str (the incident's first log line, verbatim)}``;
        ``name``/``severity``/``action``/``fatal``/``known`` come from
        :func:`xid_catalog.classify` (the worst seen in the incident). ``rate_limited`` is
        true when a line says the kernel or the driver dropped messages; those lines are
        listed in ``rate_limit_lines``. ``api_mismatches`` is
        :func:`parse_nvrm_api_mismatch` of the same text.
    :raises: nothing; unreadable lines are skipped.
    Sources: NVIDIA kernel driver (NVRM) log lines; Xid catalog in ``xid_catalog``.
    """
    window = float(incident_window_s)
    records = _records(text)
    incidents = _Incidents(window, boot_time)
    rate_limit_lines = []  # type: List[str]
    mismatches = []  # type: List[Dict[str, Any]]
    previous = None  # type: Optional[_Record]
    for index, record in enumerate(records):
        if record.marker:
            incidents.reset()
            previous = record
            continue
        match = _XID.search(record.text)
        if match:
            incidents.add(_bus_id(match.group("bus")), int(match.group("xid")),
                          match.group("msg").strip(), record, True)
        else:
            fallen = _fallen_off_bus(record, previous)
            if fallen is not None:
                incidents.add(fallen[0], 79, fallen[1], record, False)
            elif _is_rate_limit(record.text):
                rate_limit_lines.append(record.first_line.strip())
            else:
                mismatch = _api_mismatch(record, records[index + 1:])
                if mismatch is not None:
                    mismatches.append(mismatch)
        previous = record
    return {
        "events": incidents.events,
        "rate_limited": bool(rate_limit_lines),
        "rate_limit_lines": rate_limit_lines,
        "api_mismatches": mismatches,
        "incident_window_s": window,
    }


def parse_nvrm_api_mismatch(text: str) -> List[Dict[str, Any]]:
    """Find the NVIDIA driver's "API mismatch" messages in kernel log text.

    The driver logs one when a user-space component (``libcuda``, ``libnvidia-ml``, X/Wayland
    driver) of one version opens a kernel module of another, e.g.
    ``NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)`` / ``NVRM: has the version
    595.84, but this kernel module has`` / ``NVRM: the version 595.80.  Please make sure ...``
    (field case 23). Evidence that the loaded module and the user-space libraries differ.

    :param text: kernel log text, in any format :func:`parse_kernel_log` accepts.
    :returns: a list, in log order, of ``{"client": str | None (process name, when printed),
        "pid": int | None, "client_version": str (user space, e.g. "595.84"),
        "kernel_module_version": str (the loaded module, e.g. "595.80"), "time": float |
        str | None (as in events), "wall_time": str | None, "first_line": str}``.
    :raises: nothing.
    Source: NVIDIA kernel driver (NVRM) "API mismatch" message.
    """
    return parse_kernel_log(text)["api_mismatches"]


def summarize_xids(events: Union[Dict[str, Any], Iterable[EventDict]],
                   rate_limited: Optional[bool] = None) -> Dict[str, Any]:
    """Summarise Xid events for gates and reports.

    :param events: the result of :func:`parse_kernel_log` (its ``events`` and ``rate_limited``
        are used), or a list of its events (e.g. ``ansible_facts.nvidia.xid_events``).
    :param rate_limited: overrides the result's flag; ``None`` keeps it (``False`` for a list).
    :returns: ``{"total": int (sum of counts), "incidents": int (number of events),
        "by_xid": {"<xid>": count}, "by_device": {"<pci_bus_id>" or "unknown": count},
        "worst_severity": str | None, "worst_action": str | None, "any_fatal": bool,
        "fatal_xids": [int, ...] (sorted), "rate_limited": bool}``. Keys of ``by_xid`` and
        ``by_device`` are strings so the summary survives JSON unchanged. ``None`` worst values
        when there is no event. Severity order: :data:`xid_catalog.SEVERITIES`; action order:
        :data:`xid_catalog.ACTIONS`.
    :raises: nothing.
    """
    flag = False
    if isinstance(events, dict):
        flag = bool(events.get("rate_limited"))
        items = list(events.get("events") or [])
    else:
        items = list(events or [])
    if rate_limited is not None:
        flag = bool(rate_limited)
    by_xid = {}  # type: Dict[str, int]
    by_device = {}  # type: Dict[str, int]
    worst_severity = -1
    worst_action = -1
    fatal_xids = set()
    total = 0
    for event in items:
        count = int(event.get("count") or 1)
        total += count
        xid_key = str(event.get("xid"))
        by_xid[xid_key] = by_xid.get(xid_key, 0) + count
        device = event.get("pci_bus_id") or "unknown"
        by_device[device] = by_device.get(device, 0) + count
        worst_severity = max(worst_severity, severity_rank(event.get("severity")))
        worst_action = max(worst_action, action_rank(event.get("action")))
        if event.get("fatal"):
            fatal_xids.add(int(event["xid"]))
    return {
        "total": total,
        "incidents": len(items),
        "by_xid": by_xid,
        "by_device": by_device,
        "worst_severity": SEVERITIES[worst_severity] if worst_severity >= 0 else None,
        "worst_action": ACTIONS[worst_action] if worst_action >= 0 else None,
        "any_fatal": bool(fatal_xids),
        "fatal_xids": sorted(fatal_xids),
        "rate_limited": flag,
    }
