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
- ``/dev/kmsg`` records (``6,3964,206764307,-;NVRM: ...``: level, sequence number, microseconds
  since boot, flags, then the message), as agents that read the kernel's ring buffer keep them;
- a syslog line cut to ``kernel: NVRM: ...`` (time and host left out);
- Talos Linux (``talosctl dmesg``): ``node-a: kern: warning: [2026-04-22T21:30:51.870495804Z]:
  NVRM: ...`` (the node, facility and level, then the RFC 3339 wall time in brackets);
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

Bounds: per (device, Xid) the first incident and the newest ones are kept one by one
(:data:`XID_EVENTS_PER_KEY` in all), the others fold into *elided* entries that keep their line
and incident counts, so a storm of 100,000 lines gives a few dozen events and the counts stay
exact (see :func:`parse_kernel_log`). Parsing is linear in the size of the text.

Rate limiting: when the kernel or the driver says it dropped messages, the counts are lower
bounds. Recognised: the driver's own ``NVRM: Rate limiting ... prints ...`` line, ``<function>:
N callbacks suppressed`` where the function is NVIDIA's (``nv*``, ``NVRM``, ``nvidia*``, ``os_*``)
or the kernel's shared limiter (``__ratelimit``, ``printk_ratelimit``, ``printk``), and ``printk:
N messages suppressed``. "callbacks suppressed" lines of other subsystems (``net_ratelimit``,
``quiet_error``, ...) say nothing about NVIDIA messages and are not counted.

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from collections import deque
from datetime import datetime
from typing import Any, Deque, Dict, Iterable, List, Optional, Tuple, Union

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_model import normalize_pci_bus_id
from ansible_collections.gpufleet.nvidia.plugins.module_utils.xid_catalog import (
    ACTIONS,
    SEVERITIES,
    action_rank,
    classify,
    severity_rank,
)

DEFAULT_INCIDENT_WINDOW_S = 60.0

#: Individual incidents kept in ``events`` per (PCI bus id, Xid): the first one and the newest
#: ``XID_EVENTS_PER_KEY - 1``; the others are folded into elided entries (see :func:`parse_kernel_log`).
XID_EVENTS_PER_KEY = 8

#: Distinct (PCI bus id, Xid) pairs whose events are kept; incidents of further pairs are folded
#: into one elided entry per (Xid, fatal) with ``pci_bus_id`` ``None``, at most this many again.
MAX_XID_KEYS = 128

#: Characters kept of an event's ``message`` and ``first_line`` (the kernel prints at most about
#: 1,000 per line; a message joined from continuation lines can be longer).
MAX_MESSAGE_CHARS = 1024

# journalctl, syslog and ``dmesg -T`` print the day and month names of the node's LC_TIME locale:
# "Jun 09" (C, en_US), "jun 09" (es_ES, nl_NL), "juin" / "janv." (fr_FR), "Mär" (de_DE). A name is
# any short word of letters, with an optional trailing dot; the time and " kernel: " after it keep
# the prefix specific.
_MON = r"(?:[^\W\d_]{3,5}\.?)"
_DOW = r"(?:[^\W\d_]{2,4}\.?)"
_ISO_TIME = r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
#: Month names → number, lower case and without the dot: English (C locale) and the abbreviations
#: glibc prints for the common European locales. A name not here leaves the wall time unread
#: (``_wall_seconds`` gives ``None``), never the line.
_MONTHS = dict((name, number) for number, names in enumerate((
    "jan ene gen janv jän", "feb febr févr fév fev", "mar mär mars maart", "apr abr avr avril",
    "may mai mei mag maio", "jun juin giu", "jul juil lug", "aug ago août aoû",
    "sep sept set", "oct okt ott out", "nov", "dec dic dez déc"), 1) for name in names.split())


def _month(name: str) -> int:
    """The number of a printed month name (any case, trailing dot dropped); KeyError when unknown."""
    return _MONTHS[name.rstrip(".").lower()]


