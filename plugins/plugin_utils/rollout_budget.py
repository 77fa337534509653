# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Which nodes a rollout step may start now: capacity budgets, failure budgets, stop reasons.

A rollout is a sequence of steps; each step reads the fleet's state and asks :func:`decide`
which nodes to start. The same function runs in the playbook (``rollout_step`` action) and in
the fleet-scale simulation (``benchmarks/rollout/simulate.py``), so what is measured there is
what runs.

The rules (docs/rollout.md):

* **Stages in order, per GPU class.** A class's golden nodes first, then, once they have
  passed (a golden or canary node's transaction ends with its soak and the check after it), its
  canary pool, then its waves. A failure in a golden or canary stage stops the rollout (zero
  tolerance).
* **Capacity budget per GPU class** (``max_unavailable``: a count or a percentage of the class,
  at least 1): nodes of the class out of service at once — in a transaction, quarantined by
  this rollout, or out by someone else's doing (drained, down, unreachable) — never exceed it.
  Optionally also per failure domain (``max_unavailable_domain``, of the domain's size).
* **A window that widens** (slow start): in the waves a class has at most
  ``window_initial + window_growth x (nodes of the class verified in this rollout so far) / (1 +
  failures after the install, all classes together)`` transactions at once, so a driver that
  breaks only some nodes meets its stop before many are in flight: each failure the driver can be
  blamed for divides the widening, as the failure rate it suggests multiplies what a window
  exposes. The canary pool is itself the small first sample: once the class's golden node has
  passed, its canary nodes start together, within the capacity budget (before that, the same
  window applies, which keeps them waiting for the golden node).
* **A canary quorum.** A class's waves open once its golden nodes have passed and
  ``canary_quorum`` of its canary pool (count or percentage of the pool, at least 1) has passed,
  or the whole pool has, the nodes still waiting for their drain left out. The canary nodes still
  running then go on beside the waves, under the same zero tolerance: one that fails stops the
  rollout. A pool of 40 nodes whose slowest few wait for long jobs no longer holds its class's
  waves for them.
* **Two admissions: the drain, then the install** (``drain_ahead``, default on). A node starts
  (its drain is requested) as soon as its class's capacity budget has room, whatever its stage:
  draining touches no driver. Its install is admitted separately, once its drain is done, its
  stage is open and the window has room (:func:`install_admissions`). Long drains so overlap
  the golden and canary gates instead of following them. A node waiting for its install keeps
  its slot; when the rollout stops, the nodes not yet installing are released (returned to
  service untouched, ``release``). Wave nodes start longest drain first when the scheduler's
  estimate of each drain is known (``drain_estimate_s``: the end time of the node's running
  jobs); inventory order otherwise. With ``drain_ahead`` off, a node starts only when its stage
  is open and the window has room, and its install follows its drain at once.
* **Zero tolerance in the golden and canary stages, for failures the driver can be blamed for.**
  A golden or canary node that fails after its install began stops the rollout. One that fails
  before (drain, preflight, the node unreachable before the install: its record has no
  ``snapshot`` mark, so the new driver never touched it) is quarantined like any other node and
  replaced by a *stand-in*: the next wave node of its class takes its stage, its gate and its zero
  tolerance (:func:`stand_ins`).
* **Failure budget.** A wave node that fails is quarantined and the rollout goes on. It stops
  when the failures of a class that happened after the new driver was installed exceed
  ``failure_budget`` (count or percentage of the class), or when at least ``signature_limit``
  nodes failed with one signature on one target version and the fleet's background failure
  rate (``background_failure_rate`` per transaction, all signatures together) makes that many
  less likely than ``signature_alpha`` by chance alone (Poisson): the driver is implicated. Two
  failures among the first hundred nodes stop a rollout; two among thousands do not. Failures
  before the install (drain timeouts, preflight) quarantine the node but implicate nothing.

Pure functions; no I/O.
"""

from __future__ import annotations

import math
import re
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import contract_decision

STAGES = ("golden", "canary", "waves")
_RANK = {"golden": 0, "canary": 1, "waves": 2}

#: Node states a step reads (``status`` of :func:`decide`'s nodes). Apart from its status, a
#: node may be ``out_of_service`` by someone else's doing (drained, down, unreachable).
STATUSES = ("pending", "in_flight", "done", "failed", "refused")

#: Stop codes of :func:`decide` (``stop.code``).
STOP_CODES = {
    "stage_failure": "a golden or canary node failed (zero tolerance)",
    "failure_budget": "the failures of a class exceeded its failure budget",
    "driver_implicated": "several nodes failed with the same signature on the same target",
    "contract_unexplained": "a golden node's hardware contract changed in a way nothing explains",
}

DEFAULTS = {
    "max_unavailable": "10%",
    "max_unavailable_domain": None,
    "failure_budget": "1%",
    "signature_limit": 2,
    "background_failure_rate": 0.0002,
    "signature_alpha": 0.001,
    "window_initial": 1,
    "window_growth": 2,
    "canary_quorum": "50%",
    "drain_ahead": True,
    "contract_changes": "stop",
    "contract_accept": [],
    "executor": "steps",
}

#: How the playbook runs the decisions (``rollout_executor``): ``steps``, each host of a step
#: holding a worker for its whole transaction; ``passes``, each node acting only when its next
#: action is ready (:func:`pass_hosts`; docs/rollout.md "Passes").
EXECUTORS = ("steps", "passes")

_PCT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")
_COUNT = re.compile(r"^\s*(\d+)\s*$")


def parse_amount(value: Any, name: str, allow_zero: bool = False) -> Tuple[str, float]:
    """Read a count or a percentage as given in an extra var or group_vars.

    :param value: ``3``, ``"3"``, ``"10%"``, ``"2.5%"`` (extra vars arrive as text).
    :param name: the variable's name, for the error message.
    :param allow_zero: whether ``0`` / ``"0%"`` is allowed (a failure budget may be 0).
    :returns: ``("count", n)`` or ``("percent", p)``.
    :raises ValueError: for a negative, zero (unless allowed), fractional count, a percentage
        over 100, or text that is neither; the message names the variable and the value.
    """
    if isinstance(value, bool) or value is None:
        raise ValueError("%s must be a count or a percentage such as 10%%, got %r" % (name, value))
    if isinstance(value, (int, float)):
        if isinstance(value, float) and (math.isnan(value) or not value.is_integer()):
            raise ValueError("%s must be a whole count or a percentage such as 10%%, got %r" % (name, value))
        text = str(int(value))
    else:
        text = str(value)
    match = _PCT.match(text)
    if match:
        pct = float(match.group(1))
        if pct > 100:
            raise ValueError("%s must be at most 100%%, got %r" % (name, value))
        if pct == 0 and not allow_zero:
            raise ValueError("%s must be more than 0%%, got %r" % (name, value))
        return "percent", pct
    match = _COUNT.match(text)
    if match:
        count = int(match.group(1))
        if count == 0 and not allow_zero:
            raise ValueError("%s must be at least 1, got %r" % (name, value))
        return "count", float(count)
    raise ValueError("%s must be a count (at least %d) or a percentage such as 10%%, got %r"
                     % (name, 0 if allow_zero else 1, value))


def amount_of(amount: Tuple[str, float], size: int, minimum: int = 1) -> int:
    """An amount from :func:`parse_amount` applied to a group of ``size`` nodes.

    A percentage is rounded down and is at least ``minimum``; a count is capped at ``size``
    (at least ``minimum``). ``amount_of(("percent", 10), 25)`` → 2.
    """
    kind, value = amount
    if kind == "percent":
        count = int(math.floor(value / 100.0 * size + 1e-9))
    else:
        count = int(value)
    return max(minimum, min(count, size)) if size else max(minimum, 0)


def _non_negative_number(value: Any, name: str) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError("%s must be a number, got %r" % (name, value))
    if math.isnan(number) or math.isinf(number) or number < 0:
        raise ValueError("%s must be a number, 0 or more, got %r" % (name, value))
    return number


def _fraction(value: Any, name: str) -> float:
    number = _non_negative_number(value, name)
    if number >= 1:
        raise ValueError("%s must be below 1, got %r" % (name, value))
    return number


def poisson_tail(count: int, mean: float) -> float:
    """P(X >= count) for X ~ Poisson(mean): how likely ``count`` failures are by chance alone."""
    if count <= 0:
        return 1.0
    term = math.exp(-mean)
    below = term
    for k in range(1, count):
        term *= mean / k
        below += term
    return max(0.0, 1.0 - below)


def _positive_int(value: Any, name: str) -> int:
    text = str(value).strip() if not isinstance(value, bool) else ""
    if not _COUNT.match(text) or int(text) < 1:
        raise ValueError("%s must be a whole number, at least 1, got %r" % (name, value))
    return int(text)


_TRUE = ("true", "yes", "on", "1")
_FALSE = ("false", "no", "off", "0")


def _boolean(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("%s must be true or false, got %r" % (name, value))


def _choice(value: Any, choices: Sequence[str], name: str) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise ValueError("%s must be one of %s, got %r" % (name, ", ".join(choices), value))
    return text


def phase(node: Mapping[str, Any]) -> Optional[str]:
    """Where an in-flight node is in its transaction: ``draining`` (its drain requested, jobs still
    running), ``drained`` (drained, waiting for its install admission) or ``installing`` (its install
    was admitted, or nothing says otherwise: a journal without drain events). ``None`` when the node
    is not in flight."""
    if node.get("status") != "in_flight":
        return None
    if node.get("draining"):
        return "draining"
    if node.get("drained"):
        return "drained"
    return "installing"


def normalize_options(options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Validate and normalise the budget options (missing ones take :data:`DEFAULTS`).

    :param options: ``{"max_unavailable", "max_unavailable_domain", "failure_budget",
        "signature_limit", "background_failure_rate", "signature_alpha", "window_initial",
        "window_growth", "canary_quorum", "drain_ahead" (bool; text true/false, yes/no, 1/0),
        "contract_changes" (stop | warn), "contract_accept"
        (patterns, contract_decision.parse_accept), "executor" (:data:`EXECUTORS`)}``; values
        may be text (extra vars).
    :returns: the same keys with amounts as :func:`parse_amount` tuples and numbers as numbers.
    :raises ValueError: naming the first bad value, or an option that does not exist.
    """
    raw = dict(DEFAULTS)
    raw.update(dict((k, v) for k, v in (options or {}).items() if v is not None and v != ""))
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ValueError("unknown budget options: %s" % ", ".join(unknown))
    out = {
        "max_unavailable": parse_amount(raw["max_unavailable"], "rollout_max_unavailable"),
        "max_unavailable_domain": (parse_amount(raw["max_unavailable_domain"], "rollout_max_unavailable_domain")
                                   if raw.get("max_unavailable_domain") not in (None, "") else None),
        "failure_budget": parse_amount(raw["failure_budget"], "rollout_failure_budget", allow_zero=True),
        "signature_limit": _positive_int(raw["signature_limit"], "rollout_signature_limit"),
        "background_failure_rate": _fraction(raw["background_failure_rate"], "rollout_background_failure_rate"),
        "signature_alpha": _fraction(raw["signature_alpha"], "rollout_signature_alpha"),
        "window_initial": _positive_int(raw["window_initial"], "rollout_window_initial"),
        "window_growth": _non_negative_number(raw["window_growth"], "rollout_window_growth"),
        "canary_quorum": parse_amount(raw["canary_quorum"], "rollout_canary_quorum"),
        "drain_ahead": _boolean(raw["drain_ahead"], "rollout_drain_ahead"),
        "contract_changes": contract_decision.parse_mode(raw["contract_changes"]),
        "contract_accept": contract_decision.parse_accept(raw["contract_accept"]),
        "executor": _choice(raw["executor"], EXECUTORS, "rollout_executor"),
    }
    return out


def failure_signature(record: Mapping[str, Any]) -> Dict[str, Any]:
    """The signature of a failed node's record, and whether it implicates the driver.

    :param record: a rollout report record (``result``, ``flags``, ``new_fatal_xids``,
        ``marks`` (epoch seconds per phase), ``reason``, ``target.version``).
    :returns: ``{"signature": "xid 79" | "<flag>" | "<failed phase>", "implicates_driver": bool}``.
        A new fatal Xid names the signature (the lowest Xid number); otherwise the verdict's
        first flag other than ``transaction_failed``; otherwise the phase the transaction failed
        in. A failure before the install began (no ``snapshot`` or ``installed`` mark: the preflight,
        the lock, the drain or the snapshot failed, or the node was unreachable before the install)
        implicates nothing: the new driver had not touched the node. Marks are set by the
        ``node_upgrade`` role (``roles/node_upgrade/tasks/*.yml``).
    """
    marks = record.get("marks") or {}
    xids = sorted((record.get("new_fatal_xids") or {}).keys(), key=lambda x: int(x) if str(x).isdigit() else 1 << 30)
    flags = [f for f in (record.get("flags") or []) if f != "transaction_failed"]
    if xids:
        signature = "xid %s" % xids[0]
    elif flags:
        signature = flags[0]
    else:
        phase = "install"
        for name in ("rebooted", "installed", "snapshot", "drained"):
            if name in marks:
                phase = {"rebooted": "verify", "installed": "reboot", "snapshot": "install", "drained": "snapshot"}[name]
                break
        else:
            phase = "drain"
        signature = "%s failed" % phase
    return {"signature": signature, "implicates_driver": "installed" in marks or "snapshot" in marks}


def blameless(node: Mapping[str, Any]) -> bool:
    """Whether a failed node's record clears the driver (``implicates_driver`` is ``False``).

    A record that does not say (an older journal, a hand-written state) does not clear it: in the
    golden and canary stages it stops the rollout.
    """
    return node.get("status") == "failed" and node.get("implicates_driver") is False


def stand_ins(nodes: Sequence[Mapping[str, Any]]) -> Dict[str, Dict[str, str]]:
    """Wave nodes that take the place of golden or canary nodes that failed blamelessly.

    Per class, each golden or canary node that failed before its install began (:func:`blameless`)
    is replaced by the class's next wave node in priority order, golden places first. A wave node
    out of service and still pending, or refused by its preflight, is passed over (it cannot
    run), and so is one that had
    already finished when the node it would replace failed (``finished_at``: it did not run as a
    stand-in); a stand-in that itself fails blamelessly is replaced by the next one. The choice
    depends only on the nodes' states, so every step makes the same one, and a stand-in keeps its
    place once it has started.

    :param nodes: as for :func:`decide`.
    :returns: ``{wave node: {"stage": "golden" | "canary", "replaces": node name}}``.
    """
    need = {}  # type: Dict[str, List[Tuple[str, str, Any]]]
    for node in nodes:
        if node.get("stage") in ("golden", "canary") and blameless(node):
            need.setdefault(node["class"], []).append((node["stage"], node["name"], node.get("finished_at")))
    out = {}  # type: Dict[str, Dict[str, str]]
    if not need:
        return out
    for places in need.values():
        places.sort(key=lambda place: _RANK[place[0]])
    for node in nodes:
        places = need.get(node["class"])
        if not places or node.get("stage", "waves") != "waves":
            continue
        if (node.get("status") == "pending" and node.get("out_of_service")) or node.get("status") == "refused":
            continue
        stage, replaced, failed_at = places[0]
        if node.get("status") in ("done", "failed") and None not in (node.get("finished_at"), failed_at) \
                and float(node["finished_at"]) < float(failed_at):
            continue
        out[node["name"]] = {"stage": stage, "replaces": replaced}
        if blameless(node):
            places[0] = (stage, node["name"], node.get("finished_at"))
        else:
            places.pop(0)
    return out


def effective_nodes(nodes: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The nodes with each stand-in (:func:`stand_ins`) in the stage it takes; others unchanged."""
    chosen = stand_ins(nodes)
    if not chosen:
        return list(nodes)
    return [dict(node, stage=chosen[node["name"]]["stage"], stand_in_for=chosen[node["name"]]["replaces"])
            if node["name"] in chosen else node for node in nodes]


def _class_sizes(nodes: Sequence[Mapping[str, Any]], key: str) -> Dict[Any, int]:
    sizes = {}  # type: Dict[Any, int]
    for node in nodes:
        value = node.get(key)
        if value is not None:
            sizes[value] = sizes.get(value, 0) + 1
    return sizes


def _out_of_service(node: Mapping[str, Any]) -> bool:
    return node.get("status") in ("in_flight", "failed") or bool(node.get("out_of_service"))


def budgets(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """Per class: size, capacity budget, out of service now, free slots, failures and their budget.

    :param nodes: as for :func:`decide`.
    :param options: from :func:`normalize_options`.
    :returns: ``{class: {"nodes", "max_unavailable", "out_of_service", "free", "in_flight",
        "installing" (in flight past the install admission, :func:`phase`), "failed",
        "failed_after_install", "failure_budget", "verified": {stage: n}}}``; ``free``
        is ``max_unavailable - out_of_service`` (at least 0) before this step's starts.
    """
    out = {}  # type: Dict[str, Dict[str, Any]]
    for node in nodes:
        klass = node["class"]
        row = out.get(klass)
        if row is None:
            row = out[klass] = {"nodes": 0, "out_of_service": 0, "in_flight": 0, "installing": 0, "failed": 0,
                                "failed_after_install": 0, "verified": {"golden": 0, "canary": 0, "waves": 0}}
        row["nodes"] += 1
        status = node.get("status")
        if status in ("in_flight", "failed") or node.get("out_of_service"):
            row["out_of_service"] += 1
        if status == "in_flight":
            row["in_flight"] += 1
            if phase(node) == "installing":
                row["installing"] += 1
        elif status == "failed":
            row["failed"] += 1
            if node.get("implicates_driver"):
                row["failed_after_install"] += 1
        elif status == "done" and node.get("changed", True):
            stage = node.get("stage") or "waves"
            row["verified"][stage] = row["verified"].get(stage, 0) + 1
    for row in out.values():
        row["max_unavailable"] = amount_of(options["max_unavailable"], row["nodes"])
        # A percentage leaves every class at least one isolated failure; a count is taken as given
        # (0: zero tolerance).
        row["failure_budget"] = amount_of(options["failure_budget"], row["nodes"],
                                          minimum=1 if options["failure_budget"][0] == "percent" else 0)
        row["free"] = max(0, row["max_unavailable"] - row["out_of_service"])
    return out


def _stop(code: str, reason: str, **extra: Any) -> Dict[str, Any]:
    out = {"code": code, "reason": reason}
    out.update(extra)
    return out


def stop_reason(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any],
                rows: Optional[Mapping[str, Mapping[str, Any]]] = None) -> Optional[Dict[str, Any]]:
    """Why the rollout must stop now, or ``None``.

    :param nodes: as for :func:`decide`, stand-ins already in their stage (:func:`effective_nodes`).
    :returns: ``{"code" (a :data:`STOP_CODES` key), "reason" (a sentence), "nodes": [names],
        "class"?, "signature"?, "target"?}``. Checked in order: a golden / canary failure that
        the driver can be blamed for (not :func:`blameless`), a repeated signature on one
        target, a class over its failure budget, a golden node's unexplained contract change
        (:func:`contract_stop`).
    """
    rows = rows if rows is not None else budgets(nodes, options)
    failed = [n for n in nodes if n.get("status") == "failed"]
    if not failed:
        return contract_stop(nodes, options)
    early = [n for n in failed if n.get("stage") in ("golden", "canary") and not blameless(n)]
    if early:
        first = early[0]
        reason = "%s node %s failed: %s" % (first["stage"], first["name"], first.get("signature") or "failed")
        if first.get("stand_in_for"):
            reason += " (stand-in for %s)" % first["stand_in_for"]
        return _stop("stage_failure", reason, nodes=[n["name"] for n in early])
    by_signature = {}  # type: Dict[Tuple[str, str], List[str]]
    attempts = {}  # type: Dict[str, int]
    for node in nodes:
        target = str(node.get("target") or "")
        status = node.get("status")
        if (status == "done" and node.get("changed", True)) or (status == "failed" and node.get("implicates_driver")):
            attempts[target] = attempts.get(target, 0) + 1
    for node in failed:
        if node.get("implicates_driver") and node.get("signature"):
            key = (str(node.get("target") or ""), str(node["signature"]))
            by_signature.setdefault(key, []).append(node["name"])
    for (target, signature), names in sorted(by_signature.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        chance = poisson_tail(len(names), attempts.get(target, 0) * options["background_failure_rate"])
        if len(names) >= options["signature_limit"] and chance < options["signature_alpha"]:
            return _stop("driver_implicated", "driver implicated: %d nodes failed with %s after the install%s "
                         "(%d installed; by chance alone: p=%.1g)"
                         % (len(names), signature, (" of %s" % target) if target else "", attempts.get(target, 0),
                            chance), nodes=names, signature=signature, target=target or None)
    for klass in sorted(rows):
        row = rows[klass]
        if row["failed_after_install"] > row["failure_budget"]:
            names = [n["name"] for n in failed if n["class"] == klass and n.get("implicates_driver")]
            return _stop("failure_budget", "failure budget of class %s exceeded: %d nodes failed after the install "
                         "(budget %d of %d nodes)" % (klass, row["failed_after_install"], row["failure_budget"],
                                                      row["nodes"]), nodes=names, **{"class": klass})
    return contract_stop(nodes, options)


def contract_verdicts(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any]) -> Dict[str, Dict[str, Any]]:
    """What each class's golden node's contract changes come to under the current options.

    :param nodes: as for :func:`decide`; a golden node upgraded in this rollout carries
        ``contract_changes`` (``contract_decision.classify``) from its record.
    :returns: ``{class: {"node": the first golden node (plan order) with changes on record,
        "changes": contract_decision.resolve(...), "unexplained": [change]}}``; classes whose
        golden node has no record of its changes yet are absent.
    """
    out = {}  # type: Dict[str, Dict[str, Any]]
    for node in nodes:
        if node.get("stage") != "golden" or node["class"] in out or "contract_changes" not in node \
                or node.get("status") not in ("in_flight", "done"):
            continue
        changes = contract_decision.resolve(node["contract_changes"], options.get("contract_accept") or [])
        out[node["class"]] = {"node": node["name"], "changes": changes,
                              "unexplained": [c for c in changes if c["decision"] == "unexplained"]}
    return out


def contract_stop(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The stop for a golden node's unexplained contract change (``contract_changes: stop``), or ``None``.

    Checked as soon as the golden node is recorded (during its soak), so its class's canary pool
    does not start. Accepting the changes (``contract_accept``) and deciding again lifts it.
    """
    if options.get("contract_changes", "stop") != "stop":
        return None
    for klass, verdict in sorted(contract_verdicts(nodes, options).items()):
        if verdict["unexplained"]:
            return _stop("contract_unexplained", contract_decision.stop_reason(verdict["node"], klass,
                                                                               verdict["unexplained"]),
                         nodes=[verdict["node"]], **{"class": klass})
    return None


def stage_gates(nodes: Sequence[Mapping[str, Any]], quorum: Optional[Tuple[str, float]] = None) -> Dict[str, str]:
    """The stage open for each class now.

    A class moves golden → canary → waves on its own: its canary pool opens when its golden
    nodes have passed (their transaction includes the soak and its check), its waves when its
    canary pool has. A node out of service, or still waiting for its drain (``draining``:
    nothing was installed yet, so it has proven nothing), holds no stage open, and once a
    later stage of a class has started, an earlier one does not close it again. A class with
    no golden (canary) node of its own follows the fleet's: it waits while any class's golden
    (canary) stage is open. With a ``quorum`` (a :func:`parse_amount` tuple, of the class's
    canary pool), a class's canary stage also passes once that many of its canary nodes have
    passed: the others go on under zero tolerance while the waves run.

    :returns: ``{class: "golden" | "canary" | "waves"}``.
    """
    open_stages = {}  # type: Dict[str, set]
    reached = {}  # type: Dict[str, int]
    members = {}  # type: Dict[str, set]
    pool = {}  # type: Dict[str, List[int]]
    for node in nodes:
        if node.get("stage") == "canary":
            row = pool.setdefault(node["class"], [0, 0])
            row[0] += 1
            row[1] += 1 if node.get("status") == "done" else 0
    passed = set(klass for klass, (size, done) in pool.items()
                 if quorum is not None and done >= amount_of(quorum, size))
    # A canary node still draining is left out of its pool only once one of the pool has passed:
    # a pool none of whose nodes has passed proves nothing yet.
    proven = set(klass for klass, (_size, done) in pool.items() if done > 0)
    for node in nodes:
        klass = node["class"]
        stage = node.get("stage")
        status = node.get("status")
        members.setdefault(klass, set()).add(stage)
        if phase(node) == "installing" or status == "done" or (status == "failed" and not blameless(node)):
            # A node refused by its preflight (drained by someone else, say) ran nothing, and a node
            # drained ahead of its stage, or failed before its install, installed nothing: the
            # class has not reached its stage through it.
            reached[klass] = max(reached.get(klass, 0), _RANK.get(stage, 2))
        else:
            reached.setdefault(klass, 0)
        if stage == "canary" and klass in passed:
            continue
        # A golden node in flight holds its stage whatever it is doing: nothing after it installs
        # before it has passed. A canary node still draining does not, once a node of its pool has
        # passed (the quorum's "left out").
        if stage in ("golden", "canary") and (
                (status == "pending" and not node.get("out_of_service"))
                or (status == "in_flight" and (stage == "golden" or not node.get("draining") or klass not in proven))):
            open_stages.setdefault(klass, set()).add(stage)
    fleet_open = set()
    for klass, stages in open_stages.items():
        fleet_open.update(stage for stage in stages if _RANK[stage] >= reached[klass])
    out = {}
    for klass in reached:
        out[klass] = "waves"
        for stage in ("golden", "canary"):
            if _RANK[stage] < reached[klass]:
                continue
            own = stage in members[klass]
            if (own and stage in open_stages.get(klass, ())) or (not own and stage in fleet_open):
                out[klass] = stage
                break
    return out


def start_order(startable: Sequence[Mapping[str, Any]]) -> List[Mapping[str, Any]]:
    """The order in which pending nodes start: golden, canary, then wave nodes longest drain first.

    :param startable: pending nodes in priority order (inventory order within a stage).
    :returns: the same nodes; golden and canary nodes keep their order, and wave nodes with a
        ``drain_estimate_s`` (seconds until the node's running jobs end, from its scheduler) come
        first, longest first, then the others in inventory order. Starting the longest drains
        first keeps a job that runs for hours from starting last and holding the rollout's end.
    """
    def key(item):
        index, node = item
        rank = _RANK.get(node.get("stage"), 2)
        estimate = node.get("drain_estimate_s")
        if rank < 2 or not isinstance(estimate, (int, float)) or isinstance(estimate, bool) or math.isnan(estimate):
            return (rank, 1, 0.0, index)
        return (rank, 0, -float(estimate), index)
    return [node for _index, node in sorted(enumerate(startable), key=key)]


def install_windows(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any],
                    rows: Mapping[str, Mapping[str, Any]], gates: Mapping[str, str]) -> Dict[str, int]:
    """Per class, how many more transactions may begin their install now (the slow start).

    In a class's golden stage, and in its canary stage once a golden node has passed: as many as
    the capacity budget has room for. Otherwise ``window_initial + window_growth x verified /
    (1 + failures after the install, all classes)`` minus the class's transactions past their
    install admission (``installing``; with ``drain_ahead`` off, all of its transactions in
    flight), where ``verified`` counts golden and canary nodes, and wave nodes once the waves
    are open.

    :returns: ``{class: n}`` (0 or more).
    """
    slowdown = 1 + sum(row["failed_after_install"] for row in rows.values())
    ahead = bool(options.get("drain_ahead", True))
    window = {}
    for klass, row in rows.items():
        stage = gates.get(klass, "golden")
        if stage == "golden" or (stage == "canary" and row["verified"].get("golden", 0) > 0):
            window[klass] = row["free"] if not ahead else row["max_unavailable"]
        else:
            verified = (row["verified"].get("golden", 0) + row["verified"].get("canary", 0)
                        + (row["verified"].get("waves", 0) if stage == "waves" else 0))
            busy = row["installing"] if ahead else row["in_flight"]
            window[klass] = max(0, int(options["window_initial"] + options["window_growth"] * verified / slowdown)
                                - busy)
    return window


def install_admissions(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any],
                       rows: Mapping[str, Mapping[str, Any]], gates: Mapping[str, str],
                       window: Optional[Dict[str, int]] = None) -> List[str]:
    """Drained nodes whose install may begin now (``drain_ahead``), in priority order.

    A node waiting for its install (:func:`phase` ``drained``) is admitted when its stage is open
    for its class (:func:`stage_gates`; a canary node that drained while its class's waves were
    already open goes on under zero tolerance) and its class's window has room
    (:func:`install_windows`); golden and canary nodes are not held by the waves' window. The
    node already holds its capacity slot.

    :param window: from :func:`install_windows`; consumed (it is decremented per wave node
        admitted). ``None``: computed here.
    :returns: node names.
    """
    window = window if window is not None else install_windows(nodes, options, rows, gates)
    out = []
    for node in nodes:
        if phase(node) != "drained":
            continue
        klass = node["class"]
        rank = _RANK.get(node.get("stage"), 2)
        gate = _RANK[gates.get(klass, "golden")]
        if rank > gate:
            continue
        if rank == gate and window.get(klass, 0) <= 0:
            continue
        out.append(node["name"])
        if rank == gate:
            window[klass] -= 1
    return out


def decide(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any],
           candidates: Optional[Iterable[str]] = None, limit: Optional[int] = None) -> Dict[str, Any]:
    """Decide the next step of a rollout: which nodes to start now, or why to wait or stop.

    :param nodes: every node of the rollout, in priority order (inventory order within a stage),
        each ``{"name", "class", "stage" (golden | canary | waves), "status" (:data:`STATUSES`),
        "out_of_service"?: bool (drained, down or unreachable by someone else's doing: counts
        against the budget, is not started), "draining"?: bool (in flight, still waiting for its
        drain: it keeps its slot; a canary node holds no stage open), "drained"?: bool (in flight,
        drained, waiting for its install admission), "drain_estimate_s"?: seconds until its
        running jobs end (:func:`start_order`), "domain"?: failure domain, "finished_at"?: epoch s,
        "changed"?: False for a node that was already on target, "signature"?,
        "implicates_driver"?: bool, "target"?: version, "contract_changes"?: a golden node's
        ``contract_decision.classify`` from its record}``.
    :param options: from :func:`normalize_options`.
    :param candidates: names this step may start (the step's hosts); ``None``: any.
    :param limit: start at most this many (the controller's free workers); ``None``: no limit.
    :returns: ``{"action": "start" | "wait" | "done" | "stop", "start": [names] (their drain may
        begin), "install": [names] (drained nodes whose install may begin, :func:`install_admissions`;
        with ``drain_ahead`` off always empty: the install follows the drain), "release": [names]
        (on a stop: nodes in flight whose install has not begun, to return to service), "stages":
        {class: the stage open for it (:func:`stage_gates`)}, "stop": :func:`stop_reason`
        | None, "budgets": :func:`budgets`, "quarantined": [failed nodes], "deferred": [nodes
        still to do that are out of service], "in_flight": n, "stand_ins": :func:`stand_ins`,
        "contract": :func:`contract_verdicts`}``.
        ``done``: nothing is running and nothing is left that can start now (``deferred`` lists
        what waits for its node). Stand-ins are decided in the stage they take.
    """
    nodes = effective_nodes(nodes)
    rows = budgets(nodes, options)
    stop = stop_reason(nodes, options, rows)
    quarantined = [n["name"] for n in nodes if n.get("status") == "failed"]
    deferred = [n["name"] for n in nodes if n.get("status") == "pending" and n.get("out_of_service")]
    in_flight = sum(row["in_flight"] for row in rows.values())
    result = {"action": "wait", "start": [], "install": [], "release": [], "stages": {}, "stop": stop, "budgets": rows,
              "quarantined": quarantined, "deferred": deferred, "in_flight": in_flight,
              "stand_ins": dict((n["name"], {"stage": n["stage"], "replaces": n["stand_in_for"]})
                                for n in nodes if n.get("stand_in_for")),
              "contract": contract_verdicts(nodes, options)}
    if stop is not None:
        result["action"] = "stop"
        # Nodes whose install has not begun go back to service untouched.
        result["release"] = [n["name"] for n in nodes if phase(n) in ("draining", "drained")]
        return result
    startable = [n for n in nodes if n.get("status") == "pending" and not n.get("out_of_service")]
    if not startable and not in_flight:
        result["action"] = "done"
        return result
    gates = stage_gates(nodes, options.get("canary_quorum"))
    result["stages"] = gates
    if not startable:
        if options.get("drain_ahead", True):
            result["install"] = install_admissions(nodes, options, rows, gates)
            result["action"] = "start" if result["install"] else "wait"
        return result
    allowed = set(candidates) if candidates is not None else None
    domain_free = {}  # type: Dict[Any, int]
    if options.get("max_unavailable_domain") is not None:
        sizes = _class_sizes(nodes, "domain")
        busy = _class_sizes([n for n in nodes if _out_of_service(n)], "domain")
        for domain, size in sizes.items():
            domain_free[domain] = amount_of(options["max_unavailable_domain"], size) - busy.get(domain, 0)
    ahead = bool(options.get("drain_ahead", True))
    window = install_windows(nodes, options, rows, gates)
    if ahead:
        result["install"] = install_admissions(nodes, options, rows, gates, window)
    free = dict((klass, row["free"]) for klass, row in rows.items())
    chosen = []
    for node in start_order(startable):
        klass = node["class"]
        if not ahead and _RANK.get(node.get("stage"), 2) > _RANK[gates[klass]]:
            continue
        if allowed is not None and node["name"] not in allowed:
            continue
        if limit is not None and len(chosen) >= limit:
            break
        if free[klass] <= 0 or (not ahead and window[klass] <= 0):
            continue
        domain = node.get("domain")
        if domain in domain_free and domain_free[domain] <= 0:
            continue
        chosen.append(node["name"])
        free[klass] -= 1
        window[klass] -= 1
        if domain in domain_free:
            domain_free[domain] -= 1
    result["start"] = chosen
    result["action"] = "start" if chosen or result["install"] else "wait"
    return result


