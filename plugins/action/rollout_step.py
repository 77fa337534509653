# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Controller side of a rollout step: plan (validate), choose the step's hosts, admit a node (its
drain, then its install), record a node released untouched at a stop."""

from __future__ import annotations

import difflib
import json
import math
import os
import time

import yaml
from ansible import constants as C
from ansible import context
from ansible.errors import AnsibleActionFail
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

from ansible_collections.gpufleet.nvidia.plugins.module_utils import state_file
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import node_states, rollout_budget, rollout_journal, rollout_report
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import scheduler_state
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_action import ControllerAction
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.controller_run import run_alive

ARGUMENT_SPEC = {
    "state": {"type": "str", "required": True, "choices": ["plan", "choose", "admit", "install", "released",
                                                           "unfinished", "waiting"]},
    "report_dir": {"type": "path", "required": True},
    "rollout_id": {"type": "str"},
    "stages": {"type": "dict"},
    "options": {"type": "dict", "default": {}},
    "class_prefix": {"type": "str", "default": "gpu_"},
    "domain_prefix": {"type": "str", "default": ""},
    "allow_missing_stages": {"type": "list", "elements": "str", "default": []},
    "check_variables": {"type": "bool", "default": True},
    "step_hosts": {"type": "int", "default": 0},
    "node": {"type": "str"},
    "candidates": {"type": "list", "elements": "str", "default": []},
    "run_id": {"type": "str"},
    "poll_s": {"type": "float", "default": 2.0},
    "squeue": {"type": "list", "elements": "str", "default": []},
    "slurm_names": {"type": "dict", "default": {}},
    "allow_concurrent": {"type": "bool", "default": False},
    "concurrent_stale_s": {"type": "float", "default": 21600.0},
    # Extra vars arrive as text: read by pass_settings, which names a bad value at the plan.
    "pass_s": {"type": "raw", "default": 60.0},
    "passes": {"type": "raw", "default": 60},
    "timeout_s": {"type": "float", "default": 0.0},
}

#: playbooks/rollout.yml imports rollout_step.yml this many times: the most passes of one run.
MAX_PASSES = 60

#: The collection's variable prefixes: a name under one of them that no role or playbook knows
#: is a typo, refused before any host is touched.
PREFIXES = ("driver_", "kernel_hold_", "gpu_policy_", "node_upgrade_", "rollout_", "drift_")


def unknown_variables(names, known):
    """Names under the collection's prefixes that are not known, each with the closest known name.

    :param names: variable names in play (extra vars, host and group vars).
    :param known: every variable the roles and playbooks read.
    :returns: ``[(name, closest or None)]`` in sorted order.
    """
    known = set(known)
    out = []
    for name in sorted(set(names)):
        if name.startswith(PREFIXES) and name not in known:
            close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
            out.append((name, close[0] if close else None))
    return out


_COLLECTION = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def role_argument_specs(role, root=_COLLECTION):
    """A role's argument specs by entry point (I/O: reads YAML).

    Source: ``roles/<role>/meta/argument_specs.yml``, the specs Ansible checks when the role is
    included.

    :returns: ``{entry point: {"options": {...}, ...}}``; ``{}`` when the role has none.
    """
    path = os.path.join(root, "roles", role, "meta", "argument_specs.yml")
    if not os.path.exists(path):
        return {}
    with open(path, "r", encoding="utf-8") as handle:
        return (yaml.safe_load(handle) or {}).get("argument_specs") or {}


def known_variables(root=_COLLECTION):
    """Every variable the collection reads or sets under its prefixes (I/O: reads YAML).

    Source: each role's argument specs (all entry points, :func:`role_argument_specs`) and
    ``playbooks/vars/known_variables.yml`` (playbook variables and the results roles set).
    """
    names = set()
    roles = os.path.join(root, "roles")
    for role in sorted(os.listdir(roles)) if os.path.isdir(roles) else []:
        for entry in role_argument_specs(role, root).values():
            names.update((entry.get("options") or {}).keys())
    with open(os.path.join(root, "playbooks", "vars", "known_variables.yml"), "r", encoding="utf-8") as handle:
        names.update(yaml.safe_load(handle).get("gpufleet_known_variables") or [])
    return names


#: What a role's argument spec says of a value; the rest (description, default) is the role's own.
_SPEC_KEYS = ("type", "elements", "choices")


def role_options(role, entry="main", root=_COLLECTION):
    """A role entry point's options as an argument spec of their values (I/O: reads YAML).

    Source: :func:`role_argument_specs`. Only ``type``, ``elements`` and ``choices`` are kept: a
    default or ``required`` is the role's business, not the inventory's.

    :returns: ``{option: {"type", ["elements"], ["choices"]}}``; ``{}`` when the role has none.
    """
    entry_spec = role_argument_specs(role, root).get(entry) or {}
    return dict((name, dict((key, option[key]) for key in _SPEC_KEYS if key in option))
                for name, option in (entry_spec.get("options") or {}).items())


def invalid_values(values_by_host, spec):
    """The hosts' values that the spec refuses, each named: ``["<host>: <message>"]`` in host order.

    :param values_by_host: ``{host: {option: value}}``, the options each host sets (inventory,
        group and extra vars; strings from extra vars are checked as Ansible checks them, so
        ``"true"`` is a bool and ``"5"`` an int).
    :param spec: :func:`role_options`.
    """
    validator = ArgumentSpecValidator(spec)
    out = []
    for host, values in values_by_host.items():
        result = validator.validate(dict((name, value) for name, value in values.items() if name in spec))
        out.extend("%s: %s" % (host, message) for message in result.error_messages)
    return out


def plan_nodes(stages, groups, class_prefix, domain_prefix):
    """The rollout's nodes in priority order: ``[{"name", "stage", "class", "domain"}]``.

    :param stages: ``{"golden": [hosts], "canary": [hosts], "waves": [hosts]}`` (a host in two
        stages keeps the first).
    :param groups: the inventory's ``groups`` (group → hosts).
    """
    member = {}
    for group, hosts in groups.items():
        for host in hosts:
            member.setdefault(host, []).append(group)
    nodes = []
    seen = set()
    for stage in rollout_budget.STAGES:
        for host in stages.get(stage) or []:
            if host in seen:
                continue
            seen.add(host)
            names = sorted(member.get(host, []))
            klass = next((g for g in names if g.startswith(class_prefix)), "unclassified")
            domain = next((g for g in names if domain_prefix and g.startswith(domain_prefix)), None)
            nodes.append({"name": host, "stage": stage, "class": klass, "domain": domain})
    return nodes


#: Below this internal_poll_interval (seconds) the free strategy's main loop spins (docs/rollout.md).
POLL_INTERVAL_MIN = 0.01


def poll_interval_warning(interval, nodes):
    """A warning when ansible.cfg's ``internal_poll_interval`` makes the rollout's plays spin, else ``None``.

    The rollout's plays use the free strategy: each time its main loop wakes it looks for the
    next task of every host of the play, blocked ones included (ansible-core
    ``plugins/strategy/free.py``), and it sleeps ``internal_poll_interval`` between rounds.
    At Ansible's default of 0.001 s that loop, not the tasks, is most of the controller's CPU
    (benchmarks/rollout/README.md).

    :param interval: the configured value in seconds (``DEFAULT_INTERNAL_POLL_INTERVAL``).
    :param nodes: the rollout's node count (for the message).
    """
    if interval is None or float(interval) >= POLL_INTERVAL_MIN:
        return None
    return ("internal_poll_interval is %s s: the rollout's free-strategy plays look for the next task of each "
            "of up to %d hosts %d times a second, which costs the controller more CPU than the transactions; "
            "set internal_poll_interval = 0.02 under [defaults] in ansible.cfg (docs/rollout.md)"
            % (interval, nodes, int(1 / max(float(interval), 1e-6))))


ESTIMATES = "drain_estimates.json"


def drain_ends(outputs, slurm_names, now):
    """When each node's drain can be over at the latest, from its Slurm controllers' ``squeue``.

    :param outputs: ``squeue --noheader --states=RUNNING,COMPLETING --format=%N|%L`` outputs, one
        per Slurm controller (``scheduler_state.slurm_drain_estimates``).
    :param slurm_names: ``{inventory host: Slurm node name or None}`` (None: the host's short name).
    :param now: epoch seconds.
    :returns: ``{inventory host: epoch seconds}`` for the hosts with a running job that has a
        time limit; an idle node has none (its drain is quick).
    """
    left = {}
    for text in outputs or []:
        for name, seconds in scheduler_state.slurm_drain_estimates(text).items():
            left[name] = max(left.get(name, 0.0), seconds)
    return dict((host, now + left[name]) for host, name in slurm_nodes(slurm_names).items() if name in left)


def slurm_nodes(slurm_names):
    """The Slurm node name of each inventory host: its ``slurm_node_name``, or its short name.

    :param slurm_names: ``{inventory host: Slurm node name or None}``.
    :returns: ``{inventory host: Slurm node name}``, both as text.
    """
    return dict((str(host), str(name) if name not in (None, "") else str(host).split(".", maxsplit=1)[0])
                for host, name in (slurm_names or {}).items())


def pass_settings(pass_s, passes):
    """``rollout_pass_s`` and ``rollout_passes`` as numbers, or what is wrong with them.

    :param pass_s: seconds (text or number), more than 0 and at most 86400.
    :param passes: a whole number (text or number) from 1 to :data:`MAX_PASSES`.
    :returns: ``(pass_s float, passes int, [problems])``; on a problem the bad value is ``None``.
    """
    problems = []
    try:
        seconds = float(pass_s)
        if isinstance(pass_s, bool) or not 0 < seconds <= 86400:
            raise ValueError
    except (TypeError, ValueError):
        seconds = None
        problems.append("rollout_pass_s must be more than 0 and at most 86400 seconds, got %r" % (pass_s,))
    try:
        count = int(str(passes).strip())
        if isinstance(passes, bool) or not 1 <= count <= MAX_PASSES:
            raise ValueError
    except (TypeError, ValueError):
        count = None
        problems.append("rollout_passes must be a whole number from 1 to %d (the passes rollout.yml holds), got %r"
                        % (MAX_PASSES, passes))
    return seconds, count, problems


def busy_hosts(outputs, slurm_names):
    """The inventory hosts whose Slurm node runs a job now, from the controllers' ``squeue``.

    :param outputs: as :func:`drain_ends`. :param slurm_names: ``{inventory host: Slurm node name
        or None}`` (only these hosts are Slurm's).
    :returns: a set of inventory hosts, or ``None`` when an output has a line that cannot be read
        (``scheduler_state.slurm_busy_nodes``) or no Slurm controller answered: unknown.
    """
    if not outputs or not slurm_names:
        return None
    names = set()
    for text in outputs:
        found = scheduler_state.slurm_busy_nodes(text)
        if found is None:
            return None
        names.update(found)
    return set(host for host, name in slurm_nodes(slurm_names).items() if name in names)


def pace(events, run_id, pass_s, now, sleep=time.sleep):
    """Wait until ``pass_s`` seconds after this run's last pass began (I/O: sleeps).

    :param events: the journal's events (``rollout_journal.read_journal``), oldest first.
    :param pass_s: seconds between the starts of two passes. :param now: epoch seconds.
    :returns: how many seconds it waited, and the number of the pass that begins now (1 for the
        run's first).
    """
    found = rollout_journal.passes(events, run_id)
    if not found:
        return 0.0, 1
    wait = max(0.0, min(pass_s, found[-1]["time"] + pass_s - now))
    if wait > 0:
        sleep(wait)
    return wait, int(found[-1]["pass"] or len(found)) + 1


def write_estimates(directory, ends):
    """Keep the drain ends of this step beside the journal (I/O: ``state_file.write_atomic`` in the
    report directory, made 0700 when missing)."""
    state_file.private_dir(directory)
    state_file.write_atomic(os.path.join(directory, ESTIMATES),
                            json.dumps({"ends": ends}, sort_keys=True, allow_nan=False), 0o600)


def read_estimates(directory):
    """The drain ends :func:`write_estimates` kept, ``{host: epoch}``; ``{}`` when absent or unreadable
    (``state_file.read``: bounded, no NaN or infinity); entries that are not a host and a number are left out."""
    found = state_file.read(os.path.join(directory, ESTIMATES))["content"]
    ends = found.get("ends") if isinstance(found, dict) else None
    if not isinstance(ends, dict):
        return {}
    return dict((str(k), float(v)) for k, v in ends.items()
                if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v))


def with_estimates(nodes, ends, now):
    """``nodes`` (``rollout_journal.fleet_state``) with ``drain_estimate_s`` (seconds left, at least 0)
    where a drain end is known."""
    if not ends:
        return nodes
    for node in nodes:
        if node["name"] in ends:
            node["drain_estimate_s"] = max(0.0, ends[node["name"]] - now)
    return nodes


def _journal_stamp(directory):
    try:
        return os.stat(os.path.join(directory, rollout_journal.JOURNAL)).st_mtime_ns
    except OSError:
        return 0


def wait_on_journal(directory, poll_s, step):
    """Call ``step(journal)`` under the journal's lock each time the journal changes, every ``poll_s``
    seconds, until it returns something other than ``None``; return that (I/O: reads the journal).

    ``step`` may append to the journal (it holds the lock); what it appended does not count as a
    change to wake it again.
    """
    seen = None
    while True:
        with rollout_journal.locked(directory):
            if _journal_stamp(directory) != seen:
                out = step(rollout_journal.read(directory))
                if out is not None:
                    return out
                seen = _journal_stamp(directory)
        time.sleep(poll_s)


def _load_plan(directory):
    found = state_file.read(os.path.join(directory, "plan.json"))
    plan = found["content"]
    if not isinstance(plan, dict) or not isinstance(plan.get("nodes", []), list):
        raise AnsibleActionFail("rollout_step: no readable plan.json in %s (%s): run the plan first" % (
            directory, found["unreadable"] or ("absent" if not found["exists"] else "nodes is not a list")))
    return plan


def journal_read(directory):
    """``rollout_journal.read_journal``, refused when the journal itself cannot be read.

    :raises AnsibleActionFail: naming the journal and why (deciding on an empty journal would
        start nodes again).
    """
    found = rollout_journal.read_journal(directory)
    if found["unreadable"]:
        raise AnsibleActionFail("rollout_step: %s: move it away only once you know what it held" % found["unreadable"])
    return found


def journal_lost(result, found):
    """Put the journal's lost lines in a step's result: ``journal_lost`` (how many),
    ``journal_lost_lines`` (the first 20 ``unreadable: journal.jsonl:<line>: <why>``) and a warning."""
    result["journal_lost"] = len(found["lost"])
    result["journal_lost_lines"] = [entry["text"] for entry in found["lost"][:20]]
    summary = rollout_journal.lost_summary(found["lost"])
    if summary:
        result.setdefault("warnings", []).append(summary)


#: The hosts of the next step (the simulation's fixed-step executor runs the same function).
choose_hosts = rollout_budget.step_hosts


class ActionModule(ControllerAction):
    """plan: validate and write the plan; choose: the next step's hosts; admit: wait for a slot;
    install: wait for the install admission after the drain; released: the node is back in service."""

    NAME = "rollout_step"
    ARGUMENT_SPEC = ARGUMENT_SPEC

    def run(self, tmp=None, task_vars=None):
        """Run one state (the options and results are in ``plugins/modules/rollout_step.py``).

        :raises AnsibleActionFail: bad options, a report directory others can write, or a state
            file that cannot be read (each named).
        """
        try:
            return self._run(tmp, task_vars)
        except (state_file.Unreadable, state_file.UnsafeDirectory) as exc:
            raise AnsibleActionFail("rollout_step: %s" % exc)

    def _run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars)
        args = self.validated_args()
        directory = os.path.abspath(args["report_dir"])
        result["changed"] = False
        result["report_dir"] = directory
        try:
            options = rollout_budget.normalize_options(args["options"])
        except ValueError as exc:
            if args["state"] == "plan":
                raise AnsibleActionFail("rollout refused before any host was touched: %s" % exc)
            raise AnsibleActionFail("rollout_step: %s" % exc)
        if args["state"] == "plan":
            return self._plan(result, args, options, task_vars or {})
        if args["state"] == "choose":
            plan = _load_plan(directory) if not self._task.check_mode else {"nodes": []}
            limit = args["step_hosts"] or int(context.CLIARGS.get("forks") or 5)
            now = time.time()
            ends = drain_ends(args["squeue"], args["slurm_names"], now)
            if not self._task.check_mode and (ends or os.path.exists(os.path.join(directory, ESTIMATES))):
                write_estimates(directory, ends)
            passes = options["executor"] == "passes"
            found = journal_read(directory)
            if passes and not self._task.check_mode:
                pass_s, _count, problems = pass_settings(args["pass_s"], MAX_PASSES)
                if problems:
                    raise AnsibleActionFail("rollout_step: %s" % problems[0])
                result["waited_s"], number = pace(found["events"], args["run_id"], pass_s, now)
                if result["waited_s"] > 0:
                    # Nodes acted while this pass waited: decide on the journal as it is now.
                    found = journal_read(directory)
            journal_lost(result, found)
            nodes = with_estimates(rollout_journal.fleet_state(plan, found["nodes"]), ends, time.time())
            if passes:
                decision, hosts = rollout_budget.pass_hosts(nodes, options, limit,
                                                            busy_hosts(args["squeue"], args["slurm_names"]),
                                                            time.time())
            else:
                decision, hosts = choose_hosts(nodes, options, limit)
            result["drain_estimates"] = len(ends)
            # Every node's state in one place (plugin_utils.node_states), as the journal tells it.
            result["node_states"] = node_states.count_states(found["nodes"], [n["name"] for n in nodes])
            result["in_flight"] = decision["in_flight"]
            # Chosen nodes whose reboot their scheduler runs: the step asks each whether it answers
            # before it takes it up (one mid-reboot waits for a later step, not in a worker).
            chosen = set(hosts)
            result["pending"] = [n["name"] for n in nodes if n.get("pending") and n["name"] in chosen]
            if passes and not self._task.check_mode:
                result["pass"] = number
                rollout_journal.append(directory, {"event": "pass", "run_id": args["run_id"], "pass": number,
                                                   "time": time.time(), "hosts": hosts,
                                                   "states": result["node_states"]})
            # A stopped rollout's step takes its nodes in flight (to release or finish them); when
            # they fill the step, the next step takes the rest.
            result["limit"] = limit
            result.update({"action": decision["action"], "hosts": hosts, "stop": decision["stop"],
                           "classes": decision["budgets"], "quarantined": decision["quarantined"],
                           "deferred": decision["deferred"], "stages": decision["stages"]})
            return result
        if args["state"] == "unfinished":
            found = journal_read(directory)
            journal_lost(result, found)
            journal = found["nodes"]
            result["unfinished"] = rollout_journal.unfinished(journal, args["candidates"])
            result["pending"] = rollout_journal.pending(journal, args["candidates"])
            return result
        if args["state"] == "install":
            return self._install(result, args, options, directory)
        if args["state"] == "waiting":
            return self._waiting(result, args, options, directory)
        if args["state"] == "released":
            if not args["node"]:
                raise AnsibleActionFail("rollout_step: state=released needs node")
            if not self._task.check_mode:
                rollout_journal.append(directory, {"event": "released", "node": args["node"], "run_id": args["run_id"],
                                                   "time": time.time()})
            result["changed"] = True
            return result
        return self._admit(result, args, options, directory)

    def _plan(self, result, args, options, task_vars):
        stages = args["stages"] or {}
        problems = []
        names = set(task_vars.get("vars", {}) if isinstance(task_vars.get("vars"), dict) else ())
        names.update(k for k in task_vars if isinstance(k, str))
        spec = role_options("node_upgrade")
        node_values = {}
        for host in (stages.get("golden") or []) + (stages.get("canary") or []) + (stages.get("waves") or []):
            hostvars = task_vars.get("hostvars", {}).get(host) or {}
            keys = [k for k in hostvars.keys() if isinstance(k, str)]
            names.update(keys)
            node_values[host] = {}
            for key in keys:
                if key in spec:
                    try:
                        node_values[host][key] = hostvars[key]
                    except Exception:  # pylint: disable=broad-except
                        # A value that cannot be templated yet (it names a variable set later) is
                        # left to the modules and actions that read it.
                        continue
        if args["check_variables"]:
            for name, close in unknown_variables(names, known_variables()):
                problems.append("unknown variable %s%s" % (name, (" (did you mean %s?)" % close) if close else ""))
        # node_upgrade's argument spec, checked here for every node before any is touched: the
        # steps include the role without checking it again on each node (one task fewer per node).
        problems.extend(invalid_values(node_values, spec))
        total = sum(len(stages.get(stage) or []) for stage in rollout_budget.STAGES)
        if total == 0:
            problems.append("the rollout matches no host: check rollout_hosts and the inventory")
        else:
            for stage in ("golden", "canary"):
                if not stages.get(stage) and stage not in args["allow_missing_stages"]:
                    problems.append("the %s stage has no host: add hosts to the %s group, or set "
                                    "rollout_allow_no_%s=true to roll out without it" % (stage, stage, stage))
        problems.extend(pass_settings(args["pass_s"], args["passes"])[2])
        nodes = plan_nodes(stages, task_vars.get("groups", {}), args["class_prefix"], args["domain_prefix"])
        if not args["allow_concurrent"]:
            for other in rollout_journal.concurrent_rollouts(
                    os.path.dirname(result["report_dir"]), args["rollout_id"], [n["name"] for n in nodes], time.time(),
                    args["concurrent_stale_s"], run_alive):
                problems.append("rollout %s is running on %d of these nodes (%s; run %s, last written %d s ago, "
                                "report %s): let it finish or stop it, or set rollout_allow_concurrent=true if you "
                                "mean to" % (other["rollout_id"], len(other["overlap"]), ", ".join(other["overlap"][:5])
                                             + (", ..." if len(other["overlap"]) > 5 else ""), other["run_id"],
                                             other["age_s"], other["report_dir"]))
        if problems:
            raise AnsibleActionFail("rollout refused before any host was touched: %s" % "; ".join(problems))
        result["nodes"] = len(nodes)
        poll = poll_interval_warning(C.config.get_config_value("DEFAULT_INTERNAL_POLL_INTERVAL"), len(nodes))
        if poll:
            result["warnings"] = [poll]
        result["classes"] = rollout_budget.budgets([dict(n, status="pending") for n in nodes], options)
        if self._task.check_mode:
            return result
        plan = {"rollout_id": args["rollout_id"], "nodes": nodes, "options": args["options"],
                "stages": [{"name": stage, "hosts": [n["name"] for n in nodes if n["stage"] == stage]}
                           for stage in rollout_budget.STAGES]}
        # write_plan keeps the first start time and the runs of an earlier plan of this rollout.
        result["plan_path"] = rollout_report.write_plan(result["report_dir"], plan)
        return result

    def _admit(self, result, args, options, directory):
        node = args["node"]
        if not node:
            raise AnsibleActionFail("rollout_step: state=admit needs node")
        if self._task.check_mode:
            result["admitted"] = True
            return result
        plan = _load_plan(directory)
        candidates = set(args["candidates"] or [node])
        ends = read_estimates(directory)

        def step(journal):
            mine = journal.get(node) or {}
            if mine.get("status") == "in_flight":
                if mine.get("pending") or mine.get("waiting"):
                    rollout_journal.append_in_lock(directory, {
                        "event": "resumed", "node": node, "run_id": args["run_id"], "time": time.time()})
                return {"admitted": True, "resumed": True, "why": "resumes its transaction"}
            if mine.get("status") in ("done", "failed", "refused"):
                return {"admitted": False, "why": "already %s in this rollout" % mine["result"]}
            nodes = with_estimates(rollout_journal.fleet_state(plan, journal), ends, time.time())
            decision = rollout_budget.decide(nodes, options, candidates=candidates)
            if node in decision["start"]:
                event = {"event": "started", "node": node, "run_id": args["run_id"], "time": time.time()}
                if options["drain_ahead"]:
                    # Its install waits for a second admission (state=install) after its drain.
                    event["draining"] = True
                rollout_journal.append_in_lock(directory, event)
                return {"admitted": True, "resumed": False, "why": "a slot of class %s is free"
                        % next(n["class"] for n in nodes if n["name"] == node)}
            if decision["action"] in ("stop", "done"):
                return {"admitted": False, "why": (decision["stop"] or {}).get("reason") or "done",
                        "stop": decision["stop"]}
            if not decision["in_flight"] and not decision["start"]:
                return {"admitted": False, "why": "no slot can free up in this step"}
            if options["executor"] == "passes":
                # A pass takes only nodes that may start: one that lost its slot meanwhile waits
                # for a later pass, holding no worker.
                return {"admitted": False, "why": "no slot is free now; a later pass starts it"}
            return None

        result.update(wait_on_journal(directory, args["poll_s"], step))
        return result

    def _install(self, result, args, options, directory):
        """Wait until the drained node's install is admitted (``rollout_budget.install_admissions``).

        :returns: ``admitted`` true (journal ``installing``), or false with ``released`` true and
            ``why`` when the rollout stopped before it: the node goes back to service untouched;
            with ``rollout_executor: passes``, false with ``waiting`` true (journal ``waiting``)
            when its install may not begin now: the pass leaves it, drained, for a later one.
            A node whose journal says nothing of its drain (an older run), and any node with
            ``drain_ahead`` off, is admitted at once.
        """
        node = args["node"]
        if not node:
            raise AnsibleActionFail("rollout_step: state=install needs node")
        result.update({"admitted": True, "released": False, "waiting": False})
        if self._task.check_mode or not options["drain_ahead"]:
            return result
        plan = _load_plan(directory)

        def step(journal):
            mine = journal.get(node) or {}
            if mine.get("status") != "in_flight":
                raise AnsibleActionFail("rollout_step: %s is not in flight in this rollout (journal: %s)"
                                        % (node, mine.get("status") or "not started"))
            if not mine.get("draining") and not mine.get("drained"):
                return {"why": "its install was admitted before"}
            if mine.get("draining"):
                rollout_journal.append_in_lock(directory, {"event": "drained", "node": node,
                                                           "run_id": args["run_id"], "time": time.time()})
                journal = rollout_journal.read(directory)
            nodes = rollout_journal.fleet_state(plan, journal)
            decision = rollout_budget.decide(nodes, options)
            if node in decision["install"]:
                rollout_journal.append_in_lock(directory, {"event": "installing", "node": node,
                                                           "run_id": args["run_id"], "time": time.time()})
                mine = next(n for n in nodes if n["name"] == node)
                return {"why": "the %s stage of class %s is open" % (
                    decision["stages"].get(mine["class"], mine["stage"]), mine["class"])}
            if decision["action"] == "stop":
                return {"admitted": False, "released": True, "stop": decision["stop"],
                        "why": "the rollout stopped before its install: %s" % (decision["stop"] or {}).get("reason")}
            if options["executor"] == "passes":
                # Waiting is a state: the node stays drained, in flight, holding its slot and its
                # lock; a later pass takes it up once its install is admitted (rollout_budget.pass_hosts).
                rollout_journal.append_in_lock(directory, {"event": "waiting", "node": node,
                                                           "run_id": args["run_id"], "time": time.time()})
                return {"admitted": False, "waiting": True, "why": "its stage or its class's window is not open yet"}
            return None

        result.update(wait_on_journal(directory, args["poll_s"], step))
        return result

    def _waiting(self, result, args, options, directory):
        """Leave a node whose jobs still run draining, in the journal and in no worker (passes).

        The drain runs out of time ``timeout_s`` seconds after the rollout started the node (its
        ``started`` event: the drain was asked for then), as the steps executor's wait does.

        :returns: ``waiting`` true (journal ``waiting`` for ``drain`` with ``until``, epoch
            seconds); or ``waiting`` false with ``timed_out`` true (its drain is out of time: the
            transaction fails it) or with ``stop`` (the rollout stopped: the install admission
            returns the node to service untouched).
        :raises AnsibleActionFail: without ``node``, or for a node the journal has not in flight.
        """
        node = args["node"]
        if not node:
            raise AnsibleActionFail("rollout_step: state=waiting needs node")
        result.update({"waiting": False, "timed_out": False, "stop": None})
        if self._task.check_mode:
            return result
        plan = _load_plan(directory)
        with rollout_journal.locked(directory):
            journal = rollout_journal.read(directory)
            mine = journal.get(node) or {}
            if mine.get("status") != "in_flight":
                raise AnsibleActionFail("rollout_step: %s is not in flight in this rollout (journal: %s)"
                                        % (node, mine.get("status") or "not started"))
            now = time.time()
            started = mine.get("started_at")
            since = started if isinstance(started, (int, float)) and not isinstance(started, bool) else now
            result["until"] = since + max(0.0, args["timeout_s"])
            if now >= result["until"]:
                result["timed_out"] = True
                result["why"] = "its jobs did not end within %d s of its drain" % args["timeout_s"]
                return result
            decision = rollout_budget.decide(rollout_journal.fleet_state(plan, journal), options)
            if decision["action"] == "stop":
                result["stop"] = decision["stop"]
                result["why"] = "the rollout stopped while it drained"
                return result
            rollout_journal.append_in_lock(directory, {"event": "waiting", "for": "drain", "until": result["until"],
                                                       "node": node, "run_id": args["run_id"], "time": now})
        result.update({"waiting": True, "why": "its jobs still run; a later pass goes on once they end"})
        return result
