# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The one Prometheus textfile writer: families written in order, a clear error without prometheus_client."""

from __future__ import annotations

import sys

import pytest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import prometheus_textfile


def test_families_are_written_in_order_and_nothing_else(tmp_path):
    nodes = GaugeMetricFamily("gpufleet_test_nodes", "Nodes per class.", labels=["class"])
    nodes.add_metric(["gpu_h100"], 8.0)
    nodes.add_metric(["gpu_a100"], 3.0)
    watts = GaugeMetricFamily("gpufleet_test_limit_watts", "A power limit in watts.", value=700.0)
    path = tmp_path / "test.prom"
    prometheus_textfile.write_families(str(path), [nodes, watts])
    families = list(text_string_to_metric_families(path.read_text()))
    assert [family.name for family in families] == ["gpufleet_test_nodes", "gpufleet_test_limit_watts"]
    assert [(s.labels, s.value) for s in families[0].samples] == [({"class": "gpu_h100"}, 8.0),
                                                                  ({"class": "gpu_a100"}, 3.0)]
    assert [s.value for s in families[1].samples] == [700.0]
    # No process or platform collector of the default registry slips in.
    assert not any(family.name.startswith(("process_", "python_")) for family in families)
    # Written through a temporary file and a rename: nothing else is left in the directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["test.prom"]


def test_without_prometheus_client_the_error_says_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import raises ImportError
    assert prometheus_textfile.available() is False
    with pytest.raises(prometheus_textfile.PrometheusUnavailable) as raised:
        prometheus_textfile.write_families(str(tmp_path / "test.prom"), [])
    assert list(tmp_path.iterdir()) == []
    # One remedy text, in the failure (asked for) and in the note of a skipped file (default formats).
    remedy = prometheus_textfile.remedy()
    assert remedy == ("the controller's Python (%s) has no prometheus_client; to get it, install the collection's "
                      "controller requirements (%s -m pip install -r %s) and run the report again" % (
                          sys.executable, sys.executable, prometheus_textfile.REQUIREMENTS))
    assert str(raised.value) == ("the Prometheus output was asked for (formats names prometheus) but %s, or leave "
                                 "prometheus out of the formats" % remedy)
    assert prometheus_textfile.skipped_note("/r/x.prom") == (
        "the Prometheus textfile /r/x.prom was not written: %s; every other format was written" % remedy)


def test_with_prometheus_client_it_is_available():
    assert prometheus_textfile.available() is True
