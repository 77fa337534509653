# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""A node's GPU state: creation from a profile, files, and fake node roots for host tests.

The state is one JSON document per node at ``<node root>/var/lib/simgpu/state.json``; the
node-side library ``simgpu`` (the only code that interprets it on a node) documents its
rules. This module creates it (:func:`initial_state`), reads and writes it with the same
locking as the node (:func:`load_state`, :func:`save_state`, :func:`update_state`), and lays
out a whole fake node root for host-side unit tests (:func:`write_node_root`).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from typing import Any, Callable, Dict, Optional

from . import simgpu as _simgpu_pkg
from .profiles import PROFILES, mig_profile_dicts

_sim = _simgpu_pkg()
from simgpu import driver as _driver  # noqa: E402
from simgpu import faults as _faults  # noqa: E402
from simgpu import kmod as _kmod  # noqa: E402
from simgpu import state as _state  # noqa: E402

STATE_RELPATH = _sim.STATE_RELPATH
SCHEMA_VERSION = 1


def _serial(node_name: str, index: int) -> str:
    digest = int(hashlib.sha256(("%s/%d" % (node_name, index)).encode()).hexdigest()[:12], 16)
    return "165%010d" % (digest % 10 ** 10)


def _gpu_uuid(node_name: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, "%s.gpu%d.simfleet" % (node_name, index)))


def _gpu(profile: Dict[str, Any], node_name: str, index: int) -> Dict[str, Any]:
    bus = profile["bus_ids"][index]
    power = profile["power_w"]
    clocks = profile["clocks_mhz"]
    idle = {"graphics": clocks["idle_graphics"], "sm": clocks["idle_graphics"], "mem": clocks["idle_mem"],
            "video": clocks["idle_video"]}
    return {
        "index": index,
        "name": profile["name"],
        "brand": profile["brand"],
        "architecture": profile["architecture"],
        "cuda_cc": list(profile["cuda_cc"]),
        "uuid": _gpu_uuid(node_name, index),
        "serial": _serial(node_name, index),
        "minor_number": index,
        "module_id": index + 1,
        "vbios_version": profile["vbios_version"],
        "board_part_number": profile["board_part_number"],
        "gpu_part_number": profile["gpu_part_number"],
        "inforom_image": profile["inforom_image"],
        "pci": {
            "bus_id": "00000000:%s:00.0" % bus, "domain": 0, "bus": int(bus, 16), "device": 0,
            "device_id": (profile["pci_device_id"] << 16) | 0x10DE,
            "subsystem_id": (profile["pci_subsystem_id"] << 16) | 0x10DE,
        },
        "pcie": {"gen_current": profile["pcie"]["gen"], "gen_max": profile["pcie"]["gen"],
                 "gen_gpu_max": profile["pcie"]["gen"], "width_current": profile["pcie"]["width"],
                 "width_max": profile["pcie"]["width"], "replay_counter": 0},
        "memory": {"total_mib": profile["memory_mib"], "reserved_mib": profile["reserved_mib"], "used_mib": 0,
                   "bar1_total_mib": profile["bar1_mib"]},
        "power": {"limit_mw": power["default"] * 1000, "default_mw": power["default"] * 1000,
                  "min_mw": power["min"] * 1000, "max_mw": power["max"] * 1000,
                  "draw_mw": int(round(profile["idle_draw_w"] * 1000))},
        "persistence_mode": 0,
        "compute_mode": 0,
        "performance_state": 0,
        "ecc": {"supported": True, "current": 1, "pending": 1,
                "volatile": {"corrected": 0, "uncorrected": 0}, "aggregate": {"corrected": 0, "uncorrected": 0}},
        "remapped_rows": ({"correctable": 0, "uncorrectable": 0, "pending": False, "failure": False}
                          if profile["remapped_rows"] else None),
        "retired_pages": ({"single_bit": [], "double_bit": [], "pending": False}
                          if profile["retired_pages"] else None),
        "mig": {"capable": bool(profile["mig_profiles"]), "current": 0, "pending": 0,
                "profiles": mig_profile_dicts(profile["mig_profiles"]), "instances": []},
        "clocks": dict(idle, idle=dict(idle), max_graphics=clocks["max_graphics"], max_sm=clocks["max_sm"],
                       max_mem=clocks["max_mem"], max_video=clocks["max_video"],
                       app_graphics=clocks["max_graphics"], app_mem=clocks["max_mem"]),
        "clocks_event_reasons": 0x1,
        "temperature": dict(profile["temperature_c"], **profile["thresholds_c"]),
        "utilization": {"gpu": 0, "memory": 0},
        "fan_percent": None,
        "processes": [],
        "bus_state": "ok",
        "not_supported": [],
    }


