# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""awx/configure.yml against the awx.awx modules it calls, and the AWX objects it describes.

There is no AWX server here. What is proven: the playbook passes ``ansible-playbook
--syntax-check`` with awx.awx installed; every awx.awx task's arguments, templated with the
playbook's defaults and a site's variables (loops unrolled), pass the module's own
``argument_spec`` (read from the installed collection by ``awx_argspec.py``: option names,
types, choices, constraints; an unknown option fails); the workflow's nodes pass the
``workflow_nodes`` suboptions of the module's DOCUMENTATION; the surveys follow AWX's survey
rules and node and schedule variables are ones AWX accepts at launch (the rules as AWX's API
applies them, cited below); the extra vars are ones the rollout playbooks read. What is not:
that a controller accepts the objects (names it resolves, credentials, the image), and how the
jobs then behave.

Needs ``.venv-awx`` (``make venv-awx``); ``make unit`` sets GPUFLEET_REQUIRE_AWX=1, so it fails
there instead of skipping.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible.parsing.dataloader import DataLoader
from ansible.template import Templar, trust_as_template

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
PLAYBOOK = os.path.join(REPO, "awx", "configure.yml")
DEFAULTS = os.path.join(REPO, "awx", "vars", "defaults.yml")
VENV_AWX = os.path.join(REPO, ".venv-awx", "bin")
SITE = {
    "gpufleet_awx_controller_host": "https://awx.example.net",
    "gpufleet_awx_controller_token": "not-a-real-token",
    "gpufleet_awx_scm_url": "https://git.example.net/gpufleet/nvidia.git",
    "gpufleet_awx_scm_branch": "v0.1.0",
    "gpufleet_awx_ee_image": "registry.example.net/gpufleet-ee:0.1.0",
    "gpufleet_awx_machine_credential": "gpu nodes ssh",
}
# AWX's survey question types (awx/main/models/mixins.py, SURVEY_TYPE_MAPPING).
SURVEY_TYPES = {"text": str, "textarea": str, "password": str, "multiplechoice": str, "multiselect": str,
                "integer": int, "float": (float, int)}
DOC_TYPES = ("str", "int", "bool", "list", "dict", "float", "raw", "path")

if not os.path.exists(os.path.join(VENV_AWX, "ansible-playbook")):
    if os.environ.get("GPUFLEET_REQUIRE_AWX"):
        raise RuntimeError(".venv-awx is missing: run `make venv-awx` (awx.awx comes with the ansible package)")
    pytest.skip("no .venv-awx (make venv-awx); `make unit` requires it", allow_module_level=True)


def _awx(*argv, **kwargs):
    result = subprocess.run([os.path.join(VENV_AWX, argv[0])] + list(argv[1:]), capture_output=True, text=True,
                            check=False, cwd=REPO, timeout=180, **kwargs)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def play():
    loader = DataLoader()
    plays = loader.load_from_file(PLAYBOOK, trusted_as_template=True)
    assert len(plays) == 1
    return plays[0]


@pytest.fixture(scope="module")
def templar():
    loader = DataLoader()
    variables = dict(loader.load_from_file(DEFAULTS, trusted_as_template=True))
    variables.update(SITE)
    return Templar(loader=loader, variables=variables)


def _module(task):
    names = [key for key in task if key.startswith("awx.awx.")]
    return names[0][len("awx.awx."):] if names else None


@pytest.fixture(scope="module")
def calls(play, templar):
    """Every awx.awx call as (module, task name, templated arguments with module_defaults), loops unrolled."""
    defaults = templar.template(play["module_defaults"]["group/awx.awx.controller"])
    result = []
    for task in play["tasks"]:
        module = _module(task)
        if module is None:
            continue
        items = templar.template(task["loop"]) if "loop" in task else [None]
        assert items, task["name"]
        for item in items:
            variables = dict(templar.available_variables)
            if item is not None:
                variables["item"] = item
            args = templar.copy_with_new_env(available_variables=variables).template(task["awx.awx." + module])
            result.append((module, task["name"], dict(defaults, **args)))
    return result


@pytest.fixture(scope="module")
def specs(calls):
    modules = sorted({call[0] for call in calls})
    return json.loads(_awx("python", os.path.join(REPO, "tests", "unit", "awx", "awx_argspec.py"), *modules))


