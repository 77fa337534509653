"""Fleet-scale simulation of the rollout's decisions, side by side with other rollout policies.

Usage (from the repository root, with the project's virtualenv Python; no fleet, no root)::

    python benchmarks/rollout/simulate.py [--nodes 10000] [--runs 20] [--json] [--processes 2]

The ``default`` policy is this collection's: the same ``plugin_utils.rollout_budget.decide`` the
``rollout_step`` action calls in ``playbooks/rollout.yml``, with its defaults, over virtual
nodes. ``default_inventory_order`` is the same without the scheduler's drain estimates (wave nodes
in inventory order), ``default_one_admission`` the same with ``drain_ahead`` off as well (a node
starts only when its stage is open and the window has room, and installs after its drain at
once). The others are reproduced from their documented behaviour:

* ``previous``: this collection's earlier defaults: golden ``serial: 1``, canary ``[1, "100%"]``,
  waves ``[1, "5%", "25%", "100%"]`` (cut as ansible-core cuts them, ``plugin_utils.schedule``),
  ``max_fail_percentage: 0`` (the first failed node stops everything), a soak after each golden
  and canary batch (600 s) and wave batch (300 s); a batch waits for its slowest node;
* ``gpu_operator``: NVIDIA GPU Operator's upgrade controller defaults, ``maxParallelUpgrades: 1``
  and ``maxUnavailable: 25%`` of the cluster; a failed upgrade marks its node and the controller
  goes on; no stages;
* ``kubespray``: ``serial: 20%`` of the fleet, a batch waits for its slowest node, a failed node
  is left out and the play goes on; no stages.

The fleet: ``--nodes`` nodes of 8 GPUs in five classes (40 / 25 / 15 / 12 / 8 %), one golden
node per class and a canary pool of 1 % of each class (at least one). A transaction is a drain
(90 %: log-normal, median 6 min; 10 %: a long job, log-normal, median 45 min, p99 3 h) and the work after
it (install, reboot, verify: log-normal, median 12 min); median about 20 min. Unrelated node
failures strike any node at any time at the Llama 3 405B rate (419 interruptions in 54 days on
16,384 H100: 4.74e-4 per GPU-day), with the signatures in the proportions that run reported; a
node struck in its transaction fails its verification (the rollout cannot tell it from the
driver), a node struck outside one is out of service until repaired (log-normal, median 24 h).
A bad driver fails a given fraction of nodes at verification with one signature (Xid 79, "GPU has fallen off the bus").
Each node carries the scheduler's estimate of its drain (``drain_estimate_s``: the end time of its
running jobs, from their time limit, of which a job uses 30 to 100 %). A node's install is a
second step after its drain: policies without a second admission install at once; the
``default`` policy waits for ``decide``'s ``install`` (``drain_ahead``), and on a stop releases
what it drained ahead.

Each scenario runs ``--runs`` seeds: no bad driver; a driver that breaks every node; a driver
that breaks 2 % of nodes. ``--json`` prints one object: ``{"nodes", "runs", "policies": {name:
{completion_h, capacity_floor_h, completion_over_floor, max_out_of_service_pct, budget_pct,
false_stops, bad_all_wave_nodes_touched, bad_2pct_failed_total, ...}}}``; for ``default`` also
``stage_bound_over_floor``: the median over the clean runs of :func:`stage_bound_h` (the least
any golden → canary → waves schedule could take, knowing every drain) over the capacity floor.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import multiprocessing
import os
import random
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(REPO, ".build", "collections"))

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import schedule  # noqa: E402
from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import rollout_budget  # noqa: E402

CLASSES = (("gpu_h100", 0.40), ("gpu_a100", 0.25), ("gpu_h200", 0.15), ("gpu_l40s", 0.12), ("gpu_b200", 0.08))
GPUS_PER_NODE = 8
#: Llama 3 405B pre-training: 419 unexpected interruptions in 54 days on 16,384 H100 GPUs.
FAILURES_PER_GPU_DAY = 419.0 / (54 * 16384)
#: Root causes of those interruptions (share of 419), as signatures the facts would show.
SIGNATURES = (
    ("gpu_unreadable", 0.301),   # faulty GPU
    ("xid 48", 0.172),           # HBM3 memory (double-bit ECC)
    ("software", 0.129),
    ("network", 0.084 + 0.017),  # switch / cable, NIC
    ("host", 0.076),             # unplanned host maintenance
    ("xid 94", 0.045),           # SRAM
    ("xid 119", 0.041),          # GPU system processor (GSP)
    ("watchdog", 0.017),
    ("xid 63", 0.014),           # silent data corruption found by checks
    ("other", 0.104),
)
BAD_SIGNATURE = "xid 79"
POLL_S = 60.0           # a step decides at most once a minute
SOAK_S = 600.0
WAVE_SOAK_S = 300.0     # the previous defaults' soak after each wave batch


def _lognormal(rng, median_s, sigma):
    return median_s * math.exp(rng.gauss(0.0, sigma))


def drain_draw(rng, guess, scale=1.0):
    """One node's drain and the scheduler's estimate of it, in seconds: ``(drain_s, estimate_s)``.

    The drain: 90 % log-normal, median 6 min; 10 % a long job, median 45 min (both times
    ``scale``). Slurm's end time of the node's running jobs comes from their time limit: a job ends
    after 30 to 100 % of it, so the estimate is the drain or up to 3.3x longer (drawn from
    ``guess``, apart, so that a fleet is the same with estimates and without).
    """
    long_drain = rng.random() < 0.10
    drain = scale * (_lognormal(rng, 2700.0, 0.6) if long_drain else _lognormal(rng, 360.0, 0.8))
    return drain, drain / guess.uniform(0.3, 1.0)


def _signature(rng):
    pick = rng.random() * sum(share for _name, share in SIGNATURES)
    for name, share in SIGNATURES:
        pick -= share
        if pick <= 0:
            return name
    return SIGNATURES[-1][0]


class Fleet(object):
    """Virtual nodes, their transaction times and the failures that will strike them."""

    def __init__(self, size, seed, bad_fraction, estimates=True):
        rng = random.Random(seed)
        # The scheduler's estimate of each drain, drawn apart so that the fleet is the same as without.
        guess = random.Random(seed + 7919)
        self.rng = rng
        self.nodes = []
        for klass, share in CLASSES:
            count = max(1, int(round(size * share)))
            canary = max(1, count // 100)
            for index in range(count):
                stage = "golden" if index == 0 else "canary" if index <= canary else "waves"
                drain, estimate = drain_draw(rng, guess)
                self.nodes.append({
                    "name": "%s-%05d" % (klass, index), "class": klass, "stage": stage, "status": "pending",
                    "drain_s": drain, "work_s": _lognormal(rng, 720.0, 0.3),
                    "bad": rng.random() < bad_fraction,
                    "drain_estimate_s": estimate,
                })
                if not estimates:
                    del self.nodes[-1]["drain_estimate_s"]
        # Order: golden, canary, waves; classes interleaved within a stage (inventory order).
        order = {"golden": 0, "canary": 1, "waves": 2}
        self.nodes.sort(key=lambda n: (order[n["stage"]], int(n["name"][-5:]), n["class"]))
        self.by_name = dict((n["name"], n) for n in self.nodes)
        self.rate_per_s = FAILURES_PER_GPU_DAY * GPUS_PER_NODE / 86400.0

    @classmethod
    def described(cls, nodes, seed=0, failures=False):
        """A fleet given node by node (``benchmarks/rollout/scale.py``: the fleet it runs for real).

        :param nodes: ``[{"name", "class", "stage", "drain_s", "drain_estimate_s", "work_s"}]`` in
            inventory order (seconds; ``drain_estimate_s`` may be absent); ``bad`` defaults to False.
            ``drain_until_s``, where given, is when the node's jobs end (seconds from the start of
            the run, whenever its drain is asked for: real jobs that run from the start), in place
            of a drain of ``drain_s`` from its request.
        :param failures: whether unrelated node failures strike (the Llama 3 rate); a simulated
            fleet has none.
        """
        fleet = cls.__new__(cls)
        fleet.rng = random.Random(seed)
        fleet.nodes = [dict({"status": "pending", "bad": False}, **node) for node in nodes]
        fleet.by_name = dict((n["name"], n) for n in fleet.nodes)
        fleet.rate_per_s = FAILURES_PER_GPU_DAY * GPUS_PER_NODE / 86400.0 if failures else 0.0
        return fleet

    def mean_transaction_s(self):
        return statistics.fmean(n["drain_s"] + n["work_s"] for n in self.nodes)

    def class_sizes(self):
        sizes = {}
        for node in self.nodes:
            sizes[node["class"]] = sizes.get(node["class"], 0) + 1
        return sizes


class Run(object):
    """One rollout of one policy over one fleet: an event loop in simulated seconds."""

    def __init__(self, fleet, policy):
        self.fleet = fleet
        self.policy = policy
        self.now = 0.0
        self.events = []
        self.seq = 0
        self.max_oos = {}
        self.started_waves = 0
        self.drained_ahead = 0
        self.stopped = None
        self.unavailable = set()
        self.pending = [n["name"] for n in reversed(fleet.nodes)]   # next node last
        for node in fleet.nodes if fleet.rate_per_s > 0 else ():
            self._schedule(fleet.rng.expovariate(fleet.rate_per_s), "strike", node["name"])

    def _touch(self, node):
        if node["status"] in ("in_flight", "failed") or node.get("out_of_service"):
            self.unavailable.add(node["name"])
        else:
            self.unavailable.discard(node["name"])

    def _schedule(self, when, kind, name=None):
        self.seq += 1
        heapq.heappush(self.events, (when, self.seq, kind, name))

    def start(self, name):
        """The node's drain begins (it is out of service from now on)."""
        node = self.fleet.by_name[name]
        node["status"] = "in_flight"
        node["started_at"] = self.now
        node["struck"] = False
        node["draining"] = True
        node["drained"] = False
        if node["stage"] == "waves":
            self.drained_ahead += 1
        self._touch(node)
        drained_at = max(self.now, node["drain_until_s"]) if "drain_until_s" in node else self.now + node["drain_s"]
        self._schedule(drained_at, "drained", name)

    def install(self, name, acting=None):
        """The node's install begins: the new driver touches it (counted as upgraded).

        ``acting(node)``: an executor that runs the install, reboot and verification as separate
        actions schedules them itself; without it the work and the soak run in one go.
        Returns whether the install began (a node struck while it waited fails instead).
        """
        node = self.fleet.by_name[name]
        node["drained"] = False
        if node.get("struck"):
            self._fail(node, node["struck_signature"], {"started": node["started_at"], "drained": self.now})
            return False
        if node["stage"] == "waves":
            self.started_waves += 1
        if acting is not None:
            acting(node)
            return True
        soak = self.policy.node_soak_s(node["stage"])
        self._schedule(self.now + node["work_s"] + soak, "end", name)
        return True

    def release(self, name):
        """The rollout stopped before the node's install: it returns to service untouched."""
        node = self.fleet.by_name[name]
        node["status"] = "pending"
        node["draining"] = node["drained"] = False
        node["released"] = True
        self._touch(node)

    def _fail(self, node, signature, marks):
        """The node's transaction ends failed; its record goes through the report's own verdict."""
        record = {"result": "failed", "marks": marks, "flags": [], "new_fatal_xids": {}}
        if signature.startswith("xid "):
            record["new_fatal_xids"] = {signature[4:]: 1}
        else:
            record["flags"] = [signature]
        verdict = rollout_budget.failure_signature(record)
        node["status"] = "failed"
        node["signature"] = verdict["signature"]
        node["implicates_driver"] = verdict["implicates_driver"]
        node["finished_at"] = self.now
        self._touch(node)

    def _drained(self, node):
        """A node struck while it waited for its drain fails there, before its install began; the
        others wait for their install admission, or install at once (policies without one)."""
        if node["status"] != "in_flight" or not node.get("draining"):
            return False        # released at a stop meanwhile
        node["draining"] = False
        if node.get("struck"):
            self._fail(node, node["struck_signature"], {"started": node["started_at"]})
            return True
        node["drained"] = True
        if not self.policy.admits_install():
            self.install(node["name"])
        return False

    def _end(self, node):
        marks = {"started": node["started_at"], "drained": 0.0, "snapshot": 0.0, "installed": 0.0, "rebooted": 0.0}
        if node["bad"]:
            self._fail(node, BAD_SIGNATURE, marks)
        elif node.get("struck"):
            self._fail(node, node["struck_signature"], marks)
        else:
            node["status"] = "done"
            node["finished_at"] = self.now
            self._touch(node)

    def sample(self, started):
        """The most of a class out of service right after the rollout chose to start nodes of it.

        The issue's measure: the nodes the rollout took out plus those already out when it chose.
        A node failing on its own between two choices counts from the next choice that starts a
        node of its class (a class the rollout starts nothing in is not the rollout's doing).
        """
        classes = set(self.fleet.by_name[name]["class"] for name in started)
        counts = {}
        for node in self.fleet.nodes:
            if node["class"] in classes and (node["status"] in ("in_flight", "failed") or node.get("out_of_service")):
                counts[node["class"]] = counts.get(node["class"], 0) + 1
        sizes = self.fleet.class_sizes()
        for klass in classes:
            pct = 100.0 * counts.get(klass, 0) / sizes[klass]
            self.max_oos[klass] = max(self.max_oos.get(klass, 0.0), pct)

    def go(self, horizon_s=400 * 86400.0):
        self.policy.begin(self)
        while self.events:
            when, _seq, kind, name = heapq.heappop(self.events)
            if when > horizon_s:
                break
            self.now = when
            node = self.fleet.by_name.get(name)
            if kind == "end":
                if node["status"] != "in_flight":
                    continue        # its transaction already failed at the drain
                self._end(node)
            elif kind == "drained":
                self._drained(node)
            elif kind == "strike":
                if node["status"] == "in_flight":
                    node["struck"] = True
                    node["struck_signature"] = _signature(self.fleet.rng)
                elif not node.get("out_of_service"):
                    node["out_of_service"] = True
                    self._schedule(self.now + _lognormal(self.fleet.rng, 86400.0, 1.0), "repair", name)
                self._schedule(self.now + self.fleet.rng.expovariate(self.fleet.rate_per_s), "strike", name)
            elif kind == "repair":
                node["out_of_service"] = False
            elif kind not in ("tick", "soak"):
                self.policy.on_event(self, kind, node)
            if node is not None:
                self._touch(node)
            if self.policy.step(self, kind):
                break
        return self.result()

    def result(self):
        failed = len([n for n in self.fleet.nodes if n["status"] == "failed"])
        out = {"completion_s": self.policy.done_at, "stopped": self.stopped, "failed": failed,
               "waves_started": self.started_waves, "waves_drained": self.drained_ahead,
               "max_oos_pct": max(self.max_oos.values() or [0.0]), "max_oos_by_class": dict(self.max_oos)}
        executor = getattr(self.policy, "executor", None)
        if executor is not None:
            out.update(executor.stats())
        return out


