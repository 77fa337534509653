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
