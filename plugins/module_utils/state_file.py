# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one reader and the one writer of every file a rollout decides on, controller and node alike.

A rollout decides from files it keeps itself (docs/security.md lists them): on the controller the
journal, the node records, the plan, the run leases and the drain estimates; on each node the lock,
the snapshot, the flag and the drain record. Some of them are written by a party the controller
does not trust (everything a node holds), any of them can be cut by a full disk or a copy taken
mid-write. So every read here is bounded and total:

* at most ``max_bytes`` bytes (:data:`MAX_STATE_BYTES` for a state file, :data:`MAX_LINE_BYTES`
  for one journal line), a regular file, never through a symbolic link;
* UTF-8 checked (per line for a journal);
* JSON with no ``NaN`` / ``Infinity`` (RFC 8259 section 6 has none; Python's ``json`` accepts
  them, and a non-finite number compares false with everything), nested at most
  :data:`MAX_DEPTH` deep;
* for any bytes either a value or :class:`Unreadable`, whose text is ``unreadable: <file>[:<line>]:
  <why>``: the caller turns it into a refusal that names the file. No other exception leaves
  :func:`loads` or :func:`read`.

Every write goes through :func:`write_atomic`: a temporary file made by ``mkstemp`` in the target's
directory (``O_EXCL``: a planted name or link is never followed), written, ``fsync``-ed and renamed
over the target, the directory ``fsync``-ed after. State directories are made 0700 and an existing
one that others can write is refused, with the command that fixes it (:func:`private_dir`).

Standard library only, Python 3.9 compatible: it ships to managed nodes (``node_lock``) and serves
the controller alike.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import stat
import tempfile
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

#: Bytes of one state file read at most. A lock or flag is a few hundred bytes; the largest is the
#: snapshot: the facts document (about 26 kB for 8 GPUs, 77 kB after a storm of 100,000 Xid lines,
#: docs/facts.md) and the GPU trace before the update (about 10 kB for 8 GPUs, 3 s). A file larger
#: than this is not ours.
MAX_STATE_BYTES = 1048576
#: Bytes of one journal line read at most (an event is a few hundred bytes; a golden node's
#: ``finished`` with its contract changes a few kB).
MAX_LINE_BYTES = 1048576
#: Bytes of a whole journal read at most: 10,000 nodes with ten events each of 1 kB is 100 MB.
MAX_JOURNAL_BYTES = 268435456
#: Nesting depth of a JSON value accepted. The deepest file the rollout writes is a snapshot's
#: facts (about 8 levels); 64 leaves room and stays far from Python's recursion limit (1000).
MAX_DEPTH = 64


class Unreadable(ValueError):
    """A file (or one line of it) that cannot be used: ``unreadable: <file>[:<line>]: <why>``.

    :ivar where: the file's path or name. :ivar line: the line number (1-based) or ``None``.
    :ivar why: a few words, never the content.
    """

    def __init__(self, where: str, why: str, line: Optional[int] = None, tag: Optional[str] = None):
        self.where = str(where)
        self.why = str(why)
        self.line = line
        self.tag = tag
        super(Unreadable, self).__init__(self.text())

    def text(self) -> str:
        """``unreadable: <file>[:<line>]: <why>``."""
        return "unreadable: %s%s: %s" % (self.where, ":%d" % self.line if self.line is not None else "", self.why)


class _NotFinite(ValueError):
    """A number JSON does not allow, or one a float cannot hold."""


def _no_constant(name: str) -> Any:
    raise _NotFinite("holds %s, not a number JSON allows" % name)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value) or math.isnan(value):
        raise _NotFinite("holds %s, a number too large for a float" % text[:40])
    return value


