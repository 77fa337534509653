# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""An NVML session for the modules that change GPUs: start, call a setter, read, stop.

:func:`run_with_nvml` starts NVML (``nvmlInit``), runs a module's body and shuts NVML down
whatever happens; an ``nvmlInit`` failure ends the module with :func:`init_error_message`.
:func:`call_setter` calls one NVML function and answers the name of its error
(:func:`nvml_error_name`), never raising for an NVML error. :func:`read_gpus` reads every GPU
as facts-model records (``nvml_reader.read_gpu``) with process names.

Names of errors: nvml.h ``nvmlReturn_t`` (``nvml_names.RETURN_CODES``), completed by pynvml's
class name for codes nvml.h did not list. Every function here does NVML I/O; process names
also read ``/proc``.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import error_name, is_nvml_error, read_gpu


def nvml_error_name(nvml: Any, err: BaseException) -> Optional[str]:
    """Name an exception raised by a pynvml call, or ``None`` when it is no NVML error
    (``nvml_reader.is_nvml_error``).

    :param nvml: the pynvml module. :param err: the exception caught around the call.
    :returns: the nvml.h name of the return code (``"NoPermission"``, ``"InUse"``), pynvml's class
        name without ``NVMLError_`` for a code nvml.h did not list, ``"FunctionNotFound"`` for an
        ``AttributeError`` (a function this pynvml lacks); ``None`` for any other exception, which
        the caller re-raises.
    """
    if is_nvml_error(nvml, err):
        return _error_name(nvml, err)
    return None


def _error_name(nvml: Any, err: BaseException) -> str:
    """``nvml_reader.error_name``, completed by pynvml's own class name (``NVMLError_InsufficientResources``)."""
    name = error_name(nvml, err)
    if name.startswith("Error") and type(err).__name__.startswith("NVMLError_"):
        return type(err).__name__[len("NVMLError_"):]
    return name


def call_setter(nvml: Any, func_name: str, *args: Any) -> Optional[str]:
    """Call one NVML setter and return the name of its error, or ``None`` on success. Does NVML I/O.

    :param nvml: the pynvml module (initialised).
    :param func_name: e.g. ``"nvmlDeviceSetPowerManagementLimit"``.
    :param args: the setter's arguments (handle first).
    :returns: ``None`` on success, else the NVML error name (``"NoPermission"``, ``"NotSupported"``,
        ``"InUse"``, ...); a function this pynvml lacks gives ``"FunctionNotFound"``.
    :raises: exceptions that are no NVML error propagate.
    """
    base = getattr(nvml, "NVMLError", None)
    try:
        func = getattr(nvml, func_name)
    except AttributeError:
        return "FunctionNotFound"
    try:
        func(*args)
    except Exception as err:  # pylint: disable=broad-except
        if base is not None and isinstance(err, base):
            return _error_name(nvml, err)
        raise
    return None


_INIT_ERRORS = {
    "LibraryNotFound": "the NVML library (libnvidia-ml.so.1) was not found: the NVIDIA driver is not installed",
    "DriverNotLoaded": "the NVIDIA kernel module is not loaded (driver installed but not loaded, or no GPU "
                       "found): load it or reboot",
    "LibRmVersionMismatch": "Driver/library version mismatch: the NVIDIA libraries were upgraded but the loaded "
                            "kernel module is older; reboot the node to load the new module, then apply again",
    "NoPermission": "NVML refused access to the GPUs (Insufficient Permissions): run as root with access to "
                    "/dev/nvidia*",
}


def init_error_message(name: str) -> str:
    """Explain an ``nvmlInit`` failure and what to do.

    :param name: the NVML error name (``LibraryNotFound``, ``DriverNotLoaded``,
        ``LibRmVersionMismatch``, ``NoPermission``, ...).
    :returns: one sentence naming the cause and the remedy; unknown names are quoted as they are.
    """
    return "NVML could not start: %s" % _INIT_ERRORS.get(name, "NVML error %s" % name)


def run_with_nvml(module: Any, nvml: Any, body: Any) -> Dict[str, Any]:
    """Start NVML, run ``body(module, nvml)``, shut NVML down whatever happens, return its result.

    Shared by the modules that change GPUs (``gpu_policy``, ``gpu_mig``).

    :param module: the ``AnsibleModule``; its ``fail_json`` ends the run when pynvml is missing
        (``nvml`` is ``None``) or ``nvmlInit`` fails (message from :func:`init_error_message`,
        ``nvml_error`` = the NVML error name; an ``OSError`` from loading libnvidia-ml.so.1 is
        ``LibraryNotFound``).
    :param nvml: the pynvml module (``nvml_reader.load_pynvml()``) or ``None``.
    :param body: a callable ``(module, nvml) -> dict``, the module's result.
    :returns: what ``body`` returned. ``nvmlShutdown`` errors are ignored; ``body``'s are raised.
    """
    if nvml is None:
        module.fail_json(msg="The pynvml module (package nvidia-ml-py) is not installed for this Python on the "
                             "node; install it (pip install nvidia-ml-py, or the distribution's python3-pynvml).")
    try:
        nvml.nvmlInit()
    except Exception as err:  # pylint: disable=broad-except
        name = "LibraryNotFound" if isinstance(err, OSError) else error_name(nvml, err)
        module.fail_json(msg=init_error_message(name), nvml_error=name)
    try:
        return body(module, nvml)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # pylint: disable=broad-except
            pass


def read_gpus(nvml: Any) -> Dict[str, Any]:
    """Read every GPU of the node through NVML (already initialised). Does NVML I/O.

    :returns: ``{"gpus": [facts-model GPU records, nvml_reader.read_gpu], "unsupported": [...],
        "error": NVML error name of nvmlDeviceGetCount or None}``; process names are filled
        (:func:`name_processes`).
    """
    unsupported = []  # type: List[Dict[str, Any]]
    try:
        count = nvml.nvmlDeviceGetCount()
    except Exception as err:  # pylint: disable=broad-except
        name = nvml_error_name(nvml, err)
        if name is None:
            raise
        return {"gpus": [], "unsupported": unsupported, "error": name}
    gpus = [read_gpu(nvml, index, unsupported) for index in range(count)]
    name_processes(nvml, gpus)
    return {"gpus": gpus, "unsupported": unsupported, "error": None}


def process_name(nvml: Any, pid: int, proc_root: str = "/proc") -> Optional[str]:
    """Name a process by pid. Does NVML and file I/O.

    :returns: ``nvmlSystemGetProcessName(pid)``, else the first line of ``/proc/<pid>/comm``, else
        ``None``.
    """
    try:
        name = nvml.nvmlSystemGetProcessName(pid)
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        if name:
            return str(name).strip().rsplit("/", 1)[-1] or None
    except Exception:  # pylint: disable=broad-except
        pass
    try:
        with open("%s/%d/comm" % (proc_root, int(pid)), "r") as handle:
            return handle.readline().strip() or None
    except (IOError, OSError, ValueError):
        return None


def name_processes(nvml: Any, gpus: List[Dict[str, Any]]) -> None:
    """Fill ``name`` of each entry of ``gpu["processes"]`` in place. Does NVML and file I/O (:func:`process_name`)."""
    for gpu in gpus:
        for proc in gpu.get("processes") or []:
            if not proc.get("name") and proc.get("pid") is not None:
                proc["name"] = process_name(nvml, proc["pid"])
