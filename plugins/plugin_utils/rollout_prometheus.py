# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout report's metrics as a Prometheus textfile of its own, written at every render.

The families are ``drift_prometheus.rollout_families``' (nodes per class and result, per stage
and result, the status and stop reason, capacity and failure budget left per class); the drift
report can add the same families to its own file (its ``rollout_report`` option). Written by
``prometheus_textfile.write_families`` (``prometheus_client.write_to_textfile``: a temporary
file and a rename), for node_exporter's textfile collector or a CI artifact.
"""

from __future__ import annotations

from typing import Any, Mapping

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_prometheus, prometheus_textfile

#: The file's name in the rollout's report directory.
FILENAME = "gpufleet_rollout.prom"


def write_textfile(path: str, rollout: Mapping[str, Any]) -> None:
    """Write the rollout's metrics to ``path``.

    :param rollout: ``rollout_report.build_report`` output.
    :raises prometheus_textfile.PrometheusUnavailable: without ``prometheus_client``.
    :raises OSError: when the directory cannot be written.
    """
    prometheus_textfile.require()
    prometheus_textfile.write_families(path, drift_prometheus.rollout_families(rollout))
