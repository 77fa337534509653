# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of gpufleet.nvidia.rollout_report: the rollout's bookkeeping on the controller."""

from __future__ import annotations

import os
import time
from datetime import datetime, timezone

from ansible.errors import AnsibleActionFail

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget, rollout_journal, rollout_outcome
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_report
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import run_lease
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_action import ControllerAction
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_run import run_identity

ARGUMENT_SPEC = {
    "state": {"type": "str", "required": True, "choices": ["start", "probe", "record", "finish", "render", "golden"]},
    "report_dir": {"type": "path"},
    "rollout_id": {"type": "str"},
    "plan": {"type": "dict"},
    "record": {"type": "dict"},
    "controller": {"type": "str"},
    "pid": {"type": "int"},
    "run_id": {"type": "str"},
    "hold": {"type": "bool", "default": False},
    "node_class": {"type": "str"},
    "traces": {"type": "dict"},
    "fail_msg": {"type": "str"},
    "warn_skipped": {"type": "bool", "default": True},
}


def _journal_event(record, hold, stamp):
    """The rollout journal's event for a node record (``rollout_journal``)."""
    changes = (record.get("contract") or {}).get("changes") if isinstance(record.get("contract"), dict) else None
    extra = {"contract_changes": changes} if record.get("stage") == "golden" and isinstance(changes, list) else {}
    if hold:
        return dict({"event": "held", "node": record["node"], "time": stamp}, **extra)
    if record.get("result") == "pending":
        return {"event": "pending", "node": record["node"], "run_id": record.get("run_id"), "time": stamp}
    result = record.get("result") or "failed"
    event = {"event": "finished", "node": record["node"], "status": rollout_journal.status_of(result),
             "result": result, "changed": result != "skipped", "run_id": record.get("run_id"),
             "target": (record.get("target") or {}).get("version"), "time": stamp}
    if record.get("out_of_service") in (True, "True", "true"):
        event["out_of_service"] = True
    if event["status"] == "failed":
        event.update(rollout_budget.failure_signature(record))
    elif event["status"] == "done":
        event.update(extra)
    return event


def _now():
    stamp = time.time()
    return stamp, datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class ActionModule(ControllerAction):
    """Start a rollout (plan, run identity), probe a lock holder, record a node, render the report."""

    NAME = "rollout_report"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self.validated_args()
        state = args["state"]
        stamp, iso = _now()
        result["changed"] = False
        if state == "probe":
            runs = os.path.join(os.path.abspath(args["report_dir"]), "runs") if args["report_dir"] else None
            result.update(run_lease.probe_holder({"controller": args["controller"], "pid": args["pid"],
                                                  "run_id": args["run_id"]}, runs))
            return result
        if state == "start":
            run = run_identity()
            run["started_at"] = iso
            run["started_epoch"] = stamp
            result["run"] = run
        directory = args["report_dir"]
        if not directory:
            raise AnsibleActionFail("rollout_report: state=%s needs report_dir" % state)
        directory = os.path.abspath(directory)
        result["report_dir"] = directory
        if self._task.check_mode:
            result["msg"] = "check mode: nothing written to %s" % directory
            return result
        if state == "start":
            # The lease the next run (another controller, the next AWX job) judges this run's
            # locks by; renewed while this ansible-playbook process lives.
            try:
                result["run"]["lease"] = run_lease.start(directory, result["run"], result["run"]["ticks"], iso)
            except OSError as exc:
                raise AnsibleActionFail("rollout_report: cannot write the run's lease under %s: %s" % (directory, exc))
        if state == "start" and args["plan"] is not None:
            plan = dict(args["plan"])
            plan.setdefault("rollout_id", args["rollout_id"])
            plan.setdefault("started_at", iso)
            plan["runs"] = [result["run"]["run_id"]]
            result["plan_path"] = rollout_report.write_plan(directory, plan)
        if state == "golden":
            if not args["node_class"]:
                raise AnsibleActionFail("rollout_report: state=golden needs node_class")
            result["golden"] = rollout_report.golden_contract(directory, args["node_class"])
            return result
        if state == "finish":
            if not args["record"] or not args["record"].get("node"):
                raise AnsibleActionFail("rollout_report: state=finish needs record.node")
            rollout_journal.append(directory, _journal_event(args["record"], False, stamp))
            return result
        if state == "record":
            if not args["record"] or not args["record"].get("node"):
                raise AnsibleActionFail("rollout_report: state=record needs record.node")
            record = dict(args["record"])
            marks = record.get("marks") or {}
            record["durations"] = rollout_report.durations_from_marks(marks)
            started_epoch = marks.get("started")
            record["started_epoch"] = float(started_epoch) if started_epoch is not None else None
            if record["started_epoch"] is not None:
                record["started_at"] = datetime.fromtimestamp(record["started_epoch"], timezone.utc).strftime(
                    "%Y-%m-%dT%H:%M:%SZ")
            record.setdefault("finished_at", iso)
            record.setdefault("finished_epoch", stamp)
            # Bookkeeping on the controller; a node found on target changed nothing.
            result["changed"] = record.get("result") != "skipped"
            if args["traces"]:
                # The evidence must never cost the node its record.
                try:
                    record["evidence"] = rollout_report.store_traces(directory, record["node"], args["traces"])
                except (ValueError, OSError) as exc:
                    record["evidence"] = {"error": "traces not kept: %s" % exc}
            hold = args["hold"]
            path = rollout_report.store_record(
                directory, record,
                lambda merged: rollout_journal.append_in_lock(
                    directory, _journal_event(merged, hold, stamp)))
            result["paths"] = {"record": path, "json": os.path.join(directory, "rollout-report.json"),
                               "markdown": os.path.join(directory, "rollout-report.md")}
            if args["fail_msg"]:
                # Recorded first: the host fails with its record written.
                result["failed"] = True
                result["msg"] = args["fail_msg"]
        if state == "render" or (state == "start" and args["plan"] is not None):
            done = rollout_report.render(directory, iso, step_end=state == "render",
                                         inventory=(task_vars or {}).get("ansible_inventory_sources"))
            report = done["report"]
            result["paths"] = done["paths"]
            result["status"] = report["status"]
            result["summary"] = report["summary"]
            result["summary_text"] = rollout_outcome.summary_line(report["summary"])
            result["stopped_by"] = report["stopped_by"]
            result["skipped_outputs"] = report.get("skipped_outputs") or {}
            if state == "render":
                result["report"] = report
                result["markdown"] = rollout_report.render_markdown(report)
                if result["skipped_outputs"] and args["warn_skipped"]:
                    result["warnings"] = ["rollout_report: %s" % note for note in result["skipped_outputs"].values()]
        return result
