# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Action plugin of gpufleet.nvidia.driver_install: the driver role's repository and transaction in one task.

The driver role's tasks between its facts and its report (the distribution and repository of the
node, the signing key checked against its pinned fingerprint, the apt repository, the GPUs read,
the driver transaction) cost the controller a task each whatever they did; this action runs the
same modules in one. The decisions are ``module_utils.distributions`` and
``module_utils.driver_repository``'s; the transaction is the ``driver_transaction`` module's.
"""

from __future__ import annotations

import time

from ansible.errors import AnsibleActionFail, AnsibleError

from ansible_collections.gpufleet.nvidia.plugins.module_utils import distributions
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_repository as repository
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_action import NodeAction, add_diff, without_unset

#: The phases, in order: the repository (key, sources entry, package lists; on dnf the role's
#: tasks write its files between the two phases), then the transaction.
PHASES = ("repository", "install")

ARGUMENT_SPEC = {
    "phases": {"type": "list", "elements": "str", "default": list(PHASES), "choices": list(PHASES)},
    "repository": {"type": "dict", "required": True, "options": {
        "manage": {"type": "bool", "default": True},
        "url": {"type": "str", "default": ""},
        "suite": {"type": "str", "default": "/"},
        "components": {"type": "list", "elements": "str", "default": []},
        "key_fingerprint": {"type": "str", "default": ""},
        "key_content": {"type": "str", "default": "", "no_log": False},
        "key_src": {"type": "str", "default": ""},
        "key_url": {"type": "str", "default": ""},
    }},
    "transaction": {"type": "dict", "default": {}},
    "facts": {"type": "bool", "default": True},
}

#: driver_transaction's return values the action does not pass on in ``plan``.
_PLAN_LEFT_OUT = ("installed", "installed_after", "local_facts_previous")

#: driver_transaction's options that mean "not given" when empty (the role passes them as "").
_EMPTY_MEANS_UNSET = ("version", "today", "catalog")


class ActionModule(NodeAction):
    """Configure the driver repository and run the driver transaction on the node."""

    NAME = "driver_install"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        """Run ``phases`` (the options and the result are in ``plugins/modules/driver_install.py``).

        :returns: ``{"changed", "distribution", "repo" (module_utils.driver_repository.repository_config),
            "key" (the armored key), "repository_changed", "repository_query", ["plan" (the
            driver_transaction module's result), "driver_result" (the role's ``driver_result``),
            ["ansible_facts": {"nvidia"}: with ``facts``]]}``.
        :raises AnsibleActionFail: bad arguments, a distribution the collection does not support, a
            signing key that is not the pinned one, a module that failed (named).
        """
        result = super(ActionModule, self).run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self.validated_args()
        warnings = []
        facts = dict(task_vars.get("ansible_facts") or {})
        try:
            distribution = distributions.distribution_id(
                facts.get("distribution"), facts.get("distribution_major_version"), facts.get("distribution_version"))
        except distributions.PlanError as exc:
            raise AnsibleActionFail("driver_install: %s" % exc.message)
        repo_args = args["repository"]
        try:
            repo = repository.repository_config(
                distribution, url=repo_args["url"] or None, fingerprint=repo_args["key_fingerprint"] or None,
                suite=repo_args["suite"] or "/", components=repo_args["components"] or [])
        except distributions.PlanError as exc:
            raise AnsibleActionFail("driver_install: %s" % exc.message)
        result.update(changed=False, distribution=distribution, repo=repo, repository_changed=False)
        key = ""
        if repo_args["manage"]:
            key = self._key(repo_args, repo, task_vars, warnings)
            checked = repository.check_signing_key(key, repo["fingerprint"])
            if not checked.get("ok"):
                raise AnsibleActionFail("driver_install: %s" % checked.get("message"))
            result["key"] = key
            if "repository" in args["phases"] and repo["package_manager"] == "apt":
                configured = self._module("gpufleet.nvidia.driver_apt_repository", {
                    "keyring_path": repo["keyring_path"], "key": key, "sources_path": repo["sources_path"],
                    "sources_content": repo["sources_content"]}, task_vars, "configure the apt repository", warnings)
                result["repository_changed"] = bool(configured.get("changed"))
                result["changed"] = result["repository_changed"]
                add_diff(result, configured.get("diff"))
        result["repository_query"] = {
            "url": repo["url"], "suite": repo.get("suite") or "/", "components": repo.get("components") or [],
            "key": key,
            "preview": bool(self._task.check_mode and repo["package_manager"] == "apt" and result["repository_changed"]),
        }
        if "install" in args["phases"]:
            self._install(args, distribution, result, task_vars, warnings)
        if warnings:
            result["warnings"] = warnings
        return result

    def _key(self, repo_args, repo, task_vars, warnings):
        """The repository's armored signing key: given, a file on the controller, or downloaded by the node."""
        if repo_args["key_content"]:
            return repo_args["key_content"]
        if repo_args["key_src"]:
            try:
                path = self._find_needle("files", repo_args["key_src"])
                with open(path, "r", encoding="utf-8") as handle:
                    return handle.read()
            except (OSError, UnicodeDecodeError, AnsibleError) as exc:
                raise AnsibleActionFail("driver_install: cannot read the repository key %s: %s" % (repo_args["key_src"], exc))
        url = repo_args["key_url"] or repo["key_url"]
        # The key is read even in check mode: the plan is checked against it.
        check_mode = self._task.check_mode
        self._task.check_mode = False
        try:
            downloaded = self._module("ansible.builtin.uri", {"url": url, "return_content": True}, task_vars,
                                      "download the repository key", warnings)
        finally:
            self._task.check_mode = check_mode
        return downloaded.get("content") or ""

    def _install(self, args, distribution, result, task_vars, warnings):
        """Read the GPUs and run the driver transaction (driver_transaction module)."""
        gpu = self._module("gpufleet.nvidia.gpu_facts", {"kernel_log": False}, task_vars,
                           "read the GPUs and the driver state", warnings)
        nvidia = (gpu.get("ansible_facts") or {}).get("nvidia") or {}
        driver = nvidia.get("driver") or {}
        module_args = without_unset(args["transaction"] or {}, _EMPTY_MEANS_UNSET)
        module_args.update(gpus=list(nvidia.get("gpus") or []), distribution=distribution,
                           repository=dict(result["repository_query"]))
        local = module_args.get("local_facts")
        if isinstance(local, dict):
            # The version loaded at the start of the run becomes last known-good when it was
            # healthy and the recorded one (mark_known_good).
            module_args["local_facts"] = dict(local, loaded_version=driver.get("loaded_version"),
                                              driver_state=driver.get("state"))
        plan = self._module("gpufleet.nvidia.driver_transaction", module_args, task_vars,
                            "install and pin the driver set", warnings)
        add_diff(result, plan.pop("diff", None))
        # The package lists before and after, and the local facts before, stay on the node's side
        # (the role reads none of them; every byte of a result is walked by ansible-playbook).
        result["plan"] = dict((key, value) for key, value in plan.items() if key not in _PLAN_LEFT_OUT)
        result["loaded_version"] = driver.get("loaded_version")
        result["reboot_required"] = plan["resolved"]["version"] != driver.get("loaded_version")
        if args["facts"]:
            result["ansible_facts"] = {"nvidia": nvidia}
        result["finished_epoch"] = time.time()
        # The role's driver_result in one piece (its set_fact templates one value, not ten).
        result["driver_result"] = {
            "resolved": plan["resolved"], "action": plan.get("action"),
            "previous_version": (plan.get("plan") or {}).get("current_version"),
            "steps": (plan.get("plan") or {}).get("steps"), "reboot_required": result["reboot_required"],
            "loaded_version": result["loaded_version"], "local_facts": plan.get("local_facts"),
            "services": plan.get("services") or {}, "finished_epoch": result["finished_epoch"]}
        result["changed"] = result["changed"] or bool(plan.get("changed"))
