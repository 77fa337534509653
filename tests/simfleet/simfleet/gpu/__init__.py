# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPU and driver simulation of the simulated fleet (the control-host side).

- :mod:`simfleet.gpu.profiles`: GPU models (H100, A100, L40S, V100, B200) per node class;
- :mod:`simfleet.gpu.state`: a node's initial GPU state, reading/writing state files, and
  :func:`simfleet.gpu.state.write_node_root` to lay out a fake node root for host-side tests;
- :mod:`simfleet.gpu.faults`: fault injection into a state;
- :mod:`simfleet.gpu.pkgbuild`: the simulated NVIDIA driver packages (.deb);
- :mod:`simfleet.gpu.nodefiles`: the files installed into every node's root filesystem.

The node-side code lives under ``node/`` laid out as in the node's root filesystem; its
library ``simgpu`` (``node/usr/lib/simgpu/simgpu``) is the single model of GPU state that the
drop-in pynvml, nvidia-smi, dmesg and the boot unit share, and this package imports it too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

NODE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "node")
SIMGPU_LIB_DIR = os.path.join(NODE_DIR, "usr", "lib", "simgpu")
PYNVML_DROPIN = os.path.join(SIMGPU_LIB_DIR, "pynvml-dropin", "pynvml.py")

#: Control-host commands the GPU simulation needs: (command, Debian package).
HOST_REQUIREMENTS = (
    ("dpkg-deb", "dpkg"),
    ("as", "binutils"),
    ("ld", "binutils"),
    ("objcopy", "binutils"),
    ("modinfo", "kmod"),
    ("depmod", "kmod"),
)


def simgpu() -> ModuleType:
    """Import and return the node-side ``simgpu`` package (from this checkout)."""
    if SIMGPU_LIB_DIR not in sys.path:
        sys.path.insert(0, SIMGPU_LIB_DIR)
    return importlib.import_module("simgpu")


def load_pynvml(module_name: str = "simgpu_pynvml") -> ModuleType:
    """Load the drop-in pynvml by file path as ``module_name`` and return it.

    It serves the node root in ``$SIMGPU_ROOT`` (read at every ``nvmlInit``). Its exception
    classes are those of the real ``pynvml`` (nvidia-ml-py) installed beside it. Loading the
    same name twice returns the module already loaded.
    """
    if module_name in sys.modules:
        return sys.modules[module_name]
    simgpu()
    spec = importlib.util.spec_from_file_location(module_name, PYNVML_DROPIN)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module
