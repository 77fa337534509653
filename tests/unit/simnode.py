# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A fake node root with the simulated fleet's NVML, and main() of a module run as Ansible runs it.

Shared by the tests of the modules that change GPUs (gpu_policy, gpu_mig). The NVML test double
is the simulated fleet's drop-in pynvml: the real nvidia-ml-py wrappers over a simulated library
serving ``$SIMGPU_ROOT/var/lib/simgpu/state.json``.
"""

import json
import os
import sys
from unittest import mock

import pytest
from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.testing import patch_module_args

SIMFLEET = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "simfleet")
if SIMFLEET not in sys.path:
    sys.path.insert(0, SIMFLEET)

from simfleet.gpu import load_pynvml as load_sim_pynvml  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.faults import apply_fault  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu.state import (  # noqa: E402  pylint: disable=wrong-import-position
    boot_node_root,
    initial_state,
    load_state,
    state_path,
    update_state,
    write_node_root,
)


def make_node_root(tmp_path, monkeypatch, module, profile="h100"):
    """Write and boot a node root of GPU class ``profile``; point ``module.load_pynvml`` at its NVML.

    :returns: the root's path (str).
    """
    root = str(tmp_path / "root")
    write_node_root(root, initial_state(profile, "node-%s" % profile))
    boot_node_root(root)
    monkeypatch.setenv("SIMGPU_ROOT", root)
    monkeypatch.delenv("SIMGPU_FAKE_UID", raising=False)
    nvml = load_sim_pynvml()
    monkeypatch.setattr(module, "load_pynvml", lambda: nvml)
    return root


def state_of(root):
    """The simulated GPU state of the node root (dict of state.json)."""
    return load_state(state_path(root))


def fault(root, kind, args):
    """Inject a simulated fault (``simfleet fault`` kinds) into the node root's state."""
    update_state(state_path(root), lambda state: apply_fault(state, kind, args))


def run_main(main, args, capsys, check_mode=False, diff=False):
    """Run a module's ``main()`` with ``args`` as Ansible does.

    :returns: ``(exit code, result dict)``; the result carries ``_warned``, every text given to
        ``module.warn()`` (whether the core returns warnings in the result or shows them itself).
    """
    warned = []
    original = AnsibleModule.warn

    def record(self, warning, *more, **kwargs):
        warned.append(warning)
        return original(self, warning, *more, **kwargs)

    args = dict(args, _ansible_check_mode=check_mode, _ansible_diff=diff)
    with patch_module_args(args), mock.patch.object(AnsibleModule, "warn", record):
        with pytest.raises(SystemExit) as exit_info:
            main()
    result = json.loads(capsys.readouterr().out)
    result["_warned"] = warned
    return exit_info.value.code, result


def warnings_of(result):
    """The warnings the module gave."""
    return result["_warned"]
