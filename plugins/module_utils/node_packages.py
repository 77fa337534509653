# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""What a node has and what its repository offers, read through an ``AnsibleModule``, and the plan.

Shared by the ``driver_resolve`` module (reads only) and the ``driver_transaction`` module (plans,
applies and reads back). Installed packages come from ``dpkg-query`` and ``apt-mark showhold`` (apt)
or ``rpm -qa``, ``dnf module list`` and ``dnf versionlock list`` (dnf); repository versions from
``apt-cache madison`` (optionally through a private temporary apt state) or ``dnf list``; NVSwitch
devices from ``/sys/bus/pci/devices``.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import datetime
import glob
import os
import shutil
import tempfile

from ansible_collections.gpufleet.nvidia.plugins.module_utils import apt_plan
from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_catalog as bc
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_resolution
from ansible_collections.gpufleet.nvidia.plugins.module_utils import distributions
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_sets
from ansible_collections.gpufleet.nvidia.plugins.module_utils import package_transaction
from ansible_collections.gpufleet.nvidia.plugins.module_utils import repository_versions
from ansible_collections.gpufleet.nvidia.plugins.module_utils.installed_packages import parse_apt_mark_showhold, parse_dpkg_l, parse_rpm_qa


ENV = {"LANG": "C", "LC_ALL": "C", "DEBIAN_FRONTEND": "noninteractive"}


def count_nvswitches(root="/sys/bus/pci/devices"):
    """NVSwitch devices: PCI vendor 0x10de with class 0x0680xx (bridge, other)."""
    count = 0
    for device in glob.glob(os.path.join(root, "*")):
        try:
            with open(os.path.join(device, "vendor")) as handle:
                vendor = handle.read().strip().lower()
            with open(os.path.join(device, "class")) as handle:
                klass = handle.read().strip().lower()
        except (IOError, OSError):
            continue
        if vendor == "0x10de" and klass.startswith("0x0680"):
            count += 1
    return count


class AptSource(object):
    """apt-cache against the system configuration, or against a private temporary state."""

    def __init__(self, module, repository):
        self.module = module
        self.options = []
        self.tmp = None
        self.source = "system"
        if repository and repository.get("preview"):
            self._preview(repository)

    def _preview(self, repository):
        if not repository.get("url"):
            self.module.fail_json(msg="repository.preview needs repository.url")
        if not repository.get("key"):
            self.module.fail_json(msg="repository.preview needs repository.key: the repository is never trusted "
                                      "without its signing key")
        self.tmp = tempfile.mkdtemp(prefix="gpufleet-apt-")
        for sub in ("lists/partial", "cache/archives/partial", "parts"):
            os.makedirs(os.path.join(self.tmp, sub))
        key_path = os.path.join(self.tmp, "repository.asc")
        with open(key_path, "w") as handle:
            handle.write(repository["key"])
        line = "deb [signed-by=%s] %s %s %s" % (key_path, repository["url"], repository.get("suite") or "/",
                                                " ".join(repository.get("components") or []))
        with open(os.path.join(self.tmp, "sources.list"), "w") as handle:
            handle.write(line.strip() + "\n")
        self.options = [
            "-o", "Dir::Etc::SourceList=%s" % os.path.join(self.tmp, "sources.list"),
            "-o", "Dir::Etc::SourceParts=%s" % os.path.join(self.tmp, "parts"),
            "-o", "Dir::State::Lists=%s" % os.path.join(self.tmp, "lists"),
            "-o", "Dir::Cache=%s" % os.path.join(self.tmp, "cache"),
            "-o", "Dir::Cache::pkgcache=",
            "-o", "Dir::Cache::srcpkgcache=",
            "-o", "APT::Sandbox::User=root",
        ]
        rc, out, err = self.module.run_command(["apt-get"] + self.options + ["-q", "update"], environ_update=ENV)
        if rc != 0:
            self.close()
            self.module.fail_json(msg="could not read the repository %s: %s" % (repository["url"], err or out),
                                  rc=rc)
        self.source = "preview"

    def madison(self, names):
        if not names:
            return {}
        rc, out, err = self.module.run_command(["apt-cache"] + self.options + ["madison"] + sorted(set(names)),
                                               environ_update=ENV)
        if rc != 0 and not out:
            return {}
        return repository_versions.parse_apt_cache_madison(out)

    def close(self):
        if self.tmp:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def dpkg_packages(module, driver_only=True):
    """The package records of ``dpkg-query`` (:func:`installed_packages.parse_dpkg_l`; NVIDIA driver
    packages only unless ``driver_only`` is false); fails the module when dpkg-query does."""
    rc, out, err = module.run_command(
        ["dpkg-query", "-W", "-f", "${db:Status-Abbrev} ${binary:Package} ${Version} ${Architecture}\n"],
        environ_update=ENV)
    if rc != 0:
        module.fail_json(msg="dpkg-query failed: %s" % err, rc=rc)
    return parse_dpkg_l(out, driver_only=driver_only)


