# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Why NVML answered NoPermission ("Insufficient Permissions"): not root, or root without CAP_SYS_ADMIN.

:func:`read_permission_context` gathers the evidence (effective uid, ``CapEff`` of
``/proc/self/status``, container markers); :func:`permission_message` turns it into one
sentence that says what to do (field case 14: root in a container is not enough). Only
:func:`read_permission_context` does I/O (file reads).
"""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List, Optional


# CAP_SYS_ADMIN is capability number 21 (linux/capability.h).
CAP_SYS_ADMIN = 21


def cap_effective_has(status_text: Optional[str], capability: int = CAP_SYS_ADMIN) -> Optional[bool]:
    """Tell from ``/proc/self/status`` whether the process holds a capability.

    :param status_text: the content of ``/proc/self/status`` (its ``CapEff:`` line is a hex mask).
    :param capability: the capability number, default ``CAP_SYS_ADMIN`` (21, linux/capability.h).
    :returns: ``True``/``False``, or ``None`` when the text has no ``CapEff:`` line.
    """
    if not status_text:
        return None
    match = re.search(r"^CapEff:\s*([0-9a-fA-F]+)\s*$", status_text, re.MULTILINE)
    if not match:
        return None
    return bool(int(match.group(1), 16) & (1 << capability))


def in_container(cgroup_text: Optional[str] = None, marker_files: Optional[List[str]] = None,
                 container_env: Optional[str] = None) -> bool:
    """Tell whether the process runs in a container, from evidence the caller read.

    :param cgroup_text: the content of ``/proc/1/cgroup`` (docker/kubepods/containerd/lxc paths).
    :param marker_files: the marker files that exist (``/.dockerenv``, ``/run/.containerenv``).
    :param container_env: the ``container`` environment variable of PID 1 (systemd convention:
        ``docker``, ``podman``, ``lxc``, ``systemd-nspawn``).
    :returns: ``True`` when any evidence says container.
    """
    if marker_files:
        return True
    if container_env:
        return True
    if cgroup_text and re.search(r"docker|kubepods|containerd|libpod|/lxc/", cgroup_text):
        return True
    return False


def permission_message(what: str, euid: int, container: bool, cap_sys_admin: Optional[bool]) -> str:
    """Say what is missing when NVML answered NoPermission ("Insufficient Permissions").

    :param what: what was being set, e.g. ``"the power limit of GPU 0 (0000:18:00.0)"``.
    :param euid: the effective user id of the module.
    :param container: whether the module runs in a container (see :func:`in_container`).
    :param cap_sys_admin: whether ``CAP_SYS_ADMIN`` is in the effective set (see
        :func:`cap_effective_has`), ``None`` when unknown.
    :returns: one sentence: not root → run as root (``become: true``); root in a container without
        ``CAP_SYS_ADMIN`` → start the container with ``--cap-add=SYS_ADMIN`` or run on the host
        (field case 14: nvidia-docker issue 495); otherwise the GPU's or driver's own restriction.
    """
    if euid != 0:
        return ("NVML refused to set %s: Insufficient Permissions. Setting GPU policy needs root: "
                "run the task with become: true (the module ran as uid %d)." % (what, euid))
    if container or cap_sys_admin is False:
        return ("NVML refused to set %s: Insufficient Permissions although the module runs as root%s. "
                "Root in a container is not enough: the container needs CAP_SYS_ADMIN "
                "(--cap-add=SYS_ADMIN, or securityContext.capabilities.add: [SYS_ADMIN]), "
                "or run the task on the host." % (what, " in a container" if container else " without CAP_SYS_ADMIN"))
    return ("NVML refused to set %s: Insufficient Permissions although the module runs as root with "
            "CAP_SYS_ADMIN. The setting may be locked (for example by a hypervisor in a virtual machine "
            "or by the board's out-of-band management)." % what)


def _read_small(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as handle:
            return handle.read(65536).decode("utf-8", "replace")
    except (IOError, OSError):
        return None


def read_permission_context(proc_root: str = "/proc", root: str = "/") -> Dict[str, Any]:
    """Gather what :func:`permission_message` needs. Does file I/O.

    Reads ``/proc/self/status`` (``CapEff``), ``/proc/1/cgroup``, ``/proc/1/environ`` (the
    ``container=`` variable) and looks for ``/.dockerenv`` and ``/run/.containerenv``.

    :returns: ``{"euid": int, "container": bool, "cap_sys_admin": bool|None}``.
    """
    environ = _read_small(os.path.join(proc_root, "1", "environ")) or ""
    container_env = None
    for item in environ.split("\0"):
        if item.startswith("container="):
            container_env = item.split("=", 1)[1]
    markers = [path for path in (os.path.join(root, ".dockerenv"), os.path.join(root, "run", ".containerenv"))
               if os.path.exists(path)]
    return {
        "euid": os.geteuid(),
        "container": in_container(_read_small(os.path.join(proc_root, "1", "cgroup")), markers, container_env),
        "cap_sys_admin": cap_effective_has(_read_small(os.path.join(proc_root, "self", "status"))),
    }
