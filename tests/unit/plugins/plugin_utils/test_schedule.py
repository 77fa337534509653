# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Serial batches, checked against ansible-core's own PlaybookExecutor."""

from __future__ import annotations

import pytest

from ansible.executor.playbook_executor import PlaybookExecutor

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils.schedule import (
    DEFAULT_SERIAL,
    batch_count,
    normalize_serial,
    pct_to_int,
    plan_rollout,
    serial_batches,
)


class _Inventory(object):
    def __init__(self, hosts):
        self._hosts = hosts

    def get_hosts(self, pattern, order=None):
        return list(self._hosts)


class _Play(object):
    hosts = "all"
    order = "inventory"

    def __init__(self, serial):
        self.serial = serial


class _Executor(object):
    def __init__(self, hosts):
        self._inventory = _Inventory(hosts)


def ansible_batches(serial, count):
    """Batch sizes as ansible-core's PlaybookExecutor computes them."""
    hosts = ["node%05d" % i for i in range(count)]
    play = _Play(normalize_serial(serial))
    batches = PlaybookExecutor._get_serialized_batches(_Executor(hosts), play)
    return [len(batch) for batch in batches]


def test_default_serial_batches_for_fleet_sizes():
    assert serial_batches(DEFAULT_SERIAL, 16) == [1, 1, 4, 10]
    assert serial_batches(DEFAULT_SERIAL, 100) == [1, 5, 25, 69]
    assert serial_batches(DEFAULT_SERIAL, 1000) == [1, 50, 250, 699]
    assert serial_batches(DEFAULT_SERIAL, 10000) == [1, 500, 2500, 6999]
    for count in (16, 100, 1000, 10000):
        assert batch_count(DEFAULT_SERIAL, count) == 4


@pytest.mark.parametrize("serial", [
    list(DEFAULT_SERIAL),
    [1, "5%", "25%"],
    ["10%"],
    [2],
    ["30%", 1],
    [1, 0],
    [],
    [3, "-5"],
    ["100%"],
    ["1%"],
    ["33%", "50%"],
])
@pytest.mark.parametrize("count", [1, 2, 3, 7, 16, 19, 100, 101, 1000, 10000])
def test_matches_ansible_core(serial, count):
    assert serial_batches(serial, count) == ansible_batches(serial, count)


def test_last_value_repeats_and_percent_of_whole_play():
    # 25 % of 16 is 4, taken of the play's 16 hosts every time, not of the hosts left.
    assert serial_batches([1, "25%"], 16) == [1, 4, 4, 4, 3]
    # 5 % of 16 is 0.8: truncated to 0, then raised to the minimum of 1.
    assert pct_to_int("5%", 16) == 1
    assert pct_to_int("5%", 100) == 5
    assert pct_to_int("7", 100) == 7
    assert serial_batches([1, "25%"], 1000) == [1] + [250] * 3 + [249]


def test_zero_or_negative_takes_the_rest_and_empty_is_one_batch():
    assert serial_batches([1, 0], 10) == [1, 9]
    assert serial_batches([], 10) == [10]
    assert serial_batches(None, 10) == [10]
    assert serial_batches(3, 10) == [3, 3, 3, 1]
    assert serial_batches(DEFAULT_SERIAL, 0) == []


def test_invalid_serial_values_are_refused():
    with pytest.raises(ValueError):
        serial_batches(["2.5%"], 10)
    with pytest.raises(ValueError):
        serial_batches(["all"], 10)
    with pytest.raises(ValueError):
        serial_batches([True], 10)
    with pytest.raises(ValueError):
        serial_batches([1], -1)


def test_plan_rollout_counts_batches_and_gates():
    plan = plan_rollout([
        {"name": "golden", "hosts": 1, "serial": 1},
        {"name": "canary", "hosts": 8, "serial": [1, "100%"]},
        {"name": "waves", "hosts": 991, "serial": list(DEFAULT_SERIAL)},
    ], node_minutes=10, gate_minutes=30)
    assert [stage["batches"] for stage in plan["stages"]] == [[1], [1, 7], [1, 49, 247, 694]]
    assert plan["batch_count"] == 7
    assert plan["hosts"] == 1000
    assert plan["gates"] == 2
    assert plan["minutes"] == 7 * 10 + 2 * 30


def test_plan_rollout_empty_stage_has_no_gate():
    plan = plan_rollout([
        {"name": "golden", "hosts": 0, "serial": 1},
        {"name": "canary", "hosts": 0, "serial": 1},
        {"name": "waves", "hosts": 16, "serial": list(DEFAULT_SERIAL)},
    ])
    assert plan["gates"] == 0
    assert plan["batch_count"] == 4
    assert plan["minutes"] is None