# "<wall time> <host> kernel: " (journalctl -k short*, syslog), searched anywhere in the line.
_SYSLOG = re.compile(
    r"(?:^|\s)(?P<wall>" + _MON + r" {1,2}\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?"
    r"|" + _DOW + r" \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?: [A-Za-z][\w+-]*)?"
    r"|" + _ISO_TIME + r")"
    r" (?P<host>\S+) kernel: "
)
# Talos Linux (``talosctl dmesg``): "<node>: <facility>: <level>: [<RFC 3339 time>]: <message>" (field case 30).
_TALOS = re.compile(r"^\S+: [a-z]+: [a-z]+: \[(?P<wall>" + _ISO_TIME + r")\]: ")
_MONO = re.compile(r"^\[\s*(?P<mono>\d+\.\d+)\]\s?")
_CTIME = re.compile(r"^\[(?P<wall>" + _DOW + " " + _MON + r" {1,2}\d{1,2} \d\d:\d\d:\d\d \d{4})\]\s?")
_ISO = re.compile(r"^(?P<wall>" + _ISO_TIME + r")\s")
_LEVEL = re.compile(r"^<\d+>")
# /dev/kmsg: "<priority>,<sequence>,<microseconds since boot>,<flags>[,...];<message>" (Documentation/ABI/testing/dev-kmsg).
_KMSG = re.compile(r"^(?P<prio>\d+),\d+,(?P<usec>\d+),[^;]*;")
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
_GPU_UUID = re.compile(r"NVRM: GPU at (?:PCI:)?(?P<bus>[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?): "
                       r"(?P<uuid>GPU-[0-9a-fA-F-]+)")
_GPU_SERIAL = re.compile(r"NVRM: GPU Board Serial Number: (?P<serial>\S+)")
_CALLBACKS = re.compile(r"(?P<func>[\w.$-]+): \d+ callbacks suppressed")
_NV_FUNC = re.compile(r"^(?:nv|os_|_nv|NVRM|__ratelimit$|printk_ratelimit$|printk$)", re.IGNORECASE)
_PRINTK_SUPPRESSED = re.compile(r"\bprintk: \d+ messages suppressed")
_API_MISMATCH = re.compile(
    r"API mismatch: the client(?: '(?P<client>[^']*)' \(pid (?P<pid>\d+)\))?\s+has the version "
    r"(?P<client_version>\d[\d.]*\d)(?:-\d+)?,?\s+but\s+this kernel module has the version "
    r"(?P<kernel_version>\d[\d.]*\d)")

EventDict = Dict[str, Any]

#: Patterns of the lines this module reads (kernel_log_coverage counts every other NVIDIA line).
READS = (_XID, _FALLEN, _NV_RATE, _GPU_UUID, _GPU_SERIAL, re.compile(r"NVRM: API mismatch"))

# rsyslog's escape of control characters (``#012`` newline, ``#011`` tab: ``#`` and three octal
# digits, $EscapeControlCharactersOnReceive); a literal backslash-n that some shippers write.
_OCTAL_ESCAPE = re.compile(r"#(0[0-3][0-7])")
_BACKSLASH_N = re.compile(r"\\n")
#: journald shows a message with control characters as ``[355B blob data]`` unless ``journalctl -a``.
JOURNALD_BLOB = re.compile(r"\[\d+(?:\.\d+)?[KMGTPE]?B? blob data\]")
#: "caused by previous Xid 149": a follow-on Xid names its root cause (R570 and later).
_CAUSED_BY = re.compile(r"caused by previous Xid (?P<xid>\d+)", re.IGNORECASE)


def decode_escapes(text: Optional[str]) -> Optional[str]:
    """Undo the escapes that log shippers put into multi-line kernel messages.

    One ``printk`` with newlines (the NVIDIA driver's "API mismatch", its RPC dumps) reaches a
    syslog file as one line when rsyslog escapes control characters: ``#012`` for a newline,
    ``#011`` for a tab (``#`` + three octal digits). Some shippers write a literal ``\\n``
    instead. Both are turned back into the characters, so that the lines after the first read as
    continuation lines (see the module docstring). journald's ``[355B blob data]`` cannot be
    decoded (the text is not in the output); :data:`JOURNALD_BLOB` finds it, and
    ``kernel_log_coverage`` reports such a line as not read.

    :param text: kernel log text, or ``None``.
    :returns: the decoded text (``text`` itself when it holds no escape), or ``None``.
    :raises: nothing.
    Source: rsyslog ``$EscapeControlCharactersOnReceive`` (on by default; ``#ooo`` octal).
    """
    if not text:
        return text
    if "#0" in text:
        text = _OCTAL_ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), text)
    if "\\n" in text:
        text = _BACKSLASH_N.sub("\n", text)
    return text