#: The executor's parameters (``--steps-per-job`` and the rest override them).
EXECUTOR_DEFAULTS = {
    # playbooks/rollout.yml imports rollout_step.yml 12 times: one job runs at most 12 steps.
    "steps_per_job": 12,
    # Between two steps: the choice of the next hosts and the step's report (the controller's
    # own plays), about a minute at 10,000 nodes.
    "step_overhead_s": 60.0,
    # From the end of one job to the start of the next (an AWX schedule, or the operator).
    "job_gap_s": 600.0,
    # The pass executor: passes a job runs (one a minute: an hour) before the next job.
    "passes_per_job": 60,
    # A drain request or a return to service: a few tasks on a worker.
    "act_s": 10.0,
    # The work after the drain, split into what holds a worker (install, verification) and what
    # only waits (the reboot): 40 / 40 / 20 % of it.
    "install_share": 0.4,
    "reboot_share": 0.4,
    "verify_share": 0.2,
    # playbooks/rollout_step.yml with rollout_executor passes: a golden or canary node soaks in
    # the pass that verified it (tasks/gate.yml), holding its worker; False models a soak that is
    # a time stamp.
    "soak_in_worker": True,
    # A pass is one import of rollout_step.yml: its hosts are fixed when it begins and the next
    # pass begins only after its slowest host is done, pass_overhead_s later (the controller's
    # own plays: the report of the pass, the choice of the next; as step_overhead_s). False:
    # passes without a barrier, a free worker taken up at the next decision (what a controller
    # that advances each node on its own would do).
    "pass_barrier": True,
    "pass_overhead_s": 60.0,
}


