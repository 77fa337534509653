# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Driver resolution: what an operator asks for, turned into one exact version for one node.

:func:`resolve_driver` takes ``driver_branch: ltsb``, ``"580"`` or an exact ``driver_version``,
the architectures of the node's GPUs and, where known, the versions its repository offers. It
refuses - raising :class:`branch_catalog.ResolutionError` with a message that names the node's
GPUs and the choices that would be accepted - end-of-life branches (unless allowed), branches
that dropped an architecture present on the node, open kernel modules before Turing,
proprietary modules on Blackwell and later or on branches that no longer ship them, and
versions that are not in the branch or not in the repository. Each part decides one thing:
the request's form (:func:`_read_request`), the node's architectures
(:func:`_node_architectures_served`), the branch (:func:`_explicit_branch`,
:func:`_newest_branch_of_class`) and the version (:func:`_choose_version`).

Everything here is pure: dictionaries in, dictionaries out; dates are passed in (``today``).

Compatible with Python 3.7; standard library only.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_data
from ansible_collections.gpufleet.nvidia.plugins.module_utils.branch_catalog import (
    BRANCH_CLASSES, CLASS_NAMES, ResolutionError, branch_info, eol_status)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import (
    branch_of_version, is_version, parse_branch, version_key)
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_architectures import (
    allowed_module_types, architecture_display, architecture_rank, normalize_architecture, summarize_gpus)

KERNEL_MODULE_TYPES = ("auto", "open", "proprietary")

#: ``refuse(code, reason, extra="")``: the refusal of this request on this node, naming its GPUs and choices.
Refuse = Callable[..., ResolutionError]


def node_architectures(gpus: Optional[Iterable[Any]] = None,
                       declared: Optional[Iterable[Any]] = None) -> Dict[str, Any]:
    """Collect the GPU architectures of a node from its facts and/or a declaration.

    :param gpus: ``ansible_facts.nvidia.gpus`` (dicts with ``architecture``, ``name``, ``index``)
        or bare architecture values. GPUs whose architecture is ``None`` are skipped (a node
        without a driver cannot read it).
    :param declared: architectures declared for the node's GPU class (``driver_gpu_architectures``),
        used when the facts give none.
    :returns: ``{"architectures": [names, oldest first], "gpus": [{"name", "architecture"}],
        "source": "facts"|"declared"|"none", "summary": "8× NVIDIA H100 80GB HBM3 (Hopper)"}``.
    :raises ResolutionError: ``unknown_architecture`` for a value that is not an architecture, and
        ``bad_request`` when facts and declaration disagree.
    """
    found = []  # type: List[Dict[str, Any]]
    for gpu in gpus or []:
        if isinstance(gpu, dict):
            raw = gpu.get("architecture")
            name = gpu.get("name")
        else:
            raw, name = gpu, None
        if raw is None or (isinstance(raw, str) and (not raw.strip() or raw.strip().lower().startswith("unknown"))):
            continue
        try:
            arch = normalize_architecture(raw)
        except ValueError as exc:
            raise ResolutionError("unknown_architecture", str(exc))
        found.append({"name": name, "architecture": arch})
    declared_archs = []  # type: List[str]
    for value in declared or []:
        try:
            declared_archs.append(normalize_architecture(value))
        except ValueError as exc:
            raise ResolutionError("unknown_architecture", "driver_gpu_architectures: %s" % exc)
    if found:
        archs = sorted(set(g["architecture"] for g in found), key=architecture_rank)
        if declared_archs and set(declared_archs) != set(archs):
            raise ResolutionError(
                "bad_request",
                "the GPUs found (%s) do not match driver_gpu_architectures %s; correct the declaration "
                "for this GPU class" % (summarize_gpus(found), sorted(set(declared_archs), key=architecture_rank)),
            )
        source = "facts"
        gpu_list = found
    elif declared_archs:
        archs = sorted(set(declared_archs), key=architecture_rank)
        source = "declared"
        gpu_list = [{"name": None, "architecture": a} for a in archs]
    else:
        archs, source, gpu_list = [], "none", []
    return {"architectures": archs, "gpus": gpu_list, "source": source, "summary": summarize_gpus(gpu_list)}


