# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""The simulated fleet's Slurm pieces without booting a node: slurm.conf and gres.conf as rendered,
``scontrol show node -o`` as parsed, the fleet's key and node files, the inventory and status text."""

import os
import stat
import subprocess

import pytest
import yaml

from simfleet import cli, inventory, slurmconf
from simfleet.slurm import SlurmCluster, gpu_count
from simfleet.testing import ports_needed
from simfleet.gpu.state import initial_state

NODES = [
    {"name": "node01", "port": 22203, "gpus": 8, "klass": "h100"},
    {"name": "node02", "port": 22204, "gpus": 4, "klass": "l40s"},
    {"name": "node03", "port": 22205, "gpus": 8, "klass": "h100"},
]

# `scontrol show node -o` of Slurm 22.05.8 (Debian 12's slurm-client) against this slurm.conf: a node
# slurmctld has not heard from yet, then the same node after `scontrol update State=DRAIN Reason=...`.
SHOW_UNKNOWN = (
    "NodeName=node01 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=1 CPUTot=1 CPULoad=N/A AvailableFeatures=(null) "
    "ActiveFeatures=(null) Gres=gpu:8 NodeAddr=127.0.0.1 NodeHostName=node01 Port=22992  RealMemory=1 AllocMem=0 "
    "FreeMem=N/A Sockets=1 Boards=1 State=UNKNOWN ThreadsPerCore=1 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
    "Partitions=gpu,gpu_h100  BootTime=None SlurmdStartTime=None LastBusyTime=Unknown CfgTRES=cpu=1,mem=1M,billing=1 "
    "AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0 ExtSensorsJoules=n/s ExtSensorsWatts=0 ExtSensorsTemp=n/s"
)
SHOW_DRAINED = SHOW_UNKNOWN.replace("State=UNKNOWN", "State=UNKNOWN+DRAIN") + (
    " Reason=gpufleet r1: upgrade to 580.126.20 [root@2026-12-02T00:03:22]")


def _conf_lines(text):
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def _render(**kwargs):
    args = dict(cluster="sf_demo", controller_host="ctl", controller_port=22202, nodes=NODES,
                state_dir="/f/slurm/state", log_dir="/f/slurm")
    args.update(kwargs)
    return slurmconf.render_slurm_conf(**args)


def test_slurm_conf_has_one_node_line_per_node_with_its_port_and_gpus():
    lines = _conf_lines(_render())
    assert [line for line in lines if line.startswith("NodeName=")] == [
        "NodeName=node01 NodeAddr=127.0.0.1 Port=22203 CPUs=1 Gres=gpu:8 State=UNKNOWN",
        "NodeName=node02 NodeAddr=127.0.0.1 Port=22204 CPUs=1 Gres=gpu:4 State=UNKNOWN",
        "NodeName=node03 NodeAddr=127.0.0.1 Port=22205 CPUs=1 Gres=gpu:8 State=UNKNOWN",
    ]
    assert [line for line in lines if line.startswith("PartitionName=")] == [
        "PartitionName=gpu Nodes=node01,node02,node03 Default=YES MaxTime=INFINITE State=UP",
        "PartitionName=gpu_h100 Nodes=node01,node03 MaxTime=INFINITE State=UP",
        "PartitionName=gpu_l40s Nodes=node02 MaxTime=INFINITE State=UP",
    ]


def test_slurm_conf_settings_for_nodes_that_are_containers_and_reboots_slurm_runs():
    keys = dict(line.split("=", 1) for line in _conf_lines(_render()) if not line.startswith(("NodeName=", "PartitionName=")))
    assert keys["SlurmctldHost"] == "ctl(127.0.0.1)"
    assert keys["SlurmctldPort"] == "22202"
    assert keys["ClusterName"] == "sf_demo"
    assert keys["StateSaveLocation"] == "/f/slurm/state"
    assert keys["SlurmctldLogFile"] == "/f/slurm/slurmctld.log"
    assert keys["ProctrackType"] == "proctrack/linuxproc"
    assert keys["TaskPlugin"] == "task/none"
    assert keys["JobAcctGatherType"] == "jobacct_gather/none"
    assert keys["SlurmdParameters"] == "config_overrides"
    assert keys["GresTypes"] == "gpu"
    assert keys["RebootProgram"] == '"/usr/bin/systemctl reboot"'
    assert keys["ResumeTimeout"] == "300"
    assert keys["ReturnToService"] == "2"
    assert keys["SlurmUser"] == "root"
    assert "AuthInfo" not in keys
    assert not [k for k in keys if "cgroup" in keys[k].lower()]


