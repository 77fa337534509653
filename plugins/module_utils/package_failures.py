# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Classifiers of what apt, dnf and the module build left behind after a driver transaction.

Pure: no file, process or network access. Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

import re
from typing import Any, Dict, List, Optional

from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import versions_match


_DKMS_BUILD = re.compile(r"Bad return status for module build on kernel:\s*(?P<kernel>\S+)(?:\s*\((?P<arch>[^)]*)\))?")
_DKMS_LOG = re.compile(r"(?P<log>/var/lib/dkms/(?P<module>[\w.+-]+)/(?P<version>[\w.+~-]+)/build/make\.log)")


def dkms_build_failure(text: Optional[str]) -> Optional[Dict[str, Any]]:
    """A DKMS module build that failed during a package transaction, with the kernel and module named.

    DKMS prints ``Error! Bad return status for module build on kernel: 6.1.0-25-amd64 (x86_64)``
    and ``Consult /var/lib/dkms/nvidia/580.95.05/build/make.log for more information.``; dpkg then
    leaves the package unconfigured. The cause is the build against that kernel (headers missing or
    of another version, a compiler mismatch, a kernel newer than the driver supports), not the
    repository: retrying the same transaction builds the same way.

    :param text: apt/dpkg/dnf output, or ``None``.
    :returns: ``{"kernel": str, "arch": str | None, "module": str | None ("nvidia"), "version": str | None
        (the module's version), "make_log": str | None (the path to read)}``, or ``None``.
    :raises: nothing.
    Source: DKMS's own messages (dkms(8), ``make.log`` under ``/var/lib/dkms/<module>/<version>/build``).
    """
    match = _DKMS_BUILD.search(text or "")
    if match is None:
        return None
    log = _DKMS_LOG.search(text or "")
    return {"kernel": match.group("kernel"), "arch": match.group("arch"),
            "module": log.group("module") if log else None, "version": log.group("version") if log else None,
            "make_log": log.group("log") if log else None}


def classify_apt_failure(rc: Optional[int], stdout: Optional[str] = "", stderr: Optional[str] = "") -> Dict[str, Any]:
    """Classify a failed apt-get run.

    Field case 18: rc 100 with "Unable to correct problems, you have held broken packages" is a
    **dependency conflict** (a pin, a hold or a missing package of the set), not a transient
    error: do not retry; show the "unmet dependencies" block.

    Field case 34: ``Failed to fetch … 404 Not Found`` means the repository answered and the file
    is gone: a stale index or a pinned version the archive withdrew (``withdrawn``), not an
    outage; retrying the same command fails the same way.

    A DKMS build that failed (:func:`dkms_build_failure`) is ``module_build_failed``, with the
    kernel, module and ``make.log`` named, whatever dpkg said after it.

    :returns: ``{"kind": "module_build_failed"|"dependency_conflict"|"lock"|"network"|
        "dpkg_interrupted"|"not_found"|"withdrawn"|"other", "retry": bool, "unmet": [lines],
        "message": str, "rc", "module_build"?: :func:`dkms_build_failure`}``.
    """
    text = "%s\n%s" % (stdout or "", stderr or "")
    unmet = []
    capture = False
    for line in text.splitlines():
        stripped = line.strip()
        if "unmet dependencies" in stripped:
            capture = True
            continue
        if capture:
            if stripped.startswith("E:"):
                capture = False
            elif stripped:
                unmet.append(stripped)
    build = dkms_build_failure(text)
    if build is not None:
        kind, retry = "module_build_failed", False
        message = ("apt-get failed (rc %s): the %s %s kernel module did not build for kernel %s (DKMS); read %s, "
                   "install the headers of that kernel or boot a kernel the driver supports; not retried" % (
                       rc, build["module"] or "NVIDIA", build["version"] or "", build["kernel"],
                       build["make_log"] or "the DKMS make.log"))
    elif "held broken packages" in text or "unmet dependencies" in text:
        kind, retry = "dependency_conflict", False
        message = ("apt could not resolve the dependencies of the requested set (rc %s): a hold, a pin or a "
                   "package of another origin or branch blocks it; not retried" % rc)
    elif "Could not get lock" in text or "Unable to acquire the dpkg frontend lock" in text:
        kind, retry, message = "lock", True, "another package manager holds the dpkg lock"
    elif "dpkg was interrupted" in text:
        kind, retry, message = "dpkg_interrupted", False, "dpkg was interrupted; run 'dpkg --configure -a'"
    elif "Unable to locate package" in text or "Version '" in text and "was not found" in text:
        kind, retry, message = "not_found", False, "a requested package or version is not in the repository"
    elif re.search(r"\b404\s+Not Found\b", text):
        kind, retry = "withdrawn", False
        message = ("the repository answered 404 Not Found for a package of the pinned version: the package index "
                   "is stale or the version was withdrawn; run apt-get update and check the exact version with "
                   "apt-cache madison, or choose a published version or a mirror; not retried")
    elif re.search(r"(Temporary failure resolving|Failed to fetch|Could not connect|Connection failed)", text):
        kind, retry, message = "network", True, "the repository could not be reached"
    else:
        kind, retry, message = "other", False, "apt-get failed (rc %s)" % rc
    result = {"kind": kind, "retry": retry, "unmet": unmet, "message": message, "rc": rc}
    if build is not None:
        result["module_build"] = build
    return result


