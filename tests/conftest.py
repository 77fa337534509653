"""Test-wide setup: make this checkout importable as ``ansible_collections.gpufleet.nvidia``.

The repository root is the collection root. A link
``.build/collections/ansible_collections/gpufleet/nvidia`` → the repository root is made once
and put first on ``sys.path`` and in ``ANSIBLE_COLLECTIONS_PATH``, so unit tests import the
collection the way Ansible does and ansible-playbook run by integration tests finds it.
"""

import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COLLECTIONS_ROOT = os.path.join(REPO_ROOT, ".build", "collections")


def _link_collection():
    parent = os.path.join(COLLECTIONS_ROOT, "ansible_collections", "gpufleet")
    link = os.path.join(parent, "nvidia")
    os.makedirs(parent, exist_ok=True)
    if not os.path.islink(link):
        if os.path.exists(link):
            raise RuntimeError("%s exists and is not a link to the repository" % link)
        os.symlink(REPO_ROOT, link)


_link_collection()
if COLLECTIONS_ROOT not in sys.path:
    sys.path.insert(0, COLLECTIONS_ROOT)
os.environ["ANSIBLE_COLLECTIONS_PATH"] = COLLECTIONS_ROOT