class Unbounded(object):
    """Every node ``decide`` admits starts at once: the decision code alone, a worker for every node
    in flight (the figure of the decisions, not of any executor that runs them)."""

    name = "unbounded"

    def __init__(self):
        self.peak = 0

    def act(self, policy, run):
        decision = rollout_budget.decide(run.fleet.nodes, policy.options)
        over = policy.apply(run, decision)
        self.peak = max(self.peak, decision["in_flight"] + len(decision["start"]))
        return over

    def on_event(self, policy, run, kind, node):
        return None

    def stats(self):
        return {"worker_peak": self.peak}


class Steps(object):
    """``playbooks/rollout.yml`` as it runs: fixed steps, a worker per host, a barrier per step.

    A step's hosts are chosen when it begins (``rollout_budget.step_hosts``, the function the
    ``rollout_step`` action runs: nodes in flight, then the next nodes of each class, at most
    ``forks``); each host holds its worker while it waits for its admission (``decide`` with the
    step's hosts as candidates) and for its whole transaction, drain and soak included; a host that
    can no longer be admitted in the step (nothing in flight, nothing to start) leaves it; the
    next step begins ``step_overhead_s`` after the last host of this one is done, and after
    ``steps_per_job`` steps the job ends and the next one begins ``job_gap_s`` later.
    """

    name = "steps"

    def __init__(self, forks, **params):
        self.forks = int(forks)
        self.params = dict(EXECUTOR_DEFAULTS, **params)
        self.hosts = None
        self.waiting = set()
        self.next_step_at = 0.0
        self.steps = 0
        self.jobs = 0
        self.peak = 0

    def act(self, policy, run):
        by_name = run.fleet.by_name
        if self.hosts is None:
            if run.now < self.next_step_at:
                return False
            decision, hosts = rollout_budget.step_hosts(run.fleet.nodes, policy.options, self.forks)
            if decision["action"] == "done" or (decision["action"] == "stop" and not decision["in_flight"]):
                return policy.apply(run, decision)
            if self.steps % self.params["steps_per_job"] == 0:
                self.jobs += 1
            self.steps += 1
            self.hosts = hosts
            self.waiting = set(name for name in hosts if by_name[name]["status"] == "pending")
            self.peak = max(self.peak, len(hosts))
        decision = rollout_budget.decide(run.fleet.nodes, policy.options, candidates=self.waiting)
        leave = decision["action"] == "stop" or (not decision["in_flight"] and not decision["start"])
        if policy.apply(run, decision):
            return True
        self.waiting.difference_update(decision["start"])
        if leave:
            self.waiting.clear()
        if not self.waiting and not any(by_name[name]["status"] == "in_flight" for name in self.hosts):
            self.hosts = None
            self.next_step_at = run.now + self.params["step_overhead_s"]
            if self.steps % self.params["steps_per_job"] == 0:
                self.next_step_at += self.params["job_gap_s"]
            run._schedule(self.next_step_at, "tick")
        return False

    def on_event(self, policy, run, kind, node):
        return None

    def stats(self):
        return {"worker_peak": self.peak, "steps": self.steps, "jobs": self.jobs}


