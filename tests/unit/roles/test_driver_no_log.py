# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The driver role hides the output of every task that shows a URL with credentials."""

from __future__ import annotations

import os

import pytest
import yaml
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

ROLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "roles", "driver")


def _tasks(node):
    for task in node or []:
        yield task
        for key in ("block", "rescue", "always"):
            yield from _tasks(task.get(key))


@pytest.mark.parametrize("repo,index,hidden", [
    ("https://mirror.example/cuda/debian12/x86_64/", "", False),
    ("https://user:s3cret@mirror.example/cuda/debian12/x86_64/", "", True),
    ("", "https://token@pypi.mirror.example/simple", True),
    ("file:///srv/mirror", "https://pypi.mirror.example/simple", False),
])
def test_urls_with_credentials_are_detected(repo, index, hidden):
    with open(os.path.join(ROLE, "vars", "main.yml")) as handle:
        expression = yaml.safe_load(handle)["__driver_urls_hold_secrets"]
    templar = Templar(loader=DataLoader(), variables={"driver_repo_url": repo, "driver_pynvml_pip_index_url": index})
    assert templar.template(trust_as_template(expression)) is hidden


def test_every_task_that_shows_such_a_url_has_no_log():
    shown = ("driver_repo_url", "__driver_repository_args", "__driver_plan.repo.sources_content",
             "__driver_plan.repo.repo_content", "__driver_plan.repo.key_url", "driver_pynvml_pip_index_url")
    checked = 0
    for name in ("main.yml", "transaction.yml", "install_dnf.yml", "repository_dnf.yml", "pynvml.yml"):
        with open(os.path.join(ROLE, "tasks", name)) as handle:
            for task in _tasks(yaml.safe_load(handle)):
                if "block" in task:
                    continue
                text = yaml.safe_dump(task)
                if any(word in text for word in shown):
                    assert task.get("no_log") == "{{ __driver_urls_hold_secrets }}", (name, task.get("name"))
                    checked += 1
    assert checked >= 4