def _depth_ok(value: Any, limit: int) -> bool:
    """Whether ``value`` nests at most ``limit`` containers deep (iterative: no recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return False
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return True


def loads(raw: Union[bytes, str], where: str, line: Optional[int] = None, kind: Optional[type] = dict,
          max_bytes: int = MAX_STATE_BYTES, max_depth: int = MAX_DEPTH) -> Any:
    """Parse the bytes of a state file or journal line, or say why they cannot be used.

    :param raw: the bytes (or text) read.
    :param where: the file's path or name, for the message. :param line: its line number, or ``None``.
    :param kind: the JSON type the value must have (``dict``; ``None``: any).
    :returns: the parsed value.
    :raises Unreadable: too large, not UTF-8, not JSON, a ``NaN`` / ``Infinity``, nested deeper
        than ``max_depth``, or not of ``kind``. Nothing else.
    """
    if len(raw) > max_bytes:
        raise Unreadable(where, "larger than %d bytes" % max_bytes, line)
    if isinstance(raw, bytes):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Unreadable(where, "not UTF-8 text (byte %d)" % exc.start, line)
    else:
        text = raw
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except RecursionError:
        raise Unreadable(where, "JSON nested deeper than %d levels" % max_depth, line)
    except _NotFinite as exc:
        raise Unreadable(where, str(exc), line)
    except ValueError as exc:
        raise Unreadable(where, "not JSON (%s)" % str(exc)[:200], line)
    except (TypeError, OverflowError, MemoryError) as exc:
        raise Unreadable(where, "not JSON (%s)" % type(exc).__name__, line)
    if not _depth_ok(value, max_depth):
        raise Unreadable(where, "JSON nested deeper than %d levels" % max_depth, line)
    if kind is not None and not isinstance(value, kind):
        raise Unreadable(where, "holds a JSON %s, not %s" % (_json_type(value), _json_type(kind())), line)
    return value


def _json_type(value: Any) -> str:
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    if isinstance(value, str):
        return "string"
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    return "number"


def identity(raw: Optional[bytes]) -> Optional[str]:
    """What a file is, for compare-and-swap: ``None`` (absent) or ``sha256:<hex>`` of its bytes."""
    if raw is None:
        return None
    return "sha256:" + hashlib.sha256(raw).hexdigest()


def read_bytes(path: str, max_bytes: int = MAX_STATE_BYTES) -> Optional[bytes]:
    """The bytes of a regular file, at most ``max_bytes + 1`` of them (more means too large).

    :returns: the bytes, or ``None`` when there is no such file.
    :raises Unreadable: as :func:`read_file`.
    """
    found = read_file(path, max_bytes)
    return None if found is None else found[0]


def read_file(path: str, max_bytes: int = MAX_STATE_BYTES) -> Optional[Tuple[bytes, os.stat_result]]:
    """The bytes of a regular file (at most ``max_bytes + 1``) and its ``fstat`` when it was read.

    :returns: ``(bytes, stat)``, or ``None`` when there is no such file.
    :raises Unreadable: a symbolic link, a directory, not a regular file, or it cannot be read
        (permission denied, an I/O error), with the reason.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return None
        if exc.errno == errno.ELOOP:
            raise Unreadable(path, "a symbolic link, not the file itself", tag="symlink")
        if exc.errno == errno.EISDIR:
            raise Unreadable(path, "a directory", tag="directory")
        raise Unreadable(path, "cannot be opened (%s)" % (exc.strerror or exc))
    except (TypeError, ValueError) as exc:
        raise Unreadable(str(path), "not a file name (%s)" % exc)
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise Unreadable(path, "a directory", tag="directory")
        if not stat.S_ISREG(info.st_mode):
            raise Unreadable(path, "not a regular file", tag="special")
        chunks = []
        left = max_bytes + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1048576))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks), info
    except OSError as exc:
        raise Unreadable(path, "cannot be read (%s)" % (exc.strerror or exc))
    finally:
        os.close(fd)


def read(path: str, kind: Optional[type] = dict, max_bytes: int = MAX_STATE_BYTES,
         where: Optional[str] = None) -> Dict[str, Any]:
    """Read one state file without trusting it.

    :param path: the file. :param where: how messages name it (default: ``path``).
    :returns: ``{"exists": bool, "content": the value | None, "unreadable": "unreadable: <file>:
        <why>" | None, "identity": "sha256:<hex>" of the bytes, ``symlink`` / ``directory`` /
        ``special`` for what is not a regular file, or None, "mtime": epoch seconds | None}``:
        ``content`` is ``None`` when the file is absent or unreadable. Never raises.
    """
    name = where or path
    try:
        found = read_file(path, max_bytes)
    except Unreadable as exc:
        return _result(True, None, Unreadable(name, exc.why).text(), exc.tag, None)
    if found is None:
        return _result(False, None, None, None, None)
    raw, info = found
    mtime = info.st_mtime
    try:
        value = loads(raw, name, kind=kind, max_bytes=max_bytes)
    except Unreadable as exc:
        return _result(True, None, exc.text(), identity(raw), mtime)
    return _result(True, value, None, identity(raw), mtime)


def _result(exists: bool, content: Any, unreadable: Optional[str], ident: Optional[str],
            mtime: Optional[float]) -> Dict[str, Any]:
    return {"exists": exists, "content": content, "unreadable": unreadable, "identity": ident, "mtime": mtime}


