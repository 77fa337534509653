"""The simulated fleet's own decisions that need no fleet: layouts, mirror, inventory, mounts, ports."""

from __future__ import annotations

import os
import socket
import sys

import pytest

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "simfleet"))

from simfleet import base, inventory  # noqa: E402
from simfleet.fleet import parse_layout  # noqa: E402
from simfleet.proc import SimfleetError, _unescape, mounts_under, parse_port_range, port_free  # noqa: E402

CLASSES = ("h100", "a100", "l40s", "v100", "b200")


def test_layout_is_cycled_over_the_node_count():
    assert parse_layout("h100,v100", 5, CLASSES) == ["h100", "v100", "h100", "v100", "h100"]
    assert parse_layout("h100,a100,l40s,v100", None, CLASSES) == ["h100", "a100", "l40s", "v100"]


def test_layout_with_counts_must_match_the_node_count():
    assert parse_layout("h100:2,b200:1", None, CLASSES) == ["h100", "h100", "b200"]
    assert parse_layout("h100:2,b200", 3, CLASSES) == ["h100", "h100", "b200"]
    with pytest.raises(SimfleetError, match="has 3 nodes, not 4"):
        parse_layout("h100:2,b200:1", 4, CLASSES)


def test_layout_refuses_an_unknown_class():
    with pytest.raises(SimfleetError, match="unknown GPU class 'h200'"):
        parse_layout("h100,h200", 2, CLASSES)


def test_mirror_comes_from_the_hosts_bookworm_main_entry(tmp_path, monkeypatch):
    monkeypatch.delenv("SIMFLEET_MIRROR", raising=False)
    deb822 = tmp_path / "debian.sources"
    deb822.write_text(
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main contrib\n"
    )
    one_line = tmp_path / "sources.list"
    one_line.write_text("# deb http://old.example/debian bookworm main\ndeb [arch=amd64] http://other.example/debian bookworm main\n")
    empty = tmp_path / "none.list"
    empty.write_text("")
    assert base.detect_mirror([str(empty), str(deb822), str(one_line)]) == "http://mirror.example/debian"
    assert base.detect_mirror([str(one_line)]) == "http://other.example/debian"
    assert base.detect_mirror([str(empty)]) == base.DEFAULT_MIRROR
    monkeypatch.setenv("SIMFLEET_MIRROR", "http://forced.example/debian")
    assert base.detect_mirror([str(deb822)]) == "http://forced.example/debian"


def _fleet():
    return {
        "name": "t",
        "ssh_key": "/f/ssh/id_ed25519",
        "repo_port": 22200,
        "key": {"fingerprint": "ABCD", "keyring_path": "/f/repo-key.gpg", "armored_path": "/f/repo-key.asc"},
        "nodes": [
            {"name": "node01", "class": "h100", "port": 22201, "root": "/f/nodes/node01/root", "repo_url": "http://127.0.0.1:22200/node01/debian12/x86_64/"},
            {"name": "node02", "class": "v100", "port": 22202, "root": "/f/nodes/node02/root", "repo_url": "http://127.0.0.1:22200/node02/debian12/x86_64/"},
            {"name": "node03", "class": "h100", "port": 22203, "root": "/f/nodes/node03/root", "repo_url": "http://127.0.0.1:22200/node03/debian12/x86_64/"},
        ],
    }


def test_inventory_groups_nodes_by_gpu_class():
    groups = inventory.groups(_fleet())
    assert {g: [n["name"] for n in nodes] for g, nodes in groups.items()} == {"gpu_h100": ["node01", "node03"], "gpu_v100": ["node02"]}
    text = inventory.render_yaml(_fleet())
    assert '        gpu_h100:\n          hosts:\n            node01:\n              ansible_host: "127.0.0.1"\n              ansible_port: 22201\n' in text
    assert '    ansible_ssh_private_key_file: "/f/ssh/id_ed25519"\n' in text
    assert '    simfleet_apt_key_fingerprint: "ABCD"\n' in text
    ini = inventory.render_ini(_fleet())
    assert "node02 ansible_host=127.0.0.1 ansible_port=22202 simfleet_gpu_class=v100" in ini
    assert "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR'" in ini
    assert "[simfleet:children]\ngpu_h100\ngpu_v100\n" in ini


def test_mountinfo_escapes_are_decoded():
    assert _unescape("/a\\040b/c\\011d") == "/a b/c\td"
    assert _unescape("/plain") == "/plain"


def test_nothing_is_mounted_below_a_fresh_directory(tmp_path):
    assert mounts_under(str(tmp_path)) == []


def test_port_range_is_checked():
    assert parse_port_range("22200-22999") == (22200, 22999)
    for bad in ("22200", "80-90", "3000-2000", "a-b"):
        with pytest.raises(SimfleetError):
            parse_port_range(bad)


def test_a_listening_port_is_not_free():
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(1)
    port = s.getsockname()[1]
    try:
        assert port_free(port) is False
    finally:
        s.close()
    assert port_free(port) is True