class Passes(object):
    """The per-node state machine advanced in passes (``plugin_utils.node_states``): a worker only
    while a node acts, never while it waits.

    A pass (one per decision, at most one a minute) hands out the free workers: first to nodes
    whose reboot is over (their verification), then to installs ``decide`` admits, then to
    starts (a drain request, ``act_s``). The install (``install_share`` of the node's work) and
    the verification (``verify_share``; with ``soak_in_worker``, a golden or canary node's soak
    after it) hold a worker; the drain and the reboot (``reboot_share``) hold none:
    ``rollout_executor: passes`` with ``node_upgrade_drain: slurm_reboot``. After ``passes_per_job`` passes the job ends and the next begins
    ``job_gap_s`` later; nothing acts in between (drains and reboots go on). With ``pass_barrier``
    a pass begins only once every action of the one before ended, ``pass_overhead_s`` after the
    last (the playbook as it runs); without, a worker freed is taken up at the next decision.
    """

    name = "passes"

    def __init__(self, forks, **params):
        self.forks = int(forks)
        self.params = dict(EXECUTOR_DEFAULTS, **params)
        self.busy = 0
        self.peak = 0
        self.verify_queue = []
        self.passes = 0
        self.jobs = 0
        self.in_job = 0
        self.resume_at = 0.0
        self.ready_at = 0.0
        self.acting = None

    def _take(self, run, seconds, kind, name):
        self.busy += 1
        self.peak = max(self.peak, self.busy)
        run._schedule(run.now + seconds, kind, name)

    def act(self, policy, run):
        if run.now < self.resume_at:
            return False
        if self.params["pass_barrier"] and (self.busy or run.now < self.ready_at):
            return False
        if self.in_job == 0:
            self.jobs += 1
        self.passes += 1
        self.in_job += 1
        if self.in_job >= self.params["passes_per_job"]:
            self.in_job = 0
            self.resume_at = run.now + self.params["job_gap_s"]
            run._schedule(self.resume_at, "tick")
        by_name = run.fleet.by_name
        while self.verify_queue and self.busy < self.forks:
            node = by_name[self.verify_queue.pop(0)]
            soak = policy.node_soak_s(node["stage"]) if self.params["soak_in_worker"] else 0.0
            self._take(run, self.params["verify_share"] * node["work_s"] + soak, "verified", node["name"])
        free = self.forks - self.busy
        decision = rollout_budget.decide(run.fleet.nodes, policy.options, limit=free)
        installs = decision["install"][:free]
        decision = dict(decision, start=decision["start"][:max(0, free - len(installs))])

        def acting(node):
            self._take(run, self.install_s(node), "installed", node["name"])

        self.acting = acting
        if policy.apply(run, decision, installs, acting):
            return True
        for name in decision["start"]:
            self._take(run, self.params["act_s"], "acted", name)
        return False

    #: Whether the reboot holds the worker of the install (``ansible.builtin.reboot``).
    reboot_in_worker = False
    #: Whether the verification follows the reboot in that worker (not in a later pass).
    verify_in_install = False

    def install_s(self, node):
        """Seconds an install holds its worker: the install, and the reboot when the worker runs it."""
        share = self.params["install_share"] + (self.params["reboot_share"] if self.reboot_in_worker else 0.0)
        return share * node["work_s"]

    def on_event(self, policy, run, kind, node):
        if kind == "acted" and node["status"] == "in_flight" and node.get("drained"):
            # Drained by the end of its start (no job, or its jobs ended meanwhile): the same pass
            # goes on to its install admission, in the same worker.
            decision = rollout_budget.decide(run.fleet.nodes, policy.options, candidates=[node["name"]])
            if decision["action"] != "stop" and node["name"] in decision["install"]:
                self.busy -= 1
                run.install(node["name"], self.acting)
                return
        if kind == "installed" and self.verify_in_install and node["status"] == "in_flight":
            # The verification (and a golden or canary node's soak) right after the reboot, in
            # the same worker and pass (node_upgrade_drain: slurm).
            soak = policy.node_soak_s(node["stage"]) if self.params["soak_in_worker"] else 0.0
            run._schedule(run.now + self.params["verify_share"] * node["work_s"] + soak, "verified", node["name"])
            return
        if kind in ("acted", "installed", "verified"):
            self.busy -= 1
            if self.params["pass_barrier"] and not self.busy:
                self.ready_at = run.now + self.params["pass_overhead_s"]
                run._schedule(self.ready_at, "tick")
        if kind == "installed":
            reboot = 0.0 if self.reboot_in_worker else self.params["reboot_share"] * node["work_s"]
            run._schedule(run.now + reboot, "rebooted", node["name"])
        elif kind == "rebooted" and node["status"] == "in_flight":
            self.verify_queue.append(node["name"])
        elif kind == "verified":
            soak = 0.0 if self.params["soak_in_worker"] else policy.node_soak_s(node["stage"])
            run._schedule(run.now + soak, "end", node["name"])

    def stats(self):
        return {"worker_peak": self.peak, "passes": self.passes, "jobs": self.jobs}


