# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Drop-in ``pynvml`` for simfleet nodes: the real nvidia-ml-py wrappers over a simulated NVML.

This module executes the real ``pynvml.py`` of nvidia-ml-py (copied next to it on a node as
``nvidia_ml_py_pynvml.py``; found through ``$SIMGPU_REAL_PYNVML`` or ``sys.path`` elsewhere) in
its own namespace, so every function, constant, structure and exception class is the real
package's. Only the library loader is replaced: instead of ``CDLL("libnvidia-ml.so.1")`` it
binds ``simgpu.nvmlfake.FakeNvmlLib`` to the node root ``$SIMGPU_ROOT`` (default ``/``) at
each ``nvmlInit``. Init fails as the real one does: NVMLError_LibraryNotFound without
``libnvidia-ml.so.1``, NVMLError_DriverNotLoaded without a loaded module,
NVMLError_LibRmVersionMismatch when the loaded module differs from the library.

A node whose root holds ``etc/simgpu/pynvml-absent`` gets ModuleNotFoundError on import, as
if pynvml were not installed (to exercise the nvidia-smi fallback of the facts module).

When loaded under another name than ``pynvml`` next to an importable real ``pynvml`` (unit
tests on a build host), every class (exceptions, structures, handle types) is the real
module's own object, so ``isinstance(err, pynvml.NVMLError_NotSupported)`` and
``type(info) is pynvml.c_nvmlMemory_t`` hold for the real ``pynvml``.
"""

import os as _os
import sys as _sys
import types as _types

#: A node (or fake root) with this file behaves as if pynvml were not installed.
ABSENT_MARKER_RELPATH = "etc/simgpu/pynvml-absent"
if _os.path.exists(_os.path.join(_os.environ.get("SIMGPU_ROOT") or "/", ABSENT_MARKER_RELPATH)):
    raise ModuleNotFoundError("No module named 'pynvml'", name="pynvml")

_HERE = _os.path.dirname(_os.path.realpath(__file__))
_SIMGPU_LIB = _os.path.dirname(_HERE)
if _SIMGPU_LIB not in _sys.path:
    _sys.path.append(_SIMGPU_LIB)

SIMGPU_DROPIN = True


def _find_real_source():
    own = _os.path.realpath(__file__)
    candidates = [_os.environ.get("SIMGPU_REAL_PYNVML"), _os.path.join(_HERE, "nvidia_ml_py_pynvml.py")]
    candidates += [_os.path.join(entry or ".", "pynvml.py") for entry in _sys.path]
    for candidate in candidates:
        if candidate and _os.path.isfile(candidate) and _os.path.realpath(candidate) != own:
            return candidate
    raise ImportError("simgpu pynvml: the real nvidia-ml-py pynvml.py was not found "
                      "(set SIMGPU_REAL_PYNVML to its path)")


SIMGPU_REAL_SOURCE = _find_real_source()
with open(SIMGPU_REAL_SOURCE, "r", encoding="utf-8") as _handle:
    _code = compile(_handle.read(), SIMGPU_REAL_SOURCE, "exec")

_registered = _sys.modules.get(__name__)
_scratch = None
if _registered is None:
    # The real module registers its NVMLError_* classes on sys.modules[__name__].
    _scratch = _types.ModuleType(__name__)
    _sys.modules[__name__] = _scratch
try:
    exec(_code, globals())
finally:
    if _scratch is not None:
        for _name, _value in vars(_scratch).items():
            if _name.startswith("NVMLError_"):
                globals()[_name] = _value
        del _sys.modules[__name__]
del _code, _handle


def _error_base():
    """The real pynvml whose exception classes to share, or None (on a node)."""
    if __name__ == "pynvml":
        return None
    existing = _sys.modules.get("pynvml")
    if existing is None:
        try:
            import pynvml as existing  # noqa: F811  (the real nvidia-ml-py, when installed)
        except ImportError:
            return None
    return existing


_base = _error_base()
if _base is not None and getattr(_base, "NVMLError", None) is not None:
    # Share every class (exceptions, structures, handle types) with the real module, so the
    # objects the wrappers return and the errors they raise are of its types.
    for _name in dir(_base):
        _value = getattr(_base, _name)
        if isinstance(_value, type) and _name in globals() and not _name.startswith("__"):
            globals()[_name] = _value

import simgpu as _simgpu  # noqa: E402
from simgpu import driver as _sim_driver  # noqa: E402
from simgpu import nvmlfake as _sim_nvmlfake  # noqa: E402

_SIM_LIB = _sim_nvmlfake.FakeNvmlLib()


def _real(name):
    """A name the real pynvml defined in this module's namespace, looked up at call time.

    The real module's code was executed into ``globals()`` above, so its loader lock, return
    code check, error codes and function pointer cache live here under their own names.
    """
    return globals()[name]


def _LoadNvmlLibrary():
    """Bind the simulated library to ``$SIMGPU_ROOT``; LibraryNotFound without libnvidia-ml.so.1."""
    global nvmlLib
    root = _simgpu.root_dir(None)
    lib_load_lock = _real("libLoadLock")
    lib_load_lock.acquire()
    try:
        if _sim_driver.userspace_version(root) is None:
            _real("_nvmlCheckReturn")(_real("NVML_ERROR_LIBRARY_NOT_FOUND"))
        _SIM_LIB.bind(root)
        if nvmlLib is not _SIM_LIB:
            _real("_nvmlGetFunctionPointer_cache").clear()
            nvmlLib = _SIM_LIB
    finally:
        lib_load_lock.release()


def simgpu_root():
    """The node root this module serves (``$SIMGPU_ROOT``, default ``/``)."""
    return _simgpu.root_dir(None)
