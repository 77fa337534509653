# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver role's one include after driver_install: the dnf install, pynvml, both or none.

The include's condition and file name are rendered with Ansible's Templar, as the worker renders
them; the files it names must exist and hold what their names say. Not a fleet test: the fleet
runs Debian, so only the apt side runs there (field cases 20 and 21 are dnf's).
"""

from __future__ import annotations

import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

TASKS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "roles", "driver", "tasks")


def _include():
    with open(os.path.join(TASKS, "transaction.yml")) as handle:
        tasks = yaml.safe_load(handle)
    return next(task for task in tasks if "ansible.builtin.include_tasks" in task)


@pytest.mark.parametrize("apt,pynvml,runs,file", [
    (True, "none", False, None),
    (True, "auto", True, "pynvml.yml"),
    (False, "none", True, "install_dnf.yml"),
    (False, "venv", True, "install_dnf_pynvml.yml"),
])
def test_one_include_names_the_file_each_node_needs(apt, pynvml, runs, file):
    include = _include()
    plan = {"plan": {"resolved": {}}} if apt else {"repo": {"package_manager": "dnf"}}
    templar = Templar(loader=DataLoader(), variables={"__driver_plan": plan, "driver_pynvml": pynvml})
    assert templar.template(trust_as_template("{{ %s }}" % include["when"])) is runs
    if runs:
        chosen = templar.template(trust_as_template(include["ansible.builtin.include_tasks"]["file"])).strip()
        assert chosen == file and os.path.exists(os.path.join(TASKS, chosen))


def test_the_dnf_and_pynvml_file_imports_both_in_that_order():
    with open(os.path.join(TASKS, "install_dnf_pynvml.yml")) as handle:
        imported = [task["ansible.builtin.import_tasks"] for task in yaml.safe_load(handle)]
    assert imported == ["install_dnf.yml", "pynvml.yml"]