class SlurmDrainPasses(Passes):
    """:class:`Passes` for ``node_upgrade_drain: slurm``: the drain waits in no worker (the pass
    journals the node waiting for its drain); the reboot and the verification run in the worker
    of the install, in its pass."""

    name = "passes_slurm"
    reboot_in_worker = True
    verify_in_install = True


EXECUTORS = {"unbounded": Unbounded, "steps": Steps, "passes": Passes, "passes_slurm": SlurmDrainPasses}


class BudgetPolicy(object):
    """This collection's rollout: ``rollout_budget.decide`` at most once per ``poll_s`` (default
    POLL_S), on events; a golden or canary node soaks ``soak_s`` (default SOAK_S)."""

    name = "default"
    estimates = True

    def __init__(self, options=None, track=False, name=None, estimates=True, executor=None, poll_s=POLL_S,
                 soak_s=SOAK_S):
        self.options = rollout_budget.normalize_options(options or {})
        self.poll_s = float(poll_s)
        self.soak_each_s = float(soak_s)
        self.executor = executor or Unbounded()
        self.name = name or self.name
        self.estimates = estimates
        self.track = track
        self.next_decision = 0.0
        self.done_at = None
        self.pending_tick = False
        self.timeline = {}
        self.last_decision = None

    def budget_pct(self):
        kind, value = self.options["max_unavailable"]
        return value if kind == "percent" else None

    def slots(self, size):
        return rollout_budget.amount_of(self.options["max_unavailable"], size)

    def soak_s(self):
        return 2 * self.soak_each_s

    def node_soak_s(self, stage):
        """A golden or canary node soaks (and is checked again) before its transaction ends."""
        return self.soak_each_s if stage in ("golden", "canary") else 0.0

    def admits_install(self):
        """Whether a drained node waits for ``decide``'s install admission (``drain_ahead``)."""
        return bool(self.options["drain_ahead"])

    def begin(self, run):
        run._schedule(0.0, "tick")

    def step(self, run, kind):
        if run.now < self.next_decision:
            if not self.pending_tick:
                self.pending_tick = True
                run._schedule(self.next_decision, "tick")
            return False
        # A decision now, on whichever event: the tick it waited for may still be queued at this
        # very time (it then asks for the next one); without this a decision made on another event
        # would leave no tick ahead, and a run whose only events were ticks would stall.
        self.pending_tick = False
        self.next_decision = run.now + self.poll_s
        return self.executor.act(self, run)

    def on_event(self, run, kind, node):
        """An event of the executor's own (an action's end): the executor's."""
        self.executor.on_event(self, run, kind, node)

    def apply(self, run, decision, installs=None, acting=None):
        """Carry out ``decide``'s ``decision``: release on a stop, installs, starts.

        :returns: ``True`` when the run is over (done, or stopped with nothing left in flight).
        """
        if self.track:
            self._track(run, decision)
        if decision["action"] == "stop":
            if run.stopped is None:
                run.stopped = decision["stop"]["reason"]
            for name in decision["release"]:
                run.release(name)
            return decision["in_flight"] == len(decision["release"])
        if decision["action"] == "done":
            self.done_at = run.now
            return True
        for name in decision["install"] if installs is None else installs:
            run.install(name, acting)
        for name in decision["start"]:
            run.start(name)
        if decision["start"]:
            run.sample(decision["start"])
        return False

    def _track(self, run, decision):
        """Where each class's time goes (``--breakdown``): gate times and free slot-hours by phase.

        Free slot-hours are the class's capacity budget left unused between two decisions
        (``max_unavailable - out_of_service``), split by what the class was doing: waiting for
        its golden or canary gate, widening its wave window, or finishing its last transactions
        after its last start.
        """
        now = run.now
        dt = (now - self.last_decision) / 3600.0 if self.last_decision is not None else 0.0
        self.last_decision = now
        for klass, row in decision["budgets"].items():
            line = self.timeline.setdefault(klass, {
                "nodes": row["nodes"], "slots": row["max_unavailable"], "idle_gate_slot_h": 0.0,
                "idle_ramp_slot_h": 0.0, "idle_tail_slot_h": 0.0, "idle_other_slot_h": 0.0})
            stage = decision["stages"].get(klass, line.get("stage", "golden"))
            if line.get("stage_prev") is not None:
                free = line["free_prev"]
                if line["pending_prev"] == 0:
                    line["idle_tail_slot_h"] += free * dt
                elif line["stage_prev"] != "waves":
                    line["idle_gate_slot_h"] += free * dt
                elif line["window_limited_prev"]:
                    line["idle_ramp_slot_h"] += free * dt
                else:
                    line["idle_other_slot_h"] += free * dt
            for name, at in (("canary", "canary_open_h"), ("waves", "waves_open_h")):
                if at not in line and rollout_budget.STAGES.index(stage) >= rollout_budget.STAGES.index(name):
                    line[at] = now / 3600.0
            mine = [n for n in run.fleet.nodes if n["class"] == klass]
            pending = len([n for n in mine if n["status"] == "pending"])
            started_now = len([name for name in decision["start"] if run.fleet.by_name[name]["class"] == klass])
            if pending == 0 and "last_start_h" not in line:
                line["last_start_h"] = now / 3600.0
            out = row["out_of_service"] + started_now
            if "full_h" not in line and stage == "waves" and out >= row["max_unavailable"]:
                line["full_h"] = now / 3600.0
            line["stage_prev"] = stage
            line["pending_prev"] = pending
            line["free_prev"] = max(0, row["max_unavailable"] - out)
            line["window_limited_prev"] = stage == "waves" and "full_h" not in line

    def breakdown(self, run):
        """Per class: the timeline of :meth:`_track` with the last end and the class's own floor."""
        out = {}
        for klass, line in self.timeline.items():
            mine = [n for n in run.fleet.nodes if n["class"] == klass]
            mean_s = statistics.fmean(n["drain_s"] + n["work_s"] for n in mine)
            row = dict((k, round(v, 2)) for k, v in line.items() if not k.endswith("_prev") and k != "stage")
            row["last_end_h"] = round(max(n.get("finished_at") or 0.0 for n in mine) / 3600.0, 2)
            row["floor_h"] = round(len(mine) * mean_s / line["slots"] / 3600.0, 2)
            row["busy_slot_h"] = round(sum(n["drain_s"] + n["work_s"] + self.node_soak_s(n["stage"])
                                           for n in mine if n["status"] != "pending") / 3600.0, 1)
            tail = [n for n in mine if n.get("started_at") is not None
                    and n["started_at"] >= 3600.0 * (line.get("last_start_h", 0.0)) - 1800.0]
            row["longest_late_transaction_h"] = round(max([n["drain_s"] + n["work_s"] for n in tail] or [0.0]) / 3600.0, 2)
            out[klass] = row
        return out


