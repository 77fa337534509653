# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The pieces that make the drift report fast: forked workers, msgspec with the stdlib fallback,
declarations shared between hosts."""

from __future__ import annotations

import json
import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_declared, drift_parallel, fact_sources


def test_split_keeps_order_and_sizes():
    assert drift_parallel.split(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert drift_parallel.split([1], 4) == [[1]]
    assert drift_parallel.split([], 2) == [[]]


def test_map_forked_runs_chunks_in_other_processes_in_order():
    parent = os.getpid()
    results = drift_parallel.map_forked(lambda chunk: (sum(chunk), os.getpid() != parent), [[1, 2], [3], [4, 5]])
    assert [total for total, _child in results] == [3, 3, 9]
    assert [child for _total, child in results] == [False, True, True]


def test_map_forked_reports_a_failed_worker():
    def work(chunk):
        if chunk == ["bad"]:
            raise ValueError("cannot judge bad")
        return chunk
    with pytest.raises(drift_parallel.WorkerError, match="ValueError: cannot judge bad"):
        drift_parallel.map_forked(work, [["good"], ["bad"]])


INNER = {"nvidia": {"schema_version": 1, "driver": {"state": "ok", "loaded_version": "580.95.05"}},
         "ansible_nodename": "n1", "big": 2 ** 70}


@pytest.mark.parametrize("library", ["msgspec", "json"])
def test_decode_gives_the_same_facts_with_either_library(monkeypatch, library):
    if library == "json":
        monkeypatch.setattr(fact_sources, "msgspec", None)
    elif fact_sources.msgspec is None:
        pytest.skip("msgspec is not installed")
    wrapped = json.dumps({"__payload__": json.dumps(INNER)}).encode()
    assert fact_sources.decode_cache_text(wrapped) == (INNER, True)
    # Only the keys the report reads: setup's other facts ("big") are skipped.
    wanted = {"nvidia": INNER["nvidia"], "ansible_nodename": "n1"}
    assert fact_sources.decode_cache_text(wrapped, wanted=True) == (wanted, True)
    assert fact_sources.decode_cache_text(json.dumps(INNER), wanted=True) == (wanted, False)
    assert fact_sources.decode_cache_text(json.dumps(INNER["nvidia"]), wanted=True) == (INNER["nvidia"], False)
    assert fact_sources.decode_cache_text(b'"text"', wanted=True) == ("text", False)
    tagged = json.dumps({"nvidia": {"driver": {"value": {"state": "ok"}, "tags": [], "__ansible_type": "_AnsibleTaggedDict"}}})
    assert fact_sources.decode_cache_text(tagged) == ({"nvidia": {"driver": {"state": "ok"}}}, False)
    assert fact_sources.decode_cache_text(b'{"limit_w": NaN}')[0]["limit_w"] != 0
    with pytest.raises(ValueError):
        fact_sources.decode_cache_text(b'{"nvidia": ')


def test_load_fact_file_reads_the_nodename(tmp_path):
    (tmp_path / "s1_h1").write_text(json.dumps({"__payload__": json.dumps(INNER)}))
    entry = fact_sources.load_fact_file(str(tmp_path / "s1_h1"))
    assert entry["nodename"] == "n1" and entry["wrapped"] is True and entry["error"] is None


def test_vars_entry_names_and_templates(tmp_path):
    (tmp_path / "host_vars").mkdir()
    (tmp_path / "host_vars" / "h1.yml").write_text("x: 1\n")
    (tmp_path / "host_vars" / "h2").mkdir()
    (tmp_path / "hosts.yml").write_text("all: {}\n")
    assert drift_declared.vars_entry_names([str(tmp_path / "hosts.yml"), None, "/nonexistent"]) >= {"h1", "h2"}
    assert drift_declared.is_template({"a": ["{{ x }}"]}) and not drift_declared.is_template({"a": "580"})
