# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The declared variables of many hosts, each distinct set templated once (controller side).

Reading ``hostvars[host]`` costs ansible-core a full variable computation per host (inventory
sources, every vars plugin, the fact cache, then templating): about 1 ms, 10 s or more for a fleet
of 10,000 nodes. Hosts of one GPU class almost always share their declaration, so a host's
variables are read once per *declaration key* and shared by every host with the same key:

* the host's groups that carry variables (``Host.get_groups()``: every group it is in, the
  ancestors included, kept when the group has inventory variables or a ``group_vars`` entry;
  order and precedence follow from the set; a rack group without variables changes nothing), and
* the declared variables set on the host's own inventory entry (``Host.vars``, e.g. a
  ``driver_version`` next to ``ansible_host``).

A host is read on its own (``hostvars[host]``, as before) when the key cannot be trusted for it:
it has a ``host_vars`` file or directory beside an inventory source or the playbook (the files of
ansible-core's ``host_group_vars`` vars plugin), a vars plugin other than ``host_group_vars`` is
enabled (``DEFAULT_VARS_PLUGINS_ENABLED``, ``VARIABLE_PLUGINS_ENABLED``), the inventory object is
not reachable, or a declared variable of its key is a template (``{{ ... }}`` may use the host's
own variables, so it is templated per host).

Sources: ansible-core ``lib/ansible/vars/hostvars.py`` (``HostVars.raw_get`` → ``VariableManager.get_vars``),
``lib/ansible/plugins/vars/host_group_vars.py`` (``<basedir>/host_vars/<host>[.yml|.yaml|.json]``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, Iterable, Mapping, Optional, Set, Tuple

#: Extensions of a ``host_vars`` file (ansible-core's ``YAML_FILENAME_EXTENSIONS``).
VARS_EXTENSIONS = (".yml", ".yaml", ".json")


def plain(value: Any) -> Any:
    """A templated variable value copied into plain ``dict``/``list``/scalars (tags and lazy containers dropped).

    :param value: any variable value. :returns: the same data as plain Python values.
    """
    if isinstance(value, Mapping):
        return dict((str(k), plain(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def is_template(value: Any) -> bool:
    """Whether ``value`` (a raw, untemplated variable value, nested or not) holds Jinja2 markup.

    ``{{``, ``{%`` or ``{#`` in any string of it, keys included (the test ansible-core's
    ``is_possibly_template`` makes with the default delimiters).
    """
    if isinstance(value, str):
        return "{{" in value or "{%" in value or "{#" in value
    if isinstance(value, Mapping):
        return any(is_template(k) or is_template(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(is_template(v) for v in value)
    return False


def vars_entry_names(basedirs: Iterable[Optional[str]], kind: str = "host_vars") -> Set[str]:
    """Host (or group) names that have a ``host_vars`` (``group_vars``) entry beside one of ``basedirs``.

    :param basedirs: inventory source paths (a file's directory is used) and the playbook
        directory; ``None`` and missing paths are skipped.
    :param kind: ``host_vars`` or ``group_vars``.
    :returns: names of ``<basedir>/<kind>/<name>``, ``<name>.yml``/``.yaml``/``.json`` (a file or a directory).
    """
    names = set()  # type: Set[str]
    for base in basedirs:
        if not base:
            continue
        base = base if os.path.isdir(base) else os.path.dirname(base)
        directory = os.path.join(base, kind)
        try:
            entries = os.listdir(directory)
        except OSError:
            continue
        for entry in entries:
            names.add(entry)
            stem, ext = os.path.splitext(entry)
            if ext in VARS_EXTENSIONS:
                names.add(stem)
    return names


def declaration_key(host: Any, names: Iterable[str], group_files: Set[str]
                    ) -> Tuple[Tuple[str, ...], Tuple[Tuple[str, str], ...]]:
    """The key under which hosts share their declared variables.

    :param host: an ``ansible.inventory.host.Host``. :param names: the declared variable names.
    :param group_files: group names with a ``group_vars`` entry (:func:`vars_entry_names`).
    :returns: ``(names of the host's groups with variables, ((name, repr of the host's own value), ...))``.
    """
    own = getattr(host, "vars", None) or {}
    return (tuple(sorted(group.name for group in host.get_groups() if group.name in group_files or group.vars)),
            tuple((name, repr(own[name])) for name in names if name in own))


def declared_variables(hostvars: Any, hosts: Iterable[str], names: Iterable[str], basedirs: Iterable[Optional[str]],
                       vars_plugins: Iterable[str] = ("host_group_vars",)) -> Tuple[Dict[str, Optional[Dict[str, Any]]], Dict[str, int]]:
    """Each host's declared variables (templated), computed once per declaration key.

    :param hostvars: the ``hostvars`` task variable (``ansible.vars.hostvars.HostVars``).
    :param hosts: inventory host names. :param names: variables to read (``drift.DECLARED_VARIABLES``).
    :param basedirs: inventory sources and the playbook directory (for ``host_vars`` entries).
    :param vars_plugins: the enabled vars plugins (``C.VARIABLE_PLUGINS_ENABLED``); any other than
        ``host_group_vars`` makes every host be read on its own.
    :returns: ``({host: {name: value} | None (not in the inventory)}, {"keys": n, "templated": n,
        "per_host": n})``: hosts of one key share one dict object (do not change it).
    :raises: whatever templating a declared variable raises (an undefined variable...).
    """
    names = tuple(names)
    inventory = getattr(hostvars, "_inventory", None)
    shared_ok = inventory is not None and all(
        str(plugin).rsplit(".", 1)[-1] == "host_group_vars" for plugin in vars_plugins)
    basedirs = list(basedirs)
    own_files = vars_entry_names(basedirs, "host_vars") if shared_ok else set()
    group_files = vars_entry_names(basedirs, "group_vars") if shared_ok else set()
    by_key = {}  # type: Dict[Any, Optional[Dict[str, Any]]]
    templated = set()  # type: Set[Any]
    out = {}  # type: Dict[str, Optional[Dict[str, Any]]]
    stats = {"keys": 0, "templated": 0, "per_host": 0}

    def read(host: str) -> Dict[str, Any]:
        variables = hostvars[host]
        return dict((name, plain(variables[name])) for name in names if name in variables)

    for host in hosts:
        entity = inventory.get_host(host) if inventory is not None else None
        if entity is None and (inventory is not None or host not in hostvars):
            out[host] = None
            continue
        if not shared_ok or host in own_files:
            out[host] = read(host)
            stats["per_host"] += 1
            continue
        key = declaration_key(entity, names, group_files)
        if key in templated:
            out[host] = read(host)
            stats["per_host"] += 1
            continue
        if key not in by_key:
            raw = hostvars.raw_get(host)
            if any(name in raw and is_template(raw[name]) for name in names):
                templated.add(key)
                stats["templated"] += 1
                out[host] = read(host)
                stats["per_host"] += 1
                continue
            by_key[key] = read(host)
            stats["keys"] += 1
        out[host] = by_key[key]
    return out, stats
