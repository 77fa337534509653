"""simfleet: a fleet of booted Debian 12 nodes with simulated NVIDIA GPUs.

Each node is a real systemd-nspawn container (an overlay over a cached debootstrap base) that
answers SSH on 127.0.0.1. Only the GPU and its kernel module are simulated (``simfleet.gpu``).

Layout on disk:

* cache (``$SIMFLEET_CACHE``, default ``<repo>/.cache/simfleet``): the debootstrap base, the
  layer with the node-side GPU files, the built driver packages; shared by every fleet.
* fleet directory (``$SIMFLEET_STATE_DIR``, default ``<cache>/fleets/<name>``): one per fleet,
  holding ``fleet.json``, the SSH and GPG keys, the apt repository, the inventory and one
  directory per node (overlay upper/work/root, pid files, console log).
"""

from __future__ import annotations

import os

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
SIMFLEET_DIR = os.path.dirname(PACKAGE_DIR)
REPO_ROOT = os.path.dirname(os.path.dirname(SIMFLEET_DIR))

DEFAULT_FLEET_NAME = "default"
DEFAULT_PORT_RANGE = "22200-22999"
DEFAULT_LAYOUT = "h100,a100,l40s,v100,b200"


def cache_dir() -> str:
    """Directory of the shared cache: ``$SIMFLEET_CACHE`` or ``<repo>/.cache/simfleet``."""
    return os.path.abspath(os.environ.get("SIMFLEET_CACHE") or os.path.join(REPO_ROOT, ".cache", "simfleet"))


def fleet_dir(name: str | None = None, state_dir: str | None = None) -> str:
    """Directory of one fleet: ``state_dir``, ``$SIMFLEET_STATE_DIR`` or ``<cache>/fleets/<name>``."""
    if state_dir:
        return os.path.abspath(state_dir)
    if os.environ.get("SIMFLEET_STATE_DIR"):
        return os.path.abspath(os.environ["SIMFLEET_STATE_DIR"])
    return os.path.join(cache_dir(), "fleets", name or fleet_name())


def fleet_name() -> str:
    """Name of the fleet the command acts on: ``$SIMFLEET_NAME`` or ``default``."""
    return os.environ.get("SIMFLEET_NAME") or DEFAULT_FLEET_NAME
