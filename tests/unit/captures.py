"""Capture bundles built from the field cases in tests/fixtures/cases.

Each bundle names the field-case files it is made of and the file name the gpu_facts module
expects for each (see its ``capture_dir`` option). ``build(name, directory)`` lays a bundle out.
"""

import os
import shutil

CASES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "fixtures", "cases")

BUNDLES = {
    "a100-mig": {"nvidia-smi-q.xml": "01-a100-sxm4-mig-xml-v12/input.xml"},
    "a10-remap-pending": {"nvidia-smi-q.txt": "04-a10-remapped-rows-pending/input.txt"},
    "xid119-gsp": {"dmesg.txt": "06-xid119-gsp-rpc-timeout/input.log"},
    "xid-app-and-109": {"dmesg.txt": "08-xid13-xid31-xid109-same-gpu/input.log"},
    "xid63-64": {"dmesg.txt": "09-xid63-xid64-row-remapper-training-run/input.log"},
    "nvml-mismatch-after-unattended-upgrade": {
        "nvidia-smi-q.txt": "17-unattended-upgrade-libnvidia-nvml-mismatch/input-nvidia-smi.txt"},
    "dkms-module-older-than-userspace": {
        "dmesg.txt": "23-dkms-module-older-than-userspace-api-mismatch/input-nvidia-all-394-dmesg.log",
        "modinfo-nvidia.txt": "23-dkms-module-older-than-userspace-api-mismatch/input-nvidia-all-394-modinfo.txt",
    },
    "no-module-for-running-kernel": {
        "nvidia-smi-q.txt": "24-no-module-for-running-kernel-after-kernel-update/input.txt",
        "lib-modules-nvidia.txt": "24-no-module-for-running-kernel-after-kernel-update/input.txt",
        "uname-r.txt": "24-no-module-for-running-kernel-after-kernel-update/input.txt",
    },
    "pcie-switch-downgraded": {"lspci-vvv.txt": "26-pcie-switch-ports-downgraded-gpu-ok/input.txt"},
    "a100-mig-peermem-refused": {
        "nvidia-smi-q.xml": "01-a100-sxm4-mig-xml-v12/input.xml",
        "dmesg.txt": "32-nvidia-peermem-ib-core-symbol-mismatch-gb300/input-dmesg.log",
    },
}


def build(name, directory):
    """Copy the files of bundle ``name`` into ``directory`` (created) and return its path."""
    os.makedirs(directory, exist_ok=True)
    for target, source in BUNDLES[name].items():
        shutil.copyfile(os.path.join(CASES, source), os.path.join(directory, target))
    return directory


def read(name):
    """Return bundle ``name`` as {file name: bytes}, as the gpu_facts module reads it."""
    raw = {}
    for target, source in BUNDLES[name].items():
        with open(os.path.join(CASES, source), "rb") as handle:
            raw[target] = handle.read()
    return raw