def test_only_the_host_copy_names_the_host_side_munge_socket():
    host = _conf_lines(_render(munge_socket="/f/slurm/munge/run/munge.socket"))
    node = _conf_lines(_render())
    assert [line for line in host if line not in node] == ["AuthInfo=socket=/f/slurm/munge/run/munge.socket"]
    assert "DebugFlags=NO_CONF_HASH" in node


def test_a_node_without_gpus_has_no_gres():
    text = _render(nodes=[{"name": "cpu01", "port": 22210, "gpus": 0, "klass": "h100"}])
    assert "NodeName=cpu01 NodeAddr=127.0.0.1 Port=22210 CPUs=1 State=UNKNOWN" in text.splitlines()


@pytest.mark.parametrize("nodes, message", [
    ([], "at least one node"),
    ([dict(NODES[0]), dict(NODES[0], port=22299)], "node01 is listed twice"),
    ([dict(NODES[0]), dict(NODES[1], port=22203)], "port 22203 of node node02 is already taken"),
    ([dict(NODES[0], port=22202)], "port 22202 of node node01 is already taken"),
    ([dict(NODES[0], gpus=-1)], "GPU count -1 of node node01"),
    ([dict(NODES[0], gpus="8")], "GPU count '8' of node node01"),
    ([dict(NODES[0], port=70000)], "Port of node node01 70000 is not a TCP port"),
    ([dict(NODES[0], name="node 1")], "node name 'node 1'"),
])
def test_bad_node_lists_are_refused_with_the_reason(nodes, message):
    with pytest.raises(ValueError, match=message):
        _render(nodes=nodes)


def test_each_node_writes_its_gres_conf_from_its_gpus_at_each_start_of_slurmd():
    dropin = slurmconf.render_slurmd_gres_dropin()
    assert "[Service]\nExecStartPre=/usr/lib/simgpu/bin/simgpu slurm-gres --write /etc/slurm/gres.conf\n" in dropin
    assert slurmconf.SLURMD_GRES_DROPIN == "etc/systemd/system/slurmd.service.d/simfleet-gres.conf"


def _mig(state, index, layout):
    """Put GPU ``index`` of ``state`` in MIG mode with one GPU instance and compute instance per profile
    name in ``layout`` (in order)."""
    gpu = state["gpus"][index]
    gpu["mig"]["current"] = gpu["mig"]["pending"] = 1
    by_name = dict((p["name"], p) for p in gpu["mig"]["profiles"])
    gpu["mig"]["instances"] = [{"id": n + 1, "profile": by_name[name]["nvml_profile"], "placement": n,
                                "compute_instances": [{"id": 0, "slices": by_name[name]["slices"]}]}
                               for n, name in enumerate(layout)]


def test_gres_conf_counts_whole_gpus_and_mig_devices_as_autodetect_does(tmp_path):
    from simgpu import slurm_gres  # pylint: disable=import-outside-toplevel

    state = initial_state("h100", "node01")
    text, devices = slurm_gres.render(state)
    assert text.splitlines()[1:] == ["AutoDetect=off"] + ["Name=gpu File=/run/simfleet-slurm/nvidia%d" % i for i in range(8)]
    assert devices[7] == ("/run/simfleet-slurm/nvidia7", 195, 7)
    # MIG on GPUs 6 and 7: two MIG devices each, one gres/gpu per MIG device; every line then typed
    # (slurmd refuses a gres.conf where some gpu records have Type= and others do not).
    _mig(state, 6, ["3g.40gb", "1g.10gb"])
    _mig(state, 7, ["3g.40gb", "1g.10gb"])
    lines = slurm_gres.render(state)[0].splitlines()[2:]
    assert lines[:6] == ["Name=gpu Type=h100_80gb_hbm3 File=/run/simfleet-slurm/nvidia%d" % i for i in range(6)]
    assert lines[6:] == [
        "Name=gpu Type=3g.40gb MultipleFiles=/run/simfleet-slurm/nvidia6,/run/simfleet-slurm/nvidia-caps/nvidia-cap1",
        "Name=gpu Type=1g.10gb MultipleFiles=/run/simfleet-slurm/nvidia6,/run/simfleet-slurm/nvidia-caps/nvidia-cap2",
        "Name=gpu Type=3g.40gb MultipleFiles=/run/simfleet-slurm/nvidia7,/run/simfleet-slurm/nvidia-caps/nvidia-cap3",
        "Name=gpu Type=1g.10gb MultipleFiles=/run/simfleet-slurm/nvidia7,/run/simfleet-slurm/nvidia-caps/nvidia-cap4",
    ]
    # MIG mode on without MIG devices: the GPU gives Slurm nothing (6 + 2 = 8 < 10 the line above).
    _mig(state, 7, [])
    assert sum(1 for line in slurm_gres.render(state)[0].splitlines() if line.startswith("Name=gpu")) == 8
    assert slurm_gres.gpu_type("Tesla V100-SXM2-32GB") == "v100_sxm2_32gb"