def _validate(spec, args):
    validator = ArgumentSpecValidator(spec["argument_spec"], **{k: v for k, v in spec.items() if k != "argument_spec" and v})
    result = validator.validate(args)
    return [str(error) for error in result.errors]


def _doc_spec(options):
    """Turn DOCUMENTATION options (ansible-doc --json) into an argument spec, suboptions included."""
    spec = {}
    for name, option in options.items():
        assert option.get("type", "str") in DOC_TYPES, (name, option.get("type"))
        entry = {"type": option.get("type", "str")}
        for key in ("elements", "choices", "aliases"):
            if key in option:
                entry[key] = option[key]
        if "suboptions" in option:
            entry["options"] = _doc_spec(option["suboptions"])
        spec[name] = entry
    return spec


def _by_module(calls, module):
    return [call[2] for call in calls if call[0] == module]


def test_syntax_check_with_awx_awx():
    out = _awx("ansible-playbook", "--syntax-check", PLAYBOOK)
    assert "playbook: " in out


def test_every_call_matches_its_module_argument_spec(calls, specs):
    assert sorted({call[0] for call in calls}) == [
        "execution_environment", "inventory", "inventory_source", "job_template", "project", "schedule",
        "workflow_job_template"]
    for module, name, args in calls:
        assert _validate(specs[module], args) == [], (module, name)


@pytest.mark.parametrize("module,change,message", [
    ("job_template", {"fact_cache": True}, "fact_cache. Supported parameters include"),
    ("job_template", {"verbosity": 7}, "value of verbosity must be one of"),
    ("job_template", {"job_slice_count": "four"}, "job_slice_count"),
    ("execution_environment", {"pull": "sometimes"}, "value of pull must be one of"),
    ("schedule", {"extra_vars": {}}, "extra_vars. Supported parameters include"),
])
def test_a_wrong_argument_fails_the_check(calls, specs, module, change, message):
    args = copy.deepcopy(_by_module(calls, module)[0])
    args.update(change)
    errors = _validate(specs[module], args)
    assert any(message in error for error in errors), errors


def test_workflow_nodes_match_the_documented_suboptions(calls):
    doc = json.loads(_awx("ansible-doc", "-t", "module", "--json", "awx.awx.workflow_job_template"))
    node_spec = _doc_spec(doc["awx.awx.workflow_job_template"]["doc"]["options"]["workflow_nodes"]["suboptions"])
    (workflow,) = _by_module(calls, "workflow_job_template")
    for node in workflow["workflow_nodes"]:
        errors = ArgumentSpecValidator(node_spec).validate(node).errors
        assert [str(error) for error in errors] == [], node["identifier"]
    bad = dict(workflow["workflow_nodes"][0], on_failure=[{"identifier": "golden-failed-drift"}])
    errors = [str(error) for error in ArgumentSpecValidator(node_spec).validate(bad).errors]
    assert any("on_failure. Supported parameters include" in error for error in errors), errors


def test_workflow_golden_approval_canary_approval_waves(calls):
    (workflow,) = _by_module(calls, "workflow_job_template")
    nodes = {node["identifier"]: node for node in workflow["workflow_nodes"]}
    assert len(nodes) == len(workflow["workflow_nodes"])

    def following(identifier, path):
        return [n["identifier"] for n in nodes[identifier].get("related", {}).get(path, [])]

    chain, current = ["golden"], "golden"
    while following(current, "success_nodes"):
        (current,) = following(current, "success_nodes")
        chain.append(current)
    assert chain == ["golden", "approve-canary", "canary", "approve-waves", "waves"]
    ujt = {ident: node["unified_job_template"] for ident, node in nodes.items()}
    assert [ujt[i]["type"] for i in chain] == ["job_template", "workflow_approval", "job_template", "workflow_approval",
                                               "job_template"]
    assert [nodes[i]["extra_data"]["rollout_stages"] for i in ("golden", "canary", "waves")] == [["golden"], ["canary"], ["waves"]]
    assert all(ujt[i]["timeout"] == 86400 for i in ujt if ujt[i]["type"] == "workflow_approval")
    # failure paths: golden -> drift report; canary -> approval -> rollback of golden and canary
    assert following("golden", "failure_nodes") == ["golden-failed-drift"]
    assert ujt["golden-failed-drift"]["name"] == "gpufleet drift report"
    assert following("canary", "failure_nodes") == ["approve-rollback"]
    assert following("approve-rollback", "success_nodes") == ["rollback-early"]
    assert ujt["rollback-early"]["name"] == "gpufleet rollback"
    assert nodes["rollback-early"]["extra_data"] == {"rollback_hosts": "gpufleet_golden:gpufleet_canary:&gpu_nodes"}
    assert following("waves", "always_nodes") == ["waves-drift"]
    referenced = {n["identifier"] for node in nodes.values() for path in ("success_nodes", "failure_nodes", "always_nodes")
                  for n in node.get("related", {}).get(path, [])}
    assert referenced == set(nodes) - {"golden"}


