# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Extra vars arrive as strings: every bool, int and float option of the roles is converted where it is used.

``-e node_upgrade_drain_timeout_s=14400`` is the string ``"14400"`` and ``-e gpu_policy_boot_reapply=false``
the string ``"false"``, which is true in a condition. A role's argument spec checks such a value but does
not convert it. So wherever a typed option enters an expression (arithmetic, a comparison, a condition, a
value handed to a filter), it must pass through ``| bool``, ``| int`` or ``| float`` (after ``| default``
if any). Handing it whole to a module argument (``"{{ var }}"``, or ``var if var is not none else omit``)
is fine: the module's own argument spec converts it. This test reads every task file and playbook with
Jinja2's parser and names each use that breaks the rule.
"""

from __future__ import annotations

import glob
import os

import yaml
from jinja2 import Environment, nodes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
CONDITION_KEYS = ("when", "until", "changed_when", "failed_when")
CONVERSIONS = {"bool", "int", "float"}
PASS_THROUGH_TESTS = {"none", "defined", "undefined"}


def typed_options():
    """``{name: type}`` of every bool, int and float option of every role entry point."""
    out = {}
    for path in glob.glob(os.path.join(REPO, "roles", "*", "meta", "argument_specs.yml")):
        with open(path) as handle:
            for entry in (yaml.safe_load(handle)["argument_specs"] or {}).values():
                for name, spec in (entry.get("options") or {}).items():
                    if spec.get("type") in CONVERSIONS:
                        out[name] = spec["type"]
    return out


SET_FACT = ("ansible.builtin.set_fact", "set_fact")


def strings(value, key=None, in_set_fact=False):
    """``(key, text, in_set_fact)`` for every string in a loaded YAML document: the mapping key it sits
    under, and whether it is a ``set_fact`` value (kept as it is, with no module to convert it)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from strings(v, k, in_set_fact or k in SET_FACT)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item, key, in_set_fact)
    elif isinstance(value, str):
        yield key, value, in_set_fact


def _parents(node, parent=None):
    yield node, parent
    for child in node.iter_child_nodes():
        yield from _parents(child, node)


def _whole_value(tree, name):
    """``{{ name }}`` alone, or ``{{ name if name is not none else omit }}``: handed whole to a module argument."""
    body = tree.body
    if len(body) != 1 or not isinstance(body[0], nodes.Output) or len(body[0].nodes) != 1:
        return False
    expr = body[0].nodes[0]
    if isinstance(expr, nodes.Filter) and expr.name == "default":
        expr = expr.node
    if isinstance(expr, nodes.Name) and expr.name == name:
        return True
    return isinstance(expr, nodes.CondExpr) and isinstance(expr.expr1, nodes.Name) and expr.expr1.name == name \
        and isinstance(expr.expr2, nodes.Name) and expr.expr2.name == "omit"


def unconverted_uses(text, condition, typed, kept=False):
    """The typed options ``text`` uses without a conversion: ``[name]`` (``kept``: a set_fact value)."""
    source = "{{ %s }}" % text if condition else text
    if "{{" not in source and "{%" not in source:
        return []
    tree = Environment().parse(source)
    bad = []
    for node, parent in _parents(tree):
        if not isinstance(node, nodes.Name) or node.name not in typed:
            continue
        if isinstance(parent, nodes.Filter) and parent.node is node and parent.name in CONVERSIONS:
            continue
        if isinstance(parent, nodes.Test) and parent.node is node and parent.name in PASS_THROUGH_TESTS:
            continue
        if isinstance(parent, nodes.Filter) and parent.node is node and parent.name == "default":
            holder = next((p for n, p in _parents(tree) if n is parent), None)
            if isinstance(holder, nodes.Filter) and holder.node is parent and holder.name in CONVERSIONS:
                continue
            if isinstance(holder, nodes.Test) and holder.node is parent and holder.name in PASS_THROUGH_TESTS:
                continue
        if not condition and not kept and _whole_value(tree, node.name):
            continue
        bad.append(node.name)
    return bad


def test_typed_options_are_converted_where_used():
    typed = typed_options()
    assert typed["node_upgrade_drain_timeout_s"] == "int" and typed["gpu_policy_boot_reapply"] == "bool"
    files = glob.glob(os.path.join(REPO, "roles", "*", "tasks", "*.yml")) + glob.glob(os.path.join(REPO, "playbooks", "*.yml"))
    problems = []
    for path in sorted(files):
        with open(path) as handle:
            document = yaml.safe_load(handle)
        for key, text, kept in strings(document):
            for name in unconverted_uses(text, key in CONDITION_KEYS, typed, kept):
                problems.append("%s: %s (%s) in %r" % (os.path.relpath(path, REPO), name, typed[name], text[:120]))
    assert problems == []


def test_the_check_finds_each_kind_of_unconverted_use():
    typed = {"t_s": "int", "flag": "bool"}
    assert unconverted_uses("flag", True, typed) == ["flag"]
    assert unconverted_uses("(t_s / 10) | int", False, typed) == []  # not a template: a plain string
    assert unconverted_uses("{{ (t_s / 10) | int }}", False, typed) == ["t_s"]
    assert unconverted_uses("{{ (t_s | int) // 10 }}", False, typed) == []
    assert unconverted_uses("flag | bool and t_s | default(5) | int > 0", True, typed) == []
    assert unconverted_uses("{{ t_s }}", False, typed) == []
    assert unconverted_uses("{{ t_s }}", False, typed, kept=True) == ["t_s"]
    assert unconverted_uses("{{ flag if flag is not none else omit }}", False, typed) == []
    assert unconverted_uses("{{ {'x': flag} | some_filter }}", False, typed) == ["flag"]
    assert unconverted_uses("{{ flag | default(false) }}", False, typed) == []
    assert unconverted_uses("{{ 'on' if t_s | default(none) is not none else 'off' }}", False, typed) == []
    assert unconverted_uses("{{ 'on' if t_s | default(none) > 3 else 'off' }}", False, typed) == ["t_s"]