def apt_holds(module, required=False):
    """The names on hold (``apt-mark showhold``). When apt-mark fails: ``[]``, or with ``required``
    the module fails (a caller that decides whose holds are whose must not guess)."""
    rc, out, err = module.run_command(["apt-mark", "showhold"], environ_update=ENV)
    if rc != 0:
        if required:
            module.fail_json(msg="apt-mark showhold failed: %s" % err.strip(), rc=rc)
        return []
    return parse_apt_mark_showhold(out)


def gather_apt(module):
    installed = dpkg_packages(module)
    held = apt_holds(module)
    held_set = set(held)
    for package in installed:
        package["held"] = package["held"] or package["name"] in held_set
    preferences = None
    if os.path.exists(apt_plan.PREFERENCES_PATH):
        with open(apt_plan.PREFERENCES_PATH) as handle:
            preferences = handle.read()
    return installed, held, preferences


def gather_dnf(module):
    rc, out, err = module.run_command(["rpm", "-qa"], environ_update=ENV)
    if rc != 0:
        module.fail_json(msg="rpm -qa failed: %s" % err, rc=rc)
    installed = parse_rpm_qa(out, driver_only=True)
    stream = None
    rc, out, err = module.run_command(["dnf", "-q", "module", "list", "--enabled", "nvidia-driver"],
                                      environ_update=ENV)
    if rc == 0:
        for line in out.splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] == "nvidia-driver":
                stream = words[1]
                break
    locks = []
    rc, out, err = module.run_command(["dnf", "-q", "versionlock", "list"], environ_update=ENV)
    if rc == 0:
        for line in out.splitlines():
            entry = line.strip()
            if entry and ("nvidia" in entry or "cuda-drivers" in entry):
                locks.append(entry)
    return installed, stream, locks


def dnf_available(module, names):
    if not names:
        return {}
    rc, out, err = module.run_command(["dnf", "-q", "list", "--showduplicates", "--available"] + sorted(set(names)),
                                      environ_update=ENV)
    return repository_versions.parse_dnf_list(out) if rc == 0 else {}


def wanted_names(distribution, branch, module_type, fabric_manager, persistenced, installed):
    """Every name the plan may ask the repository about: the set and the old set renamed."""
    names = [p["name"] for p in package_sets.package_set(distribution, branch, module_type, fabric_manager, persistenced)]
    version = package_sets.installed_driver_version(installed)
    current = version.split(".")[0] if version else None
    for package in installed:
        names.append(package_sets.rename_for_branch(package["name"], distribution, current, branch))
    return sorted(set(names))


# The options both driver modules take: what to resolve and how to plan it.
PLAN_ARGUMENT_SPEC = dict(
    branch=dict(type="str", default="ltsb"),
    version=dict(type="str"),
    kernel_module_type=dict(type="str", default="auto", choices=["auto", "open", "proprietary"]),
    allow_eol=dict(type="bool", default=False),
    gpus=dict(type="list", elements="raw", default=[]),
    gpu_architectures=dict(type="list", elements="str", default=[]),
    fabric_manager=dict(type="str", default="auto", choices=["auto", "enabled", "disabled"]),
    persistenced=dict(type="bool", default=True),
    distribution=dict(type="str", required=True, choices=list(distributions.DISTRIBUTIONS)),
    today=dict(type="str"),
    catalog=dict(type="dict"),
    repository=dict(type="dict", options=dict(
        url=dict(type="str"),
        suite=dict(type="str", default="/"),
        components=dict(type="list", elements="str", default=[]),
        key=dict(type="str", no_log=False),
        preview=dict(type="bool", default=False),
    )),
    origin_pin=dict(type="str", default=apt_plan.DEFAULT_ORIGIN_PIN),
)