class _Record:
    """One kernel message: its first physical line plus continuation lines.

    Continuation pieces are collected in a list and joined once (:meth:`finish`): joining them one
    by one would copy the text for every line, quadratic in a long message.
    """

    __slots__ = ("first_line", "text", "mono", "wall", "stamped", "marker", "has_nvrm", "_pieces")

    def __init__(self, first_line: str, text: str, mono: Optional[float], wall: Optional[str],
                 stamped: bool, marker: bool) -> None:
        self.first_line = first_line
        self.text = text
        self.mono = mono
        self.wall = wall
        self.stamped = stamped
        self.marker = marker
        self.has_nvrm = "NVRM" in text
        self._pieces = None  # type: Optional[List[str]]

    def add(self, continuation: str) -> None:
        piece = continuation.strip()
        if piece.startswith("NVRM:"):
            self.has_nvrm = True
            piece = piece[len("NVRM:"):].strip()
        if piece:
            if self._pieces is None:
                self._pieces = [self.text] if self.text else []
            self._pieces.append(piece)

    def finish(self) -> None:
        if self._pieces is not None:
            self.text = " ".join(self._pieces)
            self._pieces = None


def _split_prefix(line: str) -> Tuple[Optional[float], Optional[str], str, bool]:
    """Return (seconds since boot, printed wall time, message text, had a time prefix)."""
    talos = _TALOS.match(line)
    if talos:
        return None, talos.group("wall"), line[talos.end():].strip(), True
    kmsg = _KMSG.match(line)
    if kmsg:
        return int(kmsg.group("usec")) / 1e6, None, line[kmsg.end():].strip(), True
    rest = _DECODE.sub("", _LEVEL.sub("", line, count=1), count=1)
    mono = None  # type: Optional[float]
    wall = None  # type: Optional[str]
    # " kernel: " is part of every syslog prefix: a cheap test before the search anywhere in the line.
    syslog = _SYSLOG.search(rest) if " kernel: " in rest else None
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
    if rest.startswith("kernel: "):
        rest = rest[len("kernel: "):]
    return mono, wall, rest.strip(), (mono is not None or wall is not None)


def split_line(line: str) -> Tuple[Optional[float], Optional[str], str]:
    """Split one kernel log line into (seconds since boot, printed wall time, message).

    :param line: one line in any format of the module docstring (dmesg, ``dmesg -T``, ISO,
        journalctl / syslog, Talos).
    :returns: ``(mono, wall, message)``: ``mono`` a float or ``None``, ``wall`` the printed wall
        time (text) or ``None``, ``message`` the text after the prefix, stripped.
    :raises: nothing.
    """
    mono, wall, rest, _stamped = _split_prefix(line)
    return mono, wall, rest


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
    for record in records:
        record.finish()
    return records


def records(text: Optional[str]) -> List[Tuple[str, str, Optional[float], Optional[str], bool]]:
    """The kernel messages of a log, as the readers of this module see them.

    :param text: kernel log text (any format of the module docstring; escapes decoded by
        :func:`decode_escapes` first), or ``None``.
    :returns: ``[(first_line, message, mono, wall, marker)]`` in log order: ``first_line`` the
        message's first physical line (stripped), ``message`` its text after the time prefix with
        continuation lines joined, ``mono`` seconds since boot or ``None``, ``wall`` the printed
        wall time or ``None``, ``marker`` true for a boot separator.
    :raises: nothing.
    """
    return [(r.first_line.strip(), r.text, r.mono, r.wall, r.marker) for r in _records(decode_escapes(text) or "")]