def step_hosts(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any],
               limit: int) -> Tuple[Dict[str, Any], List[str]]:
    """The hosts of the next step of ``playbooks/rollout.yml``: nodes in flight (to resume) first,
    then nodes that can start (``rollout_step`` state=choose, and the simulation's fixed-step executor).

    :param nodes: ``rollout_journal.fleet_state`` (the shape :func:`decide` reads); :param options:
        :func:`normalize_options`; :param limit: at most this many hosts (the controller's forks, so
        that every host of the step has a worker while it waits for its slot).
    :returns: ``(decision, [names])``. Beyond what may start now, the step takes the next nodes
        of each class in stage order, classes in turn: they wait for their slot (and their stage)
        in the same step, so that slots freed during the step are filled at once.
    :raises: what :func:`decide` raises.
    """
    decision = decide(nodes, options)
    if decision["action"] in ("stop", "done"):
        return decision, [n["name"] for n in nodes if n["status"] == "in_flight"][:limit]
    hosts = [n["name"] for n in nodes if n["status"] == "in_flight"]
    chosen = set(hosts)
    for name in decision["start"]:
        if name not in chosen:
            hosts.append(name)
            chosen.add(name)
    queues = {}
    for stage in STAGES:
        for node in nodes:
            if node["status"] == "pending" and not node.get("out_of_service") and node["name"] not in chosen \
                    and node["stage"] == stage:
                queues.setdefault(node["class"], []).append(node["name"])
    order = sorted(queues)
    while len(hosts) < limit and any(queues.values()):
        for klass in order:
            if queues[klass] and len(hosts) < limit:
                hosts.append(queues[klass].pop(0))
    return decision, hosts[:limit]