def resolve_and_plan(module, nvswitches):
    """Resolve the request in ``module.params`` (options of :data:`PLAN_ARGUMENT_SPEC`) for this node
    and plan its transaction; reads only.

    :param nvswitches: NVSwitch devices found (:func:`count_nvswitches`).
    :returns: ``{"resolved": driver_resolution.resolve_driver(...), "plan": package_transaction.plan_transaction(...),
        "installed": [records], "held": [names] (apt), "preferences": str|None (the pin file now, apt),
        "stream": str|None, "locks": [str] (dnf), "available_versions": [str]|None, "fabric_manager": bool,
        "nvswitch_count": int, "repository_source": "system"|"preview"|"none", "warnings": [str]}``.
    :raises: nothing; a refusal ends the module through ``fail_json`` (``code``: the
        ``ResolutionError`` or ``PlanError`` code).
    """
    p = module.params
    distribution = p["distribution"]
    manager = distributions.package_manager(distribution)
    catalog = p["catalog"] or bc.get_catalog()
    today = p["today"] or datetime.date.today().isoformat()
    if p["fabric_manager"] == "auto":
        fabric_manager = nvswitches > 0
    else:
        fabric_manager = p["fabric_manager"] == "enabled"

    apt = None
    stream = None
    locks = []
    preferences = None
    held = []
    try:
        if manager == "apt":
            installed, held, preferences = gather_apt(module)
            apt = AptSource(module, p["repository"])
            probe = repository_versions.version_probe_packages(distribution)
            found = apt.madison(probe)
        else:
            installed, stream, locks = gather_dnf(module)
            found = dnf_available(module, repository_versions.version_probe_packages(distribution))
        available_versions = repository_versions.driver_versions_available(
            found, repository_versions.version_probe_packages(distribution))
        repository_source = apt.source if apt else "system"
        warnings = []
        if not available_versions and p["repository"] is None:
            available_versions = None
            repository_source = "none"
            warnings.append("no repository information: versions come from the catalog (as of %s) and are not "
                            "checked against a repository" % catalog.get("as_of"))
        try:
            resolved = driver_resolution.resolve_driver(
                catalog, branch=p["branch"], gpus=p["gpus"], today=today, version=p["version"],
                kernel_module_type=p["kernel_module_type"], available_versions=available_versions,
                allow_eol=p["allow_eol"], node=None, declared_architectures=p["gpu_architectures"])
        except bc.ResolutionError as exc:
            module.fail_json(msg=exc.message, code=exc.code, allowed=exc.allowed,
                             available_versions=available_versions)
        names = wanted_names(distribution, resolved["branch"], resolved["kernel_module_type"], fabric_manager,
                             p["persistenced"], installed)
        if repository_source == "none":
            available = None
        elif manager == "apt":
            available = apt.madison(names)
        else:
            available = dnf_available(module, names)
        try:
            plan = package_transaction.plan_transaction(
                distribution, resolved["branch"], resolved["version"], resolved["kernel_module_type"],
                fabric_manager=fabric_manager, persistenced=p["persistenced"], installed=installed,
                available=available, held=held if manager == "apt" else None, current_stream=stream,
                locked=locks, origin_pin=p["origin_pin"], current_preferences=preferences)
        except distributions.PlanError as exc:
            module.fail_json(msg=exc.message, code=exc.code, resolved=resolved)
    finally:
        if apt:
            apt.close()
    return {"resolved": resolved, "plan": plan, "installed": installed, "held": held, "preferences": preferences,
            "stream": stream, "locks": locks, "available_versions": available_versions,
            "fabric_manager": fabric_manager, "nvswitch_count": nvswitches, "repository_source": repository_source,
            "warnings": resolved["warnings"] + warnings}
