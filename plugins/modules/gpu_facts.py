#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpu_facts
short_description: NVIDIA driver and GPU state as facts, read through NVML
version_added: "0.1.0"
description:
  - Returns C(ansible_facts.nvidia), one document whatever the source, with the three driver versions
    (userspace library, loaded kernel module, module on disk for the running kernel), the driver
    state verdict, installed NVIDIA packages with their hold state, every GPU (identity, power
    limits, persistence, compute mode, ECC mode and counters, row remapping, retired pages, MIG,
    clocks and clocks event reasons, temperature, PCIe link) and the Xid events of the kernel log,
    each classified with a severity and a recommended action.
  - Reads GPUs through NVML (the C(pynvml) module of the nvidia-ml-py package) when it can be
    imported, else parses C(nvidia-smi -q -x). Each field is read on its own; a field a GPU does not
    support is V(null) and listed in C(unsupported), never a failure.
  - NVML's "Driver/library version mismatch" is evidence for C(driver.state=reboot_pending), and the
    module still returns everything it can read without NVML.
  - With O(capture_dir) the module reads a captured support bundle instead of the live host, for
    offline triage.
  - Usable as a task and from fact gathering (C(ansible_facts_modules)); arguments can be given
    through C(module_defaults).
  - The schema, with the unit and source of every field, is in the collection's C(docs/facts.md).
options:
  backend:
    description:
      - Where GPU state is read from.
      - V(auto) uses NVML when C(pynvml) is importable and falls back to C(nvidia-smi -q -x).
    type: str
    choices: [auto, nvml, nvidia-smi]
    default: auto
  capture_dir:
    description:
      - Read a captured bundle from this directory on the managed node instead of the live host.
      - Recognised files, each optional; a missing file leaves its fields V(null).
        C(nvidia-smi-q.xml) (output of C(nvidia-smi -q -x)), C(nvidia-smi-q.txt) (output of
        C(nvidia-smi -q)), C(dmesg.txt) (kernel log), C(proc-driver-nvidia-version.txt) (contents
        of C(/proc/driver/nvidia/version)), C(sys-module-nvidia-version.txt) (contents of
        C(/sys/module/nvidia/version)), C(modinfo-nvidia.txt) (output of C(modinfo nvidia)),
        C(uname-r.txt) (output of C(uname -r) or C(uname -a)), C(dpkg-l.txt) (output of C(dpkg -l)),
        C(apt-mark-showhold.txt) (output of C(apt-mark showhold)), C(rpm-qa.txt) (output of C(rpm -qa)),
        C(lib-modules-nvidia.txt) (output of C(find /lib/modules -name "*nvidia*")), C(lspci-vvv.txt)
        (output of C(lspci -vvv)).
      - A file that cannot be parsed (truncated XML, binary data) fails the module with a message
        naming the file.
    type: path
  kernel_log:
    description:
      - Read the kernel log (C(dmesg), or C(journalctl -k -b) where dmesg is restricted) for Xid events.
    type: bool
    default: true
  packages:
    description:
      - List installed NVIDIA driver packages and their hold state (dpkg or rpm).
    type: bool
    default: true
notes:
  - This module supports check mode; it only reads.
  - Reading some NVML fields (for example retired pages) may need root.
requirements:
  - nvidia-ml-py on the managed node for the NVML backend (optional).
seealso:
  - name: NVML API Reference Guide
    description: The NVML calls each field is read with.
    link: https://docs.nvidia.com/deploy/nvml-api/
  - name: Xid Errors
    description: NVIDIA's catalog of Xid error codes.
    link: https://docs.nvidia.com/deploy/xid-errors/
author:
  - gpufleet.nvidia maintainers (@gpufleet)
extends_documentation_fragment:
  - ansible.builtin.action_common_attributes
  - ansible.builtin.action_common_attributes.facts
attributes:
  check_mode:
    support: full
  diff_mode:
    support: none
  facts:
    support: full
  platform:
    platforms: posix
"""

EXAMPLES = r"""
- name: Gather NVIDIA facts
  gpufleet.nvidia.gpu_facts:

- name: Show the driver state verdict
  ansible.builtin.debug:
    msg: "{{ ansible_facts['nvidia']['driver']['state'] }}"

- name: Triage a support bundle copied to the node
  gpufleet.nvidia.gpu_facts:
    capture_dir: /var/tmp/bundle-node17

# In a play, gather them with the other facts:
#   vars:
#     ansible_facts_modules: [smart, gpufleet.nvidia.gpu_facts]
#   module_defaults:
#     gpufleet.nvidia.gpu_facts:
#       kernel_log: true
"""

RETURN = r"""
ansible_facts:
  description: Facts to add to C(ansible_facts).
  returned: always
  type: complex
  contains:
    nvidia:
      description: The node's NVIDIA driver and GPU state; see the collection's C(docs/facts.md).
      returned: always
      type: complex
      contains:
        schema_version:
          description: Version of this schema.
          type: int
          sample: 1
        source:
          description: Where GPU state came from.
          type: str
          choices: [nvml, nvidia-smi, capture, none]
        driver:
          description:
            - Driver versions and verdict. C(state) is one of C(not_installed), C(not_loaded), C(ok),
              C(reboot_pending), C(broken); C(state_reasons) says why.
          type: dict
          sample:
            userspace_version: "580.126.20"
            loaded_version: "580.126.20"
            on_disk_version: "580.126.20"
            branch: "580"
            kernel_module_type: open
            cuda_driver_version: "13.0"
            state: ok
        gpus:
          description: One record per GPU; units are in the key names (C(_w), C(_mhz), C(_c), C(_mib)).
          type: list
          elements: dict
        gpu_count:
          description: Number of GPU records.
          type: int
        attached_gpus:
          description: Number of GPUs the source says are attached (may differ from C(gpu_count)).
          type: int
        xid_events:
          description: Xid events of the kernel log, deduplicated per device and incident, classified.
          type: list
          elements: dict
        xid_summary:
          description: Counts per Xid and per device, worst severity, whether any is fatal.
          type: dict
        unsupported:
          description: Fields a GPU or the driver would not give, with the NVML error.
          type: list
          elements: dict
        warnings:
          description: Things worth a look that did not stop the reading.
          type: list
          elements: str
