# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The drift engine: every node's facts against the declared state of its GPU class.

Input per node: its name, its GPU class (the inventory group, ``gpu_h100`` ...), its
``ansible_facts.nvidia`` document (docs/facts.md) or ``None`` when no facts were found, and the
declared state (:func:`declared_state` of the node's variables, the same variables the ``driver``
and ``gpu_policy`` roles read). Output: findings ``{node, class, check, severity, gpu, expected,
actual, message}`` per node (:func:`judge_node`), rolled up per class and for the fleet (:func:`roll_up`).

Checks (:data:`CHECKS`) and their severity:

* ``facts_missing`` (critical): no facts, or a value that is not a facts document
  (:func:`facts_problem`); ``facts_stale`` (warning);
* ``driver_state`` (critical): ``driver.state`` is not ``ok``;
* ``driver_branch`` (critical): the loaded branch is not the declared one (a branch class such
  as ``ltsb`` is resolved for the node's GPU architectures with the branch catalog, so a V100
  node on R580 is in sync with ``ltsb`` while an H100 node on R580 is not);
* ``driver_version`` (warning): the declared exact version is not the loaded one (same branch);
* ``driver_declared_invalid`` (critical): the declared driver cannot serve this node's GPUs;
* ``kernel_module_type`` (warning), ``driver_not_pinned`` (warning: an NVIDIA package not held);
* ``gpu_count`` (critical): fewer or more GPUs than ``gpufleet_gpu_count``; ``gpu_unreadable``
  (critical);
* ``fatal_xid`` (critical): a fatal Xid in the node's current kernel log;
* ``power_limit_w``, ``persistence_mode``, ``ecc_mode``, ``compute_mode`` (warning): a managed
  setting neither in effect nor pending as declared (``gpu_policy_plan.policy_report``);
  ``ecc_mode_pending`` (info): the declared ECC mode waits for a reboot;
* ``mig_mode``, ``mig_layout`` (warning): MIG mode or GPU instances differ from the declared
  mig-parted layout;
* ``remapped_rows_failed`` (critical), ``remapped_rows_pending`` (warning);
* ``rollout_flagged`` (critical): a rollout flagged the node, with the flag's reason;
  ``rollout_drained`` (warning): a rollout's drain record is on the node and no flag (facts
  ``rollout``, rollout_marks).