def test_job_templates(calls):
    jts = {args["name"]: args for args in _by_module(calls, "job_template")}
    assert set(jts) == {"gpufleet facts", "gpufleet drift report", "gpufleet rollout stage", "gpufleet rollout step",
                        "gpufleet rollback"}
    for args in jts.values():
        assert os.path.isfile(os.path.join(REPO, args["playbook"])), args["playbook"]
        assert args["execution_environment"] == "gpufleet-ee" and args["credentials"] == ["gpu nodes ssh"]
    facts, drift = jts["gpufleet facts"], jts["gpufleet drift report"]
    assert (facts["use_fact_cache"], facts["job_slice_count"], facts["forks"]) == (True, 4, 250)
    assert facts["extra_vars"] == {"gpufleet_hosts": "gpu_nodes", "gpufleet_facts_dir": "/var/lib/gpufleet/reports/facts"}
    assert (drift["use_fact_cache"], drift["job_slice_count"]) == (False, 1)
    assert drift["extra_vars"] == {"drift_hosts": "gpu_nodes", "drift_output_dir": "/var/lib/gpufleet/reports/drift",
                                   "drift_source": "dir", "drift_path": "/var/lib/gpufleet/reports/facts"}
    step = jts["gpufleet rollout step"]
    assert step["extra_vars"] == {"rollout_hosts": "gpu_nodes", "rollout_single_step": True,
                                  "rollout_report_dir": "/var/lib/gpufleet/reports/rollout/{{ rollout_id }}"}
    for name in ("gpufleet rollout stage", "gpufleet rollout step", "gpufleet rollback"):
        assert (jts[name]["allow_simultaneous"], jts[name]["job_slice_count"]) == (False, 1), name
    assert [q["variable"] for q in step["survey_spec"]["spec"]] == ["driver_branch", "driver_version", "rollout_id",
                                                                    "rollout_contract_accept"]
    assert step["survey_enabled"] and not facts["survey_enabled"]


def test_drift_report_from_the_fact_cache(play, templar):
    """With gpufleet_awx_drift_from_fact_cache the drift job reads the job's fact cache directory."""
    variables = dict(templar.available_variables, gpufleet_awx_drift_from_fact_cache=True)
    jts = templar.copy_with_new_env(available_variables=variables).template(variables["gpufleet_awx_job_templates"])
    (drift,) = [jt for jt in jts if jt["name"] == "gpufleet drift report"]
    assert drift["use_fact_cache"] is True
    assert drift["extra_vars"] == {
        "drift_hosts": "gpu_nodes", "drift_output_dir": "/var/lib/gpufleet/reports/drift", "drift_source": "jsonfile",
        "drift_path": "{{ lookup('ansible.builtin.env', 'ANSIBLE_CACHE_PLUGIN_CONNECTION') }}"}


@pytest.mark.parametrize("job_vars,rollback_id,report_dir", [
    ({"rollout_id": "driver-ltsb"}, "driver-ltsb-rollback", "/var/lib/gpufleet/reports/rollback/driver-ltsb"),
    ({}, "rollback", "/var/lib/gpufleet/reports/rollback/manual"),
])
def test_rollback_ids_as_the_job_templates_them(calls, job_vars, rollback_id, report_dir):
    """The rollback job's id and report directory, templated in the job as ansible-playbook would."""
    (rollback,) = [args for args in _by_module(calls, "job_template") if args["name"] == "gpufleet rollback"]
    job = Templar(loader=DataLoader(), variables=job_vars)
    extra_vars = {k: trust_as_template(v) if isinstance(v, str) else v for k, v in rollback["extra_vars"].items()}
    assert job.template(extra_vars["rollback_id"]) == rollback_id
    assert job.template(extra_vars["rollback_report_dir"]) == report_dir


