# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of gpufleet.nvidia.drift_report: the drift report, computed on the controller."""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timezone

from ansible import constants as C
from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import (
    drift_declared,
    drift_output,
    drift_html,
    drift_parallel,
    drift_prometheus,
    fact_sources,
    prometheus_textfile,
    report_junit,
)
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_action import ControllerAction

ARGUMENT_SPEC = {
    "source": {"type": "str", "default": "live", "choices": ["live", "dir", "jsonfile"]},
    "path": {"type": "path"},
    "prefix": {"type": "str", "default": ""},
    "hosts": {"type": "list", "elements": "str"},
    "class_prefix": {"type": "str", "default": "gpu_"},
    "declared_from": {"type": "str", "default": "host", "choices": ["host", "class"]},
    "declared": {"type": "dict"},
    "max_age_s": {"type": "float"},
    "output_dir": {"type": "path"},
    "formats": {"type": "list", "elements": "str", "default": ["json", "markdown", "html", "junit", "prometheus"],
                "choices": ["json", "markdown", "html", "junit", "prometheus"]},
    "prometheus_path": {"type": "path"},
    "report_only": {"type": "bool", "default": False},
    "fail_on": {"type": "str", "default": "warning", "choices": ["info", "warning", "critical"]},
    "max_markdown_findings": {"type": "int", "default": 500},
    "max_html_rows": {"type": "int", "default": 5000},
    "return_findings": {"type": "int", "default": 200},
    "prometheus_gpus": {"type": "str", "default": "drifted", "choices": ["none", "drifted", "all"]},
    "workers": {"type": "int", "default": 0},
    "rollout_report": {"type": "path"},
}

#: Fewer nodes than this are judged in the calling process alone (a fork costs more than it saves).
PARALLEL_MIN_NODES = 400


def host_classes(groups, hosts, class_prefix):
    """``{host: class}``: the first group (sorted) whose name starts with ``class_prefix``.

    :param groups: the inventory's ``groups`` variable (group → hosts).
    :returns: hosts without such a group get ``"unclassified"``.
    """
    wanted = set(hosts)
    classes = {}
    for group in sorted(groups):
        if not group.startswith(class_prefix):
            continue
        for host in groups[group]:
            if host in wanted and host not in classes:
                classes[host] = group
    for host in hosts:
        classes.setdefault(host, "unclassified")
    return classes