def _branch_problems(catalog: Dict[str, Any], branch: str, architectures: Sequence[str], today: str,
                     allow_eol: bool, module_type: str) -> List[Tuple[str, str]]:
    """Why a branch cannot serve these GPUs: a list of (code, text); empty when it can."""
    info = catalog["branches"][branch]
    problems = []
    status = eol_status(catalog, branch, today)
    if status["eol"] and not allow_eol:
        problems.append(("eol", "R%s is %s" % (branch, status["reason"])))
    missing = [a for a in architectures if a not in (info.get("architectures") or [])]
    if missing:
        problems.append(("architecture_unsupported", "R%s does not support %s"
                         % (branch, ", ".join(architecture_display(a) for a in missing))))
    flavours = _flavours_for(info, architectures)
    if module_type == "auto":
        if not flavours:
            problems.append(("flavour_conflict", "no kernel module flavour of R%s serves %s"
                             % (branch, ", ".join(architecture_display(a) for a in architectures))))
    elif module_type not in flavours:
        if module_type == "proprietary" and "proprietary" not in (info.get("kernel_module_types") or []):
            problems.append(("proprietary_unsupported", "R%s ships open kernel modules only" % branch))
        elif module_type == "proprietary":
            problems.append(("proprietary_unsupported", "proprietary kernel modules do not support %s"
                             % ", ".join(architecture_display(a) for a in architectures
                                         if architecture_rank(a) > architecture_rank(
                                             branch_data.PROPRIETARY_MODULES_LAST_ARCHITECTURE))))
        else:
            problems.append(("open_unsupported", "open kernel modules need Turing or later, not %s"
                             % ", ".join(architecture_display(a) for a in architectures
                                         if architecture_rank(a) < architecture_rank(
                                             branch_data.OPEN_MODULES_FIRST_ARCHITECTURE))))
    return problems


def _flavours_for(info: Dict[str, Any], architectures: Sequence[str]) -> List[str]:
    shipped = info.get("kernel_module_types") or []
    return [t for t in allowed_module_types(architectures) if t in shipped]


def choose_module_type(info: Dict[str, Any], architectures: Sequence[str], requested: str = "auto") -> str:
    """The kernel module flavour to install: ``requested``, or for ``auto`` open when the GPUs
    allow it (NVIDIA's default since R560, source "open-modules-blog"), else proprietary.

    :raises ResolutionError: when the flavour is not possible (see :func:`resolve_driver`).
    """
    flavours = _flavours_for(info, architectures)
    if requested == "auto":
        if "open" in flavours:
            return "open"
        if "proprietary" in flavours:
            return "proprietary"
        raise ResolutionError("flavour_conflict", "no kernel module flavour serves these GPUs")
    if requested not in flavours:
        raise ResolutionError("%s_unsupported" % requested, "%s kernel modules are not possible here" % requested)
    return requested


def allowed_choices(catalog: Dict[str, Any], architectures: Sequence[str], today: str,
                    allow_eol: bool = False, module_type: str = "auto") -> List[str]:
    """The ``driver_branch`` values that would be accepted for these GPUs.

    :returns: e.g. ``["ltsb (R620)", "pb (R595)", "580", "595", "620"]``: each class with the
        branch it resolves to, then each acceptable branch number.
    """
    ok = [b for b in sorted(catalog["branches"], key=int)
          if not _branch_problems(catalog, b, architectures, today, allow_eol, module_type)]
    choices = []
    for cls in ("ltsb", "pb", "nfb"):
        of_class = [b for b in ok if catalog["branches"][b].get("class") == cls]
        if of_class:
            choices.append("%s (R%s)" % (cls, max(of_class, key=int)))
    choices.extend(ok)
    return choices


def _refuse(code: str, reason: str, node: Optional[str], gpus_summary: str, choices: List[str],
            allow_eol: bool, extra: str = "") -> ResolutionError:
    who = "node %s" % node if node else "this node"
    text = "Refused for %s with %s: %s." % (who, gpus_summary, reason)
    if extra:
        text += " " + extra
    if choices:
        text += " Allowed driver_branch values for these GPUs: %s." % ", ".join(choices)
    else:
        hint = "" if allow_eol else " (driver_allow_eol: true would admit end-of-life branches)"
        text += " No branch in the catalog serves these GPUs%s." % hint
    return ResolutionError(code, text, choices)


