"""Integration tests run against the simulated fleet (tests/simfleet).

The session-scoped fixture ``simfleet`` brings one fleet up for the whole test session and takes it
down at the end; tests share it. Tests that use it are marked ``fleet`` automatically (mark them
``@pytest.mark.fleet`` as well, so ``-m "not fleet"`` reads right in the file). The fixture gives a
``simfleet.testing.SimFleet``: ``inventory`` (path), ``nodes``, ``classes`` (node → GPU class),
``run(node, argv)`` (SSH, returns CompletedProcess), ``fault(node, kind, **args)``,
``reboot(node)`` (returns the new boot id), ``root_of(node)``, ``state_path(node)``,
``boot_id(node)``, ``reset(*nodes)``, ``ansible(pattern, module, args)``, ``playbook(path, *args)``.

Environment:

* ``SIMFLEET_TEST_LAYOUT``: GPU classes of the nodes, cycled or counted like ``simfleet up --layout``
  (default ``h100,a100,l40s,v100``: one node per class);
* ``SIMFLEET_TEST_NODES``: number of nodes (default: one per layout item);
* ``SIMFLEET_TEST_NAME``: fleet name (default ``pytest-<pid>``, so concurrent sessions never share a
  fleet; fleets of finished sessions that were not taken down are removed at the next start);
* ``SIMFLEET_TEST_PORTS``: port range (``FIRST-LAST``); without it the fleet takes a range of the
  size of ``$SIMFLEET_PORTS`` (default 22200-22999) that no other fleet on the machine uses or has
  claimed, that range or one of the ranges after it (``simfleet.testing.choose_port_range``);
* ``SIMFLEET_TEST_KEEP=1``: leave the fleet up after the session (to look at it with ``simfleet``).

The fleet needs root and the host packages that ``simfleet`` lists; without root the fleet tests
are skipped with that reason.
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SIMFLEET_DIR = os.path.join(os.path.dirname(HERE), "simfleet")
if SIMFLEET_DIR not in sys.path:
    sys.path.append(SIMFLEET_DIR)

from simfleet.testing import DEFAULT_TEST_LAYOUT, SimFleet, fleet_unavailable, make_fleet, session_fleet_name  # noqa: E402


@pytest.fixture(scope="session")
def simfleet():
    """A running simulated fleet for the session (see the module docstring); a ``SimFleet``."""
    reason = fleet_unavailable()
    if reason:
        pytest.skip(reason)
    from simfleet.proc import SimfleetError  # pylint: disable=import-outside-toplevel

    layout = os.environ.get("SIMFLEET_TEST_LAYOUT") or DEFAULT_TEST_LAYOUT
    count = int(os.environ["SIMFLEET_TEST_NODES"]) if os.environ.get("SIMFLEET_TEST_NODES") else None
    name = os.environ.get("SIMFLEET_TEST_NAME") or session_fleet_name()
    try:
        fleet = make_fleet(name, count, layout, os.environ.get("SIMFLEET_TEST_PORTS"))
    except SimfleetError as exc:
        pytest.fail("could not bring the simulated fleet up: %s" % exc, pytrace=False)
    try:
        yield SimFleet(fleet)
    finally:
        if os.environ.get("SIMFLEET_TEST_KEEP") != "1":
            fleet.down(purge=True)


# The modules in the order ``make integration`` hands them to its pytest-xdist workers (``--dist
# loadfile``: a module and its fleet stay in one worker): the longest first, so that the last module
# to start is a short one. Seconds are estimates of one module's wall time with three workers on a
# 2-core machine, to be refreshed from the slowest-test list ``make integration`` prints
# (``--durations``); only their order matters. A module not listed goes last.
MODULE_SECONDS = {
    "test_rollout_fleet.py": 900,
    "test_rollout_slurm.py": 600,
    "test_rollout_scale.py": 500,
    "test_driver_role.py": 500,
    "test_rollout_faults.py": 400,
    "test_policy_role.py": 300,
    "test_awx_runner.py": 400,
    "test_rollout_contract.py": 200,
    "test_simfleet_lifecycle.py": 150,
    "test_driver_kernel_hold.py": 150,
    "test_policy_slurm.py": 120,
    "test_simfleet_slurm.py": 100,
    "test_simfleet_fleet.py": 100,
    "test_gpu_facts_capture.py": 20,
    "test_simfleet_tooling.py": 5,
}


def pytest_collection_modifyitems(config, items):  # pylint: disable=unused-argument
    """Mark every test that uses the ``simfleet`` fixture as a ``fleet`` test, and order the modules
    longest first (``MODULE_SECONDS``; the tests of a module keep their order)."""
    for item in items:
        if "simfleet" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.fleet)
    order = dict((id(item), index) for index, item in enumerate(items))
    items.sort(key=lambda item: (-MODULE_SECONDS.get(item.path.name, 0), item.path.name, order[id(item)]))