class BatchPolicy(object):
    """Sequential batches (Ansible ``serial``): a batch waits for its slowest node."""

    def __init__(self, name, stages, stop_on_failure, soak):
        self.name = name
        self.stages = stages          # [(stage names, serial)]
        self.stop_on_failure = stop_on_failure
        self.soak = soak              # {stage: seconds after each batch}
        self.done_at = None
        self.batches = None
        self.current = None
        self.waiting_soak = False

    def budget_pct(self):
        return None

    def slots(self, size):
        return None

    def soak_s(self):
        return 2 * self.soak.get("golden", 0.0) if self.soak else 0.0

    def node_soak_s(self, stage):
        return 0.0

    def admits_install(self):
        return False

    def begin(self, run):
        self.batches = []
        for stage_names, serial in self.stages:
            hosts = [n["name"] for n in run.fleet.nodes if n["stage"] in stage_names]
            start = 0
            for size in schedule.serial_batches(serial, len(hosts)):
                self.batches.append((stage_names[0], hosts[start:start + size]))
                start += size
        run._schedule(0.0, "tick")

    def step(self, run, kind):
        nodes = run.fleet.by_name
        if self.current is not None:
            stage, batch = self.current
            if any(nodes[name]["status"] == "in_flight" for name in batch):
                return False
            if self.stop_on_failure and any(nodes[name]["status"] == "failed" for name in batch):
                run.stopped = "a node failed (max_fail_percentage 0)"
                return True
            if not self.waiting_soak and self.soak.get(stage):
                self.waiting_soak = True
                run._schedule(run.now + self.soak[stage], "soak")
                return False
            if self.waiting_soak and kind != "soak":
                return False
            self.waiting_soak = False
            self.current = None
        while self.batches:
            stage, batch = self.batches.pop(0)
            startable = [name for name in batch if nodes[name]["status"] == "pending"
                         and not nodes[name].get("out_of_service")]
            if not startable:
                continue
            self.current = (stage, startable)
            for name in startable:
                run.start(name)
            run.sample(startable)
            return False
        self.done_at = run.now
        return True


