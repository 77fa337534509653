# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The GPUs Slurm finds on a simulated node: its ``gres.conf``, written before each start of slurmd.

On a real node ``AutoDetect=nvml`` in gres.conf makes slurmd ask NVML for the GPUs and their MIG
devices at its start: a GPU with MIG mode on is then one ``gres/gpu`` per MIG device, each given by
the parent GPU's ``/dev/nvidiaN`` and the MIG device's ``/dev/nvidia-caps/nvidia-capM`` (gres.conf(5),
``MultipleFiles``: "If using a card with Multi-Instance GPU functionality, use MultipleFiles
instead"). Slurm's NVML plugin cannot load the simulated NVML, so this module stands in for it: it
reads the simulated GPUs (``var/lib/simgpu/state.json``) and writes the lines AutoDetect would
have found, with ``AutoDetect=off``. Slurm itself then reads them and counts them; what slurmctld
does with a count that differs from ``slurm.conf`` (field case 46: INVAL and DRAIN for fewer, the
extra ones ignored for more) is Slurm's own.

The device nodes are made here as well (character devices, as slurmd requires): the whole GPUs'
``<DEVICE_DIR>/nvidia<N>`` (major 195, minor N, the NVIDIA driver's numbers) and one
``<DEVICE_DIR>/nvidia-caps/nvidia-cap<M>`` per MIG device (major :data:`CAPS_MAJOR`).

Lines are typed only when the node has a MIG device: Slurm refuses a gres.conf where some ``gpu``
records have ``Type=`` and others do not (slurmd: ``gres.conf for gpu, some records have "Type="
specification while others do not``); a node without MIG gets the untyped lines it always had.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Any, Dict, List, Tuple

from . import device

DEVICE_DIR = "/run/simfleet-slurm"
NVIDIA_MAJOR = 195
#: The major number of the simulated nvidia-caps devices (the real one is allocated at module load).
CAPS_MAJOR = 237


def gpu_type(name: str) -> str:
    """Slurm GRES type of a whole GPU from its product name: ``"NVIDIA H100 80GB HBM3"`` →
    ``"h100_80gb_hbm3"`` (lower case, the vendor word dropped, other characters ``_``)."""
    words = [w for w in re.split(r"[^A-Za-z0-9.]+", str(name or "gpu").lower()) if w and w not in ("nvidia", "tesla")]
    return "_".join(words) or "gpu"


def render(state: Dict[str, Any]) -> Tuple[str, List[Tuple[str, int, int]]]:
    """The node's ``gres.conf`` and the device nodes it names.

    :param state: the simulated GPU state (``gpus`` in NVML index order; each ``name``, ``minor_number``
        and ``mig``). Every GPU of the state is listed, a lost one included: the file stands in for
        what AutoDetect finds about MIG, not for a GPU that fell off the bus (the fleet's Slurm tests
        of lost GPUs keep the count slurm.conf gives).
    :returns: ``(text, devices)``; ``devices`` is ``[(path, major, minor)]``. The text has one line per
        whole GPU and one per MIG device, so that Slurm's count is the number of GPUs a job can be
        given: whole GPUs plus MIG devices (a GPU in MIG mode without MIG devices gives none).
    """
    gpus = list(state.get("gpus") or [])
    mig_devices = dict((i, device.mig_devices(g)) for i, g in enumerate(gpus))
    typed = any(mig_devices.values())
    lines = ["# gres.conf written at slurmd's start from the simulated GPUs (what AutoDetect=nvml finds).",
             "AutoDetect=off"]
    devices = []  # type: List[Tuple[str, int, int]]
    cap = 0
    for position, gpu in enumerate(gpus):
        minor = int(gpu.get("minor_number", gpu.get("index", position)))
        parent = "%s/nvidia%d" % (DEVICE_DIR, minor)
        devices.append((parent, NVIDIA_MAJOR, minor))
        if device.mig_enabled(gpu):
            for mig in mig_devices[position]:
                cap += 1
                path = "%s/nvidia-caps/nvidia-cap%d" % (DEVICE_DIR, cap)
                devices.append((path, CAPS_MAJOR, cap))
                lines.append("Name=gpu Type=%s MultipleFiles=%s,%s" % (mig["profile"].get("name", "mig"), parent, path))
            continue
        lines.append("Name=gpu%s File=%s" % ((" Type=" + gpu_type(gpu.get("name"))) if typed else "", parent))
    return "\n".join(lines) + "\n", devices


def write(state: Dict[str, Any], path: str) -> int:
    """Make the device nodes and write ``gres.conf`` at ``path`` (atomically); the GPU count it gives.

    :raises OSError: a device node or the file cannot be made.
    """
    text, devices = render(state)
    for dev_path, major, minor in devices:
        os.makedirs(os.path.dirname(dev_path), exist_ok=True)
        try:
            st = os.stat(dev_path)
            if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(major, minor):
                continue
            os.unlink(dev_path)
        except FileNotFoundError:
            pass
        os.mknod(dev_path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return sum(1 for line in text.splitlines() if line.startswith("Name=gpu"))
