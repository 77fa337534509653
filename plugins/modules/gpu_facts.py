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
        (output of C(lspci -vvv)), C(mokutil-sb-state.txt) (output of C(mokutil --sb-state)),
        C(sys-module-nvidia-peermem-version.txt) (contents of C(/sys/module/nvidia_peermem/version)).
      - A file that cannot be parsed (truncated XML, binary data) fails the module with a message
        naming the file and what is wrong with it (for example C(not XML), with the line number); the
        message never quotes the file's content.
      - A bundle is untrusted input. A capture file that is a symbolic link (wherever it points, in the
        bundle or not) or a regular file with more than one hard link fails the module with a message
        naming it, before anything is read, since either could make the module read any file of the node,
        as root, into facts. Copy the real file into the bundle instead.
      - A capture file that is a directory, a FIFO, a socket or a device, or a file that is empty (or
        holds only white space), is ignored with a warning naming it (in C(warnings) of the result and
        in C(ansible_facts.nvidia.warnings)); its fields stay V(null). When no recognised file of the
        bundle is usable at all (none present, or all ignored), the module fails, naming them.
      - Each file is read up to 64 MiB. Of a longer C(dmesg.txt), the newest 64 MiB (the end of the
        file, in whole lines) are read; of any other file, the first 64 MiB. Either gives a warning.
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
  rollout_state_dir:
    description:
      - Directory where the P(gpufleet.nvidia.node_upgrade#role) role keeps its state (its
        C(node_upgrade_state_dir)); its C(drain.json) says a rollout drained the node. With the flag file
        C(/etc/ansible/facts.d/gpufleet_rollout.fact) it fills C(ansible_facts.nvidia.rollout).
    type: path
    default: /var/lib/gpufleet/rollout
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
  - gpufleet.nvidia.action_group
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
headline:
  description:
    - What an operator reads first, also in C(ansible_facts.nvidia.headline) - the node's C(verdict)
      (C(healthy), C(unhealthy) or C(unknown) when the evidence does not tell), a one-sentence C(summary),
      the worst problem of each GPU that is not usable (named by PCI bus id, serial and UUID), the
      recommended C(action) and C(next_step), and what could not be read (C(unknown)).
  returned: always
  type: dict
  sample:
    verdict: unhealthy
    summary: "unhealthy: 1 GPU(s) not usable (GPU count unknown): GPU 0000:9b:00.0 (serial 1654922000001, GPU-...): Xid 119 (GSP RPC timeout)."
    gpus:
      - gpu: "GPU 0000:9b:00.0 (serial 1654922000001, GPU-...)"
        pci_bus_id: "0000:9b:00.0"
        problem: Xid 119 (GSP RPC timeout)
        action: reset_gpu
    action: reset_gpu
    next_step: "drain the node, reset GPU 0000:9b:00.0 (...) (nvidia-smi -r -i <bus id>) or reboot the node, then read the facts again"
    unknown: [gpu_count, driver.state, driver.userspace_version, driver.loaded_version]
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
          description: Number of GPU records; V(null) (unknown, not 0) when neither NVML nor nvidia-smi answered.
          type: int
        attached_gpus:
          description: Number of GPUs the source says are attached (may differ from C(gpu_count)).
          type: int
        xid_events:
          description:
            - Xid events of the kernel log, deduplicated per device and incident, classified.
            - Bounded per device and Xid to the first and the newest 7 incidents; the others are folded
              into an entry with C(elided=true) whose C(count) and C(incidents) carry theirs, so counts
              summed over the list stay exact.
          type: list
          elements: dict
        xid_summary:
          description:
            - Counts per Xid and per device, worst severity, whether any is fatal; per device and Xid
              (C(per_device_xid)) the count and the first and last time and message.
          type: dict
        driver_messages:
          description:
            - NVRM kernel log lines about a GPU without an Xid number (at most 16), with C(kind)
              (V(gpu_init_failed), the GPU could not be initialised; V(reset_required)), C(pci_bus_id) (null when
              the line names no GPU), C(time), C(message).
          type: list
          elements: dict
        sxid_events:
          description:
            - NVSwitch SXid events per switch bus id and SXid, with the driver's own C(fatal) word, C(fatal_records),
              C(links); see C(docs/xid.md).
          type: list
          elements: dict
        kernel_log_unrecognised:
          description:
            - The kernel-log lines of the NVIDIA modules that no rule reads (C(count), C(error_count), the first
              C(lines) with their C(level) and C(pci_bus_id)); at error level they make C(health.state) V(unknown).
          type: dict
        unparsed:
          description:
            - The nvidia-smi keys with a value that no fact takes (C(count), C(keys) with C(format), C(key),
              C(value), C(gpu)).
          type: dict
        node:
          description:
            - Node-level signals beyond the driver versions; see C(docs/contract.md).
          type: dict
          sample:
            secure_boot: true
            module_signer: DKMS module signing key
            module_signer_trusted: false
            module_load_failures: []
            peermem_loaded_version: null
            peermem_state: not_loaded
        health:
          description:
            - Whether the node and its GPUs are usable, whatever form the signal took (numbered Xid, driver
              message, NVML or nvidia-smi field); C(gpus) lists only the GPUs that are not usable, C(problems)
              the node's problems with their remedies.
          type: dict
          sample:
            healthy: false
            gpus: []
            problems:
              - kind: peermem_not_loaded
                reboot_fixes: false
        contract:
          description:
            - The node's hardware contract (C(docs/contract.md)) - C(node) and C(gpus) hold contract values only
              (equal on every node of a GPU class), C(units) the per-unit values (UUID, serial, PCI bus id,
              counters).
          type: dict
          sample:
            contract_version: 1
            node: {cuda_driver_version: "13.0", kernel: 6.1.0-28-amd64}
            gpus: [{index: 0, memory_reserved_mib: 545, power_default_limit_w: 700.0}]
            units: [{index: 0, uuid: GPU-00000000-0000-0000-0000-0000000000a0}]
        kernel_log_gpus:
          description:
            - The UUID and board serial the driver printed for each GPU it set up (C(pci_bus_id), C(uuid),
              C(serial)); they name a GPU that no other source lists.
          type: list
          elements: dict
        headline:
          description: The headline block (see the result's C(headline)).
          type: dict
        rollout:
          description:
            - What a rollout left on the node - C(flagged) (with the flag's C(reason), C(rollout_id), C(stage),
              C(time), C(rollback_version), C(rollback_verified)) and C(drained) (C(drained_by), C(drained_at));
              V(null) values when not read (a capture).
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

import errno
import os
import re
import stat
import sys
from xml.parsers.expat import errors as expat_errors

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.common.text.converters import to_text

from ansible_collections.gpufleet.nvidia.plugins.module_utils.facts_assemble import (
    CAPTURE_FILES,
    CaptureError,
    assemble_facts,
)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_log import MAX_XID_KEYS, keep_newest
from ansible_collections.gpufleet.nvidia.plugins.module_utils.nvml_reader import load_pynvml, read_nvml
from ansible_collections.gpufleet.nvidia.plugins.module_utils.node_lock import read_state, unreadable_state
from ansible_collections.gpufleet.nvidia.plugins.module_utils import rollout_marks

# Reading limit of one file or command output, in bytes (characters for command output).
_MAX_FILE_BYTES = 64 * 1024 * 1024
# Capture files whose newest part is kept when they are over the limit (logs, oldest line first).
_NEWEST_FIRST_FILES = ("dmesg.txt",)
# Expat's error messages (xml.parsers.expat.errors), longest first: the only words of an XML parse
# error that are kept in a failure message (see content_free).
_EXPAT_REASONS = sorted(expat_errors.messages.values(), key=len, reverse=True)
_TRUNCATED_HINT = "; the document ends before </nvidia_smi_log>, the capture looks truncated"
_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")


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


def _megabytes(size):
    """A size for a message: ``64.0 MiB``, or ``4096 bytes`` under 1 MiB."""
    return "%.1f MiB" % (size / 1048576.0) if size >= 1048576 else "%d bytes" % size


def _read_capture_file(module, capture_dir, filename, warnings):
    """Read one capture file of a bundle, refusing what could read outside the bundle.

    :param module: the AnsibleModule (``fail_json`` for a refused file).
    :param capture_dir: the bundle directory. :param filename: a key of ``CAPTURE_FILES``.
    :param warnings: list that gets the warnings (also given to ``module.warn``).
    :returns: ``(data, problem)``: the file's bytes (at most ``_MAX_FILE_BYTES``) and ``None``;
        ``(None, None)`` when the file is absent; ``(None, text)`` when it is present but
        unusable (a directory, not a regular file, empty), ``text`` saying why (warned).
    :raises: nothing; a symbolic link, a file with several hard links or a file that cannot be
        opened fails the module (``fail_json`` with ``file``).
    """
    path = os.path.join(capture_dir, filename)

    def refuse(problem):
        module.fail_json(msg="%s: %s" % (filename, problem), file=filename)

    def unusable(problem):
        text = "capture_dir: %s %s; ignored, its fields are null" % (filename, problem)
        warnings.append(text)
        module.warn(text)
        return None, problem

    link_problem = ("is a symbolic link; a support bundle is untrusted input and a link could make "
                    "this module read any file of the node, so capture files must be regular files "
                    "(copy the file it points to into the bundle)")
    try:
        info = os.lstat(path)
    except OSError as err:
        if err.errno in (errno.ENOENT, errno.ENOTDIR):
            return None, None
        refuse("cannot be read (%s)" % (err.strerror or err))
    if stat.S_ISLNK(info.st_mode):
        refuse(link_problem)
    if stat.S_ISDIR(info.st_mode):
        return unusable("is a directory, not a file")
    if not stat.S_ISREG(info.st_mode):
        return unusable("is not a regular file (a FIFO, socket or device)")
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP:
            refuse(link_problem)  # replaced by a link since lstat
        refuse("cannot be read (%s)" % (err.strerror or err))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return unusable("is not a regular file (a FIFO, socket or device)")
        if info.st_nlink > 1:
            refuse("has %d hard links; a support bundle is untrusted input and a hard link could make "
                   "this module read another file of the node, so capture files must be plain copies"
                   % info.st_nlink)
        size = info.st_size
        if size > _MAX_FILE_BYTES and filename in _NEWEST_FIRST_FILES:
            # One byte more than the limit: it tells whether the cut falls between two lines.
            handle.seek(size - _MAX_FILE_BYTES - 1)
            data, left_out = keep_newest(handle.read(_MAX_FILE_BYTES + 1), _MAX_FILE_BYTES)
            left_out += size - _MAX_FILE_BYTES - 1
            text = ("capture_dir: %s is %s, over the %s reading limit: only its newest %s (the end of "
                    "the file, whole lines) were read, the oldest %s left out"
                    % (filename, _megabytes(size), _megabytes(_MAX_FILE_BYTES), _megabytes(len(data)),
                       _megabytes(left_out)))
            warnings.append(text)
            module.warn(text)
        else:
            data = handle.read(_MAX_FILE_BYTES)
            if size > _MAX_FILE_BYTES:
                text = ("capture_dir: %s is %s, over the %s reading limit: only its first %s were read"
                        % (filename, _megabytes(size), _megabytes(_MAX_FILE_BYTES), _megabytes(len(data))))
                warnings.append(text)
                module.warn(text)
    if not data.strip():
        return unusable("is empty" if not data else "holds only white space")
    return data, None


def read_capture(module, capture_dir, warnings=None):
    """Read the files of a captured bundle, as untrusted input.

    :param module: the AnsibleModule; ``module.warn`` gets each warning, ``fail_json`` ends the
        run for a refused bundle.
    :param capture_dir: path of the bundle directory on the managed node.
    :param warnings: a list to extend with the warnings (for ``ansible_facts.nvidia.warnings``).
    :returns: ``{file name (a key of CAPTURE_FILES): bytes}`` of the usable files, each at most
        ``_MAX_FILE_BYTES`` (64 MiB; the newest part of ``dmesg.txt``, the first part of others).
    :raises: nothing; fails the module (``fail_json``) when ``capture_dir`` is not a directory,
        when a capture file is a symbolic link or has several hard links or cannot be opened
        (``file`` names it), and when no recognised file is usable. A directory, a special file
        or an empty file is skipped with a warning naming it.
    """
    warnings = [] if warnings is None else warnings
    if not os.path.isdir(capture_dir):
        module.fail_json(msg="capture_dir %s is not a directory; it should hold files such as %s"
                         % (capture_dir, ", ".join(sorted(CAPTURE_FILES))))
    raw = {}
    unusable = []
    for filename in sorted(CAPTURE_FILES):
        data, problem = _read_capture_file(module, capture_dir, filename, warnings)
        if data is not None:
            raw[filename] = data
        elif problem is not None:
            unusable.append("%s %s" % (filename, problem))
    if not raw:
        if unusable:
            named = {"file": unusable[0].split(" ", 1)[0]} if len(unusable) == 1 else {}
            module.fail_json(msg="capture_dir %s has no usable capture file: %s"
                             % (capture_dir, "; ".join(unusable)), **named)
        module.fail_json(msg="capture_dir %s holds none of the capture files; it should hold files such as %s"
                         % (capture_dir, ", ".join(sorted(CAPTURE_FILES))))
    return raw


def content_free(problem, data=None):
    """A parser's complaint about a capture file, without the file's own text.

    The nvidia-smi parsers quote the line where they stopped (``... line 1 is not XML: 'root:...'``),
    which is useful for a file one trusts and a leak for a bundle: the quote goes to the task
    output and logs. The quote is cut, what is wrong and where is kept.

    :param problem: the parser's message (``SmiParseError``/``CaptureError`` text, without the
        ``<file>: `` prefix).
    :param data: the file's bytes, or ``None``; any quoted text of the message that occurs in
        them is replaced by ``<file text>`` as well.
    :returns: the message, e.g. ``expected an <nvidia_smi_log> XML document from nvidia-smi -q -x,
        but line 1 is not XML``, or ``... parsing stopped at line 3, column 2 (mismatched tag)``.
    :raises: nothing.
    """
    head, sep, _rest = problem.partition(" is not XML")
    if sep:
        return head + sep
    head, sep, _rest = problem.partition(" (first line: ")
    if sep:
        return head
    match = re.match(r"^(.*?parsing stopped at line \d+, column \d+) \((.*)$", problem, re.S)
    if match:
        rest = match.group(2)
        reason = next((r for r in _EXPAT_REASONS if rest.startswith(r)), "not well-formed")
        return "%s (%s%s)" % (match.group(1), reason, _TRUNCATED_HINT if _TRUNCATED_HINT in rest else "")
    match = re.match(r"^(expected root element <\w+> \([^)]*\)), found <.*> at line (\d+)$", problem, re.S)
    if match:
        return "%s, found another root element at line %s" % (match.group(1), match.group(2))
    if data:
        text = to_text(data, errors="surrogate_or_replace")

        def scrub(quoted):
            inner = quoted.group(0)[1:-1]
            inner = inner[:-3] if inner.endswith("...") else inner
            return "<file text>" if inner.strip() and inner in text else quoted.group(0)
        problem = _QUOTED.sub(scrub, problem)
    return problem


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
    inputs["peermem_version"] = _read_text_file("/sys/module/nvidia_peermem/version")
    for key, path in (("rollout_flag", rollout_marks.FLAG_FILE),
                      ("rollout_drain", os.path.join(module.params["rollout_state_dir"], "drain.json"))):
        try:
            inputs[key] = read_state(path)
        except OSError as err:
            inputs[key] = unreadable_state("%s cannot be read (%s)" % (path, err))
    result = _run(module, ["mokutil", "--sb-state"])
    if result is not None:
        inputs["mokutil_sb_state"] = "%s\n%s" % (result[1], result[2])
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
        source = "dmesg"
        if result is None or result[0] != 0:
            result = _run(module, ["journalctl", "-k", "-b", "-a", "--no-pager", "-o", "short-monotonic"])
            source = "journalctl -k"
        if result is not None and result[0] == 0:
            text, left_out = keep_newest(result[1], _MAX_FILE_BYTES)
            inputs["kernel_log"] = text
            if left_out:
                inputs["kernel_log_warning"] = (
                    "kernel log: %s printed %d characters, over the %d reading limit: only the newest "
                    "%d (whole lines) were read" % (source, len(result[1]), _MAX_FILE_BYTES, len(text)))
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
            rollout_state_dir=dict(type="path", default=rollout_marks.STATE_DIR),
        ),
        supports_check_mode=True,
    )
    capture_dir = module.params["capture_dir"]
    warnings = []
    raw = {}
    try:
        if capture_dir:
            raw = read_capture(module, capture_dir, warnings)
            facts = assemble_facts(raw, capture=True)
        else:
            inputs = collect_live(module)
            if inputs.get("kernel_log_warning"):
                warning = inputs.pop("kernel_log_warning")
                warnings.append(warning)
                module.warn(warning)
            facts = assemble_facts(inputs, capture=False)
    except CaptureError as err:
        # The file name is ours; what follows it is the parser's, with any quote of the file cut.
        problem = to_text(err)
        prefix = "%s: " % err.filename
        if problem.startswith(prefix):
            problem = problem[len(prefix):]
        module.fail_json(msg=prefix + content_free(problem, raw.get(err.filename)), file=err.filename)
    dropped = (facts.get("xid_summary") or {}).get("dropped_lines")
    if dropped:
        warnings.append("kernel log: %d Xid line(s) are in no event (more than %d distinct device/Xid pairs and "
                        "%d distinct Xid numbers beyond them); Xid counts are lower bounds"
                        % (dropped, MAX_XID_KEYS, MAX_XID_KEYS))
    facts["warnings"] = warnings + list(facts.get("warnings") or [])
    # The headline first: what an operator reads before the rest of the document.
    facts = dict([("headline", facts["headline"])] + [(k, v) for k, v in facts.items() if k != "headline"])
    module.exit_json(changed=False, headline=facts["headline"], ansible_facts={"nvidia": facts})


if __name__ == "__main__":
    main()
