# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The bases of the collection's actions: arguments validated first; controller-only ones.

Every one supports check mode and validates its arguments against an argument spec before it
does anything; controller-only actions (reports, rollout steps) need no connection to the host
they run for.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase


class ValidatedAction(ActionBase):
    """An action whose arguments are checked first; subclasses set ``NAME`` and ``ARGUMENT_SPEC``."""

    TRANSFERS_FILES = False
    _supports_check_mode = True
    NAME = "action"
    ARGUMENT_SPEC = {}  # type: dict

    def validated_args(self):
        """The task's arguments checked against ``ARGUMENT_SPEC``, defaults filled in.

        :raises AnsibleActionFail: ``"<NAME>: <every problem>"``.
        """
        validation = ArgumentSpecValidator(self.ARGUMENT_SPEC).validate(self._task.args)
        if validation.error_messages:
            raise AnsibleActionFail("%s: %s" % (self.NAME, "; ".join(validation.error_messages)))
        return validation.validated_parameters


class ControllerAction(ValidatedAction):
    """An action that runs on the controller only, needing no connection to its host."""

    _requires_connection = False


def without_unset(options, empty_means_unset):
    """``options`` without the keys of ``empty_means_unset`` whose value is ``None`` or ``""`` (a role
    passes an option it was not given as ``""``; the module's own default then applies)."""
    return dict((key, value) for key, value in options.items()
                if not (key in empty_means_unset and value in (None, "")))


def add_diff(result, diff):
    """Put a module's ``diff`` (a dict or a list of them) into an action's ``result``, whose ``diff``
    list ``--diff`` shows; nothing when the module gave none."""
    if diff:
        result.setdefault("diff", []).extend(diff if isinstance(diff, list) else [diff])


class NodeAction(ValidatedAction):
    """An action that runs the collection's modules on its node, several in one task.

    Each task costs the controller the same (the play iterator, the host's variables, a worker
    process) whatever it does; one action that runs several modules pays that once.
    """

    def _module(self, name, args, task_vars, what, warnings):
        """Run one module on the node; its warnings join ``warnings``.

        :param name: the module's FQCN (``gpufleet.nvidia.gpu_facts``).
        :param args: its arguments (a dict).
        :param what: what the run is for; a failure then raises naming it and the module.
            ``None``: a failure is returned (its ``failed`` and ``msg``), not raised.
        :returns: the module's result, without its ``warnings``, its ``invocation`` (the arguments it
            was given: the caller has them, and they would travel back to the controller in this
            task's result) and Ansible's internal keys.
        :raises AnsibleActionFail: ``"<what> (<name>): <the module's msg>"`` when the module failed
            and ``what`` is given.
        """
        try:
            result = self._execute_module(module_name=name, module_args=args, task_vars=task_vars)
        finally:
            self._remove_tmp_path(self._connection._shell.tmpdir)
        warnings.extend(str(warning) for warning in result.get("warnings") or [])
        if result.get("failed") and what is not None:
            raise AnsibleActionFail("%s (%s): %s" % (what, name, result.get("msg") or "failed"))
        return dict((key, value) for key, value in result.items()
                    if not key.startswith("_ansible") and key not in ("warnings", "invocation"))