def split_lines(raw: bytes) -> Tuple[List[bytes], bool]:
    """The lines of a journal's bytes and whether its last line is cut (no final newline)."""
    if not raw:
        return [], False
    lines = raw.split(b"\n")
    cut = lines[-1] != b""
    if not cut:
        lines.pop()
    return lines, cut


#: A glued line (a cut line with the next event appended to it) holds the next event whole after
#: the cut: it starts at one of these (events are written ``sort_keys``, so ``{"`` opens each).
_OBJECT_START = re.compile(rb'\{\s*"')
#: Starts of a glued line tried at most (each try parses the rest of the line).
MAX_RECOVERY_TRIES = 32


def read_lines(raw: bytes, where: str, max_line_bytes: int = MAX_LINE_BYTES) -> Dict[str, Any]:
    """Read a JSON-lines file's bytes line by line: each line an object, or counted as lost.

    A line that is not an object is lost, and only it: the lines before and after it are read.
    A line that holds a cut line with a whole event after it (a writer appended to a journal
    whose last line was cut, before appending repaired cut tails) gives that event back
    (``recovered``), its cut head counted as lost.

    :param raw: the file's bytes. :param where: its name for the messages.
    :returns: ``{"events": [(line number, dict)], "lost": [{"line": n, "why": str, "text":
        "unreadable: <where>:<n>: <why>", "node": the node it names, if any}], "cut_tail": bool,
        "recovered": [line numbers]}``.
    """
    lines, cut = split_lines(raw)
    events = []  # type: List[Tuple[int, Dict[str, Any]]]
    lost = []  # type: List[Dict[str, Any]]
    recovered = []  # type: List[int]
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            events.append((number, loads(line, where, number, dict, max_line_bytes)))
            continue
        except Unreadable as exc:
            error = exc  # type: Unreadable
        start, tail = _recover(line, where, number, max_line_bytes)
        if tail is not None:
            events.append((number, tail))
            recovered.append(number)
            why = "cut short, followed by a whole event on the same line (that event kept)"
        else:
            why = error.why  # pylint: disable=used-before-assignment
        if number == len(lines) and cut and tail is None:
            why = "cut short at the end of the file (%s)" % error.why  # pylint: disable=used-before-assignment
        entry = {"line": number, "why": why, "text": Unreadable(where, why, number).text()}
        node = _named_node(line[:start])
        if node is not None:
            entry["node"] = node
        lost.append(entry)
    return {"events": events, "lost": lost, "cut_tail": cut, "recovered": recovered}


def _recover(line: bytes, where: str, number: int, max_line_bytes: int) -> Tuple[int, Optional[Dict[str, Any]]]:
    """``(where the whole event starts, the event)`` of a glued line, or ``(len(line), None)``."""
    tries = 0
    for match in _OBJECT_START.finditer(line, 1):
        tries += 1
        if tries > MAX_RECOVERY_TRIES:
            break
        try:
            return match.start(), loads(line[match.start():], where, number, dict, max_line_bytes)
        except Unreadable:
            continue
    return len(line), None


_NODE_FIELD = re.compile(rb'"node"\s*:\s*"((?:[^"\\\n]|\\.){1,255})"')


def _named_node(line: bytes) -> Optional[str]:
    """The last node name a damaged line names (``"node": "..."``), when one can be read."""
    found = None
    for match in _NODE_FIELD.finditer(line[:MAX_LINE_BYTES]):
        try:
            name = json.loads(b'"' + match.group(1) + b'"')
        except ValueError:
            continue
        if isinstance(name, str) and name:
            found = name
    return found


def repair_tail(fd: int) -> bool:
    """End a cut last line of an append-only file with a newline, so the next line is not glued on.

    :param fd: the file, opened for appending (``O_APPEND``) and readable.
    :returns: whether a newline was written (the cut line is then its own, lost, line).
    :raises OSError: when the file cannot be read or written.
    """
    size = os.fstat(fd).st_size
    if size == 0:
        return False
    if os.pread(fd, 1, size - 1) == b"\n":
        return False
    os.write(fd, b"\n")
    return True


def append_line(path: str, line: bytes) -> bool:
    """Append one line to a JSON-lines file, repairing a cut tail first; ``fsync`` before returning.

    The caller holds the file's directory lock. The file is created 0600 when missing and never
    followed through a symbolic link.

    :returns: whether a cut tail was repaired.
    :raises OSError: when the file cannot be opened or written (a link: ``ELOOP``).
    """
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file", path)
        repaired = repair_tail(fd)
        data = line if line.endswith(b"\n") else line + b"\n"
        while data:
            written = os.write(fd, data)
            data = data[written:]
        os.fsync(fd)
        return repaired
    finally:
        os.close(fd)