def test_gpu_counts_come_from_the_class_profiles():
    assert (gpu_count("h100"), gpu_count("l40s"), gpu_count("v100")) == (8, 4, 8)


def test_cluster_name_is_lower_case_and_short():
    assert slurmconf.cluster_name("pytest-slurm-4242") == "sf_pytest_slurm_4242"
    assert slurmconf.cluster_name("Demo") == "sf_demo"
    assert len(slurmconf.cluster_name("x" * 40)) == 40


def test_show_node_lines_are_read_key_by_key():
    nodes = slurmconf.parse_show_node(SHOW_UNKNOWN + "\n\n" + SHOW_UNKNOWN.replace("node01", "node02") + "\n")
    assert sorted(nodes) == ["node01", "node02"]
    node = nodes["node01"]
    assert node["State"] == "UNKNOWN"
    assert node["Gres"] == "gpu:8"
    assert node["Port"] == "22992"
    assert node["Partitions"] == "gpu,gpu_h100"
    assert node["CfgTRES"] == "cpu=1,mem=1M,billing=1"
    assert node["AllocTRES"] == ""
    assert node["ExtSensorsTemp"] == "n/s"
    assert "Reason" not in node


def test_a_reason_with_spaces_and_colons_is_read_whole():
    node = slurmconf.parse_show_node(SHOW_DRAINED)["node01"]
    assert node["Reason"] == "gpufleet r1: upgrade to 580.126.20 [root@2026-12-02T00:03:22]"
    assert node["State"] == "UNKNOWN+DRAIN"


def test_free_text_in_the_middle_ends_at_the_next_key():
    line = ("NodeName=node02 Arch=x86_64 CoresPerSocket=1 NodeHostName=node02 Version=22.05.8 "
            "OS=Linux 6.1.0-31-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1 (2025-02-07)  RealMemory=1 "
            "State=MIXED+DRAIN Reason=operator: bad fan, see RT#12 [ops@2026-12-01T10:00:00] Comment=(null)")
    node = slurmconf.parse_show_node(line)["node02"]
    assert node["OS"] == "Linux 6.1.0-31-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.128-1 (2025-02-07)"
    assert node["RealMemory"] == "1"
    assert node["Reason"] == "operator: bad fan, see RT#12 [ops@2026-12-01T10:00:00]"
    assert node["Comment"] == "(null)"


def test_other_output_is_refused():
    with pytest.raises(ValueError, match="not a line of `scontrol show node -o`"):
        slurmconf.parse_show_node("NODELIST   NODES PARTITION STATE\nnode01 1 gpu* idle")


