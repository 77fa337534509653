"""The collection as ``ansible-galaxy collection build`` ships it: what is in the tarball and what is not."""

import os
import subprocess
import sys
import tarfile

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ANSIBLE_GALAXY = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")

# Top-level paths of the checkout that are for developing the collection, not for using it.
NOT_SHIPPED = ("tests", "molecule", "benchmarks", "tools", ".ci", "inventories/simfleet", ".build", ".venv",
               ".venv-awx", "Makefile", "requirements-test.txt", "requirements-awx.txt", "pytest.ini", ".ansible-lint")


@pytest.fixture(scope="module")
def members(tmp_path_factory):
    """The member names of the tarball built from this checkout."""
    out = tmp_path_factory.mktemp("build")
    done = subprocess.run([ANSIBLE_GALAXY, "collection", "build", "--output-path", str(out), REPO],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    with open(os.path.join(REPO, "galaxy.yml")) as handle:
        galaxy = yaml.safe_load(handle)
    tarball = out / ("%s-%s-%s.tar.gz" % (galaxy["namespace"], galaxy["name"], galaxy["version"]))
    with tarfile.open(str(tarball)) as archive:
        return set(archive.getnames())


def test_tarball_ships_no_development_paths(members):
    shipped = sorted(name for name in members for path in NOT_SHIPPED if name == path or name.startswith(path + "/"))
    assert shipped == []


def test_tarball_ships_what_a_user_runs(members):
    for name in ("MANIFEST.json", "FILES.json", "README.md", "meta/runtime.yml",
                 "plugins/modules/gpu_facts.py", "plugins/module_utils/nvml_names.py",
                 "roles/driver/tasks/main.yml", "roles/driver/README.md", "roles/kernel_hold/README.md",
                 "roles/gpu_policy/README.md", "playbooks/facts.yml", "inventories/example/hosts.yml",
                 "changelogs/changelog.yaml", "docs/facts.md", "awx/configure.yml", "awx/vars/defaults.yml",
                 # The controller's needs, where ansible-builder's introspection and users look for them.
                 "requirements.txt", "bindep.txt"):
        assert name in members, name


def test_galaxy_metadata_names_no_placeholder_host():
    with open(os.path.join(REPO, "galaxy.yml")) as handle:
        galaxy = yaml.safe_load(handle)
    for key in ("repository", "documentation", "homepage", "issues"):
        assert ".invalid" not in str(galaxy.get(key) or ""), key