def write_atomic(path: str, data: Union[bytes, str], mode: int = 0o600) -> None:
    """Write a whole file atomically: ``mkstemp`` in its directory, write, ``fsync``, ``rename``.

    The temporary name is new and made with ``O_EXCL`` (``tempfile.mkstemp``), so a name or link
    planted in the directory is never written through; the rename replaces a link planted at
    ``path`` itself rather than its target. A reader sees the old file or the new, never half.

    :param path: the file; its directory must exist. :param data: bytes, or text (UTF-8).
    :param mode: the file's mode (0600: a state file is nobody else's).
    :raises OSError: when the directory cannot be written (the temporary file is removed).
    """
    body = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    directory = os.path.dirname(os.path.abspath(path))
    handle, temp = tempfile.mkstemp(prefix=".%s." % os.path.basename(path)[:64], suffix=".tmp", dir=directory)
    try:
        view = memoryview(body)
        while view:
            written = os.write(handle, view)
            view = view[written:]
        os.fchmod(handle, mode)
        os.fsync(handle)
        os.close(handle)
        handle = -1
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)  # an empty directory in its place (a crashed earlier writer's); a full one fails
        os.rename(temp, path)
    except BaseException:
        if handle >= 0:
            os.close(handle)
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _fsync_dir(directory: str) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class UnsafeDirectory(OSError):
    """A state directory that others can write, or that is not a directory: refused, with the fix."""

    def __str__(self) -> str:
        return str(self.strerror)


def private_dir(path: str, mode: int = 0o700) -> str:
    """Make sure a state directory is this user's own: created ``mode`` (0700) when missing,
    refused when it exists and someone else owns it or can write it.

    A directory others can write lets them plant a name the rollout then reads or renames over,
    and lets them change its records. Its parents are made with the default mode when missing.

    :returns: ``path``.
    :raises UnsafeDirectory: the path is not a directory, is owned by another user (not root),
        or is writable by its group or others; the message gives the command that fixes it.
    :raises OSError: when it cannot be made.
    """
    try:
        os.makedirs(path, mode=mode)
    except FileExistsError:
        pass
    try:
        info = os.stat(path)
    except OSError as exc:
        raise UnsafeDirectory(exc.errno, "state directory %s cannot be read (%s)" % (path, exc.strerror or exc))
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeDirectory(errno.ENOTDIR, "state directory %s is not a directory: move it away" % path)
    owner = os.geteuid()
    if info.st_uid not in (owner, 0):
        raise UnsafeDirectory(errno.EPERM, "state directory %s is owned by uid %d, not by this user (uid %d): "
                                           "chown %d %s, or choose another directory"
                              % (path, info.st_uid, owner, owner, path))
    if info.st_mode & 0o022:
        raise UnsafeDirectory(errno.EPERM, "state directory %s is writable by %s (mode %04o): run chmod go-w %s"
                              % (path, "others" if info.st_mode & 0o002 else "its group",
                                 stat.S_IMODE(info.st_mode), path))
    return path


_PLAIN_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def file_name(name: str) -> str:
    """The one file-name rule for a name from the inventory or a node: a name that names no other path.

    The name itself when it is plain (letters, digits, ``.``, ``_``, ``-``, not first, at most 200),
    else its characters outside those written as ``%XX`` (UTF-8) and, when that is long, cut with
    a hash of the whole name kept (``2001%3Adb8%3A%3A1`` for ``2001:db8::1``, ``%2E.%2Fx`` for
    ``../x``). Distinct names give distinct file names.

    :raises ValueError: for a name that is not text or is empty.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("%r cannot name a file" % (name,))
    if _PLAIN_NAME.match(name) and name not in (".", ".."):
        return name
    quoted = "".join(ch if (ch.isascii() and (ch.isalnum() or ch in "._-")) else
                     "".join("%%%02X" % b for b in ch.encode("utf-8", "surrogatepass")) for ch in name)
    if quoted[:1] in (".", "-", "_"):
        quoted = "%%%02X" % ord(quoted[0]) + quoted[1:]
    if len(quoted) > 200:
        quoted = quoted[:180] + "-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return quoted


def iter_names(values: Any) -> Iterator[str]:
    """The text items of ``values`` (a list from an untrusted file), others left out."""
    for value in values if isinstance(values, list) else []:
        if isinstance(value, str):
            yield value
