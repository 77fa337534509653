# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""meta/execution-environment.yml builds a context that ansible-builder and ansible-galaxy accept.

``ansible-builder create`` writes the build context (Containerfile and ``_build/``) without a
container runtime. The galaxy stage of the image (``ansible-galaxy collection install -r
requirements.yml`` in ``/build``) and the builder stage's introspection of the installed
collections are run here too, on the host, so a context that would fail inside the image build
fails here.
"""

from __future__ import annotations

import ast
import importlib.metadata
import os
import pathlib
import re
import subprocess
import sys

import pytest
import yaml

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
REPO_PATH = pathlib.Path(REPO)
EE_FILE = os.path.join(REPO, "meta", "execution-environment.yml")
CONTROLLER_DIRS = ("plugins/action", "plugins/filter", "plugins/plugin_utils")
COLLECTION_PREFIX = "ansible_collections.gpufleet.nvidia."


def _pins(path):
    """Return {distribution name: version} for the ``name==version`` lines of a requirements file."""
    pins = {}
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            match = re.match(r"^([A-Za-z0-9_.-]+)==(\S+)", line.strip())
            if match:
                pins[match.group(1).lower()] = match.group(2)
    return pins


@pytest.fixture(scope="module")
def definition():
    with open(EE_FILE, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


@pytest.fixture(scope="module")
def context(tmp_path_factory):
    """Run ``ansible-builder create`` into a fresh directory and return that directory."""
    ctx = tmp_path_factory.mktemp("ee") / "context"
    result = subprocess.run(
        [sys.executable, "-m", "ansible_builder", "create", "-f", EE_FILE, "--context", str(ctx),
         "--output-filename", "Containerfile"],
        capture_output=True, text=True, check=False, cwd=str(ctx.parent), timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return ctx


@pytest.fixture(scope="module")
def installed(context, tmp_path_factory):
    """Do the image's galaxy stage on the host: install requirements.yml from ``_build``."""
    dest = tmp_path_factory.mktemp("ee-collections")
    # Only the image's collection path: the checkout's own link (tests/conftest.py) would make
    # ansible-galaxy report the collection as installed already.
    env = dict(os.environ, ANSIBLE_GALAXY_DISABLE_GPG_VERIFY="1", ANSIBLE_COLLECTIONS_PATH=str(dest))
    galaxy = os.path.join(os.path.dirname(sys.executable), "ansible-galaxy")
    result = subprocess.run(
        [galaxy, "collection", "install", "-r", "requirements.yml", "--collections-path", str(dest)],
        capture_output=True, text=True, check=False, cwd=str(context / "_build"), env=env, timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return dest


def test_schema_3_and_base_image(definition, context):
    assert definition["version"] == 3
    base = definition["images"]["base_image"]["name"]
    assert base == "quay.io/centos/centos:stream9"
    containerfile = (context / "Containerfile").read_text(encoding="utf-8")
    assert 'ARG EE_BASE_IMAGE="%s"' % base in containerfile
    assert "FROM $EE_BASE_IMAGE AS base" in containerfile
    assert 'ARG PYCMD="/usr/bin/python3.12"' in containerfile


def test_ansible_core_and_runner_match_the_test_pins(context):
    """The image runs the ansible-core and ansible-runner that the tests run."""
    pins = _pins(os.path.join(REPO, "requirements-test.txt"))
    containerfile = (context / "Containerfile").read_text(encoding="utf-8")
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="([^"]*)"$', containerfile, re.M).group(1).split()
    assert refs == ["ansible-core==%s" % pins["ansible-core"], "ansible-runner==%s" % pins["ansible-runner"]]


def _lines(path):
    """The lines of a requirements or bindep file that are not blank or comments."""
    return [line.strip() for line in path.read_text(encoding="utf-8").split("\n")
            if line.strip() and not line.strip().startswith("#")]


def test_the_definition_reads_the_collection_root_files_not_a_second_list(definition, context):
    """requirements.txt and bindep.txt at the collection root are the one list of controller needs."""
    assert definition["dependencies"]["python"] == "../requirements.txt"
    assert definition["dependencies"]["system"] == "../bindep.txt"
    assert _lines(context / "_build" / "requirements.txt") == _lines(REPO_PATH / "requirements.txt")
    assert _lines(context / "_build" / "bindep.txt") == _lines(REPO_PATH / "bindep.txt")


def test_requirements_are_floors_at_the_tested_versions():
    """The controller requirements name the versions the tests run, as lower bounds (an execution
    environment combines them with other collections' requirements: no exact pins)."""
    pins = _pins(os.path.join(REPO, "requirements-test.txt"))
    floors = dict(re.match(r"^([A-Za-z0-9_.-]+)>=(\S+)$", line).groups() for line in _lines(REPO_PATH / "requirements.txt"))
    assert floors == {"prometheus-client": pins["prometheus-client"], "msgspec": pins["msgspec"]}
    assert floors == {"prometheus-client": "0.26.0", "msgspec": "0.22.0"}