def _read_request(branch: Any, version: Optional[str],
                  choices: List[str]) -> Tuple[Optional[str], Optional[str], Optional[str]]:
    """The request's form: ``(requested class or None, explicit branch or None, version or None)``.

    An explicit ``driver_version`` names its branch; with a class it must belong to that class.

    :raises ResolutionError: ``bad_request`` for a malformed version or branch, ``unknown_branch``
        or ``version_not_in_branch`` for a version outside what was asked.
    """
    if version is not None and str(version).strip() == "":
        version = None
    if version is not None and not is_version(version):
        raise ResolutionError("bad_request", "driver_version %r is not an NVIDIA driver version (e.g. 580.126.20)"
                              % (version,), choices)
    requested_class = str(branch).strip().lower() if branch is not None else None
    explicit = parse_branch(branch)
    if explicit is None and requested_class not in BRANCH_CLASSES:
        if version is not None and (branch is None or requested_class in ("", "none")):
            explicit = branch_of_version(version)
        else:
            raise ResolutionError("bad_request", "driver_branch must be nfb, pb, ltsb or a branch number such as "
                                  "580, got %r" % (branch,), choices)
    return requested_class, explicit, version


def _version_branch(catalog: Dict[str, Any], version: str, explicit: Optional[str], requested_class: Optional[str],
                    refuse: Refuse) -> str:
    """The branch an exact version names, checked against the branch or class asked for.

    :param refuse: ``refuse(code, reason, extra="")`` → :class:`ResolutionError` for this node.
    :raises ResolutionError: ``version_not_in_branch``, ``unknown_branch``.
    """
    vbranch = branch_of_version(version)
    if explicit is not None and vbranch != explicit:
        raise refuse("version_not_in_branch", "driver_version %s is not in branch R%s" % (version, explicit))
    if explicit is None:
        if vbranch not in catalog["branches"]:
            raise refuse("unknown_branch", "driver_version %s belongs to R%s, which the catalog (as of %s) "
                         "does not know" % (version, vbranch, catalog.get("as_of")))
        vclass = catalog["branches"][vbranch].get("class")
        if vclass != requested_class:
            raise refuse("version_not_in_branch", "driver_version %s belongs to R%s, a %s, not a %s"
                         % (version, vbranch, CLASS_NAMES.get(vclass, "?"), CLASS_NAMES[requested_class]))
    return vbranch


def _node_architectures_served(catalog: Dict[str, Any], node_info: Dict[str, Any], node: Optional[str],
                               allow_eol: bool) -> List[str]:
    """The node's architectures, each served by at least one branch of the catalog.

    :raises ResolutionError: ``unknown_architecture`` when none is known,
        ``architecture_unsupported`` when no branch serves one of them.
    """
    archs = node_info["architectures"]
    if not archs:
        raise ResolutionError(
            "unknown_architecture",
            "Refused for %s: the GPU architectures are unknown (no GPU facts and no driver_gpu_architectures); "
            "declare driver_gpu_architectures for this GPU class" % ("node %s" % node if node else "this node"),
        )
    for arch in archs:
        if not any(arch in (i.get("architectures") or []) for i in catalog["branches"].values()):
            raise _refuse("architecture_unsupported", "no branch in the catalog (as of %s) supports %s"
                          % (catalog.get("as_of"), architecture_display(arch)), node, node_info["summary"], [],
                          allow_eol)
    return archs


def _explicit_branch(catalog: Dict[str, Any], explicit: str, archs: Sequence[str], today: str, allow_eol: bool,
                     kernel_module_type: str, refuse: Refuse) -> str:
    """An explicitly named branch, if it serves these GPUs.

    :raises ResolutionError: ``unknown_branch`` and the first of the branch's problems (see
        :func:`_branch_problems`), with the last branch of a dropped architecture named.
    """
    branch_info(catalog, explicit)
    problems = _branch_problems(catalog, explicit, archs, today, allow_eol, kernel_module_type)
    if not problems:
        return explicit
    code = problems[0][0]
    extra = ""
    if code == "architecture_unsupported":
        last = [b for b, i in catalog["branches"].items() if set(i.get("last_for") or []) & set(archs)]
        if last:
            extra = "R%s is the last branch for %s." % (
                last[0], ", ".join(architecture_display(a) for a in archs
                                   if a in catalog["branches"][last[0]].get("last_for", [])))
    if code == "eol":
        extra = "Set driver_allow_eol: true to install it anyway."
    raise refuse(code, "; ".join(t for _c, t in problems), extra)


