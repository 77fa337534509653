# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The ``driver.state`` verdict, from the three driver versions and a little evidence.

Three versions describe an NVIDIA driver on a node, and they can disagree:

* **userspace** - the libraries (``libnvidia-ml.so``, ``libcuda.so``) and tools: NVML
  ``nvmlSystemGetDriverVersion``, ``nvidia-smi``'s ``<driver_version>``, or the installed driver
  packages (:mod:`installed_packages`, :mod:`driver_packages`);
* **loaded** - the kernel module in memory (:mod:`driver_loaded`);
* **on disk** - the kernel module that the *running* kernel loads at the next boot
  (:mod:`driver_on_disk`).

:func:`driver_state` turns the versions and a little evidence into one of ``not_installed``,
``not_loaded``, ``ok``, ``reboot_pending``, ``broken`` (docs/facts.md, ``driver.state``),
comparing versions for exact equality (:func:`driver_versions.versions_match`). Pure: nothing
here reads a file or runs a command.

Compatible with Python 3.7 (the managed nodes' floor, see README.md); standard library only.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import nvml_names
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import upstream_version, versions_match


# NVML error names as pynvml spells them without the ``NVMLError_`` prefix
# (``pynvml.NVMLError_LibRmVersionMismatch`` ...), from nvml_names.RETURN_CODES.
NVML_LIB_RM_VERSION_MISMATCH = nvml_names.RETURN_CODES[nvml_names.ERROR_LIB_RM_VERSION_MISMATCH]
NVML_DRIVER_NOT_LOADED = nvml_names.RETURN_CODES[nvml_names.ERROR_DRIVER_NOT_LOADED]
NVML_LIBRARY_NOT_FOUND = nvml_names.RETURN_CODES[nvml_names.ERROR_LIBRARY_NOT_FOUND]
NVML_NO_PERMISSION = nvml_names.RETURN_CODES[nvml_names.ERROR_NO_PERMISSION]


def _package_label(package: Dict[str, Any]) -> str:
    return "%s %s (%s)" % (package.get("name"), package.get("version") or "?", package.get("status"))


def _signature_reasons(evidence: Dict[str, Any], module_found: Optional[bool], kernel_text: str) -> List[str]:
    """Why a built module is not loaded when Secure Boot refused it (field case 33), with the remedy."""
    signer = evidence.get("module_signer")
    signer_text = ("signed by \"%s\"" % signer) if signer else "unsigned"
    remedy = (" A reboot into the same kernel will not fix it: enroll the signing key as a Machine Owner Key "
              "(mokutil --import, and trust it for modules where the kernel keeps MOKs out of its machine keyring), "
              "or install the distribution's or NVIDIA's signed precompiled modules, or boot a kernel that trusts "
              "the key.")
    if evidence.get("signature_rejected"):
        return ["The kernel refused the module's signature (%s) under Secure Boot: module signature not accepted."
                % signer_text + remedy]
    if evidence.get("secure_boot") and module_found:
        return ["Secure Boot is on and the module (%s) is built for %s but not loaded: the kernel most likely "
                "refused its signature (look for \"Loading of unsigned module is rejected\" or \"Key was rejected "
                "by service\")." % (signer_text, kernel_text) + remedy]
    return []


# A captured bundle whose versions disagree says "reboot pending" only with the module on disk read:
# the module that loads at the next boot may itself differ from the libraries (field case 23: broken).
_NEEDS_MODINFO = (
    ". Whether a reboot fixes it depends on the kernel module on disk for the running kernel, which "
    "this bundle does not hold (no modinfo-nvidia.txt: modinfo nvidia): reboot_pending if it is the "
    "userspace version, broken if not; the state is undetermined.")


def driver_state(
    userspace_version: Optional[str],
    loaded_version: Optional[str],
    on_disk_version: Optional[str],
    packages: Optional[List[Dict[str, Any]]] = None,
    evidence: Optional[Dict[str, Any]] = None,
) -> Tuple[Optional[str], List[str]]:
    """Decide ``driver.state`` from the three versions, the packages and some evidence.

    States (docs/facts.md, ``driver.state``):

    * ``not_installed`` - no driver package, no userspace library, no module on disk for the
      running kernel, nothing loaded.
    * ``broken`` - checked first, whatever else holds: driver packages half-configured
      (dpkg state ``U``/``F``/``H``/``W``/``t`` or error flag ``R``); or the on-disk module
      differs from the userspace (a reboot loads the wrong module again - field case 23); or no
      module on disk for the running kernel while the driver is installed ("driver not built for
      the running kernel", an installation problem and not a GPU failure - field case 24); or NVML
      reports a library/module mismatch while the on-disk module equals the loaded one (the
      libraries are the odd ones out); or, on a live host, a module is loaded or on disk but no
      userspace driver is present at all.
    * ``not_loaded`` - installed, nothing loaded (e.g. NVML ``DriverNotLoaded``, no
      ``/sys/module/nvidia``).
    * ``reboot_pending`` - loaded ≠ userspace and on-disk == userspace: the next boot loads
      the right module. On a live host NVML ``LibRmVersionMismatch`` is evidence for it even when a
      version is unknown (field case 17); a captured bundle without ``modinfo`` says no more than
      its evidence: undetermined (``None``), naming the file it lacks, since the module on disk
      may differ from the libraries as well (field case 23, ``broken``).
    * ``ok`` - loaded == userspace (and on-disk == both).

    Unknown versions (``None``), decided conservatively:

    * On a live host (``evidence["live"]`` true, the default) a source that gave nothing means
      absent: no loaded version → not loaded; no userspace version and no NVML evidence →
      no userspace driver.
    * In a captured bundle (``evidence["live"]`` false) a missing file means unknown. When the
      verdict needs a fact that is unknown, the state is ``None`` (undetermined) and the reasons
      say what is missing; it is never ``ok``.
    * An unknown on-disk version (``modinfo`` not available) does not block ``ok`` or
      ``reboot_pending``; the reasons then say that the on-disk module was not checked. A
      rollout's verification compares ``on_disk_version`` with its target itself.
    * A version that differs is never guessed equal: ``"595.71"`` does not match ``"595.71.05"``.

    :param userspace_version: NVML ``nvmlSystemGetDriverVersion`` / ``nvidia-smi``
        ``<driver_version>`` / :func:`driver_packages.userspace_version_from_packages`, or ``None``.
    :param loaded_version: ``/sys/module/nvidia/version`` or ``/proc/driver/nvidia/version``, or
        ``None``.
    :param on_disk_version: ``modinfo -F version nvidia`` for the running kernel, or ``None``.
    :param packages: driver package records (:func:`installed_packages.parse_dpkg_l`, :func:`installed_packages.parse_rpm_qa`);
        ``None`` when no package list was read, ``[]`` when it was read and holds none.
    :param evidence: optional flags: ``nvml_error`` (``"LibRmVersionMismatch"``,
        ``"DriverNotLoaded"``, ``"LibraryNotFound"``, another pynvml error name, or ``None``),
        ``nvml_initialized`` (bool: NVML or ``nvidia-smi`` answered, which proves the loaded
        module has the library's version), ``module_loaded`` (bool|None:
        ``/sys/module/nvidia`` present), ``module_found_for_running_kernel`` (bool|None:
        ``modinfo`` found a module / said "Module nvidia not found"), ``userspace_present``
        (bool|None: ``libnvidia-ml.so.1`` or ``nvidia-smi`` found), ``running_kernel`` (str),
        ``module_present_for`` (list of kernel releases that have an ``nvidia.ko``),
        ``kernel_log_nvrm`` (bool: the kernel log holds ``NVRM:`` lines, so a module was loaded
        when they were written; only words the undetermined verdict),
        ``secure_boot`` (bool|None: ``mokutil --sb-state``), ``module_signer`` (str|None: ``modinfo``
        ``signer:``), ``signature_rejected`` (bool: the kernel log says the module's signature was
        refused; a ``not_loaded`` state then says so, and that a reboot will not fix it),
        ``live`` (bool, default ``True``; ``False`` for a captured bundle).
    :returns: ``(state, reasons)``: ``state`` is one of ``facts_model.DRIVER_STATES`` or
        ``None`` (undetermined: a captured bundle without the files the verdict needs, or a
        loaded module whose userspace version could not be read, e.g. NVML ``NoPermission`` in a
        container without driver packages); ``reasons`` is a list of plain sentences that name
        the versions.
    :raises: nothing.
    """
    evidence = evidence or {}
    live = evidence.get("live", True)
    nvml_error = evidence.get("nvml_error")
    running_kernel = evidence.get("running_kernel")
    kernel_text = ("the running kernel %s" % running_kernel) if running_kernel else "the running kernel"
    reasons = []  # type: List[str]

    userspace = upstream_version(userspace_version)
    loaded = upstream_version(loaded_version)
    on_disk = upstream_version(on_disk_version)

    installed = [p for p in (packages or []) if p.get("installed", True)]
    half = [p for p in installed if p.get("half_configured")]

    module_found = evidence.get("module_found_for_running_kernel")
    if on_disk is not None:
        module_found = True

    loaded_inferred = False
    if loaded is None and userspace is not None and evidence.get("nvml_initialized"):
        loaded = userspace
        loaded_inferred = True
        reasons.append(
            "NVML or nvidia-smi answered, so a kernel module that works with the libraries' version %s is loaded "
            "(its own version file was not read)." % userspace
        )

    # Userspace: True present, False absent, None unknown.
    userspace_present = None  # type: Optional[bool]
    if (
        userspace is not None
        or nvml_error in (NVML_LIB_RM_VERSION_MISMATCH, NVML_DRIVER_NOT_LOADED, NVML_NO_PERMISSION)
        or evidence.get("nvml_initialized")
        or evidence.get("userspace_present")
    ):
        userspace_present = True
    elif nvml_error == NVML_LIBRARY_NOT_FOUND or evidence.get("userspace_present") is False or live:
        userspace_present = False

    # Loaded module: True, False, None unknown.
    module_loaded = None  # type: Optional[bool]
    if loaded is not None or nvml_error == NVML_LIB_RM_VERSION_MISMATCH or evidence.get("module_loaded"):
        module_loaded = True
    elif nvml_error == NVML_DRIVER_NOT_LOADED or evidence.get("module_loaded") is False or live:
        module_loaded = False

    packages_known = packages is not None
    something_installed = bool(installed) or userspace_present is True or module_found is True

    # --- not installed ----------------------------------------------------------------------
    if not something_installed and module_loaded is not True:
        unknown = []
        if not packages_known:
            unknown.append("the package list")
        if userspace_present is None:
            unknown.append("the userspace libraries (NVML / nvidia-smi)")
        if module_found is None and not live:
            unknown.append("the kernel module on disk (modinfo)")
        if module_loaded is None:
            unknown.append("the loaded kernel module")
        if unknown:
            seen = ""
            if evidence.get("kernel_log_nvrm"):
                seen = ("The kernel log holds NVRM lines, so an NVIDIA kernel module was loaded when "
                        "they were written. ")
            return None, reasons + [
                "%sThe driver state is undetermined: %s could not be checked."
                % (seen, ", ".join(unknown))
            ]
        return "not_installed", reasons + [
            "No NVIDIA driver is installed: no driver package, no NVML library, no nvidia kernel "
            "module on disk for %s and none loaded." % kernel_text
        ]

    # --- broken -----------------------------------------------------------------------------
    broken = []  # type: List[str]
    if half:
        broken.append(
            "Driver packages are not fully installed or configured: %s; a package transaction "
            "did not finish." % ", ".join(_package_label(p) for p in half)
        )
    if on_disk is not None and userspace is not None and not versions_match(on_disk, userspace):
        broken.append(
            "The kernel module on disk for %s is %s but the userspace driver is %s: the module that "
            "loads at every boot does not match the libraries, so a reboot will not fix it; rebuild "
            "or reinstall the kernel module." % (kernel_text, on_disk, userspace)
        )
    if module_found is False and (installed or userspace_present is True):
        present_for = evidence.get("module_present_for") or []
        sentence = (
            "The nvidia kernel module is not built for %s (modinfo: Module nvidia not found) "
            "although the driver is installed" % kernel_text
        )
        if userspace is not None:
            sentence += " (userspace %s)" % userspace
        if present_for:
            sentence += "; a module exists only for %s" % ", ".join(present_for)
        sentence += (
            ". This is an installation problem, not a GPU failure: build the module for this "
            "kernel (DKMS or the installer) or boot a kernel it was built for."
        )
        broken.append(sentence)
    if (
        nvml_error == NVML_LIB_RM_VERSION_MISMATCH
        and userspace is None
        and on_disk is not None
        and loaded is not None
        and versions_match(on_disk, loaded)
    ):
        broken.append(
            "NVML reports a driver/library version mismatch, yet the on-disk module %s equals the "
            "loaded module: the userspace libraries are the odd ones out and a reboot will not fix "
            "it." % on_disk
        )
    if userspace_present is False and (module_loaded is True or module_found is True):
        where = "loaded" if module_loaded is True else "on disk for %s" % kernel_text
        version = loaded if module_loaded is True else on_disk
        broken.append(
            "The nvidia kernel module %s is %s but no NVIDIA userspace driver was found (no NVML "
            "library, no nvidia-smi, no driver package)." % (version or "(version unknown)", where)
        )
    if broken:
        return "broken", reasons + broken

    # --- not loaded -------------------------------------------------------------------------
    if module_loaded is False:
        sentence = "No nvidia kernel module is loaded"
        if nvml_error == NVML_DRIVER_NOT_LOADED:
            sentence += " (NVML: DriverNotLoaded)"
        parts = []
        if userspace is not None:
            parts.append("userspace %s" % userspace)
        if on_disk is not None:
            parts.append("on disk %s" % on_disk)
        if parts:
            sentence += "; installed: %s" % ", ".join(parts)
        return "not_loaded", reasons + [sentence + "."] + _signature_reasons(evidence, module_found, kernel_text)
    if module_loaded is None:
        return None, reasons + [
            "Whether a kernel module is loaded is unknown (no /sys/module/nvidia/version or "
            "/proc/driver/nvidia/version, no NVML answer); the state is undetermined."
        ]

    # --- loaded -----------------------------------------------------------------------------
    on_disk_note = (
        " The on-disk module for %s was not checked (no modinfo)." % kernel_text
        if on_disk is None
        else ""
    )
    if loaded is not None and userspace is not None:
        if versions_match(loaded, userspace):
            if nvml_error == NVML_LIB_RM_VERSION_MISMATCH:
                reasons.append(
                    "NVML reported a driver/library version mismatch although the versions read "
                    "agree; the sources were read at different times."
                )
            if on_disk is not None:
                return "ok", reasons + [
                    "Userspace, loaded and on-disk driver versions agree: %s." % loaded
                ]
            if loaded_inferred:
                return "ok", reasons + [
                    "The userspace driver is %s and NVML works with the loaded module.%s"
                    % (loaded, on_disk_note)
                ]
            return "ok", reasons + [
                "Userspace and loaded driver versions agree: %s.%s" % (loaded, on_disk_note)
            ]
        sentence = (
            "The loaded kernel module is %s but the userspace driver is %s" % (loaded, userspace)
        )
        if nvml_error == NVML_LIB_RM_VERSION_MISMATCH:
            sentence += " (NVML: driver/library version mismatch)"
        if on_disk is not None:
            sentence += "; the on-disk module is %s, so a reboot loads the matching module." % on_disk
        elif not live:
            return None, reasons + [sentence + _NEEDS_MODINFO]
        else:
            sentence += "; a reboot is expected to load the matching module.%s" % on_disk_note
        return "reboot_pending", reasons + [sentence]

    if nvml_error == NVML_LIB_RM_VERSION_MISMATCH:
        sentence = "NVML reports a driver/library version mismatch: the loaded kernel module"
        if loaded is not None:
            sentence += " (%s)" % loaded
        sentence += " differs from the userspace libraries"
        if userspace is not None:
            sentence += " (%s)" % userspace
        if on_disk is not None:
            sentence += "; the on-disk module is %s" % on_disk
        if on_disk is None and not live:
            return None, reasons + [sentence + _NEEDS_MODINFO]
        sentence += "; a reboot (or module reload) is pending."
        if on_disk is None:
            sentence += on_disk_note
        return "reboot_pending", reasons + [sentence]

    # Loaded, userspace present but its version unknown.
    if loaded is not None and on_disk is not None and not versions_match(loaded, on_disk):
        return "reboot_pending", reasons + [
            "The loaded kernel module is %s but the on-disk module for %s is %s; the userspace "
            "version is unknown. A reboot loads %s." % (loaded, kernel_text, on_disk, on_disk)
        ]
    return None, reasons + [
        "A kernel module%s is loaded but the userspace driver version is unknown; the state is "
        "undetermined." % ((" " + loaded) if loaded else "")
    ]
