"""Build a fleet's fact cache from real module output, in both on-disk forms Ansible and AWX write.

One real host's cache file is made first (:func:`seed_cache`): ``ansible-playbook`` runs ``setup``
and ``gpufleet.nvidia.gpu_facts`` (on the H100 capture of ``tests/fixtures/smi``, as
``capture_dir``) against ``localhost`` with ``fact_caching = jsonfile``, so ansible-core writes
``s1_localhost`` holding ``{"__payload__": "<json>"}`` (the 2.19 form). :func:`write_fleet` then
multiplies it to N hosts with 8 GPUs each (GPU 0 of the capture repeated, with its own index, UUID,
serial and PCI bus id), some drifted, some without facts, and writes

* ``cache-219/s1_<host>``: the ansible-core 2.19 jsonfile form;
* ``cache-awx/<host>``: plain JSON, the form of AWX's ``fact_cache/<host>`` and older cores;
* ``inventory/``: ``hosts.yml`` with one group per GPU class (``gpu_h100_*``) and per rack,
  ``group_vars`` declaring each class, ``host_vars`` for a few hosts whose power limit differs
  from their class's (in sync only when the host's own variables are read); ``inventory-ini/``
  the same inventory as ``hosts.ini``.

The drift every node gets is recorded, so a caller knows the right answer (:func:`expected_counts`).
Standard library only; used by ``bench.py`` and by the unit tests.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CAPTURE = os.path.join(REPO, "tests", "fixtures", "smi", "h100-sxm5-r580-v13.xml")

#: PCI bus ids of the eight GPUs of an HGX H100 board.
BUS_IDS = ("0000:18:00.0", "0000:2a:00.0", "0000:3a:00.0", "0000:5d:00.0",
           "0000:9a:00.0", "0000:ab:00.0", "0000:ba:00.0", "0000:db:00.0")

#: GPU class → its group_vars (what the driver and gpu_policy roles read). The capture's GPU 0 runs
#: R580 at 580.95.05, 700 W of 700 W, persistence and ECC on: every class's declaration holds for it.
CLASSES = {
    "gpu_h100_train": {"driver_branch": "580", "driver_version": "580.95.05", "gpu_policy_power_limit_w": 700,
                       "gpu_policy_persistence_mode": True, "gpu_policy_ecc_mode": True, "gpufleet_gpu_count": 8},
    "gpu_h100_infer": {"driver_branch": "580", "driver_version": "580.95.05", "gpu_policy_power_limit_percent": 100,
                       "gpu_policy_persistence_mode": True, "gpufleet_gpu_count": 8},
    "gpu_h100_dev": {"driver_branch": "580", "driver_version": "580.95.05", "gpu_policy_power_limit_w": 700,
                     "gpu_policy_persistence_mode": True, "gpufleet_gpu_count": 8},
    "gpu_h100_batch": {"driver_branch": "580", "driver_version": "580.95.05", "driver_allow_eol": True,
                       "gpu_policy_power_limit_w": 700, "gpu_policy_persistence_mode": True, "gpufleet_gpu_count": 8},
}

#: What a drifted node gets, in turn: one GPU's power limit 50 W under the declared, persistence off
#: on GPU 0, an older driver of the same branch, one GPU lost.
DRIFT_KINDS = ("power", "persistence", "version", "gpu_lost")

SEED_PLAY = """\
- name: Gather the facts of one real host into the fact cache
  hosts: localhost
  gather_facts: true
  tasks:
    - name: Read the GPU state of the captured H100 node
      gpufleet.nvidia.gpu_facts:
        capture_dir: "{{ capture_dir }}"