class OperatorPolicy(object):
    """GPU Operator upgrade controller: maxParallelUpgrades at once while unavailable < maxUnavailable."""

    name = "gpu_operator"

    def __init__(self, parallel=1, max_unavailable_pct=25.0):
        self.parallel = parallel
        self.max_unavailable_pct = max_unavailable_pct
        self.done_at = None

    def budget_pct(self):
        return self.max_unavailable_pct

    def slots(self, size):
        return None

    def soak_s(self):
        return 0.0

    def node_soak_s(self, stage):
        return 0.0

    def admits_install(self):
        return False

    def begin(self, run):
        run._schedule(0.0, "tick")

    def step(self, run, kind):
        by_name = run.fleet.by_name
        while run.pending and by_name[run.pending[-1]]["status"] != "pending":
            run.pending.pop()
        upgrading = len([name for name in run.unavailable if by_name[name]["status"] == "in_flight"])
        limit = int(self.max_unavailable_pct / 100.0 * len(by_name))
        started = []
        startable = False
        for name in reversed(run.pending):
            node = by_name[name]
            if node["status"] != "pending" or node.get("out_of_service"):
                continue
            startable = True
            if upgrading >= self.parallel or len(run.unavailable) >= limit:
                break
            run.start(name)
            upgrading += 1
            started.append(name)
        if not startable and not upgrading:
            self.done_at = run.now
            return True
        if started:
            run.sample(started)
        return False


def policies():
    return [
        BudgetPolicy(),
        # The defaults without the scheduler's drain estimates (inventory order), and with one
        # admission per node (drain and install together): what each part of the defaults brings.
        BudgetPolicy(name="default_inventory_order", estimates=False),
        BudgetPolicy({"drain_ahead": False}, name="default_one_admission", estimates=False),
        BatchPolicy("previous", [(("golden",), 1), (("canary",), [1, "100%"]), (("waves",), [1, "5%", "25%", "100%"])],
                    True, {"golden": SOAK_S, "canary": SOAK_S, "waves": WAVE_SOAK_S}),
        OperatorPolicy(),
        BatchPolicy("kubespray", [(("golden", "canary", "waves"), "20%")], False, {}),
    ]


class _Done(object):
    """The finished fleet, as :meth:`BudgetPolicy.breakdown` reads it."""

    def __init__(self, fleet):
        self.fleet = fleet


def stage_bound_h(fleet, drain_ahead=True):
    """A lower bound on any staged rollout of this fleet, in hours, even one that knew every drain.

    A class's wave node cannot begin its install before its golden node and at least one of its
    canary nodes have passed (their transaction and soak, one after the other), so the rollout
    cannot end before ``max(golden + quickest canary, the wave node's drain) + its work`` for its
    slowest wave node when drains may begin ahead of the stages (``drain_ahead``), or
    ``golden + quickest canary + the wave node's own transaction`` when they may not. Capacity,
    the window and failures are left out: the bound only grows with them.
    """
    first = {}
    for stage in ("golden", "canary"):
        for node in fleet.nodes:
            if node["stage"] == stage:
                length = node["drain_s"] + node["work_s"] + SOAK_S
                key = (node["class"], stage)
                first[key] = min(first.get(key, length), length)
    bound = 0.0
    for node in fleet.nodes:
        if node["stage"] == "waves":
            gates = first.get((node["class"], "golden"), 0.0) + first.get((node["class"], "canary"), 0.0)
            if drain_ahead:
                bound = max(bound, max(gates, node["drain_s"]) + node["work_s"])
            else:
                bound = max(bound, gates + node["drain_s"] + node["work_s"])
    return bound / 3600.0


def _one(args):
    index, size, seed, bad, executor = args
    policy = policies()[index]
    if executor is not None:
        kind, forks, params = executor
        policy.executor = EXECUTORS[kind](forks, **params)
    fleet = Fleet(size, seed, bad, getattr(policy, "estimates", False))
    bound = stage_bound_h(fleet, policy.admits_install())
    return index, bad, fleet.mean_transaction_s(), fleet.class_sizes(), dict(Run(fleet, policy).go(), bound_h=bound)


def capacity_floor_h(policy, sizes, mean_s):
    """Per class: nodes x mean transaction time / concurrent slots, the largest, plus the soaks."""
    worst = 0.0
    total = sum(sizes.values())
    for klass, size in sizes.items():
        slots = policy.slots(size)
        if slots is None:
            if policy.name == "gpu_operator":
                slots = size * policy.parallel / float(total)
            elif policy.name == "kubespray":
                slots = size * 0.20
            else:
                slots = size * max(schedule.serial_batches([1, "5%", "25%", "100%"], total)) / float(total)
        worst = max(worst, size * mean_s / max(slots, 1e-9))
    return (worst + policy.soak_s()) / 3600.0


def summarize(policy, mine, floor=None):
    """One policy's row from its runs ``mine`` (``_one``'s results); ``floor``: the capacity floor
    to compare with (default: the policy's own, :func:`capacity_floor_h`)."""
    clean = [r for r in mine if r[1] == 0.0]
    completions = [r[4]["completion_s"] / 3600.0 for r in clean if r[4]["completion_s"] is not None]
    mean_s = statistics.fmean(r[2] for r in clean)
    floor = floor if floor is not None else capacity_floor_h(policy, clean[0][3], mean_s)
    completion = statistics.median(completions) if completions else None
    row = {
        "completion_h": round(completion, 2) if completion is not None else None,
        "completed_runs": len(completions),
        "capacity_floor_h": round(floor, 2),
        "completion_over_floor": round(completion / floor, 2) if completion is not None else None,
        "max_out_of_service_pct": round(max(r[4]["max_oos_pct"] for r in mine), 2),
        "budget_pct": policy.budget_pct(),
        "false_stops": len([r for r in clean if r[4]["stopped"]]),
        "false_stop_reasons": sorted(set(r[4]["stopped"] for r in clean if r[4]["stopped"])),
        "bad_all_wave_nodes_touched": max(r[4]["waves_started"] for r in mine if r[1] == 1.0),
        # Wave nodes whose drain began before the stop, installed or not (drained ahead of their
        # stage and released untouched when the rollout stopped).
        "bad_all_wave_nodes_drained": max(r[4]["waves_drained"] for r in mine if r[1] == 1.0),
        "bad_2pct_failed_total": max(r[4]["failed"] for r in mine if r[1] == 0.02),
        "bad_2pct_stopped_runs": len([r for r in mine if r[1] == 0.02 and r[4]["stopped"]]),
        "clean_failed_median": statistics.median(r[4]["failed"] for r in clean),
    }
    for key in ("worker_peak", "steps", "passes", "jobs"):
        values = [r[4][key] for r in clean if key in r[4]]
        if values:
            row[key if key == "worker_peak" else key + "_median"] = (
                max(values) if key == "worker_peak" else statistics.median(values))
    return row, floor, mean_s


