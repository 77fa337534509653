# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Fixtures for the GPU simulation's unit tests: fake node roots under tmp_path."""

import io
import os
import sys

import pytest

SIMFLEET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "simfleet")
if SIMFLEET_DIR not in sys.path:
    sys.path.insert(0, os.path.abspath(SIMFLEET_DIR))

from simfleet.gpu import load_pynvml, simgpu  # noqa: E402  pylint: disable=wrong-import-position
from simfleet.gpu import state as gpu_state  # noqa: E402  pylint: disable=wrong-import-position

KERNEL = "6.1.0-31-amd64"

simgpu()
from simgpu import cli as sim_cli  # noqa: E402  pylint: disable=wrong-import-position
from simgpu import smi as sim_smi  # noqa: E402  pylint: disable=wrong-import-position


class FakeNode:
    """A fake node root: state file, driver files, and helpers to run its front ends."""

    def __init__(self, root):
        self.root = root
        self.boot_count = 0

    @property
    def state_path(self):
        return gpu_state.state_path(self.root)

    def state(self):
        return gpu_state.load_state(self.state_path)

    def boot(self):
        self.boot_count += 1
        return gpu_state.boot_node_root(self.root, kernel_release=KERNEL, boot_id="boot-%d" % self.boot_count,
                                        now=1767225600.0 + 600 * self.boot_count)

    def smi(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        code = sim_smi.main(list(argv), root=self.root, stdout=out, stderr=err)
        return code, out.getvalue(), err.getvalue()

    def dmesg(self, *argv):
        out, err = io.StringIO(), io.StringIO()
        code = sim_cli.dmesg_main(list(argv), root=self.root, stdout=out, stderr=err)
        return code, out.getvalue()


@pytest.fixture(name="make_node")
def fixture_make_node(tmp_path, monkeypatch):
    """make_node(profile, version, flavor, boot=True, **write_node_root kwargs) -> FakeNode."""
    monkeypatch.setenv("SIMGPU_KERNEL_RELEASE", KERNEL)
    monkeypatch.delenv("SIMGPU_FAKE_UID", raising=False)

    def make(profile="h100", version="580.126.20", flavor="open", boot=True, **kwargs):
        root = str(tmp_path / ("root-%s" % profile))
        state = kwargs.pop("state", None) or gpu_state.initial_state(profile, "node-%s" % profile)
        gpu_state.write_node_root(root, state, loaded=False, userspace_version=version, flavor=flavor,
                                  kernel_release=KERNEL, **kwargs)
        monkeypatch.setenv("SIMGPU_ROOT", root)
        node = FakeNode(root)
        if boot:
            node.boot()
        return node

    return make


@pytest.fixture(name="nvml")
def fixture_nvml():
    """The drop-in pynvml (shut down after the test if a test left it initialised)."""
    module = load_pynvml()
    yield module
    while getattr(module, "_SIM_LIB").refcount > 0:
        module.nvmlShutdown()
