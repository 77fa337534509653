# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU simulation's files inside every node's root filesystem.

:func:`install_into_rootfs` puts into a (debootstrap'd) root filesystem:

- ``/usr/lib/simgpu/`` - the ``simgpu`` library and its ``bin/simgpu`` entry point (the
  source carries no interpreter line; the node's ``#!/usr/bin/python3`` is written at install
  time and the file made executable, see :data:`NODE_SCRIPTS`);
- ``/usr/lib/simgpu/pynvml-dropin/pynvml.py`` (the drop-in) next to
  ``nvidia_ml_py_pynvml.py`` (the real nvidia-ml-py ``pynvml.py`` of the control host, copied
  at install time, never kept in this repository), and the link
  ``/usr/local/lib/python3.<minor>/dist-packages/pynvml.py`` -> the drop-in: that directory
  comes before ``/usr/lib/python3/dist-packages`` on Debian's ``sys.path`` and dpkg never
  writes there, so the drop-in also shadows a ``python3-pynvml`` package installed later
  (a module run from a virtualenv without system site-packages does not see it);
- ``/usr/local/bin/dmesg`` - the kernel-log stand-in (ahead of /usr/bin in PATH);
- ``/usr/lib/systemd/system/simgpu-boot.service``, enabled for ``multi-user.target``;
- ``/var/lib/simgpu/`` (the state file is written there when the node is created).

Driver files (NVML library, nvidia-smi, kernel modules) come from the driver packages.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
from typing import List, Optional

from . import NODE_DIR

REAL_PYNVML_NAME = "nvidia_ml_py_pynvml.py"
DROPIN_RELPATH = "usr/lib/simgpu/pynvml-dropin/pynvml.py"
DEFAULT_PYTHON = "python3.11"
UNIT_NAME = "simgpu-boot.service"
#: Node files that are commands: relative path -> interpreter line written before the source.
#: The node's Python is /usr/bin/python3 (Debian 12 has no ``python``).
NODE_SCRIPTS = {"usr/lib/simgpu/bin/simgpu": "#!/usr/bin/python3\n"}


def real_pynvml_path() -> str:
    """Path of the real nvidia-ml-py ``pynvml.py`` importable by this Python.

    Raises RuntimeError when nvidia-ml-py is not installed (the control host's virtualenv has it).
    """
    spec = importlib.util.find_spec("pynvml")
    origin = getattr(spec, "origin", None) if spec else None
    if not origin or not os.path.isfile(origin) or "pynvml-dropin" in origin:
        raise RuntimeError("nvidia-ml-py (pynvml) is not installed for %s; it is needed to build node files"
                           % os.path.realpath(sys.executable))
    return origin


def pynvml_link_relpath(rootfs: str) -> str:
    """Where the drop-in is linked: ``usr/local/lib/<python3.X of the rootfs>/dist-packages/pynvml.py``."""
    libdir = os.path.join(rootfs, "usr/lib")
    found = sorted(name for name in (os.listdir(libdir) if os.path.isdir(libdir) else [])
                   if name.startswith("python3.") and name[8:].isdigit())
    python = found[-1] if found else DEFAULT_PYTHON
    return "usr/local/lib/%s/dist-packages/pynvml.py" % python


def _node_files() -> List[str]:
    out = []
    for base, dirs, files in os.walk(NODE_DIR):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for name in sorted(files):
            if not name.endswith((".pyc", ".pyo")):
                out.append(os.path.relpath(os.path.join(base, name), NODE_DIR))
    return out


def node_files_digest(real_pynvml: Optional[str] = None) -> str:
    """SHA-256 over the node-side files and the real pynvml.py: a cache key for base images."""
    digest = hashlib.sha256()
    for rel in _node_files():
        digest.update(rel.encode() + b"\0")
        with open(os.path.join(NODE_DIR, rel), "rb") as handle:
            digest.update(handle.read())
    with open(real_pynvml or real_pynvml_path(), "rb") as handle:
        digest.update(handle.read())
    return digest.hexdigest()


def install_into_rootfs(rootfs: str, real_pynvml: Optional[str] = None) -> List[str]:
    """Install the node-side GPU simulation into the root filesystem at ``rootfs``.

    Idempotent. Returns the node paths written. Raises RuntimeError without nvidia-ml-py.
    """
    source_pynvml = real_pynvml or real_pynvml_path()
    written = []
    for rel in _node_files():
        src = os.path.join(NODE_DIR, rel)
        dst = os.path.join(rootfs, rel)
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        if os.path.lexists(dst):
            os.unlink(dst)
        if rel in NODE_SCRIPTS:
            with open(src, "rb") as handle:
                body = handle.read()
            with open(dst, "wb") as handle:
                handle.write(NODE_SCRIPTS[rel].encode("ascii") + body)
            shutil.copystat(src, dst)
            os.chmod(dst, 0o755)
        else:
            shutil.copy2(src, dst)
            os.chmod(dst, 0o755 if os.access(src, os.X_OK) else 0o644)
        written.append("/" + rel)
    real_dst = os.path.join(rootfs, os.path.dirname(DROPIN_RELPATH), REAL_PYNVML_NAME)
    shutil.copyfile(source_pynvml, real_dst)
    os.chmod(real_dst, 0o644)
    written.append("/" + os.path.relpath(real_dst, rootfs))
    link_rel = pynvml_link_relpath(rootfs)
    link = os.path.join(rootfs, link_rel)
    os.makedirs(os.path.dirname(link), exist_ok=True)
    if os.path.lexists(link):
        os.unlink(link)
    os.symlink("/" + DROPIN_RELPATH, link)
    written.append("/" + link_rel)
    wants = os.path.join(rootfs, "etc/systemd/system/multi-user.target.wants")
    os.makedirs(wants, exist_ok=True)
    unit_link = os.path.join(wants, UNIT_NAME)
    if os.path.lexists(unit_link):
        os.unlink(unit_link)
    os.symlink("/usr/lib/systemd/system/" + UNIT_NAME, unit_link)
    written.append("/etc/systemd/system/multi-user.target.wants/" + UNIT_NAME)
    os.makedirs(os.path.join(rootfs, "var/lib/simgpu"), exist_ok=True)
    return written