def initial_state(profile: str, node_name: str) -> Dict[str, Any]:
    """The GPU state of a fresh node of class ``profile`` (a key of PROFILES), never booted.

    Shape (JSON-able): ``schema``, ``node``, ``profile``, ``system`` (``nvswitch_count``,
    ``open_modules_only``), ``boot`` (``count``, ``id``, ``time``), ``faults``
    (``build_fail``, ``gpu_lost``, ``version_mismatch``), ``kernel_log`` (None until the first
    boot) and ``gpus``: per GPU identity (name, uuid, serial, pci bus id ``00000000:BB:00.0``,
    vbios), ``power`` in milliwatts (``limit_mw``, ``default_mw``, ``min_mw``, ``max_mw``,
    ``draw_mw``), ``persistence_mode`` / ``compute_mode`` (NVML enums), ``ecc`` (current,
    pending, volatile/aggregate corrected/uncorrected), ``remapped_rows`` / ``retired_pages``
    (None where the GPU has no such feature), ``mig`` (capable, current, pending, profiles,
    instances), clocks in MHz, temperatures in C, ``pcie``, ``processes``, ``bus_state``
    (``ok`` | ``lost`` | ``absent``) and ``not_supported`` (field names, see simgpu.faults.FIELDS).

    Raises KeyError for an unknown profile.
    """
    spec = PROFILES[profile]
    return {
        "schema": SCHEMA_VERSION,
        "node": node_name,
        "profile": profile,
        "system": {"nvswitch_count": spec["nvswitch_count"], "open_modules_only": spec["open_modules_only"]},
        "boot": {"count": 0, "id": None, "time": None},
        "faults": _faults.empty_faults(),
        "kernel_log": None,
        "gpus": [_gpu(spec, node_name, i) for i in range(spec["count"])],
    }


def load_state(path: str) -> Dict[str, Any]:
    """Read a state file (see simgpu.state.load_state)."""
    return _state.load_state(path)


def save_state(path: str, state: Dict[str, Any]) -> None:
    """Write a state file atomically under the node's writers' lock (simgpu.state.save_state)."""
    _state.save_state(path, state)


def update_state(path: str, mutate: Callable[[Dict[str, Any]], Any]) -> Any:
    """Locked read-modify-write of a state file (simgpu.state.update_state)."""
    return _state.update_state(path, mutate)


def state_path(root_dir: str) -> str:
    """The state file of the node whose root filesystem is at ``root_dir``."""
    return os.path.join(root_dir, STATE_RELPATH)


def write_node_root(root_dir: str, state: Dict[str, Any], loaded: bool = True,
                    userspace_version: Optional[str] = "580.126.20", module_version: Optional[str] = None,
                    loaded_version: Optional[str] = None, flavor: str = "open",
                    kernel_release: Optional[str] = None) -> Dict[str, Optional[str]]:
    """Lay out a fake node root at ``root_dir`` for host-side tests, as a booted node has it.

    - ``var/lib/simgpu/state.json`` = ``state``;
    - ``usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<userspace_version>`` and the link
      ``libnvidia-ml.so.1`` (the NVML library marker; skipped when ``userspace_version`` is None);
    - ``lib/modules/<kernel_release>/updates/dkms/nvidia.ko`` with ``.modinfo`` version
      ``module_version`` (default: ``userspace_version``; skipped when both are None) and the
      license of ``flavor`` (``open`` | ``proprietary``);
    - when ``loaded``: ``sys/module/nvidia/version`` and ``proc/driver/nvidia/version`` for
      ``loaded_version`` (default: ``module_version``).

    ``kernel_release`` defaults to ``$SIMGPU_KERNEL_RELEASE`` or ``uname -r`` (what the node
    code uses when not told). Returns the paths written (``state``, ``library``, ``module``,
    ``loaded``; None for what was skipped). Use with ``SIMGPU_ROOT=<root_dir>``.
    """
    release = _sim.kernel_release(kernel_release)
    paths: Dict[str, Optional[str]] = {"state": state_path(root_dir), "library": None, "module": None,
                                       "loaded": None}
    save_state(paths["state"], state)  # type: ignore[arg-type]
    if userspace_version:
        paths["library"] = _driver.install_userspace(root_dir, userspace_version)
    module_version = module_version or userspace_version
    if module_version:
        path = _kmod.module_path(root_dir, release)
        _kmod.write_module(path, _kmod.modinfo_fields(module_version, flavor, release))
        paths["module"] = path
    if loaded:
        version = loaded_version or module_version
        if not version:
            raise ValueError("write_node_root: loaded=True needs a module_version or loaded_version")
        present = [g for g in state.get("gpus", []) if g.get("bus_state", "ok") != "absent"]
        _driver.write_loaded(root_dir, version, flavor, present)
        paths["loaded"] = os.path.join(root_dir, "sys/module/nvidia/version")
    else:
        _driver.clear_loaded(root_dir)
    return paths


def boot_node_root(root_dir: str, kernel_release: Optional[str] = None, boot_id: Optional[str] = None,
                   now: Optional[float] = None) -> Dict[str, Any]:
    """Run the node boot sequence (simgpu.boot.boot) against a fake node root; no mounts."""
    from simgpu import boot as _boot

    return _boot.boot(root_dir, release=kernel_release, boot_id=boot_id, now=now, mount=False)