def classify_dnf_failure(text: Optional[str]) -> Dict[str, Any]:
    """Classify a failed dnf driver transaction (field case 21).

    :returns: ``{"kind": "stream_switch_refused"|"flavour_conflict"|"depsolve_conflict"|"other",
        "from_stream": str|None, "to_stream": str|None, "packages": [str], "remedy": str}``:
        a stream switch needs ``dnf module reset nvidia-driver`` first; a precompiled kmod
        conflicts with a DKMS kmod (swap them explicitly, never ``--allowerasing``); a depsolve
        problem names the packages whose versions must be pinned together.
    """
    body = text or ""
    switch = re.search(r"switching of module '([^']+)' stream\s+'([^']*)' to stream '([^']+)'", body)
    if switch or "module_stream_switch" in body:
        return {"kind": "stream_switch_refused",
                "from_stream": switch.group(2) if switch else None,
                "to_stream": switch.group(3) if switch else None,
                "packages": [], "remedy": "dnf module reset %s, then enable the new stream and install"
                % (switch.group(1) if switch else "nvidia-driver")}
    conflict = re.search(r"package (kmod-nvidia\S+) from @System conflicts with (\S+) provided by (\S+)", body)
    if conflict:
        return {"kind": "flavour_conflict", "from_stream": None, "to_stream": None,
                "packages": [conflict.group(1), conflict.group(3)],
                "remedy": "the installed precompiled module and the DKMS module are exclusive: keep the installed "
                          "flavour or swap it explicitly (dnf swap); never --allowerasing on a running node"}
    problem = re.search(r"Problem: package (\S+) from \S+ requires (.+?), but none of the providers", body)
    if problem:
        return {"kind": "depsolve_conflict", "from_stream": None, "to_stream": None,
                "packages": [problem.group(1), problem.group(2).strip()],
                "remedy": "pin the driver and the CUDA packages to versions that agree"}
    return {"kind": "other", "from_stream": None, "to_stream": None, "packages": [], "remedy": ""}


def verify_module_build(target_version: str, on_disk_version: Optional[str], running_kernel: Optional[str] = None,
                        modules_by_kernel: Optional[Dict[str, List[str]]] = None) -> Dict[str, Any]:
    """Check, before any reboot, that the module the running kernel will load is the target build.

    Field case 23: DKMS left 595.80 on disk while the userspace is 595.84 - **broken**, a reboot
    does not help. Field case 24: no ``nvidia.ko`` for the running kernel at all (only for an older
    one) - **not built for the running kernel**.

    :param target_version: the driver version just installed.
    :param on_disk_version: ``modinfo -F version nvidia`` for the running kernel, ``None`` when
        modinfo found no module.
    :param running_kernel: ``uname -r``.
    :param modules_by_kernel: ``{kernel release: [module files]}`` (``driver_state.nvidia_modules_by_kernel``).
    :returns: ``{"verdict": "ok"|"broken"|"not_built_for_running_kernel", "expected", "found",
        "running_kernel", "module_present_for": [kernels], "message": str}``.
    """
    present = sorted(k for k, mods in (modules_by_kernel or {}).items() if mods)
    result = {"expected": target_version, "found": on_disk_version, "running_kernel": running_kernel,
              "module_present_for": present}
    if not on_disk_version:
        result["verdict"] = "not_built_for_running_kernel"
        result["message"] = ("no nvidia module for the running kernel %s%s; rebuild it (DKMS) or boot a kernel it "
                             "was built for" % (running_kernel or "?",
                                                " (present for %s)" % ", ".join(present) if present else ""))
    elif versions_match(on_disk_version, target_version):
        result["verdict"] = "ok"
        result["message"] = "the module on disk for %s is %s" % (running_kernel or "the running kernel", on_disk_version)
    else:
        result["verdict"] = "broken"
        where = running_kernel or "the running kernel"
        result["message"] = ("the module on disk for %s is %s but the driver installed is %s: a reboot would load "
                             "the wrong module; rebuild or reinstall it" % (where, on_disk_version, target_version))
    return result