class ActionModule(ControllerAction):
    """Collect facts and declarations, judge them with plugin_utils.drift, write the outputs."""

    NAME = "drift_report"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validated_args()
        # The default formats include prometheus: a controller without prometheus_client writes the
        # others and says so once; formats that name prometheus fail without it, before any work.
        skipped = self._skipped(args)
        started = time.time()
        groups = task_vars.get("groups") or {}
        hosts = args["hosts"]
        if hosts is None:
            hosts = [h for h in groups.get("all", []) if h not in ("localhost",)]
        classes = host_classes(groups, hosts, args["class_prefix"])
        facts_of, source = self._collect(args, hosts, task_vars)
        declared_of = self._declarations(args, hosts, classes, task_vars)
        generated = datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        engine = drift.DriftEngine(max_age_s=args["max_age_s"])
        keep_gpus = args["prometheus_gpus"] if "prometheus" in args["formats"] else "none"
        if keep_gpus == "none" and set(args["formats"]) & {"html", "junit"}:
            # The HTML and JUnit outputs name a drifted node's GPUs by PCI bus id.
            keep_gpus = "drifted"

        def judge(chunk):
            errors = {}
            judged = []
            for host in chunk:
                facts, age, checked, nodename = facts_of(host, errors)
                judged.append((host, drift.judge_node(
                    {"node": host, "class": classes[host], "facts": facts, "declared": declared_of(host),
                     "facts_age_s": age, "facts_checked": checked, "hostname": nodename}, engine, keep_gpus)))
            return judged, errors
        workers = args["workers"] or drift_parallel.usable_cpus()
        if len(hosts) < PARALLEL_MIN_NODES:
            workers = 1
        try:
            parts = drift_parallel.map_forked(judge, drift_parallel.split(hosts, workers))
        except drift_parallel.WorkerError as err:
            raise AnsibleActionFail("drift_report: %s" % err)
        errors = {}
        for _judged, part_errors in parts:
            errors.update(part_errors)
        # Which nodes keep their GPU summaries is settled after the class-level version skew check,
        # which can drift a node its own checks found in sync: that node's facts are read again.
        report = drift.roll_up((item for judged, _errors in parts for item in judged),
                               generated_at=generated, source=source, keep_gpus=keep_gpus,
                               facts_of=lambda host: facts_of(host, {})[0])
        report["source_errors"] = errors
        code = drift.exit_code(report, args["report_only"], args["fail_on"])
        report["skipped_outputs"] = skipped
        paths = self._write(args, report, started, workers)
        summary = report["summary"]
        result.update({
            "changed": False,
            "summary": summary,
            "classes": report["classes"],
            "findings": report["findings"][:max(0, args["return_findings"])],
            "drifted_nodes": sorted(name for name, node in report["nodes"].items() if not node["in_sync"]),
            "paths": paths,
            "exit_code": code,
            "drift": drift.exit_code(report, False, args["fail_on"]) != 0,
            "source_errors": errors,
            "skipped_outputs": report["skipped_outputs"],
            "elapsed_s": round(time.time() - started, 3),
        })
        if report["skipped_outputs"]:
            result["warnings"] = ["drift_report: %s" % note for note in report["skipped_outputs"].values()]
        result["msg"] = "%d nodes: %d in sync, %d drifted (%d without facts); %d critical, %d warning findings" % (
            summary["nodes"], summary["in_sync"], summary["drifted"], summary["missing"],
            summary["by_severity"]["critical"], summary["by_severity"]["warning"])
        if code:
            result["failed"] = True
            result["msg"] = "drift found: " + result["msg"]
        return result

    def _declarations(self, args, hosts, classes, task_vars):
        """``declared_of(host) -> drift.declared_state(...)``: computed once per distinct declaration.

        ``declared`` (per class) wins; ``declared_from=class`` reads a class's first host only;
        otherwise hosts sharing groups and own declared variables share one reading
        (:func:`drift_declared.declared_variables`).
        """
        hostvars = task_vars.get("hostvars") or {}
        overrides = dict((klass, drift.declared_state(variables))
                         for klass, variables in (args["declared"] or {}).items())
        wanted = [host for host in hosts if classes[host] not in overrides]
        if args["declared_from"] == "class":
            first = {}
            for host in wanted:
                first.setdefault(classes[host], host)
            wanted = list(first.values())
        basedirs = list(task_vars.get("ansible_inventory_sources") or []) + [task_vars.get("playbook_dir")]
        variables, _stats = drift_declared.declared_variables(
            hostvars, wanted, drift.DECLARED_VARIABLES, basedirs, C.VARIABLE_PLUGINS_ENABLED)
        states = {}  # id of a shared variables dict -> its declared state

        def state(found):
            if found is None:
                return {}
            if id(found) not in states:
                states[id(found)] = (found, drift.declared_state(found))
            return states[id(found)][1]
        by_class = dict((classes[host], state(variables[host])) for host in wanted)

        def declared_of(host):
            klass = classes[host]
            if klass in overrides:
                return overrides[klass]
            if args["declared_from"] == "class":
                return by_class[klass]
            return state(variables[host])
        return declared_of

    def _collect(self, args, hosts, task_vars):
        """``(facts_of(host, errors) -> (facts, age, checked, nodename), source label)``; files are read lazily.

        ``errors`` gets ``{host: why}`` for a file that cannot be used; ``checked`` says the
        document's shape was checked already (``drift.facts_problem``); ``nodename`` is the
        host's ``ansible_nodename`` when the source holds it.
        """
        if args["source"] == "live":
            hostvars = task_vars.get("hostvars") or {}

            def live(host, errors):
                if host not in hostvars:
                    return None, None, False, None
                facts = drift_declared.plain(hostvars[host].get("ansible_facts") or {})
                nodename = facts.get("nodename") if isinstance(facts.get("nodename"), str) else None
                return fact_sources.nvidia_from_host_facts(facts), None, False, nodename
            return live, "live"
        if not args["path"]:
            raise AnsibleActionFail("drift_report: source=%s needs path" % args["source"])
        try:
            files = fact_sources.locate_fact_files(args["path"], args["source"], args["prefix"], hosts)
        except fact_sources.FactSourceError as err:
            raise AnsibleActionFail("drift_report: %s" % err)
        now = time.time()

        def from_file(host, errors):
            if host not in files:
                return None, None, False, None
            try:
                entry = fact_sources.load_fact_file(files[host], now)
            except fact_sources.FactSourceError as err:
                errors[host] = str(err)
                return None, None, False, None
            if entry["error"]:
                errors[host] = "%s: %s" % (entry["path"], entry["error"])
            return entry["facts"], entry["age_s"], entry["facts"] is not None, entry["nodename"]
        return from_file, "%s:%s" % (args["source"], args["path"])

    def _prometheus_path(self, args):
        """The Prometheus textfile's absolute path (``prometheus_path``, else in ``output_dir``), or ``None``."""
        if args["prometheus_path"]:
            return os.path.abspath(args["prometheus_path"])
        return "%s/gpufleet_drift.prom" % os.path.abspath(args["output_dir"]) if args["output_dir"] else None

    def _skipped(self, args):
        """``{"prometheus": note}`` when the default formats meant a Prometheus file that this
        controller cannot write (no ``prometheus_client``); else ``{}``.

        :raises AnsibleActionFail: when the task's ``formats`` names prometheus and
            ``prometheus_client`` is missing (asked for, so not skipped).
        """
        prom = self._prometheus_path(args)
        if self._task.check_mode or not prom or "prometheus" not in args["formats"]:
            return {}
        try:
            prometheus_textfile.require()
        except prometheus_textfile.PrometheusUnavailable as err:
            if "formats" in (self._task.args or {}):
                raise AnsibleActionFail("drift_report: %s" % err)
            return {"prometheus": prometheus_textfile.skipped_note(prom)}
        return {}

    def _write(self, args, report, started, workers=1):
        """Write the outputs (JSON, Markdown, HTML, JUnit XML, Prometheus); the Prometheus file in a second
        process when there is a CPU for it, as it costs about as much as the others.

        :returns: ``{format: path}``.
        """
        paths = {}
        if self._task.check_mode:
            return paths
        # Absolute: the playbook shows the Markdown with a file lookup, which would search a
        # relative path beside the playbook instead of the working directory it was written in.
        out = os.path.abspath(args["output_dir"]) if args["output_dir"] else None
        formats = set(args["formats"])
        if out and "json" in formats:
            paths["json"] = "%s/drift-report.json" % out
        if out and "markdown" in formats:
            paths["markdown"] = "%s/drift-report.md" % out
        if out and "html" in formats:
            paths["html"] = "%s/drift-report.html" % out
        if out and "junit" in formats:
            paths["junit"] = "%s/drift-report.junit.xml" % out
        prom = self._prometheus_path(args)
        rollout = None
        if prom and "prometheus" in formats and "prometheus" not in (report.get("skipped_outputs") or {}):
            paths["prometheus"] = prom
            rollout = self._rollout_report(args)

        for path in paths.values():
            os.makedirs(os.path.dirname(path), exist_ok=True)
        prom_report = report
        if args["prometheus_gpus"] == "none" and "prometheus" in paths:
            # GPUs kept for the HTML page only: no per-GPU series.
            prom_report = dict(report, nodes=dict((name, dict((k, v) for k, v in node.items() if k != "gpus"))
                                                  for name, node in report["nodes"].items()))

        def write(names):
            for name in names:
                if name == "json":
                    drift_output.write_atomic(paths["json"], drift_output.render_json(report))
                elif name == "markdown":
                    drift_output.write_atomic(paths["markdown"],
                                              drift_output.render_markdown(report, args["max_markdown_findings"]))
                elif name == "html":
                    drift_output.write_atomic(paths["html"], drift_html.render_html(report, args["max_html_rows"]))
                elif name == "junit":
                    drift_output.write_atomic(paths["junit"], report_junit.drift_junit(report))
                else:
                    drift_prometheus.write_textfile(paths["prometheus"], prom_report, started, rollout)
            return True
        jobs = [[name for name in ("json", "markdown", "html", "junit") if name in paths]]
        if "prometheus" in paths:
            if workers > 1 and jobs[0]:
                jobs.append(["prometheus"])
            else:
                jobs[0].append("prometheus")
        try:
            drift_parallel.map_forked(write, jobs)
        except drift_parallel.WorkerError as err:
            raise AnsibleActionFail("drift_report: writing the outputs: %s" % err)
        return paths

    def _rollout_report(self, args):
        """The rollout report named by ``rollout_report`` (a file, or a directory holding
        ``rollout-report.json``), or ``None``.

        :raises AnsibleActionFail: when it is named but cannot be read or is not a report.
        """
        path = args["rollout_report"]
        if not path:
            return None
        if os.path.isdir(path):
            path = os.path.join(path, "rollout-report.json")
        try:
            with open(path, "rb") as handle:
                data = json.loads(handle.read())
        except (IOError, OSError, ValueError) as err:
            raise AnsibleActionFail("drift_report: rollout_report %s cannot be read: %s" % (path, err))
        if not isinstance(data, dict) or not isinstance(data.get("nodes"), list):
            raise AnsibleActionFail("drift_report: rollout_report %s is not a rollout report (no list of nodes); "
                                    "give the rollout's report directory or its rollout-report.json" % path)
        return data