def test_surveys_follow_awx_survey_rules(calls):
    """AWX's checks of a survey spec (awx/api/views/__init__.py, JobTemplateSurveySpec._validate_spec_data)."""
    surveys = [args["survey_spec"] for args in _by_module(calls, "job_template") + _by_module(calls, "workflow_job_template")
               if "survey_spec" in args]
    assert len(surveys) == 3
    for survey in surveys:
        assert isinstance(survey["name"], str) and isinstance(survey["description"], str) and survey["spec"]
        variables = [question["variable"] for question in survey["spec"]]
        assert len(variables) == len(set(variables))
        for question in survey["spec"]:
            assert all(isinstance(question[k], str) for k in ("type", "question_name", "variable"))
            assert isinstance(question["required"], bool)
            assert question["type"] in SURVEY_TYPES
            if question.get("default", "") != "":
                assert isinstance(question["default"], SURVEY_TYPES[question["type"]])
            assert all(isinstance(question[k], int) for k in ("min", "max") if question.get(k) is not None)
            if question["type"] == "text" and question.get("default"):
                assert question["min"] <= len(question["default"]) <= question["max"]


def test_node_and_schedule_variables_are_accepted_at_launch(calls):
    """AWX takes a launch's variables only if the template prompts for them or its survey asks them.

    awx/main/models/mixins.py, SurveyJobTemplateMixin._accept_or_ignore_variables: survey
    variables are accepted, then everything if ask_variables_on_launch, else the rest is refused
    ("Variables ... are not allowed on launch").
    """
    jts = {args["name"]: args for args in _by_module(calls, "job_template")}

    def accepts(template, names):
        asked = {q["variable"] for q in template.get("survey_spec", {}).get("spec", [])}
        return template["ask_variables_on_launch"] or set(names) <= asked

    (workflow,) = _by_module(calls, "workflow_job_template")
    checked = 0
    for node in workflow["workflow_nodes"]:
        if node.get("extra_data"):
            assert accepts(jts[node["unified_job_template"]["name"]], node["extra_data"]), node["identifier"]
            checked += 1
    for schedule in _by_module(calls, "schedule"):
        if schedule.get("extra_data"):
            assert accepts(jts[schedule["unified_job_template"]], schedule["extra_data"]), schedule["name"]
            assert not jts[schedule["unified_job_template"]]["ask_variables_on_launch"]
            checked += 1
    assert checked == 5
    assert {s["unified_job_template"] for s in _by_module(calls, "schedule")} == {
        "gpufleet facts", "gpufleet drift report", "gpufleet rollout step"}


def test_rollout_variables_are_ones_the_playbooks_read(calls):
    """Every variable handed to the rollout jobs passes the rollout's own unknown-variable check."""
    sys.path.insert(0, os.path.join(REPO, ".build", "collections"))
    from ansible_collections.gpufleet.nvidia.plugins.action.rollout_step import known_variables, unknown_variables  # pylint: disable=import-outside-toplevel

    jts = {args["name"]: args for args in _by_module(calls, "job_template")}
    (workflow,) = _by_module(calls, "workflow_job_template")
    names = set(workflow["extra_vars"]) | {q["variable"] for q in workflow["survey_spec"]["spec"]}
    for jt in ("gpufleet rollout stage", "gpufleet rollout step", "gpufleet rollback"):
        names |= set(jts[jt]["extra_vars"]) | {q["variable"] for q in jts[jt].get("survey_spec", {}).get("spec", [])}
    names |= {k for node in workflow["workflow_nodes"] for k in node.get("extra_data", {})}
    names |= {k for s in _by_module(calls, "schedule") for k in s.get("extra_data", {})}
    assert {"rollout_single_step", "rollout_stages", "rollout_id", "rollout_report_dir", "driver_branch",
            "rollback_hosts"} <= names
    assert unknown_variables(sorted(names), known_variables()) == []
    assert unknown_variables(["rollout_single_stepp"], known_variables()) != []


def test_secrets_are_never_printed(play):
    assert play["no_log"] == "{{ gpufleet_awx_no_log | default(true) | bool }}"
    secrets = ("gpufleet_awx_controller_token", "gpufleet_awx_controller_password")
    for task in play["tasks"]:
        text = json.dumps(task, default=str)
        assert not any(secret in text for secret in secrets), task["name"]
        assert task.get("no_log", True) is True or _module(task) is None
    assert all(secret in json.dumps(play["module_defaults"], default=str) for secret in secrets)