@pytest.mark.parametrize("state, summary, base, flags, responding", [
    ("IDLE", "idle", "IDLE", [], True),
    ("ALLOCATED+DRAIN", "draining", "ALLOCATED", ["DRAIN"], True),
    ("MIXED+DRAIN", "draining", "MIXED", ["DRAIN"], True),
    ("IDLE+DRAIN", "drained", "IDLE", ["DRAIN"], True),
    ("DOWN+DRAIN+REBOOT_ISSUED", "drained", "DOWN", ["DRAIN", "REBOOT_ISSUED"], True),
    ("IDLE*", "idle", "IDLE", [], False),
    ("DOWN*", "down", "DOWN", [], False),
    ("IDLE+NOT_RESPONDING", "idle", "IDLE", ["NOT_RESPONDING"], False),
])
def test_node_state_names_draining_and_drained_as_sinfo_does(state, summary, base, flags, responding):
    got = slurmconf.node_state({"State": state})
    assert (got["summary"], got["base"], got["flags"], got["responding"]) == (summary, base, flags, responding)
    assert got["drain"] is ("DRAIN" in flags)


def test_node_state_needs_a_state():
    with pytest.raises(ValueError, match="no State"):
        slurmconf.node_state({"NodeName": "node01"})


def test_the_wrapper_runs_the_command_with_the_fleet_slurm_conf(tmp_path):
    path = tmp_path / "env-wrapper"
    path.write_text(slurmconf.wrapper_script("/usr/bin/env", "/f/my fleet/slurm.conf"))
    os.chmod(str(path), 0o755)
    env = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    out = subprocess.run([str(path)], env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    assert "SLURM_CONF=/f/my fleet/slurm.conf" in out.splitlines()


def _fleet_record():
    return {"slurm": {"slurmctld_port": 22202},
            "nodes": [{"name": "node01", "class": "h100", "port": 22201, "slurmd_port": 22203},
                      {"name": "node02", "class": "l40s", "port": 22204, "slurmd_port": 22205}]}


def test_configure_makes_one_key_and_both_configurations_once(tmp_path):
    cluster = SlurmCluster(str(tmp_path), "demo")
    rec = _fleet_record()
    assert cluster.configure(rec, {"node01": 8, "node02": 4}) is True
    key = open(cluster.key_path, "rb").read()
    assert len(key) == 1024
    assert stat.S_IMODE(os.stat(cluster.key_path).st_mode) == 0o400
    assert stat.S_IMODE(os.stat(os.path.dirname(cluster.munge_socket)).st_mode) == 0o755
    host = open(cluster.conf_path, encoding="utf-8").read()
    assert "AuthInfo=socket=%s" % cluster.munge_socket in host.splitlines()
    assert "NodeName=node02 NodeAddr=127.0.0.1 Port=22205 CPUs=1 Gres=gpu:4 State=UNKNOWN" in host.splitlines()
    assert "AuthInfo" not in open(cluster.node_conf_path, encoding="utf-8").read()
    assert sorted(os.listdir(cluster.bin_dir)) == ["sbatch", "scancel", "scontrol", "sinfo", "squeue", "srun"]
    # The same fleet again: nothing changed, the key stays.
    assert cluster.configure(rec, {"node01": 8, "node02": 4}) is False
    assert open(cluster.key_path, "rb").read() == key
    # A node more: the configuration changed (slurmctld and slurmd restart).
    rec["nodes"].append({"name": "node03", "class": "h100", "port": 22206, "slurmd_port": 22207})
    assert cluster.configure(rec, {"node01": 8, "node02": 4, "node03": 8}) is True


def test_provision_node_gives_the_node_the_fleet_key_owned_by_its_munge_user(tmp_path):
    cluster = SlurmCluster(str(tmp_path / "fleet"), "demo")
    cluster.configure(_fleet_record(), {"node01": 8, "node02": 4})
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    uid, gid = os.getuid(), os.getgid()
    (root / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\nmunge:x:%d:%d::/nonexistent:/usr/sbin/nologin\n" % (uid, gid))
    assert cluster.provision_node(str(root)) is True
    key = root / "etc" / "munge" / "munge.key"
    assert key.read_bytes() == open(cluster.key_path, "rb").read()
    assert stat.S_IMODE(key.stat().st_mode) == 0o400 and key.stat().st_uid == uid
    assert (root / "etc" / "slurm" / "slurm.conf").read_text() == open(cluster.node_conf_path, encoding="utf-8").read()
    assert (root / slurmconf.SLURMD_GRES_DROPIN).read_text() == slurmconf.render_slurmd_gres_dropin()
    assert not (root / "etc" / "slurm" / "gres.conf").exists()  # written by slurmd's ExecStartPre on the node
    assert cluster.provision_node(str(root)) is False


def test_a_node_without_a_munge_user_is_an_error(tmp_path):
    cluster = SlurmCluster(str(tmp_path / "fleet"), "demo")
    cluster.configure(_fleet_record(), {"node01": 8, "node02": 4})
    (tmp_path / "root" / "etc").mkdir(parents=True)
    (tmp_path / "root" / "etc" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    with pytest.raises(KeyError, match="no user munge"):
        cluster.provision_node(str(tmp_path / "root"))


def test_a_fleet_with_slurm_needs_twice_the_ports():
    assert ports_needed(2, None) == 3
    assert ports_needed(2, None, slurm=True) == 6


def _inventory_fleet(with_slurm):
    return {"name": "demo", "ssh_key": "/f/ssh/id_ed25519", "repo_port": 22200,
            "key": {"keyring_path": "/f/k.gpg", "armored_path": "/f/k.asc", "fingerprint": "AB"},
            "slurm": {"conf": "/f/slurm/slurm.conf", "bin": "/f/slurm/bin"} if with_slurm else None,
            "nodes": [dict(n, root="/f/nodes/%s/root" % n["name"], repo_url="http://x/%s/" % n["name"],
                           **({} if with_slurm else {"slurmd_port": None}))
                      for n in _fleet_record()["nodes"]]}


def test_the_inventory_of_a_fleet_with_slurm_says_where_slurm_commands_run():
    data = yaml.safe_load(inventory.render_yaml(_inventory_fleet(True)))
    assert {k: v for k, v in data["all"]["vars"].items() if "slurm" in k} == {
        "simfleet_slurm_conf": "/f/slurm/slurm.conf", "simfleet_slurm_bin_dir": "/f/slurm/bin",
        "simfleet_slurm_drain_host": "localhost"}
    node02 = data["all"]["children"]["simfleet"]["children"]["gpu_l40s"]["hosts"]["node02"]
    assert (node02["simfleet_slurm_node_name"], node02["simfleet_slurm_partition"]) == ("node02", "gpu_l40s")
    assert "simfleet_slurm_node_name=node01" in inventory.render_ini(_inventory_fleet(True))


def test_the_inventory_declares_each_node_gpu_count_for_the_drift_report():
    data = yaml.safe_load(inventory.render_yaml(_inventory_fleet(False)))
    hosts = {}
    for group in data["all"]["children"]["simfleet"]["children"].values():
        hosts.update(group["hosts"])
    assert {name: h["gpufleet_gpu_count"] for name, h in hosts.items()} == {"node01": 8, "node02": 4}
    assert "gpufleet_gpu_count=4" in inventory.render_ini(_inventory_fleet(False))


def test_the_inventory_of_a_fleet_without_slurm_has_no_slurm_variables():
    text = inventory.render_yaml(_inventory_fleet(False))
    assert "slurm" not in text


def test_status_text_shows_each_node_slurm_state():
    node = {"name": "node01", "class": "h100", "port": 2201, "state": "running", "reboot_hang": False, "nspawn_pid": 42,
            "boot_id": "b1", "driver_version": None, "drained": False, "flag": None, "slurm": {"state": "MIXED+DRAIN"}}
    st = {"name": "demo", "dir": "/f", "inventory": "/f/inventory.yml", "repo": {"state": "running", "port": 2299, "blocked": []},
          "slurm": {"slurmctld": {"state": "running", "port": 2298, "pid": 7}, "conf": "/f/slurm/slurm.conf", "bin": "/f/slurm/bin"},
          "nodes": [node, dict(node, name="node02", slurm=None)]}
    lines = cli._status_text(st).splitlines()
    assert lines[3] == "slurmctld: running on 127.0.0.1:2298  SLURM_CONF=/f/slurm/slurm.conf  (wrappers in /f/slurm/bin)"
    assert lines[4].split() == ["NODE", "CLASS", "PORT", "STATE", "NSPAWN", "DRIVER", "DRAIN", "FLAG", "SLURM", "BOOT", "ID"]
    assert lines[5].split() == ["node01", "h100", "2201", "running", "42", "-", "-", "-", "MIXED+DRAIN", "b1"]
    assert lines[6].split() == ["node02", "h100", "2201", "running", "42", "-", "-", "-", "-", "b1"]