"""

import os
import sys

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import (
    CAPTURE_FILES,
    CaptureError,
    assemble_facts,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import load_pynvml, read_nvml

_MAX_FILE_BYTES = 64 * 1024 * 1024


def _read_text_file(path):
    """Read a small text file; ``None`` when it does not exist or cannot be read."""
    try:
        with open(path, "rb") as handle:
            data = handle.read(_MAX_FILE_BYTES)
    except (IOError, OSError):
        return None
    return to_text(data, errors="surrogate_or_replace")


def _run(module, argv, env=None):
    """Run a command (argv list, no shell); return (rc, stdout, stderr) or None when absent."""
    # PATH order first (as the operator's shell would find it), then the sbin directories.
    path = module.get_bin_path(argv[0])
    if path is None:
        return None
    return module.run_command([path] + argv[1:], environ_update=env or {}, check_rc=False)


def read_capture(module, capture_dir):
    """Read the files of a captured bundle: {input key: bytes}."""
    if not os.path.isdir(capture_dir):
        module.fail_json(msg="capture_dir %s is not a directory; it should hold files such as %s"
                         % (capture_dir, ", ".join(sorted(CAPTURE_FILES))))
    raw = {}
    for filename in CAPTURE_FILES:
        path = os.path.join(capture_dir, filename)
        if os.path.isfile(path):
            with open(path, "rb") as handle:
                raw[filename] = handle.read(_MAX_FILE_BYTES)
    return raw


def list_nvidia_modules(top="/lib/modules"):
    """Paths of nvidia*.ko* files under /lib/modules, one a line (like ``find -name '*nvidia*'``)."""
    paths = []
    try:
        releases = sorted(os.listdir(top))
    except OSError:
        return None
    for release in releases:
        for dirpath, dirnames, filenames in os.walk(os.path.join(top, release)):
            dirnames[:] = [d for d in dirnames if d not in ("build", "source")]
            paths.extend(os.path.join(dirpath, name) for name in filenames if name.startswith("nvidia"))
    return "\n".join(paths)


def collect_live(module):
    """Collect the inputs of the facts from the live host: {input key: text or object}."""
    inputs = {"running_kernel": os.uname()[2]}
    inputs["sys_module_version"] = _read_text_file("/sys/module/nvidia/version")
    inputs["proc_version"] = _read_text_file("/proc/driver/nvidia/version")
    inputs["modules_find"] = list_nvidia_modules()
    result = _run(module, ["modinfo", "nvidia"])
    if result is not None:
        rc, out, err = result
        inputs["modinfo"] = out if rc == 0 else (err or out)
    if module.params["packages"]:
        result = _run(module, ["dpkg", "-l"], env={"COLUMNS": "400"})
        if result is not None and result[0] == 0:
            inputs["dpkg_l"] = result[1]
        else:
            result = _run(module, ["rpm", "-qa"])
            if result is not None and result[0] == 0:
                inputs["rpm_qa"] = result[1]
        result = _run(module, ["apt-mark", "showhold"])
        if result is not None and result[0] == 0:
            inputs["apt_mark_showhold"] = result[1]

    backend = module.params["backend"]
    nvml = load_pynvml() if backend in ("auto", "nvml") else None
    if backend == "nvml" and nvml is None:
        module.fail_json(msg="backend=nvml was asked for, but the pynvml module (package nvidia-ml-py) "
                             "cannot be imported by %s on this node; install nvidia-ml-py or use "
                             "backend=auto" % sys.executable)
    if nvml is not None:
        inputs["nvml"] = read_nvml(nvml)
    else:
        result = _run(module, ["nvidia-smi", "-q", "-x"])
        if result is not None:
            rc, out, err = result
            if rc == 0:
                inputs["smi_xml"] = out
            else:
                inputs["smi_error"] = "%s\n%s" % (out, err)

    if module.params["kernel_log"]:
        result = _run(module, ["dmesg"])
        if result is not None and result[0] == 0:
            inputs["kernel_log"] = result[1]
        else:
            result = _run(module, ["journalctl", "-k", "-b", "--no-pager", "-o", "short-monotonic"])
            if result is not None and result[0] == 0:
                inputs["kernel_log"] = result[1]
            else:
                inputs["kernel_log_error"] = "neither dmesg nor journalctl -k could be read"
    return inputs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            backend=dict(type="str", default="auto", choices=["auto", "nvml", "nvidia-smi"]),
            capture_dir=dict(type="path"),
            kernel_log=dict(type="bool", default=True),
            packages=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    capture_dir = module.params["capture_dir"]
    try:
        if capture_dir:
            facts = assemble_facts(read_capture(module, capture_dir), capture=True)
        else:
            facts = assemble_facts(collect_live(module), capture=False)
    except CaptureError as err:
        module.fail_json(msg=to_text(err), file=err.filename)
    module.exit_json(changed=False, ansible_facts={"nvidia": facts})


if __name__ == "__main__":
    main()
