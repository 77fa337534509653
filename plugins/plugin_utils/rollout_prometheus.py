# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The rollout report's metrics as a Prometheus textfile of its own, written at every render.

The families are ``drift_prometheus.rollout_families``' (nodes per class and result, per stage
and result, the status and stop reason, capacity and failure budget left per class); the drift
report can add the same families to its own file (its ``rollout_report`` option). Written by
``prometheus_client.write_to_textfile`` (a temporary file and a rename), for node_exporter's
textfile collector or a CI artifact.
"""

from __future__ import annotations

from typing import Any, Iterable, List, Mapping

from ansible_collections.gpufleet.nvidia.plugins.plugin_utils import drift_prometheus

#: The file's name in the rollout's report directory.
FILENAME = "gpufleet_rollout.prom"


class _Collected(object):
    """A ``prometheus_client`` collector that yields prepared metric families."""

    def __init__(self, families: List[Any]):
        self.families = families

    def collect(self) -> Iterable[Any]:
        """The families, as ``CollectorRegistry`` asks for them."""
        return iter(self.families)


def available() -> bool:
    """Whether ``prometheus_client`` can be imported on this controller."""
    try:
        drift_prometheus.require()
    except drift_prometheus.PrometheusUnavailable:
        return False
    return True


def write_textfile(path: str, rollout: Mapping[str, Any]) -> None:
    """Write the rollout's metrics to ``path``.

    :param rollout: ``rollout_report.build_report`` output.
    :raises drift_prometheus.PrometheusUnavailable: without ``prometheus_client``.
    :raises OSError: when the directory cannot be written.
    """
    drift_prometheus.require()
    from prometheus_client import CollectorRegistry, write_to_textfile  # pylint: disable=import-outside-toplevel
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collected(drift_prometheus.rollout_families(rollout)))
    write_to_textfile(path, registry)