def _newest_branch_of_class(catalog: Dict[str, Any], requested_class: str, archs: Sequence[str], today: str,
                            allow_eol: bool, kernel_module_type: str, avail: Optional[List[str]],
                            refuse: Refuse) -> str:
    """The newest branch of a class that serves these GPUs and has a version to install.

    :raises ResolutionError: ``no_branch``, with why each branch of the class was passed over.
    """
    candidates = sorted((b for b, i in catalog["branches"].items() if i.get("class") == requested_class),
                        key=int, reverse=True)
    rejected = []
    for cand in candidates:
        problems = _branch_problems(catalog, cand, archs, today, allow_eol, kernel_module_type)
        if problems:
            rejected.append("; ".join(t for _c, t in problems))
            continue
        if _branch_versions(catalog, cand, avail):
            return cand
        rejected.append("R%s has no version %s" % (cand, "in the repository" if avail is not None
                                                   else "in the catalog"))
    raise refuse("no_branch", "no %s serves these GPUs (%s)" % (
        CLASS_NAMES[requested_class], "; ".join(rejected) or "none in the catalog"))


def _choose_version(catalog: Dict[str, Any], chosen: str, version: Optional[str], avail: Optional[List[str]],
                    refuse: Refuse) -> Tuple[str, str, bool, List[str]]:
    """The exact version: the one asked for, else the branch's newest in the repository (or catalog).

    :returns: ``(version, version_source ("request"|"repository"|"catalog"), in_catalog, warnings)``.
    :raises ResolutionError: ``version_not_in_repository``, ``version_unknown``, ``no_version``.
    """
    info = catalog["branches"][chosen]
    known = info.get("versions") or []
    warnings = []  # type: List[str]
    not_in_catalog = "%s is in the repository but not in the catalog (as of " + str(catalog.get("as_of")) + ")"
    if version is not None:
        if avail is not None and version not in avail:
            in_branch = [v for v in avail if branch_of_version(v) == chosen]
            raise refuse("version_not_in_repository", "driver_version %s is not in the repository" % version,
                         "The repository offers for R%s: %s." % (chosen, ", ".join(in_branch) or "nothing"))
        if version in known:
            return version, "request", True, warnings
        if avail is None:
            raise refuse("version_unknown", "driver_version %s is neither in the catalog (as of %s) nor known "
                         "to be in the repository" % (version, catalog.get("as_of")),
                         "Known R%s versions: %s." % (chosen, ", ".join(known) or "none"))
        return version, "request", False, [not_in_catalog % version]
    versions = _branch_versions(catalog, chosen, avail)
    if not versions:
        raise refuse("no_version", "R%s has no version %s" % (
            chosen, "in the repository" if avail is not None else "in the catalog"))
    resolved = versions[-1]
    source = "repository" if avail is not None else "catalog"
    if resolved in known:
        return resolved, source, True, warnings
    return resolved, source, False, [not_in_catalog % resolved]


