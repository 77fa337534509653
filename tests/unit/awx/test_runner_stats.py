# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""playbooks/drift_report.yml run by ansible-runner, as an AWX job runs it, and what the job publishes.

ansible-runner is AWX's executor: AWX writes a private data directory (``project/``,
``inventory/``, ``env/extravars``, ``env/envvars``) and runs the playbook in it. The stats
event at the end of the job (``playbook_on_stats``) carries what ``set_stats`` published under
``artifact_data``; AWX stores that as the job's artifacts and hands it to a workflow's next
nodes as extra vars. What is proven here: a real ansible-runner job over a fact directory
publishes ``gpufleet_drift`` with the verdict, the counts and the report paths, and exits 2 on
drift (the job fails) or 0 with ``drift_report_only``. What is not: an AWX server storing it.
"""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

ansible_runner = pytest.importorskip("ansible_runner")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "plugins", "action"))
from test_drift_report import INVENTORY, facts  # noqa: E402

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))


def private_data_dir(tmp_path, extravars):
    """An AWX-shaped private data directory: the project checkout, the inventory, the job's variables."""
    root = tmp_path / "job"
    (root / "project").mkdir(parents=True)
    shutil.copy(os.path.join(REPO, "playbooks", "drift_report.yml"), str(root / "project" / "drift_report.yml"))
    (root / "inventory").mkdir()
    (root / "inventory" / "hosts.yml").write_text(INVENTORY)
    (root / "env").mkdir()
    (root / "env" / "extravars").write_text(json.dumps(dict(extravars, ansible_python_interpreter=sys.executable)))
    # AWX passes the job's environment; here the collection and configuration the suite uses.
    keep = ("ANSIBLE_COLLECTIONS_PATH", "ANSIBLE_CONFIG", "PATH", "PYTHONDONTWRITEBYTECODE")
    (root / "env" / "envvars").write_text(json.dumps(dict((k, os.environ[k]) for k in keep if k in os.environ)))
    return root


def stats_artifacts(root, ident):
    """``artifact_data`` of the job's ``playbook_on_stats`` event, read from the job's event files."""
    events_dir = root / "artifacts" / ident / "job_events"
    for name in sorted(os.listdir(str(events_dir))):
        with open(str(events_dir / name)) as handle:
            event = json.load(handle)
        if event.get("event") == "playbook_on_stats":
            return event["event_data"].get("artifact_data")
    raise AssertionError("no playbook_on_stats event in %s" % events_dir)


@pytest.mark.parametrize("report_only, rc, status", [(False, 2, "failed"), (True, 0, "successful")])
def test_drift_job_publishes_its_verdict(tmp_path, report_only, rc, status):
    facts_dir = tmp_path / "facts"
    facts_dir.mkdir()
    (facts_dir / "h1.json").write_text(json.dumps(facts("Hopper", "NVIDIA H100 80GB HBM3", "620.70.06", 600.0)))
    (facts_dir / "h2.json").write_text(json.dumps(facts("Hopper", "NVIDIA H100 80GB HBM3", "620.70.06", 700.0)))
    (facts_dir / "v1.json").write_text(json.dumps(facts("Volta", "Tesla V100-SXM2-32GB", "580.95.05", 300.0)))
    out = tmp_path / "reports"
    extravars = {"drift_source": "dir", "drift_path": str(facts_dir), "drift_output_dir": str(out)}
    if report_only:
        extravars["drift_report_only"] = "true"  # a survey answer arrives as a string
    root = private_data_dir(tmp_path, extravars)
    job = ansible_runner.run(private_data_dir=str(root), playbook="drift_report.yml", ident="drift-1",
                             quiet=True)
    assert (job.rc, job.status) == (rc, status), job.stdout.read()[-3000:]
    published = stats_artifacts(root, "drift-1")
    drift = published["gpufleet_drift"]
    # h2 runs 700 W against a 600 W policy, h3 has no facts: drifted, whatever report_only says.
    assert drift["drift"] is True
    assert drift["drifted_nodes"] == ["h2", "h3"]
    assert (drift["summary"]["nodes"], drift["summary"]["in_sync"], drift["summary"]["drifted"],
            drift["summary"]["missing"]) == (4, 2, 2, 1)
    assert drift["summary"]["worst_severity"] == "critical"
    assert drift["paths"]["json"] == str(out / "drift-report.json")
    assert os.path.exists(drift["paths"]["markdown"])
    assert drift["msg"].startswith("4 nodes: 2 in sync, 2 drifted")