def simulate(size, runs, processes, names=None, forks=(), executors=("steps", "passes"), params=None, fork_runs=None):
    """Every policy over ``runs`` seeds of each scenario; with ``forks``, the default policy again
    on each executor of ``executors`` with each worker count (``by_forks``: the steps executor,
    ``by_forks_passes``: the pass executor), over ``fork_runs`` seeds (default ``runs``)."""
    params = params or {}
    jobs = []
    for index in range(len(policies())):
        if names and policies()[index].name not in names:
            continue
        for run in range(runs):
            for bad in (0.0, 1.0, 0.02):
                jobs.append((index, size, 1000 + run, bad, None))
    for kind in executors if forks else ():
        for count in forks:
            for run in range(fork_runs or runs):
                for bad in (0.0, 1.0, 0.02):
                    jobs.append((0, size, 1000 + run, bad, (kind, count, params)))
    with multiprocessing.Pool(processes) as pool:
        results = pool.map(_one, jobs, chunksize=1)
    out = {}
    mean_s = None
    for index, policy in enumerate(policies()):
        mine = [r for r, job in zip(results, jobs) if r[0] == index and job[4] is None]
        if not mine:
            continue
        out[policy.name], floor, mean_s = summarize(policy, mine)
        if isinstance(policy, BudgetPolicy):
            # What stage order alone costs: even a schedule that knew every drain needs this much
            # (drains ahead of the stages allowed).
            out[policy.name]["stage_bound_over_floor"] = round(
                statistics.median(r[4]["bound_h"] for r in mine if r[1] == 0.0) / floor, 2)
    if forks:
        default = policies()[0]
        row = out.setdefault(default.name, {})
        for kind in executors:
            table = {}
            for count in forks:
                mine = [r for r, job in zip(results, jobs) if job[4] is not None and job[4][:2] == (kind, count)]
                clean = [r for r in mine if r[1] == 0.0]
                floor = capacity_floor_h(default, clean[0][3], statistics.fmean(r[2] for r in clean))
                table[str(count)], _floor, mean_s = summarize(default, mine, floor)
            row["by_forks" if kind == "steps" else "by_forks_" + kind] = table
        row["executor"] = dict(EXECUTOR_DEFAULTS, **params)
    return {"nodes": size, "runs": runs, "classes": dict(CLASSES), "mean_transaction_min": round(mean_s / 60.0, 1),
            "failures_per_gpu_day": FAILURES_PER_GPU_DAY, "policies": out}


def _flag(text):
    """A yes/no command-line value (``true``/``false``, ``yes``/``no``, ``1``/``0``)."""
    value = str(text).strip().lower()
    if value in ("true", "yes", "1"):
        return True
    if value in ("false", "no", "0"):
        return False
    raise argparse.ArgumentTypeError("not a yes/no value: %r" % (text,))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--nodes", type=int, default=10000)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--processes", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--policies", help="comma-separated policy names to run (default: all)")
    parser.add_argument("--forks", default="100,200,500,1000",
                        help="worker counts for by_forks (comma-separated; empty: none)")
    parser.add_argument("--executors", default="steps,passes",
                        help="executors for by_forks: steps (playbooks/rollout.yml as it runs), passes (the state "
                             "machine, slurm_reboot), passes_slurm (the state machine, slurm drain: the reboot in the worker)")
    parser.add_argument("--fork-runs", type=int, help="seeds per scenario for by_forks (default: --runs)")
    for key, value in sorted(EXECUTOR_DEFAULTS.items()):
        parser.add_argument("--" + key.replace("_", "-"), type=_flag if isinstance(value, bool) else type(value),
                            default=value, help="executor parameter (default %s)" % value)
    parser.add_argument("--breakdown", type=int, metavar="SEED",
                        help="run the default policy once on a clean fleet and print where each class's time goes")
    args = parser.parse_args(argv)
    if args.breakdown is not None:
        policy = BudgetPolicy(track=True)
        fleet = Fleet(args.nodes, args.breakdown, 0.0)
        done = Run(fleet, policy).go()
        print(json.dumps({"completion_h": round(done["completion_s"] / 3600.0, 2),
                          "stage_bound_h": round(stage_bound_h(fleet, policy.admits_install()), 2),
                          "classes": policy.breakdown(_Done(fleet))},
                         indent=1, sort_keys=True))
        return 0
    forks = [int(count) for count in args.forks.split(",") if count.strip()]
    params = dict((key, getattr(args, key)) for key in EXECUTOR_DEFAULTS)
    result = simulate(args.nodes, args.runs, args.processes,
                      set(args.policies.split(",")) if args.policies else None,
                      forks, [kind for kind in args.executors.split(",") if kind], params, args.fork_runs)
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
        return 0
    print("%d nodes, %d runs per scenario, mean transaction %.1f min"
          % (args.nodes, args.runs, result["mean_transaction_min"]))
    for name, row in result["policies"].items():
        print("%-13s %s" % (name, json.dumps(row, sort_keys=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