def _wall_seconds(wall: Optional[str]) -> Optional[float]:
    """Seconds of a printed wall time, for differences only (year 2000 when none is printed)."""
    if not wall:
        return None
    text = wall.strip()
    try:
        match = re.match(_DOW + " (" + _MON + r") {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d) (\d{4})$", text)
        if match:
            stamp = datetime(int(match.group(6)), _month(match.group(1)), int(match.group(2)),
                             int(match.group(3)), int(match.group(4)), int(match.group(5)))
            return (stamp - datetime(1970, 1, 1)).total_seconds()
        match = re.match("(" + _MON + r") {1,2}(\d{1,2}) (\d\d):(\d\d):(\d\d)(\.\d+)?$", text)
        if match:
            stamp = datetime(2000, _month(match.group(1)), int(match.group(2)),
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
    except (KeyError, ValueError):
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
    # Substring tests first: the searches are run only on the few lines that can match them.
    lower = text.lower()
    if "nvrm:" in lower and "rate" in lower and _NV_RATE.search(text):
        return True
    if "messages suppressed" in text and _PRINTK_SUPPRESSED.search(text):
        return True
    match = _CALLBACKS.search(text) if "callbacks suppressed" in text else None
    if match:
        return bool(_NV_FUNC.match(match.group("func")) or "NVRM" in text[:match.start()])
    return False


def _time_of(record: _Record) -> Union[float, str, None]:
    if record.mono is not None:
        return record.mono
    return record.wall


def _epoch_of(record: _Record, boot_time: Optional[float]) -> Optional[float]:
    """Seconds since the epoch of a line: boot time + monotonic stamp, or an ISO wall time with its zone."""
    if record.mono is not None:
        return round(boot_time + record.mono, 6) if boot_time is not None else None
    if record.wall and re.search(r"\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)$", record.wall):
        seconds = _wall_seconds(record.wall)
        return None if seconds is None else round(seconds, 6)
    return None


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


def _message_refined(xid: int) -> bool:
    """Whether :func:`xid_catalog.classify` reads the message of this Xid: 154 and 144-150 only,
    as its docstring says; for every other Xid the class depends on the number alone."""
    return xid == 154 or 144 <= xid <= 150


def _clip(text: Optional[str]) -> Optional[str]:
    """``text`` cut to :data:`MAX_MESSAGE_CHARS` characters (``...`` marks a cut)."""
    if text is None or len(text) <= MAX_MESSAGE_CHARS:
        return text
    return text[:MAX_MESSAGE_CHARS - 3] + "..."


class _Elided:
    """Incidents that were not kept one by one, folded into one entry (see :func:`parse_kernel_log`)."""

    __slots__ = ("event", "first_seq", "last_seq")

    def __init__(self, seq: int, event: EventDict, bus: Optional[str]) -> None:
        self.event = dict(event)
        self.event["pci_bus_id"] = bus
        self.event["elided"] = True
        self.first_seq = seq
        self.last_seq = seq

    def fold(self, seq: int, event: EventDict) -> None:
        entry = self.event
        entry["count"] += event["count"]
        entry["incidents"] += event["incidents"]
        if seq < self.first_seq:
            self.first_seq = seq
            for key in ("message", "time", "wall_time", "epoch_s", "pid", "process", "first_line"):
                entry[key] = event[key]
        if seq > self.last_seq:
            self.last_seq = seq
            entry["last_time"] = event["last_time"]
        if severity_rank(event["severity"]) > severity_rank(entry["severity"]):
            for key in ("name", "severity", "action", "fatal", "known"):
                entry[key] = event[key]


class _KeyEvents:
    """The events kept for one (PCI bus id, Xid): the first, the newest, the rest elided."""

    __slots__ = ("bus", "first", "recent", "elided", "overflow")

    def __init__(self, bus: Optional[str], overflow: bool) -> None:
        self.bus = bus
        self.overflow = overflow
        self.first = None  # type: Optional[Tuple[int, EventDict]]
        # An overflow key keeps only its open incident; every closed one goes to the overflow entries.
        self.recent = deque(maxlen=None)  # type: Deque[Tuple[int, EventDict]]
        self.elided = {}  # type: Dict[bool, _Elided]


class _Incidents:
    """Folds Xid lines into events per (device, Xid) and incident, keeping a bounded number."""

    def __init__(self, window_s: float, boot_time: Optional[float]) -> None:
        self.window_s = window_s
        self.boot_time = boot_time
        self.dropped_lines = 0
        self._seq = 0
        self._keys = {}  # type: Dict[Tuple[Optional[str], int], _KeyEvents]
        self._overflow = {}  # type: Dict[Tuple[int, bool], _Elided]
        self._open = {}  # type: Dict[Tuple[Optional[str], int], Dict[str, Any]]
        self._last_on_device = {}  # type: Dict[Optional[str], Tuple[Optional[str], int]]
        self._classes = {}  # type: Dict[Tuple[int, Optional[str]], Dict[str, Any]]

    def reset(self) -> None:
        self._open = {}
        self._last_on_device = {}

    def _classify(self, xid: int, message: str) -> Dict[str, Any]:
        """:func:`xid_catalog.classify`, remembered per Xid (classify copies a catalog entry each call)."""
        key = (xid, message if _message_refined(xid) else None)
        entry = self._classes.get(key)
        if entry is None:
            if len(self._classes) >= 4096:
                self._classes = {}
            entry = classify(xid, message)
            self._classes[key] = entry
        return entry

    def _folds(self, key: Tuple[Optional[str], int], state: Dict[str, Any], record: _Record) -> bool:
        kind, seconds = _clock_of(record)
        if kind is not None and kind == state["clock"] and state["seconds"] is not None:
            return abs(seconds - state["seconds"]) <= self.window_s
        return self._last_on_device.get(key[0]) == key

    def _elide(self, store: _KeyEvents, seq: int, event: EventDict) -> None:
        """Fold a closed incident into the elided entry of its key (or of its Xid, for an overflow key)."""
        fatal = bool(event["fatal"])
        if store.overflow:
            slot = (event["xid"], fatal)
            elided = self._overflow.get(slot)
            if elided is None:
                if len(self._overflow) >= MAX_XID_KEYS:
                    self.dropped_lines += event["count"]
                    return
                self._overflow[slot] = _Elided(seq, event, None)
            else:
                elided.fold(seq, event)
            return
        elided = store.elided.get(fatal)
        if elided is None:
            store.elided[fatal] = _Elided(seq, event, store.bus)
        else:
            elided.fold(seq, event)

    def _keep(self, key: Tuple[Optional[str], int], seq: int, event: EventDict) -> None:
        store = self._keys.get(key)
        if store is None:
            store = _KeyEvents(key[0], overflow=len(self._keys) >= MAX_XID_KEYS)
            self._keys[key] = store
        if store.first is None and not store.overflow:
            store.first = (seq, event)
            return
        limit = 1 if store.overflow else XID_EVENTS_PER_KEY - 1
        if len(store.recent) >= limit:
            old_seq, old_event = store.recent.popleft()
            self._elide(store, old_seq, old_event)
        store.recent.append((seq, event))

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
                event["message"] = _clip(message)
            entry = self._classify(xid, message)
            if severity_rank(entry["severity"]) > severity_rank(event["severity"]):
                _apply_class(event, entry)
        else:
            pid, process = _pid_and_process(message) if numbered else (None, None)
            time = _time_of(record)
            event = {
                "pci_bus_id": bus,
                "xid": xid,
                "name": None,
                "message": _clip(message),
                "time": time,
                "last_time": time,
                "wall_time": record.wall,
                "epoch_s": _epoch_of(record, self.boot_time),
                "count": 1,
                "incidents": 1,
                "elided": False,
                "severity": None,
                "action": None,
                "fatal": None,
                "known": None,
                "pid": pid,
                "process": process,
                "first_line": _clip(record.first_line.strip()),
            }
            _apply_class(event, self._classify(xid, message))
            self._open[key] = {
                "event": event,
                "clock": kind,
                "seconds": seconds,
                "numbered": 1 if numbered else 0,
                "unnumbered": 0 if numbered else 1,
                "had_numbered": numbered,
            }
            self._seq += 1
            self._keep(key, self._seq, event)
        self._last_on_device[bus] = key

    def events(self) -> List[EventDict]:
        """The kept events, individual and elided, in the order of their first line."""
        kept = []  # type: List[Tuple[int, EventDict]]
        for store in self._keys.values():
            if store.overflow:
                while store.recent:
                    seq, event = store.recent.popleft()
                    self._elide(store, seq, event)
                continue
            if store.first is not None:
                kept.append(store.first)
            kept.extend(store.recent)
            kept.extend((elided.first_seq, elided.event) for elided in store.elided.values())
        kept.extend((elided.first_seq, elided.event) for elided in self._overflow.values())
        kept.sort(key=lambda item: item[0])
        return [event for _seq, event in kept]


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


def _api_mismatch(record: _Record, records: List[_Record], start: int) -> Optional[Dict[str, Any]]:
    """The API mismatch told by ``record``, read on into at most 4 records from ``records[start]``.

    A following record continues the message when it has no timestamp, or (syslog, where every
    line is stamped) when it is an ``NVRM:`` line with the first line's seconds-since-boot stamp.
    """
    if "API mismatch" not in record.text:
        return None
    text = record.text
    match = _API_MISMATCH.search(text)
    for extra in records[start:start + 4]:
        same_message = not extra.stamped or (
            record.mono is not None and extra.mono == record.mono and extra.text.startswith("NVRM:"))
        if match is not None or extra.marker or not same_message:
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


def _link_root_causes(events: List[EventDict]) -> None:
    """Tie each follow-on Xid ("... caused by previous Xid 149") to its root cause.

    Every event gets ``caused_by_xid`` (the root's number, or ``None``). A follow-on whose root
    is in the log on the same GPU (``root_in_log`` true) keeps its own class: the root's event
    carries the verdict. When the root is not in the log (cut, rotated, rate-limited), the
    follow-on is classified as its root when that is worse (``classified_by_root`` true), so
    that losing the root's line never makes the GPU look better.
    """
    seen = set((event.get("pci_bus_id"), event.get("xid")) for event in events)
    for event in events:
        match = _CAUSED_BY.search(event.get("message") or "")
        event["caused_by_xid"] = int(match.group("xid")) if match else None
        event["root_in_log"] = None
        event["classified_by_root"] = False
        if match is None:
            continue
        root = int(match.group("xid"))
        event["root_in_log"] = (event.get("pci_bus_id"), root) in seen
        if not event["root_in_log"]:
            entry = classify(root)
            if severity_rank(entry["severity"]) > severity_rank(event["severity"]):
                _apply_class(event, entry)
                event["classified_by_root"] = True


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
        "api_mismatches": [mismatch, ...], "incident_window_s": float, "dropped_lines": int}``.
        Events are in the order of their first line; each is ``{"pci_bus_id": "0000:9b:00.0" |
        None, "xid": int, "name": str, "message": str, "time": float (seconds since boot) | str
        (the printed wall time, when the line has no seconds-since-boot stamp) | None,
        "last_time": same for the incident's last line, "wall_time": str | None, "epoch_s":
        float | None, "count": int (lines folded; a lower bound when ``rate_limited``),
        "incidents": int (incidents the entry stands for: 1, more for an elided entry),
        "elided": bool, "severity": str, "action": str, "fatal": bool, "known": bool, "pid": int
        | None, "process": str | None (the process the driver named), "first_line": str (the
        incident's first log line, verbatim)}``; ``message`` and ``first_line`` are cut to
        :data:`MAX_MESSAGE_CHARS` characters. ``name``/``severity``/``action``/``fatal``/``known``
        come from :func:`xid_catalog.classify` (the worst seen in the incident).
        ``caused_by_xid``: int | None, the root cause a follow-on Xid names ("Ch 00000001 caused
        by previous Xid 149", NVIDIA/open-gpu-kernel-modules issue 1150); ``root_in_log``: bool when
        a root is named (its event on the same GPU is in the log), else ``None``;
        ``classified_by_root``: bool, true when the root's line is missing and the event took the
        root's worse class (see :func:`_link_root_causes`).
        Escaped multi-line messages (``#012``, ``\\n``) are decoded first (:func:`decode_escapes`).
        ``rate_limited`` is true when a line says the kernel or the driver dropped messages;
        those lines are listed in ``rate_limit_lines``.

        ``api_mismatches`` are the driver's "API mismatch" messages, in log order: a user-space
        component (``libcuda``, ``libnvidia-ml``, an X/Wayland driver) of one version opened a
        kernel module of another, e.g. ``NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)``
        / ``NVRM: has the version 595.84, but this kernel module has`` / ``NVRM: the version
        595.80.  Please make sure ...`` (field case 23; NVIDIA kernel driver (NVRM) message). Each is
        ``{"client": str | None (process name, when printed), "pid": int | None,
        "client_version": str (user space, e.g. "595.84"), "kernel_module_version": str (the
        loaded module, e.g. "595.80"), "time": float | str | None (as in events), "wall_time":
        str | None, "first_line": str}``; evidence that the loaded module and the user-space
        libraries differ, not an Xid.

        Bounds, so that a storm cannot flood a fact cache: per (PCI bus id, Xid) the first
        incident and the newest ``XID_EVENTS_PER_KEY - 1`` (7) are kept one by one; the others
        are folded into one *elided* entry per fatal class (``elided: true``): ``count`` is the
        sum of their lines, ``incidents`` their number, ``time``/``message``/``first_line``/
        ``pid``/``process``/``wall_time``/``epoch_s`` those of the first of them, ``last_time``
        that of the last, the classification the worst. So the sum of ``count`` per Xid (and
        fatal class) over ``events`` is the number of lines, whatever was elided. Incidents of
        (bus id, Xid) pairs after the first :data:`MAX_XID_KEYS` (128) are all elided, into one
        entry per (Xid, fatal class) with ``pci_bus_id`` ``None``; when those entries are
        :data:`MAX_XID_KEYS` already, further lines are only counted in ``dropped_lines``
        (0 for any real log). At most 128 × (8 + 2) + 128 entries.
    :raises: nothing; unreadable lines are skipped.
    Sources: NVIDIA kernel driver (NVRM) log lines; Xid catalog in ``xid_catalog``.
    """
    window = float(incident_window_s)
    records = _records(decode_escapes(text) or "")
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
                mismatch = _api_mismatch(record, records, index + 1)
                if mismatch is not None:
                    mismatches.append(mismatch)
        previous = record
    events = incidents.events()
    _link_root_causes(events)
    return {
        "events": events,
        "rate_limited": bool(rate_limit_lines),
        "rate_limit_lines": rate_limit_lines,
        "api_mismatches": mismatches,
        "incident_window_s": window,
        "dropped_lines": incidents.dropped_lines,
    }


def gpu_identities(text: Optional[str]) -> Dict[str, Dict[str, Optional[str]]]:
    """The UUID and board serial the driver printed for each GPU it initialised.

    When it sets a GPU up, the NVIDIA kernel module prints ``NVRM: GPU at PCI:0000:9b:00:
    GPU-<uuid>`` and, on the next NVRM line, ``NVRM: GPU Board Serial Number: <serial>`` (field
    case 06). They name a GPU that no other source lists: one lost since, or a bundle with
    nothing but a kernel log.

    :param text: kernel log text (any format :func:`split_line` reads), or ``None``.
    :returns: PCI bus id (normalised, ``0000:9b:00.0``) → ``{"uuid": str, "serial": str or None}``;
        the last mention wins. ``{}`` for no text.
    :raises: nothing.
    """
    found = {}  # type: Dict[str, Dict[str, Optional[str]]]
    last = None  # type: Optional[str]
    for line in (text or "").splitlines():
        if "NVRM: GPU " not in line:
            continue
        match = _GPU_UUID.search(line)
        if match:
            last = _bus_id(match.group("bus"))
            if last:
                found[last] = {"uuid": match.group("uuid"), "serial": None}
            continue
        match = _GPU_SERIAL.search(line)
        if match and last in found:
            found[last]["serial"] = match.group("serial")
            last = None
    return found


def keep_newest(text: Union[str, bytes, None], limit: int) -> Tuple[Union[str, bytes, None], int]:
    """The newest part of a kernel log that is longer than a reading limit, in whole lines.

    A kernel log is oldest first and its newest lines matter most (the fatal Xid that took the GPU
    down), so a log over the limit loses its beginning, never its end.

    :param text: the log (``str``, or ``bytes`` as read from a file), or ``None``. It may be the
        end of a longer log: only the first line, which the cut may have split, is judged.
    :param limit: the most characters (bytes for ``bytes``) to keep, > 0.
    :returns: ``(kept, left_out)``: ``kept`` is ``text`` itself when it is at most ``limit``
        long, else its last ``limit`` characters less the partial line they start with;
        ``left_out`` is the number of characters (bytes) not kept, 0 when nothing was cut.
    :raises ValueError: when ``limit`` is not positive.
    """
    if limit <= 0:
        raise ValueError("limit must be positive, got %r" % (limit,))
    if text is None or len(text) <= limit:
        return text, 0
    newline = b"\n" if isinstance(text, bytes) else "\n"
    start = len(text) - limit
    if text[start - 1:start] != newline:
        cut = text.find(newline, start)
        start = len(text) if cut < 0 else cut + 1
    return text[start:], start


def summarize_xids(events: Union[Dict[str, Any], Iterable[EventDict]],
                   rate_limited: Optional[bool] = None) -> Dict[str, Any]:
    """Summarise Xid events for gates and reports.

    :param events: the result of :func:`parse_kernel_log` (its ``events``, ``rate_limited`` and
        ``dropped_lines`` are used), or a list of its events (e.g.
        ``ansible_facts.nvidia.xid_events``), elided entries included.
    :param rate_limited: overrides the result's flag; ``None`` keeps it (``False`` for a list).
    :returns: ``{"total": int (sum of counts: Xid lines), "incidents": int (sum of the events'
        ``incidents``, 1 for an event without it), "by_xid": {"<xid>": count}, "by_device":
        {"<pci_bus_id>" or "unknown": count}, "worst_severity": str | None, "worst_action": str
        | None, "any_fatal": bool, "fatal_xids": [int, ...] (sorted), "rate_limited": bool,
        "elided_incidents": int (incidents only counted in elided entries), "dropped_lines":
        int (Xid lines in no entry at all, see :func:`parse_kernel_log`; 0 for a list),
        "per_device_xid": [{"pci_bus_id": str | None, "xid": int, "count": int (lines),
        "incidents": int, "fatal": bool (any), "first_time", "first_message", "last_time",
        "last_message"}, ...]}`` (one entry per (bus id, Xid) in the order of its first event;
        times as in events: the first event's ``time``, the last one's ``last_time``). Counts
        are lower bounds when ``rate_limited`` or ``dropped_lines``. Keys of ``by_xid`` and
        ``by_device`` are strings so the summary survives JSON unchanged. ``None`` worst values
        when there is no event. Severity order: :data:`xid_catalog.SEVERITIES`; action order:
        :data:`xid_catalog.ACTIONS`.
    :raises: nothing.
    """
    flag = False
    dropped = 0
    if isinstance(events, dict):
        flag = bool(events.get("rate_limited"))
        dropped = int(events.get("dropped_lines") or 0)
        items = list(events.get("events") or [])
    else:
        items = list(events or [])
    if rate_limited is not None:
        flag = bool(rate_limited)
    by_xid = {}  # type: Dict[str, int]
    by_device = {}  # type: Dict[str, int]
    per_key = {}  # type: Dict[Tuple[Any, Any], Dict[str, Any]]
    worst_severity = -1
    worst_action = -1
    fatal_xids = set()
    total = 0
    incidents = 0
    elided = 0
    for event in items:
        count = int(event.get("count") or 1)
        stands_for = int(event.get("incidents") or 1)
        total += count
        incidents += stands_for
        if event.get("elided"):
            elided += stands_for
        xid_key = str(event.get("xid"))
        by_xid[xid_key] = by_xid.get(xid_key, 0) + count
        device = event.get("pci_bus_id") or "unknown"
        by_device[device] = by_device.get(device, 0) + count
        worst_severity = max(worst_severity, severity_rank(event.get("severity")))
        worst_action = max(worst_action, action_rank(event.get("action")))
        if event.get("fatal"):
            fatal_xids.add(int(event["xid"]))
        pair = (event.get("pci_bus_id"), event.get("xid"))
        entry = per_key.get(pair)
        if entry is None:
            entry = per_key[pair] = {
                "pci_bus_id": pair[0], "xid": pair[1], "count": 0, "incidents": 0, "fatal": False,
                "first_time": event.get("time"), "first_message": event.get("message"),
                "last_time": None, "last_message": None,
            }
        entry["count"] += count
        entry["incidents"] += stands_for
        entry["fatal"] = entry["fatal"] or bool(event.get("fatal"))
        entry["last_time"] = event.get("last_time", event.get("time"))
        entry["last_message"] = event.get("message")
    return {
        "total": total,
        "incidents": incidents,
        "by_xid": by_xid,
        "by_device": by_device,
        "worst_severity": SEVERITIES[worst_severity] if worst_severity >= 0 else None,
        "worst_action": ACTIONS[worst_action] if worst_action >= 0 else None,
        "any_fatal": bool(fatal_xids),
        "fatal_xids": sorted(fatal_xids),
        "rate_limited": flag,
        "elided_incidents": elided,
        "dropped_lines": dropped,
        "per_device_xid": list(per_key.values()),
    }
