"""meta/runtime.yml against the code: the action group's documentation and the Python floor."""

import ast
import glob
import os
import re

import yaml

from ansible_collections.gpufleet.nvidia.plugins.doc_fragments.action_group import ModuleDocFragment

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# ansible-core release → the oldest Python it runs modules with on a managed node. Source: the
# ansible-core porting guides and changelogs (2.17 removed Python 2.7 and 3.6 on targets,
# ansible/ansible#81866; 2.18 made 3.8 the target minimum).
TARGET_PYTHON_FLOOR = {(2, 16): (3, 6), (2, 17): (3, 7), (2, 18): (3, 8), (2, 19): (3, 8), (2, 20): (3, 8)}

# ansible-core release → the oldest Python it runs on the controller. Source: the "Control Node
# Python" column of ansible-core's support matrix (docs "Releases and maintenance").
CONTROLLER_PYTHON_FLOOR = {(2, 17): (3, 10), (2, 18): (3, 11), (2, 19): (3, 11), (2, 20): (3, 12)}


def _runtime():
    with open(os.path.join(REPO, "meta", "runtime.yml")) as handle:
        return yaml.safe_load(handle)


def _documentation(path):
    """The DOCUMENTATION block of a module file, as YAML."""
    with open(path) as handle:
        tree = ast.parse(handle.read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "DOCUMENTATION" for t in node.targets):
            return yaml.safe_load(node.value.value)
    raise AssertionError("%s has no DOCUMENTATION" % path)


def test_action_group_is_documented_on_exactly_its_modules():
    members = set(_runtime()["action_groups"]["nvidia"])
    documented = set()
    for path in glob.glob(os.path.join(REPO, "plugins", "modules", "*.py")):
        fragments = _documentation(path).get("extends_documentation_fragment") or []
        if "gpufleet.nvidia.action_group" in fragments:
            documented.add(os.path.basename(path)[:-3])
    assert documented == members == {"gpu_facts", "gpu_policy", "gpu_mig", "driver_resolve"}


def test_action_group_fragment_names_the_group():
    doc = yaml.safe_load(ModuleDocFragment.DOCUMENTATION)
    assert doc["attributes"]["action_group"]["membership"] == ["gpufleet.nvidia.nvidia"]
    assert set(_runtime()["action_groups"]) == {"nvidia"}


def _floor():
    match = re.match(r"^>=(\d+)\.(\d+)\.\d+,<\d+\.\d+\.\d+$", _runtime()["requires_ansible"])
    assert match, _runtime()["requires_ansible"]
    return int(match.group(1)), int(match.group(2))


def test_requires_ansible_admits_no_target_python_older_than_3_7():
    # module_utils start with `from __future__ import annotations`, which Python 3.6 cannot import.
    assert TARGET_PYTHON_FLOOR[_floor()] >= (3, 7)


def test_node_side_code_parses_with_the_floor_python():
    version = TARGET_PYTHON_FLOOR[_floor()]
    paths = glob.glob(os.path.join(REPO, "plugins", "module_utils", "*.py")) + \
        glob.glob(os.path.join(REPO, "plugins", "modules", "*.py"))
    failed = []
    for path in sorted(paths):
        with open(path) as handle:
            try:
                ast.parse(handle.read(), filename=path, feature_version=version)
            except SyntaxError as err:
                failed.append("%s: %s" % (os.path.relpath(path, REPO), err))
    assert failed == []


def test_readme_states_the_floor():
    with open(os.path.join(REPO, "README.md")) as handle:
        readme = handle.read()
    floor = _floor()
    assert "ansible-core %d.%d" % floor in readme
    assert "Python %d.%d" % TARGET_PYTHON_FLOOR[floor] in readme
    # The controller's Python too, next to it: "3.10 or later for 2.17".
    assert "%d.%d or later for %d.%d" % (CONTROLLER_PYTHON_FLOOR[floor] + floor) in readme


def test_role_readmes_name_every_variable_of_the_role():
    for role in ("driver", "kernel_hold", "gpu_policy"):
        with open(os.path.join(REPO, "roles", role, "meta", "argument_specs.yml")) as handle:
            options = yaml.safe_load(handle)["argument_specs"]["main"]["options"]
        with open(os.path.join(REPO, "roles", role, "README.md")) as handle:
            readme = handle.read()
        missing = sorted(name for name in options if "`%s`" % name not in readme)
        assert (role, missing) == (role, [])