def pass_hosts(nodes: Sequence[Mapping[str, Any]], options: Mapping[str, Any], limit: int,
               busy: Optional[Iterable[str]] = None, now: Optional[float] = None) -> Tuple[Dict[str, Any], List[str]]:
    """The hosts of the next pass (``rollout_executor: passes``): only nodes whose next action is
    ready now, so that every worker of the pass acts and none waits (``plugin_utils.node_states``).

    In flight, a node is left out while it waits: for its install admission (``waiting``, drained
    ahead, not in :func:`decide`'s ``install`` and not to be released at a stop), for its drain
    (``waiting_for: drain``) while ``busy`` says its jobs still run and its drain has time left
    (``waiting_until`` after ``now``; a stop takes it, to release it), or for the reboot its
    scheduler runs (``pending``) while ``busy`` says its jobs still run. Every other node in
    flight is taken (its reboot may be over; a cut-off or killed node is resumed), then the nodes
    :func:`decide` starts now. No node is taken to wait for a slot: a slot freed during the pass is
    filled by the next one.

    :param nodes: ``rollout_journal.fleet_state`` (:func:`decide`'s shape; ``waiting``?, ``pending``?).
    :param options: :func:`normalize_options`. :param limit: at most this many hosts (the forks).
    :param busy: inventory names of the nodes with a running job (``squeue``); ``None`` when
        unknown (every pending or draining node is taken: reading it is safe, only a worker's time).
    :param now: epoch seconds (``None``: no drain is taken as out of time).
    :returns: ``(decision, [names])``: in flight first, in node order, then the starts.
    :raises: what :func:`decide` raises.
    """
    decision = decide(nodes, options)
    busy_set = set(busy) if busy is not None else None
    installs = set(decision["install"])
    release = set(decision.get("release") or [])
    hosts = []
    for node in nodes:
        if node.get("status") != "in_flight":
            continue
        jobs_run = busy_set is not None and node["name"] in busy_set
        if node.get("waiting_for") == "drain":
            until = node.get("waiting_until")
            out_of_time = now is not None and isinstance(until, (int, float)) and now >= until
            if jobs_run and not out_of_time and decision["action"] != "stop":
                continue
        elif node.get("waiting") and node["name"] not in installs and node["name"] not in release:
            continue
        if node.get("pending") and jobs_run:
            continue
        hosts.append(node["name"])
    if decision["action"] not in ("stop", "done"):
        chosen = set(hosts)
        hosts.extend(name for name in decision["start"] if name not in chosen)
    return decision, hosts[:max(0, int(limit))]
