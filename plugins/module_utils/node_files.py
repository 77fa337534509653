# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Files the collection's modules write on a node: read as text, written whole, only when they differ.

Compatible with Python 3.7; standard library only (and the module's ``check_mode``).
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, Optional, Tuple


def read_text(path: str) -> Optional[str]:
    """The text (UTF-8) of ``path``, or ``None`` when there is no such file or it cannot be read."""
    try:
        with open(path, "r", encoding="utf-8") as handle:
            return handle.read()
    except (IOError, OSError, UnicodeDecodeError):
        return None


def read_json_object(path: str) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """A JSON object file: ``(content, None)``, ``({}, None)`` when there is no such file, or ``(None, why)``.

    ``why`` names what is wrong (not JSON, not an object, not readable), never the content.
    """
    if not os.path.lexists(path):
        return {}, None
    text = read_text(path)
    if text is None:
        return None, "cannot be read as UTF-8 text"
    try:
        content = json.loads(text)
    except ValueError as exc:
        return None, "not JSON: %s" % exc
    if not isinstance(content, dict):
        return None, "not a JSON object (%s)" % type(content).__name__
    return content, None


def write_file(module: Any, path: str, content: str, mode: int = 0o644, directory_mode: Optional[int] = None) -> bool:
    """Write ``content`` to ``path`` with ``mode``, root-owned where the module runs as root, when anything differs.

    The file is written to a temporary file in its directory and renamed over ``path``, so that a
    reader never sees half of it. A missing directory is made (``directory_mode``, else 0755); with
    ``directory_mode`` an existing directory gets that mode.

    :param module: the ``AnsibleModule`` (its ``check_mode``: nothing is written, the answer is
        whether it would be).
    :returns: whether the file (or its directory) changed, or in check mode would change.
    """
    root = os.geteuid() == 0
    changed = False
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        changed = True
        if not module.check_mode:
            os.makedirs(directory, directory_mode if directory_mode is not None else 0o755)
    elif directory_mode is not None and (os.stat(directory).st_mode & 0o7777) != directory_mode:
        changed = True
        if not module.check_mode:
            os.chmod(directory, directory_mode)
    try:
        info = os.stat(path)
        if read_text(path) == content and (info.st_mode & 0o7777) == mode \
                and (not root or (info.st_uid == 0 and info.st_gid == 0)):
            return changed
    except OSError:
        pass
    if module.check_mode:
        return True
    handle, temp = tempfile.mkstemp(dir=directory, prefix=".gpufleet-")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as out:
            out.write(content)
        os.chmod(temp, mode)
        if root:
            os.chown(temp, 0, 0)
        os.rename(temp, path)
    except BaseException:
        if os.path.exists(temp):
            os.unlink(temp)
        raise
    return True
