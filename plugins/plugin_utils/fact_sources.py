# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller-side readers of saved ``ansible_facts.nvidia`` documents, for the drift report.

Three on-disk shapes are read (I/O is the purpose of this module):

* a directory of ``<host>.json`` files, as ``playbooks/facts.yml`` writes with
  ``gpufleet_facts_dir`` (each file the ``nvidia`` document itself, or a whole facts dict that holds
  it under ``nvidia`` / ``ansible_nvidia`` / ``ansible_facts.nvidia``);
* Ansible's ``jsonfile`` fact cache (``fact_caching = jsonfile``). ansible-core 2.19 writes one
  file per host named ``<prefix>s1_<host>`` (the cache plugin's prefix, then the cache schema
  id ``s1_`` added by ansible-core's ``PluginInterposer``) holding ``{"__payload__": "<json>"}``,
  where the inner JSON may wrap values carrying Ansible data tags as
  ``{"value": ..., "tags": [...], "__ansible_type": "_AnsibleTaggedStr"}``. Older ansible-core
  and AWX's artifacts fact cache (``fact_cache/<host>``) write plain JSON named ``<prefix><host>``.
  Both are handled;
* one facts dict per host from a live run (``hostvars[host].ansible_facts``), see
  :func:`nvidia_from_host_facts`.

Decoding uses ``msgspec`` when it is installed on the controller and the standard library's
``json`` otherwise; both give the same values. A cache file of ``setup`` + ``gpu_facts`` is about
28 kB of which the ``nvidia`` document is a third: :func:`load_fact_file` has ``msgspec`` decode
only the keys it uses (``nvidia``, ``ansible_nvidia``, ``ansible_facts``, ``ansible_nodename``)
and skip the rest without building it, about 4x less work than decoding the whole file (with
``msgspec``, ``orjson`` or ``json`` alike). Text that ``msgspec`` refuses but ``json`` reads
(``NaN``) is decoded by ``json``, and text carrying Ansible's data tags is decoded by ``json`` with
an object hook that drops them, so the result never depends on which library is installed.

Source of the cache format: ansible-core ``lib/ansible/_internal/_plugins/_cache.py``
(``_PAYLOAD_KEY``, ``_get_wrapped_key_prefix``) and ``lib/ansible/plugins/cache/__init__.py``
(``_get_cache_file_name``: ``<dir>/<prefix><key>``).
"""

from __future__ import annotations

import json
import os
import re
import time
from typing import Any, Dict, Iterable, Mapping, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.drift import facts_problem

try:
    import msgspec
except ImportError:  # the standard library is the fallback
    msgspec = None

_SCHEMA_PREFIX = re.compile(r"^s\d+_")
_PAYLOAD_KEY = "__payload__"
_TYPE_KEY = "__ansible_type"
_TYPE_MARK = _TYPE_KEY.encode("ascii")

#: The keys of a host's facts that the drift report reads (the rest of ``setup`` is skipped), and
#: ansible-core 2.19's wrapper key.
FACT_KEYS = ("nvidia", "ansible_nvidia", "ansible_facts", "ansible_nodename", "driver", "schema_version", _PAYLOAD_KEY)

if msgspec is not None:
    class _Wanted(msgspec.Struct):  # pylint: disable=too-few-public-methods
        """The keys of :data:`FACT_KEYS`; absent ones stay ``UNSET``, other keys are skipped."""
        nvidia: Any = msgspec.UNSET
        ansible_nvidia: Any = msgspec.UNSET
        ansible_facts: Any = msgspec.UNSET
        ansible_nodename: Any = msgspec.UNSET
        driver: Any = msgspec.UNSET
        schema_version: Any = msgspec.UNSET
        payload: Any = msgspec.field(name=_PAYLOAD_KEY, default=msgspec.UNSET)

    _ANY = msgspec.json.Decoder()
    _WANTED = msgspec.json.Decoder(_Wanted)


class FactSourceError(Exception):
    """A fact source that cannot be read at all (missing directory, unreadable file)."""


def _untag(obj: Dict[str, Any]) -> Any:
    """``json.loads`` object hook: drop Ansible's data tags, keep the plain value."""
    if _TYPE_KEY in obj:
        return obj.get("value")
    return obj


def _wanted_only(value: Any) -> Any:
    """The :data:`FACT_KEYS` of a decoded facts object; a non-object or an ``nvidia`` document as it is."""
    if not isinstance(value, dict) or ("driver" in value and "schema_version" in value):
        return value
    return dict((key, value[key]) for key in FACT_KEYS if key in value)


def _loads(data: Any, wanted: bool = False) -> Any:
    """Decode JSON text (``bytes`` or ``str``); Ansible's data tags, where present, are dropped.

    :param wanted: only the :data:`FACT_KEYS` of a JSON object are kept (``msgspec`` skips the
        others without building them; the stdlib decodes everything, then drops them).
    :raises ValueError: when it is not JSON.
    """
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if _TYPE_MARK in raw:
        value = json.loads(data, object_hook=_untag)
        return _wanted_only(value) if wanted else value
    if msgspec is not None:
        try:
            if not wanted:
                return _ANY.decode(raw)
            try:
                found = _WANTED.decode(raw)
            except msgspec.ValidationError:
                return _ANY.decode(raw)  # not an object: the caller says what it holds
            if found.driver is not msgspec.UNSET and found.schema_version is not msgspec.UNSET:
                return _ANY.decode(raw)  # the nvidia document itself: all of it is needed
            out = dict((key, getattr(found, key)) for key in FACT_KEYS[:-1] if getattr(found, key) is not msgspec.UNSET)
            if found.payload is not msgspec.UNSET:
                out[_PAYLOAD_KEY] = found.payload
            return out
        except msgspec.DecodeError:
            pass  # NaN, a lone surrogate...: json reads them or says why
    value = json.loads(data)
    return _wanted_only(value) if wanted else value


def decode_cache_text(text: Any, wanted: bool = False) -> Tuple[Any, bool]:
    """Decode one fact cache file's text.

    :param text: the file content (``bytes`` or ``str``).
    :param wanted: keep only the keys the drift report reads (:data:`FACT_KEYS`) of the facts.
    :returns: ``(facts, wrapped)``: the facts dict with Ansible's data tags removed, and whether
        the file used ansible-core 2.19's ``{"__payload__": ...}`` wrapper.
    :raises ValueError: when the text (or the payload) is not JSON.
    """
    outer = _loads(text, wanted)
    if isinstance(outer, dict) and isinstance(outer.get(_PAYLOAD_KEY), str) and len(outer) == 1:
        return _loads(outer[_PAYLOAD_KEY], wanted), True
    if wanted and isinstance(outer, dict):
        outer.pop(_PAYLOAD_KEY, None)
    return outer, False


def nvidia_from_host_facts(facts: Any) -> Optional[Dict[str, Any]]:
    """Find the ``nvidia`` document in what a source holds for a host.

    :param facts: a host's facts (``{"nvidia": ...}``, ``{"ansible_nvidia": ...}``,
        ``{"ansible_facts": {"nvidia": ...}}``) or the ``nvidia`` document itself (it has
        ``schema_version`` and ``driver``).
    :returns: the document or ``None``.
    """
    if not isinstance(facts, Mapping):
        return None
    if "driver" in facts and "schema_version" in facts:
        return dict(facts)
    for key in ("nvidia", "ansible_nvidia"):
        value = facts.get(key)
        if isinstance(value, Mapping):
            return dict(value)
    inner = facts.get("ansible_facts")
    if isinstance(inner, Mapping):
        return nvidia_from_host_facts(inner)
    return None


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except (IOError, OSError) as err:
        raise FactSourceError("cannot read %s: %s" % (path, err))


def _check_dir(path: str) -> None:
    if not os.path.isdir(path):
        raise FactSourceError("fact source %s is not a directory" % path)


def locate_fact_files(path: str, source: str = "dir", prefix: str = "",
                      hosts: Optional[Iterable[str]] = None) -> Dict[str, str]:
    """Find the fact file of each host without reading it (so a caller can stream them).

    :param path: the directory. :param source: ``dir`` (``<host>.json``) or ``jsonfile`` (Ansible's
        fact cache: ``<prefix>s1_<host>`` written by ansible-core 2.19, else ``<prefix><host>``).
    :param prefix: the cache's ``fact_caching_prefix`` (``jsonfile`` only).
    :param hosts: only these hosts; ``None`` for every file found.
    :returns: ``{host: file path}``.
    :raises FactSourceError: when ``path`` is not a directory or ``source`` is unknown.
    """
    _check_dir(path)
    found = {}  # type: Dict[str, str]
    if source == "dir":
        if hosts is None:
            hosts = [name[:-5] for name in os.listdir(path) if name.endswith(".json") and not name.startswith(".")]
        for host in hosts:
            file_path = os.path.join(path, host + ".json")
            if os.path.isfile(file_path):
                found[host] = file_path
        return found
    if source != "jsonfile":
        raise FactSourceError("unknown fact source %r (dir or jsonfile)" % (source,))
    if hosts is not None:
        for host in hosts:
            for candidate in (prefix + "s1_" + host, prefix + host):
                file_path = os.path.join(path, candidate)
                if os.path.isfile(file_path):
                    found[host] = file_path
                    break
        return found
    old_style = {}  # type: Dict[str, str]
    for name in sorted(os.listdir(path)):
        if name.startswith(".") or not name.startswith(prefix):
            continue
        file_path = os.path.join(path, name)
        if not os.path.isfile(file_path):
            continue
        rest = name[len(prefix):]
        match = _SCHEMA_PREFIX.match(rest)
        if match:
            found[rest[match.end():]] = file_path
        else:
            old_style[rest] = file_path
    for host, file_path in old_style.items():
        found.setdefault(host, file_path)
    return found


def load_fact_file(file_path: str, now: Optional[float] = None) -> Dict[str, Any]:
    """Read one fact file (any of the shapes above).

    :returns: ``{"facts": nvidia document | None, "age_s": float (from the file time), "path",
        "error": str | None, "wrapped": bool (ansible-core 2.19 payload), "nodename": str | None
        (``ansible_nodename`` of ``setup`` when the file holds it)}``. ``facts`` is
        ``None`` and ``error`` says why when the file is not JSON (``not JSON: ...``), holds no
        ``nvidia`` document (``no nvidia facts in the file``, with what it holds instead when
        that is not an object: ``...: it holds a JSON string, expected an object``), or holds one
        of the wrong shape (``not a facts document: driver is a str, expected a mapping``, see
        :func:`drift.facts_problem`).
    :raises FactSourceError: when the file cannot be read.
    """
    return _entry(file_path, time.time() if now is None else now)


def _entry(file_path: str, now: float) -> Dict[str, Any]:
    try:
        facts, wrapped = decode_cache_text(_read(file_path), wanted=True)
        error = None
    except ValueError as err:
        facts, wrapped, error = None, False, "not JSON: %s" % err
    document = nvidia_from_host_facts(facts)
    if error is None:
        error = _document_error(facts, document)
        if error is not None:
            document = None
    return {"facts": document, "age_s": max(0.0, now - os.path.getmtime(file_path)), "path": file_path,
            "error": error, "wrapped": wrapped, "nodename": _nodename(facts)}


def _nodename(facts: Any) -> Optional[str]:
    """``ansible_nodename`` (``uname -n``, from ``setup``) of a cache file's facts, if it holds it."""
    if isinstance(facts, dict):
        value = facts.get("ansible_nodename")
        if value is None and isinstance(facts.get("ansible_facts"), dict):
            value = facts["ansible_facts"].get("ansible_nodename")
        if isinstance(value, str) and value:
            return value
    return None


def _json_kind(value: Any) -> str:
    """The JSON name of a decoded value's type: ``string``, ``array``, ``number``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return type(value).__name__


def _document_error(facts: Any, document: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why a decoded fact file gives no usable document (``None`` when it does)."""
    if document is not None:
        problem = facts_problem(document)
        return "not a facts document: %s" % problem if problem else None
    if not isinstance(facts, Mapping):
        return "no nvidia facts in the file: it holds a JSON %s, expected an object" % _json_kind(facts)
    for key in ("nvidia", "ansible_nvidia", "ansible_facts"):
        if key in facts and not isinstance(facts[key], Mapping):
            return "no nvidia facts in the file: its %s is a JSON %s, expected an object" % (key, _json_kind(facts[key]))
    return "no nvidia facts in the file"