def resolve_driver(catalog: Dict[str, Any], branch: Any = "ltsb", gpus: Optional[Iterable[Any]] = None,
                   today: Optional[str] = None, version: Optional[str] = None,
                   kernel_module_type: str = "auto", available_versions: Optional[Iterable[str]] = None,
                   allow_eol: bool = False, node: Optional[str] = None,
                   declared_architectures: Optional[Iterable[Any]] = None) -> Dict[str, Any]:
    """Resolve a driver request to one exact version for one node.

    Steps: collect the node's GPU architectures (:func:`node_architectures`); pick the branch
    (an explicit branch number, or for a class the newest branch of that class that is not end
    of life - unless ``allow_eol`` - supports every architecture present and can serve the
    kernel module flavour); pick the version (the requested one, which must belong to the
    branch and be in the repository; else the newest version of the branch in the repository,
    or, without repository information, the newest the catalog knows).

    :param catalog: from :func:`branch_catalog.get_catalog` or :func:`branch_catalog.refresh_from_releases`.
    :param branch: ``"nfb"``, ``"pb"``, ``"ltsb"``, or a branch number (``"580"``, ``"R580"``, 580).
    :param gpus: ``ansible_facts.nvidia.gpus`` or architecture values.
    :param today: ``"YYYY-MM-DD"``, the date end of life is judged on (default: the catalog's
        ``as_of``).
    :param version: an exact driver version (``"580.126.20"``), optional.
    :param kernel_module_type: ``auto``, ``open`` or ``proprietary``.
    :param available_versions: driver versions the node's repository offers (upstream versions,
        e.g. from ``apt-cache madison nvidia-driver``); ``None`` when unknown.
    :param allow_eol: admit end-of-life branches (``driver_allow_eol``).
    :param node: the node's name, for messages.
    :param declared_architectures: ``driver_gpu_architectures``, used when facts have no GPUs.
    :returns: ``{"branch", "branch_class", "version", "kernel_module_type", "eol", "eol_date",
        "max_cuda_major", "architectures", "gpus", "architecture_source", "version_source"
        ("request"|"repository"|"catalog"), "in_catalog", "warnings": [str], "catalog_as_of",
        "requested": {"branch", "version", "kernel_module_type"}}``.
    :raises ResolutionError: with ``code`` and a message naming the node's GPUs and the allowed
        choices (see :class:`branch_catalog.ResolutionError`).
    """
    today = today or catalog.get("as_of")
    kernel_module_type = (kernel_module_type or "auto").strip().lower()
    if kernel_module_type not in KERNEL_MODULE_TYPES:
        raise ResolutionError("bad_request", "driver_kernel_module_type must be one of %s, got %r"
                              % (", ".join(KERNEL_MODULE_TYPES), kernel_module_type))
    node_info = node_architectures(gpus, declared_architectures)
    archs = _node_architectures_served(catalog, node_info, node, allow_eol)
    choices = allowed_choices(catalog, archs, today, allow_eol, kernel_module_type)

    def refuse(code: str, reason: str, extra: str = "") -> ResolutionError:
        return _refuse(code, reason, node, node_info["summary"], choices, allow_eol, extra)

    requested_class, explicit, version = _read_request(branch, version, choices)
    avail = None
    if available_versions is not None:
        avail = sorted(set(str(v).strip() for v in available_versions if is_version(v)), key=version_key)
    if version is not None:
        explicit = _version_branch(catalog, version, explicit, requested_class, refuse)
    if explicit is not None:
        chosen = _explicit_branch(catalog, explicit, archs, today, allow_eol, kernel_module_type, refuse)
    else:
        chosen = _newest_branch_of_class(catalog, requested_class, archs, today, allow_eol, kernel_module_type,
                                         avail, refuse)
    info = catalog["branches"][chosen]
    module_type = choose_module_type(info, archs, kernel_module_type)
    status = eol_status(catalog, chosen, today)
    warnings = []  # type: List[str]
    if status["eol"]:
        warnings.append("R%s is %s; installed because driver_allow_eol is set" % (chosen, status["reason"]))
    resolved, version_source, in_catalog, version_warnings = _choose_version(catalog, chosen, version, avail, refuse)
    return {
        "branch": chosen,
        "branch_class": info.get("class"),
        "version": resolved,
        "kernel_module_type": module_type,
        "eol": status["eol"],
        "eol_date": info.get("eol"),
        "max_cuda_major": info.get("max_cuda_major"),
        "architectures": archs,
        "gpus": node_info["summary"],
        "architecture_source": node_info["source"],
        "version_source": version_source,
        "in_catalog": in_catalog,
        "warnings": warnings + version_warnings,
        "catalog_as_of": catalog.get("as_of"),
        "requested": {"branch": branch, "version": version, "kernel_module_type": kernel_module_type},
    }


def _branch_versions(catalog: Dict[str, Any], branch: str, avail: Optional[List[str]]) -> List[str]:
    if avail is not None:
        return [v for v in avail if branch_of_version(v) == branch]
    return list(catalog["branches"][branch].get("versions") or [])
