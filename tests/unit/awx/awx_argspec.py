# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print, as JSON, the argument specs of awx.awx modules, read from the installed collection.

Run with the Python of the virtualenv that holds the ``ansible`` package (``.venv-awx``)::

    .venv-awx/bin/python tests/unit/awx/awx_argspec.py job_template schedule ...

Each module's ``main()`` builds its ``argument_spec`` and hands it, with the auth options that
``ControllerModule`` adds, to ``AnsibleModule.__init__``; that call is intercepted before any
parameter is read or any request is made. Output: ``{module: {"argument_spec": {...},
"mutually_exclusive": [...], "required_if": [...], ...}}``, with ``fallback`` (a function) and
other values that are not JSON left out. A module that does not exist raises
``ModuleNotFoundError``.
"""

from __future__ import annotations

import importlib
import json
import os
import sys

import ansible_collections  # the ansible package's collections, installed beside ansible-core
from ansible.module_utils import basic
from ansible.utils.collection_loader._collection_finder import _AnsibleCollectionFinder

CONSTRAINTS = ("mutually_exclusive", "required_together", "required_one_of", "required_if", "required_by")


class Captured(Exception):
    """Raised from the intercepted AnsibleModule.__init__ with its keyword arguments."""

    def __init__(self, kwargs):
        super().__init__("captured")
        self.kwargs = kwargs


def _jsonable(value):
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items() if k != "fallback"}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return repr(value)


def _intercept(self, *args, **kwargs):
    raise Captured(kwargs)


def argument_spec(module):
    """Return the JSON-ready argument spec and constraints of ``awx.awx.<module>``."""
    imported = importlib.import_module("ansible_collections.awx.awx.plugins.modules.%s" % module)
    original = basic.AnsibleModule.__init__
    basic.AnsibleModule.__init__ = _intercept
    kwargs = None
    try:
        imported.main()
    except Captured as captured:
        kwargs = captured.kwargs
    finally:
        basic.AnsibleModule.__init__ = original
    if kwargs is None:
        raise RuntimeError("awx.awx.%s did not build an AnsibleModule" % module)
    result = {"argument_spec": _jsonable(kwargs["argument_spec"])}
    for key in CONSTRAINTS:
        result[key] = _jsonable(kwargs.get(key) or [])
    return result


def main(argv):
    """Print the specs of the modules named in ``argv`` as one JSON object."""
    site = os.path.dirname(list(ansible_collections.__path__)[0])
    _AnsibleCollectionFinder(paths=[site])._install()  # pylint: disable=protected-access
    json.dump({module: argument_spec(module) for module in argv}, sys.stdout, sort_keys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
