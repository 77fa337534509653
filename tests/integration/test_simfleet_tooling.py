"""The simulated fleet's own decisions that need no fleet: layouts, mirror, inventory, mounts, ports."""

from __future__ import annotations

import os
import socket
import sys

import pytest

sys.path.append(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "simfleet"))

from simfleet import DEFAULT_PORT_RANGE, base, inventory, testing  # noqa: E402
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


@pytest.fixture
def port_claims(tmp_path, monkeypatch):
    """Range choice against an empty cache and a claim directory of the test's own."""
    monkeypatch.setenv("SIMFLEET_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SIMFLEET_PORT_CLAIMS", str(tmp_path / "claims"))
    monkeypatch.delenv("SIMFLEET_PORTS", raising=False)
    names = []
    yield names
    for name in names:
        testing.release_port_range(name)


def _listen(port):
    """A socket listening on 127.0.0.1:port, or None when something else already listens there."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        assert port_free(port) is False
        return None
    s.listen(1)
    return s


def test_a_test_fleet_skips_the_default_range_while_its_repository_port_is_busy(port_claims):
    default_lo, default_hi = parse_port_range(DEFAULT_PORT_RANGE)
    blocker = _listen(default_lo)  # the port the default range gives the apt repository
    try:
        port_claims.append("t-busy")
        chosen = testing.choose_port_range(5, fleet="t-busy")
    finally:
        if blocker:
            blocker.close()
    lo, hi = parse_port_range(chosen)
    size = default_hi - default_lo + 1
    assert hi - lo + 1 == size
    assert lo >= default_lo + size and (lo - default_lo) % size == 0
    assert all(port_free(p) for p in range(lo, lo + 5))
    with open(os.path.join(os.environ["SIMFLEET_PORT_CLAIMS"], chosen + ".lock"), encoding="utf-8") as f:
        assert f.read() == "%d t-busy\n" % os.getpid()


def test_sessions_choosing_at_once_get_different_ranges(port_claims):
    port_claims.extend(["t-a", "t-b", "t-c"])
    first = testing.choose_port_range(3, "41000-41009", fleet="t-a")
    # t-a holds its claim (an flock on the range's file; another open file of it, as another
    # session's, cannot take it), so t-b gets a later range although nothing listens yet.
    second = testing.choose_port_range(3, "41000-41009", fleet="t-b")
    assert first != second
    assert parse_port_range(second)[0] > parse_port_range(first)[0]
    testing.release_port_range("t-a")
    assert testing.choose_port_range(3, "41000-41009", fleet="t-c") == first


def test_a_range_with_a_port_recorded_by_another_fleet_is_skipped(port_claims, tmp_path):
    other = tmp_path / "cache" / "fleets" / "other"
    other.mkdir(parents=True)
    # A fleet whose nodes are down still owns its ports: nothing listens, yet the range is taken.
    (other / "fleet.json").write_text('{"repo_port": 41100, "nodes": [{"name": "node01", "port": 41105}]}')
    port_claims.append("t-rec")
    chosen = testing.choose_port_range(3, "41100-41109", fleet="t-rec")
    assert parse_port_range(chosen)[0] >= 41110


def test_ports_needed_counts_the_repository_and_each_node():
    assert testing.ports_needed(None, "h100,a100,l40s,v100") == 5
    assert testing.ports_needed(2, "l40s,v100") == 3
    assert testing.ports_needed(None, "h100:2,b200:1") == 4
