# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A recording stand-in for the node behind an action that runs modules (not an integration test).

``node_action`` builds the action with a fake ``_execute_module`` that records each call and
answers from ``answers``: a module's result, or a function of the module's arguments.
"""

from __future__ import annotations

from unittest import mock

from ansible.playbook.play_context import PlayContext


def node_action(cls, args, answers, check_mode=False):
    """``(plugin, calls)``: ``cls`` (an ActionModule) for a task with ``args``; ``calls`` gets
    ``(module name, module arguments, check mode at the call)`` for each module run."""
    task = mock.MagicMock()
    task.args = args
    task.async_val = 0
    task.check_mode = check_mode
    context = PlayContext()
    context.check_mode = check_mode
    connection = mock.MagicMock()
    connection._shell.tmpdir = None
    plugin = cls(task, connection, context, loader=None, templar=None, shared_loader_obj=None)
    calls = []

    def execute(module_name=None, module_args=None, task_vars=None, **_kwargs):
        calls.append((module_name, dict(module_args or {}), plugin._task.check_mode))
        found = answers[module_name]
        return found(module_args) if callable(found) else found

    plugin._execute_module = execute
    plugin._remove_tmp_path = lambda *a, **k: None
    return plugin, calls
