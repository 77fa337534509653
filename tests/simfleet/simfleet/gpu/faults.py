# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fault injection into a node's GPU state (the state-level fault kinds of ``simfleet fault``).

The implementation is the node-side ``simgpu.faults`` (one definition for host and node);
see its docstring for the kinds and their arguments. ``reboot_hang`` and
``repo_unreachable`` are fleet-level faults handled by the fleet tool, not here.
"""

from __future__ import annotations

from typing import Any, Dict, Sequence, Union

from . import simgpu as _simgpu_pkg

_simgpu_pkg()
from simgpu import faults as _impl  # noqa: E402

KINDS = _impl.KINDS
FIELDS = _impl.FIELDS


def apply_fault(state: Dict[str, Any], kind: str,
                args: Union[None, Dict[str, Any], Sequence[str]] = None) -> Dict[str, Any]:
    """Apply fault ``kind`` with ``args`` (dict or command-line strings) to ``state``; return it.

    Raises ValueError for an unknown kind, field or GPU index.
    """
    return _impl.apply_fault(state, kind, args)


def apply_fault_to_file(path: str, kind: str, args: Union[None, Dict[str, Any], Sequence[str]] = None) -> Dict[str, Any]:
    """Apply a fault to the state file at ``path`` under the node's lock; return the new state."""
    from simgpu.state import update_state

    def mutate(state: Dict[str, Any]) -> Dict[str, Any]:
        _impl.apply_fault(state, kind, args)
        return state

    return update_state(path, mutate)