One pass over the nodes, constant work per GPU: linear in the fleet. Declarations are normalised
once per distinct declaration and driver resolutions are memoised per (request, architectures).
Pure: no I/O (fact sources and renderers live on the controller, ``plugins/plugin_utils``).
Python 3.9 compatible.
"""

from __future__ import annotations

import json
from collections import abc
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

from ansible_collections.gpufleet.nvidia.plugins.module_utils import branch_catalog, driver_resolution, driver_versions, gpu_architectures
from ansible_collections.gpufleet.nvidia.plugins.module_utils import gpu_policy_plan
from ansible_collections.gpufleet.nvidia.plugins.module_utils import mig_plan
from ansible_collections.gpufleet.nvidia.plugins.module_utils.driver_versions import versions_match
from ansible_collections.gpufleet.nvidia.plugins.module_utils.gpu_health import gpu_label
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.rollout_verdict import fatal_xid_counts

#: Severities of a drift finding, least to most serious: how far a node is from its declared
#: state. Not the severity of an Xid event (xid_catalog.SEVERITIES, which has ``fatal``): a
#: fatal Xid is one ``critical`` finding here.
FINDING_SEVERITIES = ("info", "warning", "critical")

#: check → (severity, what it means)
CHECKS = {
    "facts_missing": ("critical", "no facts for the node"),
    "facts_stale": ("warning", "the facts are older than the allowed age"),
    "driver_state": ("critical", "driver.state is not ok"),
    "driver_branch": ("critical", "the loaded driver branch is not the declared branch"),
    "driver_version": ("warning", "the loaded driver version is not the declared version"),
    "driver_version_skew": ("warning", "the nodes of the class run more than one driver version, declared or not"),
    "driver_declared_invalid": ("critical", "the declared driver cannot serve the node's GPUs"),
    "kernel_module_type": ("warning", "the kernel module flavour is not the declared one"),
    "driver_not_pinned": ("warning", "an NVIDIA driver package is not held"),
    "gpu_count": ("critical", "the number of GPUs differs from the declared count"),
    "gpu_unreadable": ("critical", "a GPU cannot be read"),
    "fatal_xid": ("critical", "a fatal Xid is in the current kernel log"),
    "power_limit_w": ("warning", "the power limit in effect is not the declared one"),
    "persistence_mode": ("warning", "persistence mode is not the declared one"),
    "ecc_mode": ("warning", "ECC mode is not the declared one (neither now nor pending)"),
    "ecc_mode_pending": ("info", "the declared ECC mode waits for a reboot"),
    "ecc_not_supported": ("info", "ECC is declared but the GPU has no ECC (not a drift: nothing can turn it on)"),
    "compute_mode": ("warning", "compute mode is not the declared one"),
    "mig_mode": ("warning", "MIG mode is not the declared one"),
    "mig_layout": ("warning", "MIG GPU instances are not the declared layout"),
    "mig_declared_invalid": ("critical", "the declared MIG layout does not fit the node"),
    "policy_declared_invalid": ("critical", "the declared GPU policy is invalid"),
    "remapped_rows_failed": ("critical", "a row remapping failed: the GPU needs inspection"),
    "remapped_rows_pending": ("warning", "a row remapping waits for a GPU reset"),
    "rollout_flagged": ("critical", "a rollout flagged the node (out of service until the flag is cleared)"),
    "rollout_drained": ("warning", "a rollout drained the node and has not returned it to service"),
}

#: Node variables read by :func:`declared_state` (the roles' public variables).
DECLARED_VARIABLES = (
    "driver_version", "driver_branch", "driver_kernel_module_type", "driver_allow_eol", "driver_gpu_architectures",
    "gpu_policy_gpus", "gpu_policy_power_limit_w", "gpu_policy_power_limit_percent", "gpu_policy_persistence_mode",
    "gpu_policy_ecc_mode", "gpu_policy_compute_mode", "gpu_policy_mig_config", "gpu_policy_mig_label",
    "gpu_policy_mig_layout", "gpufleet_gpu_count",
)


#: Fields of a GPU record that are mappings (or null) in the facts schema (docs/facts.md).
_GPU_MAPPINGS = ("power", "ecc", "remapped_rows", "retired_pages", "mig", "clocks", "memory", "pcie")


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_mapping(value: Any) -> bool:
    """``isinstance(value, Mapping)``, with the common case (a ``dict``) first: it runs per field of every GPU."""
    return isinstance(value, (dict, abc.Mapping))


def _is_string(value: Any) -> bool:
    return isinstance(value, str)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _list_of(value: Any, what: str, element: Callable[[Any], bool], element_name: str) -> Optional[str]:
    """Problem text when ``value`` is neither null nor a list whose items all pass ``element``."""
    if value is None:
        return None
    if not isinstance(value, list):
        return "%s is a %s, expected a list" % (what, _kind(value))
    for number, item in enumerate(value):
        if not element(item):
            return "%s[%d] is a %s, expected %s" % (what, number, _kind(item), element_name)
    return None


def _number_or_null(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def facts_problem(facts: Any) -> Optional[str]:
    """Why ``facts`` is not an ``ansible_facts.nvidia`` document the drift checks can read.

    Only the shape of what the checks read is checked, not the values: the document and its
    ``driver`` are mappings; ``driver.loaded_version``/``userspace_version``/``on_disk_version``
    are strings or null; ``driver.state_reasons`` is a list of strings, ``driver.packages`` a
    list of mappings; ``gpus`` a list of mappings, each with ``errors`` a list of strings and
    ``power``, ``ecc``, ``remapped_rows``, ``retired_pages``, ``mig``, ``clocks``, ``memory``,
    ``pcie`` mappings and ``mig.devices`` a list of mappings; ``gpu_count`` a number;
    ``xid_events`` a list of mappings whose ``xid`` and ``count`` are numbers; ``xid_summary`` a
    mapping with ``by_xid`` a mapping and ``fatal_xids`` a list of numbers. Null stands for an
    empty value everywhere but for the document and ``driver`` (schema: docs/facts.md).

    :param facts: what a fact source holds for a node (any JSON value).
    :returns: ``None`` when the shape is right, else one sentence naming the first wrong field,
        e.g. ``"driver is a str, expected a mapping"``.
    :raises: nothing.
    """
    if not _is_mapping(facts):
        return "the document is a %s, expected a mapping" % _kind(facts)
    driver = facts.get("driver")
    if not _is_mapping(driver):
        return "driver is a %s, expected a mapping" % _kind(driver)
    for key in ("loaded_version", "userspace_version", "on_disk_version"):
        if driver.get(key) is not None and not isinstance(driver.get(key), str):
            return "driver.%s is a %s, expected a string" % (key, _kind(driver.get(key)))
    problem = (_list_of(driver.get("state_reasons"), "driver.state_reasons", _is_string, "a string")
               or _list_of(driver.get("packages"), "driver.packages", _is_mapping, "a mapping")
               or _list_of(facts.get("gpus"), "gpus", _is_mapping, "a mapping")
               or _list_of(facts.get("xid_events"), "xid_events", _is_mapping, "a mapping"))
    if problem:
        return problem
    if not _number_or_null(facts.get("gpu_count")):
        return "gpu_count is a %s, expected a number" % _kind(facts.get("gpu_count"))
    for number, gpu in enumerate(facts.get("gpus") or []):
        problem = _list_of(gpu.get("errors"), "gpus[%d].errors" % number, _is_string, "a string")
        if problem:
            return problem
        for key in _GPU_MAPPINGS:
            if gpu.get(key) is not None and not _is_mapping(gpu.get(key)):
                return "gpus[%d].%s is a %s, expected a mapping" % (number, key, _kind(gpu.get(key)))
        problem = _list_of((gpu.get("mig") or {}).get("devices"), "gpus[%d].mig.devices" % number,
                           _is_mapping, "a mapping")
        if problem:
            return problem
    for number, event in enumerate(facts.get("xid_events") or []):
        for key in ("xid", "count"):
            if not _number_or_null(event.get(key)):
                return "xid_events[%d].%s is a %s, expected a number" % (number, key, _kind(event.get(key)))
    summary = facts.get("xid_summary")
    if summary is not None:
        if not _is_mapping(summary):
            return "xid_summary is a %s, expected a mapping" % _kind(summary)
        if summary.get("by_xid") is not None and not _is_mapping(summary.get("by_xid")):
            return "xid_summary.by_xid is a %s, expected a mapping" % _kind(summary.get("by_xid"))
        problem = _list_of(summary.get("fatal_xids"), "xid_summary.fatal_xids", _is_number, "a number")
        if problem:
            return problem
    return None


def finding_severity_rank(severity: Optional[str]) -> int:
    """``info`` 0, ``warning`` 1, ``critical`` 2; -1 for ``None``/unknown."""
    return FINDING_SEVERITIES.index(severity) if severity in FINDING_SEVERITIES else -1


def declared_state(variables: Mapping[str, Any]) -> Dict[str, Any]:
    """The declared state of a node from its variables (group_vars of its GPU class, host_vars).

    :param variables: a mapping holding any of :data:`DECLARED_VARIABLES`: the ``driver`` role's
        ``driver_branch`` (``ltsb``/``pb``/``nfb``/``"580"``), ``driver_version`` (exact, or empty),
        ``driver_kernel_module_type``, ``driver_allow_eol``, ``driver_gpu_architectures``; the
        ``gpu_policy`` role's ``gpu_policy_*`` variables; ``gpufleet_gpu_count`` (GPUs per node).
        Missing or empty values are "not declared".
    :returns: ``{"driver": {"branch", "version", "kernel_module_type", "allow_eol",
        "architectures"}, "policy": {policy spec of gpu_policy_plan.normalize_policy} | None,
        "mig": {"config", "label", "layout"} | None, "gpu_count": int | None}``.
    """
    def value(name: str) -> Any:
        item = variables.get(name)
        if isinstance(item, str) and not item.strip():
            return None
        return item

    policy = {
        "gpus": value("gpu_policy_gpus"),
        "power_limit_w": value("gpu_policy_power_limit_w"),
        "power_limit_percent": value("gpu_policy_power_limit_percent"),
        "persistence_mode": value("gpu_policy_persistence_mode"),
        "ecc_mode": value("gpu_policy_ecc_mode"),
        "compute_mode": value("gpu_policy_compute_mode"),
    }
    managed = any(policy[key] is not None for key in policy if key != "gpus")
    mig = None
    if value("gpu_policy_mig_layout") is not None or value("gpu_policy_mig_config") is not None:
        mig = {"config": value("gpu_policy_mig_config"), "label": value("gpu_policy_mig_label"),
               "layout": value("gpu_policy_mig_layout")}
    kmt = value("driver_kernel_module_type")
    count = value("gpufleet_gpu_count")
    return {
        "driver": {
            "branch": str(value("driver_branch")) if value("driver_branch") is not None else None,
            "version": value("driver_version"),
            "kernel_module_type": kmt if kmt in ("open", "proprietary") else None,
            "allow_eol": bool(value("driver_allow_eol")),
            "architectures": list(value("driver_gpu_architectures") or []),
        },
        "policy": policy if managed else None,
        "mig": mig,
        "gpu_count": int(count) if count is not None else None,
    }


class DriftEngine(object):
    """Judge nodes against declarations; memoises what is shared between nodes.

    :param catalog: the branch catalog (``branch_catalog.get_catalog()`` by default).
    :param today: ``YYYY-MM-DD`` for end-of-life decisions (default: the catalog's ``as_of``).
    :param max_age_s: facts older than this (``facts_age_s`` of a node) are ``facts_stale``;
        ``None`` disables the check.
    """

    def __init__(self, catalog: Optional[Dict[str, Any]] = None, today: Optional[str] = None,
                 max_age_s: Optional[float] = None):
        self.catalog = catalog or branch_catalog.get_catalog()
        self.today = today
        self.max_age_s = max_age_s
        self._resolved = {}  # type: Dict[Tuple[Any, ...], Tuple[Optional[str], Optional[str], Optional[str]]]
        self._policies = {}  # type: Dict[str, Any]
        self._mig = {}  # type: Dict[str, Any]
        self._by_identity = {}  # type: Dict[int, Tuple[Any, Any]]
        self._archs = {}  # type: Dict[Tuple[Any, ...], Any]

    # ----- memoised pieces
    def expected_branch(self, declared_driver: Mapping[str, Any], architectures: Tuple[str, ...]
                        ) -> Tuple[Optional[str], Optional[str], Optional[str]]:
        """``(branch, version, error)`` the declaration resolves to for these architectures.

        A branch number is taken as is; a class (``ltsb``...) is resolved with
        ``driver_resolution.resolve_driver`` (newest branch of the class serving every architecture,
        end of life honoured). ``error`` is the refusal's message when the request cannot serve
        the GPUs. Source: the branch catalog (docs/driver.md).
        """
        branch = declared_driver.get("branch")
        version = declared_driver.get("version")
        key = (branch, version, declared_driver.get("kernel_module_type"), declared_driver.get("allow_eol"),
               architectures)
        if key in self._resolved:
            return self._resolved[key]
        if branch is None and version is None:
            answer = (None, None, None)  # type: Tuple[Optional[str], Optional[str], Optional[str]]
        elif not architectures:
            parsed = driver_versions.parse_branch(branch) if branch else None
            if version:
                parsed = str(version).split(".", 1)[0]
            answer = (parsed, version, None)
        else:
            try:
                resolved = driver_resolution.resolve_driver(
                    self.catalog, branch=branch or str(version).split(".", 1)[0], gpus=list(architectures),
                    today=self.today, version=version or None,
                    kernel_module_type=declared_driver.get("kernel_module_type") or "auto",
                    allow_eol=bool(declared_driver.get("allow_eol")))
                answer = (resolved["branch"], version or None, None)
            except branch_catalog.ResolutionError as err:
                if err.code in ("version_unknown", "version_not_in_repository") and version:
                    answer = (str(version).split(".", 1)[0], version, None)
                else:
                    answer = (None, version, err.message)
        self._resolved[key] = answer
        return answer

    def architectures(self, gpus: List[Any]) -> Tuple[str, ...]:
        """The node's GPU architectures (``driver_resolution.node_architectures``), memoised per
        tuple of the GPUs' ``architecture`` values (fleets have few).

        :raises branch_catalog.ResolutionError: for a value that is not an architecture.
        """
        key = tuple(gpu.get("architecture") if isinstance(gpu, dict) else gpu for gpu in gpus)
        if key not in self._archs:
            try:
                self._archs[key] = tuple(driver_resolution.node_architectures(list(key), None)["architectures"])
            except branch_catalog.ResolutionError as err:
                self._archs[key] = err
        found = self._archs[key]
        if isinstance(found, Exception):
            raise found
        return found

    def policy(self, spec: Mapping[str, Any]) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
        """Normalised policy (memoised per distinct spec) or the error text."""
        known = self._by_identity.get(id(spec))
        if known is not None and known[0] is spec:
            return known[1]
        key = json.dumps(spec, sort_keys=True, default=str)
        if key not in self._policies:
            try:
                self._policies[key] = (gpu_policy_plan.normalize_policy(dict(spec)), None)
            except gpu_policy_plan.PolicyError as err:
                self._policies[key] = (None, "; ".join(err.errors))
        # Nodes sharing a declaration share its dict: the next look-up is by identity (the spec is
        # kept with its answer, so its id cannot be reused while the engine lives).
        self._by_identity[id(spec)] = (spec, self._policies[key])
        return self._policies[key]

    def mig_entries(self, mig: Mapping[str, Any]) -> Tuple[Optional[List[Dict[str, Any]]], Optional[str]]:
        """Parsed mig-parted entries (memoised) or the error text."""
        key = json.dumps(mig, sort_keys=True, default=str)
        if key not in self._mig:
            try:
                if mig.get("layout") is not None:
                    entries = mig_plan.parse_mig_config(mig["layout"])
                else:
                    entries = mig_plan.parse_mig_config(mig.get("config"), mig.get("label"))
                self._mig[key] = (entries, None)
            except mig_plan.MigConfigError as err:
                self._mig[key] = (None, "; ".join(getattr(err, "errors", None) or [str(err)]))
        return self._mig[key]

    # ----- one node
    def node_findings(self, node: str, klass: str, facts: Optional[Mapping[str, Any]],
                      declared: Mapping[str, Any], facts_age_s: Optional[float] = None,
                      checked: bool = False) -> List[Dict[str, Any]]:
        """Findings for one node.

        :param node: inventory name; :param klass: GPU class (group name).
        :param facts: ``ansible_facts.nvidia`` or ``None``. A value that is not a facts document
            (:func:`facts_problem`: a string, a list, a ``driver`` that is not a mapping...) gives
            one ``facts_missing`` finding whose ``actual`` says what is wrong.
        :param declared: :func:`declared_state` of the node's variables.
        :param facts_age_s: age of the facts in seconds (fact cache file time), if known.
        :param checked: the caller has already found ``facts_problem(facts)`` to be ``None`` (a
            fact source does, to say why a file is unusable); the shape is then not checked again.
        :returns: a list of findings ``{node, class, check, severity, gpu, expected, actual,
            message}`` (``gpu`` is an NVML index or ``None`` for node-wide findings).
        :raises: nothing for a wrongly shaped document; a value of a wrong type deeper in it (a
            power limit that is a string) may raise ``TypeError``/``ValueError``, which
            :func:`judge_node` turns into a ``facts_missing`` finding of that node.
        """
        out = []  # type: List[Dict[str, Any]]

        def add(check: str, message: str, expected: Any = None, actual: Any = None, gpu: Any = None) -> None:
            out.append({"node": node, "class": klass, "check": check, "severity": CHECKS[check][0], "gpu": gpu,
                        "expected": expected, "actual": actual, "message": message})

        if facts is None or (isinstance(facts, Mapping) and facts.get("driver") is None):
            add("facts_missing", "no NVIDIA facts for this node (run gpu_facts, or check the fact cache)")
            return out
        problem = None if checked else facts_problem(facts)
        if problem:
            # A wrongly shaped document (a string, a list, a driver that is not a mapping...) is
            # no facts at all for this node; the other nodes are judged as usual.
            add("facts_missing", "the NVIDIA facts of this node are not a facts document (%s); run gpu_facts "
                "again" % problem, actual=problem)
            return out
        if self.max_age_s is not None and facts_age_s is not None and facts_age_s > self.max_age_s:
            add("facts_stale", "facts are %d s old (allowed %d s)" % (facts_age_s, self.max_age_s),
                expected=self.max_age_s, actual=int(facts_age_s))
        self._driver_findings(add, facts, declared)
        gpus = facts.get("gpus") or []
        count = facts.get("gpu_count")
        count = len(gpus) if count is None else int(count)
        want = declared.get("gpu_count")
        if want is not None and count != want:
            add("gpu_count", "%d GPU(s) visible, %d declared" % (count, want), expected=want, actual=count)
        for gpu in gpus:
            if gpu.get("readable") is False:
                add("gpu_unreadable", "%s cannot be read: %s" % (
                    gpu_label(gpu), ", ".join(gpu.get("errors") or []) or "unknown error"),
                    gpu=gpu.get("index"))
            rows = gpu.get("remapped_rows") or {}
            if rows.get("failed"):
                add("remapped_rows_failed", "%s: a row remapping failed; inspect the GPU" % gpu_label(gpu),
                    gpu=gpu.get("index"))
            elif rows.get("pending"):
                add("remapped_rows_pending", "%s: a row remapping waits for a GPU reset" % gpu_label(gpu),
                    gpu=gpu.get("index"))
        fatal = fatal_xid_counts(facts)
        if fatal:
            add("fatal_xid", "fatal Xid in the current kernel log: %s" % ", ".join(
                "Xid %s ×%d" % (key, fatal[key]) for key in sorted(fatal, key=int)), actual=sorted(int(k) for k in fatal))
        self._rollout_findings(add, facts.get("rollout") or {})
        readable = [gpu for gpu in gpus if gpu.get("readable") is not False]
        if declared.get("policy"):
            self._policy_findings(add, readable, declared["policy"])
        if declared.get("mig"):
            self._mig_findings(add, readable, declared["mig"])
        return out

    @staticmethod
    def _rollout_findings(add: Any, rollout: Mapping[str, Any]) -> None:
        """A node a rollout flagged or drained (the facts' ``rollout`` section, rollout_marks.rollout_marks)."""
        if not isinstance(rollout, Mapping):
            return
        where = ", ".join(part for part in (
            ("stage %s" % rollout["stage"]) if rollout.get("stage") else "",
            str(rollout["time"]) if rollout.get("time") else "") if part)
        if rollout.get("flagged"):
            reason = rollout.get("reason") or "no reason recorded"
            add("rollout_flagged", "flagged by rollout %s%s: %s" % (
                rollout.get("rollout_id") or "?", " (%s)" % where if where else "", reason),
                expected="not flagged", actual=reason)
        elif rollout.get("drained"):
            add("rollout_drained", "drained by rollout %s%s and not returned to service" % (
                rollout.get("drained_by") or "?", " since %s" % rollout["drained_at"] if rollout.get("drained_at") else ""),
                expected="in service", actual="drained")

    def _driver_findings(self, add: Any, facts: Mapping[str, Any], declared: Mapping[str, Any]) -> None:
        driver = facts.get("driver") or {}
        state = driver.get("state")
        if state != "ok":
            add("driver_state", "driver state %s%s" % (state, (": " + "; ".join(driver.get("state_reasons") or []))
                                                       if driver.get("state_reasons") else ""),
                expected="ok", actual=state)
        want = declared.get("driver") or {}
        loaded = driver.get("loaded_version") or driver.get("userspace_version")
        if want.get("branch") or want.get("version"):
            try:
                archs = self.architectures(facts.get("gpus") or []) or tuple(
                    gpu_architectures.normalize_architecture(a) for a in want.get("architectures") or [])
            except (branch_catalog.ResolutionError, ValueError):
                archs = ()
            branch, version, error = self.expected_branch(want, archs)
            if error:
                add("driver_declared_invalid", error, expected=want.get("branch"), actual=loaded)
            loaded_branch = loaded.split(".", 1)[0] if loaded else None
            if branch and loaded_branch != branch:
                why = ""
                if want.get("branch") and driver_versions.parse_branch(want["branch"]) is None:
                    why = " (%s resolves to R%s for %s)" % (
                        want["branch"], branch,
                        ", ".join(gpu_architectures.architecture_display(a) for a in archs) or "these GPUs")
                add("driver_branch", "driver branch %s, declared R%s%s" % (
                    ("R" + loaded_branch) if loaded_branch else "none", branch, why), expected=branch,
                    actual=loaded_branch)
            elif version and not versions_match(loaded, version):
                add("driver_version", "driver %s, declared %s" % (loaded, version), expected=version, actual=loaded)
        kmt = want.get("kernel_module_type")
        if kmt and driver.get("kernel_module_type") and driver.get("kernel_module_type") != kmt:
            add("kernel_module_type", "%s kernel modules, declared %s" % (driver.get("kernel_module_type"), kmt),
                expected=kmt, actual=driver.get("kernel_module_type"))
        unheld = [pkg.get("name") for pkg in driver.get("packages") or [] if pkg.get("held") is False]
        if unheld and driver.get("package_manager") == "dpkg":
            add("driver_not_pinned", "not held: %s" % ", ".join(sorted(unheld)), expected="held", actual=sorted(unheld))

    def _policy_findings(self, add: Any, gpus: List[Dict[str, Any]], spec: Mapping[str, Any]) -> None:
        policy, error = self.policy(spec)
        if error:
            add("policy_declared_invalid", error)
            return
        try:
            chosen = gpu_policy_plan.select_gpus(policy["gpus"], gpus)
        except gpu_policy_plan.PolicyError as err:
            add("policy_declared_invalid", "; ".join(err.errors))
            return
        for gpu in chosen:
            report = gpu_policy_plan.policy_report(policy, gpu)
            for setting in report["drift"]:
                if setting == "ecc_mode" and (gpu.get("ecc") or {}).get("supported") is False:
                    add("ecc_not_supported", "GPU %s: ECC declared %s, the GPU has no ECC" % (
                        gpu.get("index"), _show(report["wanted"].get(setting))),
                        expected=report["wanted"].get(setting), actual=None, gpu=gpu.get("index"))
                    continue
                add(setting, "GPU %s: %s is %s, declared %s" % (
                    gpu.get("index"), setting, _show(report["in_effect"].get(setting)),
                    _show(report["wanted"].get(setting))),
                    expected=report["wanted"].get(setting), actual=report["in_effect"].get(setting),
                    gpu=gpu.get("index"))
            if "ecc_mode" in report["pending"] and report["pending"]["ecc_mode"] == report["wanted"].get("ecc_mode"):
                add("ecc_mode_pending", "GPU %s: ECC %s after the next reboot" % (
                    gpu.get("index"), _show(report["pending"]["ecc_mode"])),
                    expected=report["wanted"].get("ecc_mode"), actual=report["in_effect"].get("ecc_mode"),
                    gpu=gpu.get("index"))

    def _mig_findings(self, add: Any, gpus: List[Dict[str, Any]], mig: Mapping[str, Any]) -> None:
        entries, error = self.mig_entries(mig)
        if error:
            add("mig_declared_invalid", error)
            return
        try:
            layout = mig_plan.resolve_layout(entries, gpus)
        except mig_plan.MigConfigError as err:
            add("mig_declared_invalid", "; ".join(getattr(err, "errors", None) or [str(err)]))
            return
        by_index = dict((gpu.get("index"), gpu) for gpu in gpus)
        for index in sorted(layout):
            wanted = layout[index]
            gpu = by_index[index]
            current = bool((gpu.get("mig") or {}).get("mode_current"))
            if current != bool(wanted["mig_enabled"]):
                add("mig_mode", "GPU %s: MIG %s, declared %s" % (index, _show(current), _show(wanted["mig_enabled"])),
                    expected=bool(wanted["mig_enabled"]), actual=current, gpu=index)
                continue
            if wanted["mig_enabled"]:
                have = mig_plan.current_layout(gpu)
                if have != dict(wanted["mig_devices"]):
                    add("mig_layout", "GPU %s: MIG instances %s, declared %s" % (
                        index, mig_plan.format_layout(have) or "none", mig_plan.format_layout(wanted["mig_devices"])),
                        expected=dict(wanted["mig_devices"]), actual=have, gpu=index)


def _show(value: Any) -> str:
    if value is True:
        return "enabled"
    if value is False:
        return "disabled"
    if isinstance(value, float):
        return ("%.3f" % value).rstrip("0").rstrip(".") + " W"
    return "none" if value is None else str(value)


#: What :func:`judge_node` keeps of each GPU (``gpus`` of a node entry) for the Prometheus series.
GPU_SUMMARY_FIELDS = ("index", "uuid", "serial", "pci_bus_id", "name", "persistence_mode", "compute_mode")


def gpu_summaries(facts: Mapping[str, Any], findings: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """A compact record per GPU of a facts document, for per-GPU metrics.

    :param facts: ``ansible_facts.nvidia`` (shape checked: :func:`facts_problem` is ``None``).
    :param findings: the node's findings (``gpu`` is an NVML index or ``None``).
    :returns: ``[{"index", "uuid", "serial", "pci_bus_id", "name", "persistence_mode" (bool|None),
        "compute_mode" (str|None), "ecc_mode" (bool|None: ``ecc.mode_current``), "power": {"limit_w",
        "enforced_limit_w", "default_limit_w", "min_limit_w", "max_limit_w"} (W, None unknown),
        "remapped_rows": {"correctable", "uncorrectable", "pending", "failed"}, "fatal_xid_events"
        (int: fatal Xid lines of the kernel log naming this GPU's PCI bus id), "findings" (int),
        "worst_severity" (str|None)}]``. Sources: NVML (``nvmlDeviceGetEnforcedPowerLimit``,
        ``nvmlDeviceGetRemappedRows``...) or ``nvidia-smi -q -x`` as read by ``gpu_facts``; Xids from
        the kernel log (docs/facts.md).
    """
    fatal_by_bus = {}  # type: Dict[str, int]
    for event in facts.get("xid_events") or []:
        if event.get("fatal") and event.get("pci_bus_id"):
            bus = str(event["pci_bus_id"]).lower()
            fatal_by_bus[bus] = fatal_by_bus.get(bus, 0) + int(event.get("count") or 1)
    by_index = {}  # type: Dict[Any, List[Dict[str, Any]]]
    for finding in findings:
        if finding.get("gpu") is not None:
            by_index.setdefault(finding["gpu"], []).append(finding)
    out = []
    for gpu in facts.get("gpus") or []:
        power = gpu.get("power") or {}
        rows = gpu.get("remapped_rows") or {}
        own = by_index.get(gpu.get("index"), [])
        worst = max([finding_severity_rank(f["severity"]) for f in own] or [-1])
        entry = dict((key, gpu.get(key)) for key in GPU_SUMMARY_FIELDS)
        entry.update({
            "ecc_mode": (gpu.get("ecc") or {}).get("mode_current"),
            "power": dict((key, power.get(key))
                          for key in ("limit_w", "enforced_limit_w", "default_limit_w", "min_limit_w", "max_limit_w")),
            "remapped_rows": dict((key, rows.get(key)) for key in ("correctable", "uncorrectable", "pending", "failed")),
            "fatal_xid_events": fatal_by_bus.get(str(gpu.get("pci_bus_id") or "").lower(), 0),
            "findings": len(own),
            "worst_severity": FINDING_SEVERITIES[worst] if worst >= 0 else None,
        })
        out.append(entry)
    return out


def judge_node(item: Mapping[str, Any], engine: "DriftEngine", keep_gpus: str = "none") -> Dict[str, Any]:
    """Judge one node: its entry of the report's ``nodes`` (:func:`roll_up`).

    :param item: ``{"node", "class", "facts", "declared", "facts_age_s", "facts_checked" (bool,
        optional: :func:`facts_problem` already ran), "hostname" (optional: the node's own host name,
        ``uname -n``, when it is known and may differ from the inventory name)}``.
    :param keep_gpus: ``none``, ``drifted`` (keep :func:`gpu_summaries` of a node that is not in
        sync by its own checks) or ``all``. The class-level check (:func:`version_skew`) is not
        known here: a node it drifts has no ``gpus`` yet, and :func:`roll_up` with ``keep_gpus``
        and ``facts_of`` takes the final decision, once every finding is known.
    :returns: ``{"class", "in_sync", "missing", "worst_severity", "findings", "driver": {"loaded",
        "userspace", "on_disk", "branch", "state"}}`` plus ``"gpus"`` when kept, ``"hostname"`` when given
        and, for a node not in sync whose facts have one, ``"headline"`` (``{verdict, summary, action,
        next_step}`` of facts_headline.node_headline). A value of a wrong
        type deep in the facts (``AttributeError``, ``TypeError``, ``ValueError``, ``KeyError``,
        ``IndexError`` of a check) makes one ``facts_missing`` finding "could not be judged".
    :raises: nothing for any node's facts.
    """
    name = item["node"]
    klass = item.get("class") or "unclassified"
    facts = item.get("facts")
    try:
        found = engine.node_findings(name, klass, facts, item.get("declared") or {}, item.get("facts_age_s"),
                                     checked=bool(item.get("facts_checked")))
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as err:
        found = [{"node": name, "class": klass, "check": "facts_missing", "severity": CHECKS["facts_missing"][0],
                  "gpu": None, "expected": None, "actual": "%s: %s" % (type(err).__name__, err),
                  "message": "the NVIDIA facts of this node could not be judged (%s: %s); run gpu_facts "
                             "again" % (type(err).__name__, err)}]
    worst = max([finding_severity_rank(f["severity"]) for f in found] or [-1])
    in_sync = worst < finding_severity_rank("warning")
    missing = any(f["check"] == "facts_missing" for f in found)
    driver = facts.get("driver") if isinstance(facts, Mapping) else None
    driver = driver if isinstance(driver, Mapping) else {}
    entry = {
        "class": klass,
        "in_sync": in_sync,
        "missing": missing,
        "worst_severity": FINDING_SEVERITIES[worst] if worst >= 0 else None,
        "findings": found,
        "driver": {"loaded": driver.get("loaded_version"), "userspace": driver.get("userspace_version"),
                   "on_disk": driver.get("on_disk_version"), "branch": driver.get("branch"),
                   "state": driver.get("state")},
    }
    if item.get("hostname"):
        entry["hostname"] = item["hostname"]
    headline = facts.get("headline") if isinstance(facts, Mapping) and not in_sync else None
    if isinstance(headline, Mapping):
        # What the node's own facts say first (facts_headline), beside the findings against the declaration.
        entry["headline"] = {"verdict": headline.get("verdict"), "summary": headline.get("summary"),
                             "action": headline.get("action"), "next_step": headline.get("next_step")}
    if not missing and (keep_gpus == "all" or (keep_gpus == "drifted" and not in_sync)):
        try:
            entry["gpus"] = gpu_summaries(facts, found)
        except (AttributeError, TypeError, ValueError):
            entry["gpus"] = []
    return entry


def _loaded(node: Mapping[str, Any]) -> Optional[str]:
    driver = node.get("driver") or {}
    return driver.get("loaded") or driver.get("userspace")


def version_skew(judged: List[Tuple[str, Dict[str, Any]]]) -> Dict[str, Dict[str, Any]]:
    """Find the classes whose nodes run more than one driver version, and mark the odd nodes out.

    Two driver versions in one class split its jobs: a 2-node NCCL job across 550.144.03 and
    570.124.06 ran its all-reduce at 90.55 % of one version's bus bandwidth (field case 42,
    NVIDIA/nccl-tests issue 297), whether or not a version was declared. Every node whose loaded
    version is not the class's most common one (ties: the newest version) gets a
    ``driver_version_skew`` finding, and its ``in_sync`` / ``worst_severity`` are updated.

    :param judged: ``(name, judge_node(...))`` per node (changed in place).
    :returns: class → ``{"versions": {version: nodes}, "majority": version}`` for every class with a
        known version (``versions`` has one key when there is no skew).
    :raises: nothing.
    """
    per_class = {}  # type: Dict[str, Dict[str, int]]
    for _name, node in judged:
        version = _loaded(node)
        if version and not node.get("missing"):
            counts = per_class.setdefault(node["class"], {})
            counts[version] = counts.get(version, 0) + 1
    out = {}
    for klass, counts in per_class.items():
        majority = sorted(counts, key=lambda v: (counts[v], [int(p) if p.isdigit() else 0 for p in v.split(".")]))[-1]
        out[klass] = {"versions": dict(sorted(counts.items())), "majority": majority}
    for name, node in judged:
        found = out.get(node["class"])
        version = _loaded(node)
        if not found or len(found["versions"]) < 2 or not version or version == found["majority"] or node.get("missing"):
            continue
        listed = ", ".join("%s x%d" % item for item in sorted(found["versions"].items()))
        node["findings"].append({
            "node": name, "class": node["class"], "check": "driver_version_skew",
            "severity": CHECKS["driver_version_skew"][0], "gpu": None, "expected": found["majority"], "actual": version,
            "message": "class %s runs %d driver versions (%s): this node runs %s, most of the class %s" % (
                node["class"], len(found["versions"]), listed, version, found["majority"])})
        worst = max(finding_severity_rank(f["severity"]) for f in node["findings"])
        node["worst_severity"] = FINDING_SEVERITIES[worst]
        node["in_sync"] = worst < finding_severity_rank("warning")
    return out


#: Values of ``keep_gpus`` (:func:`judge_node`, :func:`settle_gpus`): which nodes keep their GPU summaries.
KEEP_GPUS = ("none", "drifted", "all")


def settle_gpus(judged: List[Tuple[str, Dict[str, Any]]], keep_gpus: str,
                facts_of: Optional[Callable[[str], Any]] = None) -> int:
    """Decide which nodes keep their GPU summaries, once every finding is known (node and class level).

    :func:`judge_node` keeps the summaries of the nodes its own checks drift; :func:`version_skew`
    may drift more nodes afterwards, whose facts are no longer at hand (they were judged in a worker
    process). Their summaries are made here from ``facts_of``; a node that is in sync loses them
    under ``drifted``, every node loses them under ``none``, and a node without facts has none.

    :param judged: ``(name, judge_node(...))`` per node, after :func:`version_skew` (changed in place:
        ``gpus`` set or removed).
    :param keep_gpus: ``none``, ``drifted`` or ``all`` (:data:`KEEP_GPUS`).
    :param facts_of: ``facts_of(name) -> ansible_facts.nvidia document or None``, called once for
        each node that needs summaries and has none; ``None``: such a node is left without ``gpus``.
        A document that cannot be summarised (not a mapping, a wrong type deep inside) gives ``[]``.
    :returns: how many nodes got their summaries from ``facts_of``.
    :raises ValueError: for a ``keep_gpus`` not in :data:`KEEP_GPUS`.
    """
    if keep_gpus not in KEEP_GPUS:
        raise ValueError("keep_gpus must be one of %s, got %r" % (", ".join(KEEP_GPUS), keep_gpus))
    made = 0
    for name, node in judged:
        wanted = not node.get("missing") and (keep_gpus == "all" or (keep_gpus == "drifted" and not node["in_sync"]))
        if not wanted:
            node.pop("gpus", None)
        elif "gpus" not in node and facts_of is not None:
            facts = facts_of(name)
            try:
                node["gpus"] = gpu_summaries(facts, node["findings"]) if _is_mapping(facts) else []
            except (AttributeError, TypeError, ValueError):
                node["gpus"] = []
            made += 1
    return made


def roll_up(judged: Iterable[Tuple[str, Dict[str, Any]]], generated_at: Optional[str] = None,
            source: Optional[str] = None, keep_gpus: Optional[str] = None,
            facts_of: Optional[Callable[[str], Any]] = None) -> Dict[str, Any]:
    """Roll judged nodes (``(name, judge_node(...))`` in node order) up per class and for the fleet.

    The drift report: the ``drift_report`` action judges every node with :func:`judge_node` (in
    worker processes, ``drift_parallel``) and rolls them up here.

    :param judged: ``(name, judge_node(item, engine, keep_gpus))`` per node; each entry's
        ``missing`` is taken out (counted), the rest is kept as the node's entry.
    :param generated_at: ISO 8601 time to put in the report; :param source: where the facts came
        from (``live``, ``dir:<path>``, ``jsonfile:<path>``).
    :param keep_gpus: ``none``, ``drifted`` or ``all``: which nodes keep ``gpus``, decided after the
        class-level :func:`version_skew` (:func:`settle_gpus`, with ``facts_of``); ``None`` keeps what
        :func:`judge_node` kept.
    :param facts_of: ``facts_of(name) -> facts document or None`` for :func:`settle_gpus`.
    :returns: ``{"generated_at", "source", "summary": {"nodes", "in_sync", "drifted", "missing",
        "findings", "by_severity": {severity: n}, "by_check": {check: n}, "worst_severity"},
        "classes": {class: {"nodes", "in_sync", "drifted", "missing", "by_check", "worst_severity",
        "drifted_nodes": [names], "driver_versions": {version: nodes} (more than one key: skew,
        :func:`version_skew`)}}, "nodes": {name: {"class", "in_sync", "worst_severity",
        "findings": [...], "driver": {"loaded", "userspace", "on_disk", "branch", "state"}, "gpus"
        (when kept)}}, "findings": [all findings, node order]}``.
        A node is ``in_sync`` when it has no finding above ``info``; ``missing`` when its facts
        are missing, are not a facts document (:func:`facts_problem`) or could not be judged
        (:func:`judge_node`); one such node never stops the report.
    :raises ValueError: for a ``keep_gpus`` not in :data:`KEEP_GPUS`.
    """
    judged = list(judged)
    skew = version_skew(judged)
    if keep_gpus is not None:
        settle_gpus(judged, keep_gpus, facts_of)
    summary = {"nodes": 0, "in_sync": 0, "drifted": 0, "missing": 0, "findings": 0,
               "by_severity": dict((s, 0) for s in FINDING_SEVERITIES), "by_check": {}, "worst_severity": None}
    classes = {}  # type: Dict[str, Dict[str, Any]]
    per_node = {}  # type: Dict[str, Dict[str, Any]]
    findings = []  # type: List[Dict[str, Any]]
    for name, node in judged:
        klass = node["class"]
        missing = node.pop("missing")
        per_node[name] = node
        entry = classes.setdefault(klass, {"nodes": 0, "in_sync": 0, "drifted": 0, "missing": 0, "by_check": {},
                                           "worst_severity": None, "drifted_nodes": [],
                                           "driver_versions": skew.get(klass, {}).get("versions", {})})
        entry["nodes"] += 1
        summary["nodes"] += 1
        if missing:
            entry["missing"] += 1
            summary["missing"] += 1
        if node["in_sync"]:
            entry["in_sync"] += 1
            summary["in_sync"] += 1
        else:
            entry["drifted"] += 1
            summary["drifted"] += 1
            entry["drifted_nodes"].append(name)
        if finding_severity_rank(node["worst_severity"]) > finding_severity_rank(entry["worst_severity"]):
            entry["worst_severity"] = node["worst_severity"]
        for finding in node["findings"]:
            summary["findings"] += 1
            summary["by_severity"][finding["severity"]] += 1
            summary["by_check"][finding["check"]] = summary["by_check"].get(finding["check"], 0) + 1
            entry["by_check"][finding["check"]] = entry["by_check"].get(finding["check"], 0) + 1
            findings.append(finding)
    worst_all = max([finding_severity_rank(c["worst_severity"]) for c in classes.values()] or [-1])
    summary["worst_severity"] = FINDING_SEVERITIES[worst_all] if worst_all >= 0 else None
    return {"generated_at": generated_at, "source": source, "summary": summary, "classes": classes,
            "nodes": per_node, "findings": findings}


def exit_code(report: Mapping[str, Any], report_only: bool = False, fail_on: str = "warning") -> int:
    """Exit status of a drift run: 0 in sync (or ``report_only``), 2 when a finding reaches ``fail_on``.

    :param fail_on: ``info``, ``warning`` (default) or ``critical``.
    :raises ValueError: for another ``fail_on``.
    """
    if fail_on not in FINDING_SEVERITIES:
        raise ValueError("fail_on must be one of %s, got %r" % (", ".join(FINDING_SEVERITIES), fail_on))
    if report_only:
        return 0
    worst = finding_severity_rank(report["summary"].get("worst_severity"))
    return 2 if worst >= finding_severity_rank(fail_on) else 0