"""


def seed_cache(workdir, python=None, collections=None):
    """Run ``setup`` + ``gpu_facts`` on localhost with a jsonfile fact cache; return the cache file's JSON.

    :param workdir: an empty directory for the capture, the play and the cache.
    :param python: the Python of the virtualenv holding ansible-core (default: this one).
    :param collections: ``ANSIBLE_COLLECTIONS_PATH`` in which ``gpufleet.nvidia`` is found.
    :returns: ``{"__payload__": "<json>"}`` as ansible-core 2.19 wrote it for ``localhost``.
    :raises RuntimeError: when the play fails or writes no 2.19 cache file.
    """
    python = python or sys.executable
    capture = os.path.join(workdir, "capture")
    cache = os.path.join(workdir, "cache")
    os.makedirs(capture)
    os.makedirs(cache)
    # A copy: gpu_facts refuses capture files that are links.
    shutil.copyfile(CAPTURE, os.path.join(capture, "nvidia-smi-q.xml"))
    play = os.path.join(workdir, "seed.yml")
    with open(play, "w") as handle:
        handle.write(SEED_PLAY)
    env = dict(os.environ, ANSIBLE_CACHE_PLUGIN="jsonfile", ANSIBLE_CACHE_PLUGIN_CONNECTION=cache,
               ANSIBLE_LOCALHOST_WARNING="False", ANSIBLE_NOCOLOR="1", ANSIBLE_GATHERING="explicit")
    if collections:
        env["ANSIBLE_COLLECTIONS_PATH"] = collections
    argv = [os.path.join(os.path.dirname(python), "ansible-playbook"), "-i", "localhost,", "-c", "local",
            "-e", "ansible_python_interpreter=%s" % python, "-e", "capture_dir=%s" % capture, play]
    proc = subprocess.run(argv, cwd=workdir, env=env, capture_output=True, text=True, check=False)
    path = os.path.join(cache, "s1_localhost")
    if proc.returncode != 0 or not os.path.isfile(path):
        raise RuntimeError("seeding the fact cache failed (%s):\n%s" % (proc.returncode, (proc.stdout + proc.stderr)[-3000:]))
    with open(path) as handle:
        wrapped = json.load(handle)
    if set(wrapped) != {"__payload__"}:
        raise RuntimeError("%s is not in ansible-core 2.19's form: keys %s" % (path, sorted(wrapped)))
    return wrapped


def host_name(number):
    """The inventory name of node ``number``: ``h100-00042``."""
    return "h100-%05d" % number


def plan(nodes, drift_every=66, missing_every=521, override_every=250):
    """What each node is: ``{host: (class, kind)}``, kind ``None`` (in sync), a :data:`DRIFT_KINDS`
    entry, ``"missing"`` (no cache file) or ``"override"`` (host_vars power limit 650 W, facts at 650 W).

    Node ``n`` is missing when ``n % missing_every == missing_every - 1``, else drifted when
    ``n % drift_every == drift_every - 1`` (kinds in turn), else an override when
    ``n % override_every == override_every // 2``.
    """
    names = sorted(CLASSES)
    out = {}
    drifted = 0
    for number in range(nodes):
        kind = None
        if number % missing_every == missing_every - 1:
            kind = "missing"
        elif number % drift_every == drift_every - 1:
            kind = DRIFT_KINDS[drifted % len(DRIFT_KINDS)]
            drifted += 1
        elif number % override_every == override_every // 2:
            kind = "override"
        out[host_name(number)] = (names[number % len(names)], kind)
    return out


def expected_counts(layout, declared_from="host"):
    """``{"nodes", "in_sync", "drifted", "missing"}`` the drift report must give for :func:`plan`'s layout.

    With ``declared_from="class"`` the override hosts' own power limit is not seen: they are drifted.
    """
    kinds = [kind for _klass, kind in layout.values()]
    missing = kinds.count("missing")
    drifted = sum(1 for kind in kinds if kind in DRIFT_KINDS) + missing
    if declared_from == "class":
        drifted += kinds.count("override")
    return {"nodes": len(kinds), "in_sync": len(kinds) - drifted, "drifted": drifted, "missing": missing}


def _node_facts(template, host, number, kind):
    """The seed's facts made into node ``number``'s (a deep copy of the changed parts only)."""
    facts = dict(template)
    facts["ansible_hostname"] = facts["ansible_nodename"] = host
    facts["ansible_fqdn"] = host + ".fleet.example"
    facts["ansible_machine_id"] = "%032x" % (0x5eed0000 + number)
    facts["ansible_product_uuid"] = "5eed%04x-0000-4000-8000-%012x" % (number % 0x10000, number)
    nvidia = dict(template["nvidia"])
    driver = dict(nvidia["driver"])
    base = nvidia["gpus"][0]
    gpus = []
    for index, bus in enumerate(BUS_IDS):
        gpu = copy.deepcopy(base)
        gpu.update(index=index, pci_bus_id=bus, uuid="GPU-%08x-%04x-4000-8000-%012x" % (number, index, number * 8 + index),
                   serial="165%010d" % (number * 8 + index))
        if kind == "override":
            gpu["power"].update(limit_w=650.0, enforced_limit_w=650.0, requested_limit_w=650.0)
        gpus.append(gpu)
    if kind == "power":
        gpus[3]["power"].update(limit_w=650.0, enforced_limit_w=650.0, requested_limit_w=650.0)
    elif kind == "persistence":
        gpus[0]["persistence_mode"] = False
    elif kind == "version":
        driver["userspace_version"] = "580.82.07"
    elif kind == "gpu_lost":
        gpus.pop()
    nvidia.update(driver=driver, gpus=gpus, gpu_count=len(gpus), attached_gpus=len(gpus))
    facts["nvidia"] = nvidia
    return facts


def write_fleet(root, seed, nodes, **plan_args):
    """Write the fleet's caches and inventory under ``root``.

    :param seed: :func:`seed_cache`'s result. :param nodes: how many hosts.
    :param plan_args: ``drift_every``, ``missing_every``, ``override_every`` of :func:`plan`.
    :returns: ``{"layout": plan(...), "cache_219": dir, "cache_awx": dir, "inventory": dir (YAML),
        "inventory_ini": dir (INI), "bytes_219": total size of the 2.19 files}``.
    """
    template = json.loads(seed["__payload__"])
    if "nvidia" not in template:
        raise RuntimeError("the seed cache holds no nvidia facts")
    layout = plan(nodes, **plan_args)
    cache_219 = os.path.join(root, "cache-219")
    cache_awx = os.path.join(root, "cache-awx")
    inventory = os.path.join(root, "inventory")
    for directory in (cache_219, cache_awx, os.path.join(inventory, "group_vars"), os.path.join(inventory, "host_vars")):
        os.makedirs(directory)
    total = 0
    groups = dict((klass, []) for klass in CLASSES)
    racks = {}
    for number, (host, (klass, kind)) in enumerate(sorted(layout.items())):
        groups[klass].append(host)
        racks.setdefault("rack_%03d" % (number // 32), []).append(host)
        if kind == "override":
            with open(os.path.join(inventory, "host_vars", host + ".yml"), "w") as handle:
                handle.write("gpu_policy_power_limit_w: 650\ngpu_policy_power_limit_percent: null\n")
        if kind == "missing":
            continue
        plain = json.dumps(_node_facts(template, host, number, kind))
        wrapped = json.dumps({"__payload__": plain})
        total += len(wrapped)
        with open(os.path.join(cache_219, "s1_" + host), "w") as handle:
            handle.write(wrapped)
        with open(os.path.join(cache_awx, host), "w") as handle:
            handle.write(plain)
    with open(os.path.join(inventory, "hosts.yml"), "w") as handle:
        handle.write("all:\n  children:\n")
        for name, members in sorted(groups.items()) + sorted(racks.items()):
            handle.write("    %s:\n      hosts:\n" % name)
            for host in members:
                handle.write("        %s:\n" % host)
    for klass, variables in CLASSES.items():
        with open(os.path.join(inventory, "group_vars", klass + ".yml"), "w") as handle:
            for key, value in sorted(variables.items()):
                handle.write("%s: %s\n" % (key, json.dumps(value)))
    with open(os.path.join(inventory, "group_vars", "all.yml"), "w") as handle:
        handle.write("ansible_user: ops\nansible_ssh_pipelining: true\n")
    ini = os.path.join(root, "inventory-ini")
    os.makedirs(ini)
    for directory in ("group_vars", "host_vars"):
        shutil.copytree(os.path.join(inventory, directory), os.path.join(ini, directory))
    with open(os.path.join(ini, "hosts.ini"), "w") as handle:
        for name, members in sorted(groups.items()) + sorted(racks.items()):
            handle.write("[%s]\n%s\n\n" % (name, "\n".join(members)))
    return {"layout": layout, "cache_219": cache_219, "cache_awx": cache_awx, "inventory": inventory,
            "inventory_ini": ini, "bytes_219": total}
