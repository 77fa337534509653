# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""NVIDIA driver versions: their form, their branch, their order, the upstream version of a
package version, and exact equality.

A driver version is dotted and numeric (``"580.126.20"``, 2 to 4 parts); its first part is its
*branch* (``"580"``), which NVIDIA writes ``R580``. Bare driver versions are ordered by
:func:`version_key` (the parts as integers; anything else is refused); package versions, with
their epochs and revisions, are not ordered here (``ansible.module_utils.compat.version.LooseVersion``
on :func:`upstream_version` results does that where needed). Versions are compared for
**exact equality** of the upstream version (:func:`versions_match`): the kernel module and the
userspace must be the same build, and the same branch is not enough (NVIDIA Fabric Manager
refuses 530.30.02 with driver 530.41.03, field case 11).

Compatible with Python 3.7 (the managed nodes' floor, see README.md); standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Optional, Tuple


#: A bare driver version as NVIDIA prints it: ``580.82.07``, ``550.120``.
VERSION_TOKEN = re.compile(r"^\d+\.\d+(?:\.\d+)*$")

#: The same, to embed in a larger pattern.
VERSION_IN_TEXT = r"\d+\.\d+(?:\.\d+)*"


def upstream_version(version: Optional[str]) -> Optional[str]:
    """Strip a package version down to NVIDIA's driver version.

    Debian/Ubuntu versions are ``[epoch:]upstream[-revision]`` (Debian Policy 5.6.12); rpm versions
    are ``[epoch:]version-release``. The epoch (before the first ``:``) and the revision/release
    (after the last ``-``) are removed: ``"580.126.20-1"`` → ``"580.126.20"``,
    ``"460.73.01-0ubuntu0.20.04.1"`` → ``"460.73.01"``, ``"3:580.126.09-1.el9"`` → ``"580.126.09"``.
    NVIDIA driver versions themselves never contain ``-`` or ``:``.

    :param version: a package version, a bare driver version, or ``None``.
    :returns: the upstream version, or ``None`` for ``None``, empty text or ``"<none>"``
        (what ``dpkg -l`` prints for a package that is not installed).
    :raises: nothing.
    """
    if version is None:
        return None
    text = version.strip()
    if not text or text == "<none>":
        return None
    if ":" in text:
        head, rest = text.split(":", 1)
        if head.isdigit():
            text = rest
    if "-" in text:
        text = text.rsplit("-", 1)[0]
    return text or None


def versions_match(a: Optional[str], b: Optional[str]) -> bool:
    """Exact equality of two NVIDIA driver versions.

    Both sides are reduced with :func:`upstream_version` (so a package version may be compared
    with a driver version) and compared as strings: ``"580.126.09"`` matches only
    ``"580.126.09"``; ``"550.120"`` does not match ``"550.127.05"`` and ``"530.30.02"`` does not
    match ``"530.41.03"`` even though the branches agree (field case 11: Fabric Manager and the
    kernel module must be the same build). No prefix matching: ``"595.71"`` does not match
    ``"595.71.05"``.

    :returns: ``True`` only when both are known and equal; ``False`` when they differ or when
        either is ``None``/empty. Callers that must tell "different" from "unknown" test for
        ``None`` first.
    :raises: nothing.
    """
    left = upstream_version(a)
    right = upstream_version(b)
    if left is None or right is None:
        return False
    return left == right


_VERSION = re.compile(r"^\d+(?:\.\d+){1,3}$")


_BRANCH = re.compile(r"^[rR]?(\d{3,4})$")


def version_key(version: str) -> Tuple[int, ...]:
    """Sort key of an NVIDIA driver version: ``"580.126.20"`` → ``(580, 126, 20)``.

    :param version: a dotted numeric driver version (2 to 4 parts).
    :returns: a tuple of ints.
    :raises ValueError: when ``version`` is not a dotted numeric version.
    """
    text = str(version).strip()
    if not _VERSION.match(text):
        raise ValueError("not an NVIDIA driver version: %r (expected e.g. 580.126.20)" % (version,))
    return tuple(int(part) for part in text.split("."))


def is_version(value: Any) -> bool:
    """Tell whether ``value`` is a dotted numeric driver version such as ``"580.126.20"``."""
    return value is not None and bool(_VERSION.match(str(value).strip()))


def parse_branch(value: Any) -> Optional[str]:
    """Normalise a branch number: ``"R580"``, ``"580"``, ``580`` → ``"580"``.

    :returns: the branch as a string of digits, or ``None`` when ``value`` is not a branch number
        (a class name such as ``"ltsb"`` is not a branch number).
    :raises: nothing.
    """
    if value is None or isinstance(value, bool):
        return None
    match = _BRANCH.match(str(value).strip())
    return match.group(1) if match else None


def branch_of_version(version: str) -> str:
    """The branch of a driver version: ``"580.126.20"`` → ``"580"``.

    :raises ValueError: when ``version`` is not a driver version.
    """
    return str(version_key(version)[0])
