# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The base of the collection's controller-only actions (reports, rollout steps).

They need no connection to the host they run for, support check mode, and validate their
arguments against an argument spec before doing anything.
"""

from __future__ import annotations

from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.plugins.action import ActionBase


class ControllerAction(ActionBase):
    """An action that runs on the controller only; subclasses set ``NAME`` and ``ARGUMENT_SPEC``."""

    TRANSFERS_FILES = False
    _requires_connection = False
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