def test_system_packages(context):
    assert _lines(context / "_build" / "bindep.txt") == ["openssh-clients [platform:rpm]", "openssh-client [platform:dpkg]"]
    containerfile = (context / "Containerfile").read_text(encoding="utf-8")
    repo_step = containerfile.index("/etc/yum.repos.d/kubernetes.repo")
    assert "baseurl=https://pkgs.k8s.io/core:/stable:/v1.34/rpm/" in containerfile
    assert repo_step < containerfile.index("RUN $PKGMGR install $PYPKG")
    # kubectl is this image's own step, in the final image after the repository is known.
    kubectl = containerfile.index("RUN $PKGMGR install -y kubectl && $PKGMGR clean all")
    assert repo_step < kubectl and kubectl > containerfile.rindex("FROM ")


def test_the_image_sets_a_poll_interval_at_which_the_rollout_does_not_spin_and_keeps_facts_in_ansible_facts(context):
    containerfile = (context / "Containerfile").read_text(encoding="utf-8")
    step = containerfile.index("'internal_poll_interval = 0.02' 'inject_facts_as_vars = False' > /etc/ansible/ansible.cfg")
    # In the final image, not a build stage.
    assert step > containerfile.rindex("FROM ")


def test_no_python_requirements_beyond_ansible_core(context):
    """Controller-side plugins import nothing outside the standard library but what ansible-core installs
    and the execution environment's own Python requirements.

    Walks the imports of plugins/action, plugins/filter and plugins/plugin_utils and of every
    collection module they import in turn (module_utils they share with the modules), so a
    new third-party import on the controller side fails here until it is added to the
    execution environment.
    """
    requirements = _lines(context / "_build" / "requirements.txt")
    assert requirements == ["prometheus-client>=0.26.0", "msgspec>=0.22.0"]
    seen, third_party = set(), set()
    todo = [os.path.join(REPO, d, f) for d in CONTROLLER_DIRS for f in sorted(os.listdir(os.path.join(REPO, d)))
            if f.endswith(".py")]
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module] + ["%s.%s" % (node.module, alias.name) for alias in node.names]
            else:
                continue
            for name in names:
                if name.startswith(COLLECTION_PREFIX):
                    candidate = os.path.join(REPO, *name[len(COLLECTION_PREFIX):].split(".")) + ".py"
                    if os.path.exists(candidate):
                        todo.append(candidate)
                    continue
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in ("ansible", "ansible_collections", "__future__"):
                    third_party.add(top)
    assert os.path.join(REPO, "plugins", "module_utils", "branch_catalog.py") in seen
    assert third_party == {"jinja2", "yaml", "prometheus_client", "msgspec"}
    core_requires = {re.split(r"[<>=!~; ]", req)[0].lower() for req in importlib.metadata.requires("ansible-core")}
    assert {"jinja2", "pyyaml"} <= core_requires


def test_galaxy_stage_installs_the_collection(definition, installed):
    collection = installed / "ansible_collections" / "gpufleet" / "nvidia"
    with open(os.path.join(REPO, "galaxy.yml"), encoding="utf-8") as handle:
        galaxy = yaml.safe_load(handle)
    manifest = yaml.safe_load((collection / "MANIFEST.json").read_text(encoding="utf-8"))
    assert manifest["collection_info"]["version"] == galaxy["version"]
    for path in ("meta/runtime.yml", "plugins/action/rollout_step.py", "roles/node_upgrade/tasks/drain.yml",
                 "playbooks/rollout_step.yml", "playbooks/vars/rollout.yml"):
        assert (collection / path).is_file(), path
    # Kept out by galaxy.yml's build_ignore: ansible-builder would read it as this collection's
    # dependency list (and its paths are relative to meta/, not to the collection). Without it,
    # introspection reads the root's requirements.txt and bindep.txt, which ship.
    assert not (collection / "meta" / "execution-environment.yml").exists()
    assert _lines(collection / "requirements.txt") == _lines(REPO_PATH / "requirements.txt")
    assert _lines(collection / "bindep.txt") == _lines(REPO_PATH / "bindep.txt")
    assert [entry["name"] for entry in definition["dependencies"]["galaxy"]["collections"]] == ["collections/gpufleet_nvidia"]


def test_builder_stage_introspection(context, installed, tmp_path):
    """The builder stage's introspect, run on the installed collections, yields the image's packages and
    the collection's own (read from its requirements.txt and bindep.txt)."""
    out_bindep, out_pip = tmp_path / "bindep.txt", tmp_path / "requirements.txt"
    result = subprocess.run(
        [sys.executable, str(context / "_build" / "scripts" / "introspect.py"), "introspect",
         "--user-pip=%s" % (context / "_build" / "requirements.txt"),
         "--user-bindep=%s" % (context / "_build" / "bindep.txt"),
         "--write-bindep=%s" % out_bindep, "--write-pip=%s" % out_pip, str(installed)],
        capture_output=True, text=True, check=False, timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    bindep = [line for line in out_bindep.read_text(encoding="utf-8").split("\n") if line]
    pip = [line for line in out_pip.read_text(encoding="utf-8").split("\n") if line]
    # What any execution environment that includes the installed collection gets from it.
    assert [line for line in bindep if line.endswith("# from collection gpufleet.nvidia")] == [
        "openssh-clients [platform:rpm]  # from collection gpufleet.nvidia",
        "openssh-client [platform:dpkg]  # from collection gpufleet.nvidia"]
    assert [line for line in pip if line.endswith("# from collection gpufleet.nvidia")] == [
        "prometheus-client>=0.26.0  # from collection gpufleet.nvidia", "msgspec>=0.22.0  # from collection gpufleet.nvidia"]
    assert not any("kubectl" in line for line in bindep)
