# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Stand-in kernel modules: ELF objects whose only content is a ``.modinfo`` section.

``modinfo`` (kmod) reads ``key=value`` pairs from the ``.modinfo`` section of a module file;
that is all the simulation needs a "built" ``nvidia.ko`` to carry. The driver packages make
these files with ``as`` + ``objcopy`` in their maintainer scripts (as ``modinfo`` would see
a DKMS build); :func:`module_bytes` makes the same thing in Python for host-side tests, and
:func:`read_modinfo` reads either.
"""

from __future__ import annotations

import os
import struct
from typing import Dict, List, Optional, Tuple

MODULE_NAMES = ("nvidia", "nvidia-modeset", "nvidia-uvm", "nvidia-drm", "nvidia-peermem")
OPEN_LICENSE = "Dual MIT/GPL"
PROPRIETARY_LICENSE = "NVIDIA"


def module_path(root: str, release: str, name: str = "nvidia") -> str:
    """Path where DKMS installs module ``name`` for kernel ``release`` under ``root``."""
    return os.path.join(root, "lib/modules", release, "updates/dkms", name + ".ko")


def modinfo_fields(version: str, flavor: str, release: str, name: str = "nvidia") -> List[Tuple[str, str]]:
    """The ``.modinfo`` pairs of a simulated module (same keys ``modinfo`` shows for nvidia.ko).

    ``flavor`` is ``open`` (license "Dual MIT/GPL") or ``proprietary`` (license "NVIDIA").
    """
    license_ = OPEN_LICENSE if flavor == "open" else PROPRIETARY_LICENSE
    fields = [
        ("version", version),
        ("supported", "external"),
        ("license", license_),
    ]
    if name == "nvidia":
        fields += [
            ("description", "NVIDIA core GPU kernel module"),
            ("firmware", "nvidia/%s/gsp_ga10x.bin" % version),
            ("firmware", "nvidia/%s/gsp_tu10x.bin" % version),
            ("alias", "char-major-195-*"),
        ]
    fields += [
        ("name", name.replace("-", "_")),
        ("vermagic", "%s SMP preempt mod_unload modversions " % release),
    ]
    return fields


def module_bytes(fields: List[Tuple[str, str]]) -> bytes:
    """A minimal ELF64 relocatable object (x86-64) holding ``fields`` in ``.modinfo``."""
    modinfo = b"".join(("%s=%s" % kv).encode() + b"\0" for kv in fields)
    shstrtab = b"\0.modinfo\0.shstrtab\0"
    ehsize, shentsize = 64, 64
    off_modinfo = ehsize
    off_shstr = off_modinfo + len(modinfo)
    off_sh = (off_shstr + len(shstrtab) + 7) & ~7
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    ehdr = ident + struct.pack("<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, off_sh, 0,
                               ehsize, 0, 0, shentsize, 3, 2)
    null = b"\0" * shentsize
    sh_modinfo = struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, off_modinfo, len(modinfo), 0, 0, 1, 0)
    sh_shstr = struct.pack("<IIQQQQIIQQ", 10, 3, 0, 0, off_shstr, len(shstrtab), 0, 0, 1, 0)
    body = ehdr + modinfo + shstrtab
    body += b"\0" * (off_sh - len(body))
    return body + null + sh_modinfo + sh_shstr


def write_module(path: str, fields: List[Tuple[str, str]]) -> None:
    """Write a stand-in module file at ``path`` (directories created)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as handle:
        handle.write(module_bytes(fields))


def read_modinfo(path: str) -> Optional[Dict[str, List[str]]]:
    """Parse the ``.modinfo`` section of an ELF64 module file.

    Returns ``{key: [values...]}`` (a key such as ``firmware`` may repeat), or ``None`` when the
    file does not exist, is not ELF64 little-endian, or has no ``.modinfo`` section.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    if shoff == 0 or shnum == 0 or shoff + shnum * shentsize > len(data):
        return None

    def section(i: int) -> Tuple[int, int, int]:
        name, _type, _flags, _addr, off, size = struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
        return name, off, size

    _n, stroff, strsize = section(shstrndx)
    strtab = data[stroff:stroff + strsize]
    for i in range(shnum):
        name_off, off, size = section(i)
        end = strtab.find(b"\0", name_off)
        if strtab[name_off:end] == b".modinfo":
            result: Dict[str, List[str]] = {}
            for item in data[off:off + size].split(b"\0"):
                if b"=" in item:
                    key, value = item.decode("utf-8", "replace").split("=", 1)
                    result.setdefault(key, []).append(value)
            return result
    return None


def module_flavor(info: Dict[str, List[str]]) -> str:
    """``open`` when the module's license is "Dual MIT/GPL", else ``proprietary``."""
    return "open" if OPEN_LICENSE in info.get("license", []) else "proprietary"
