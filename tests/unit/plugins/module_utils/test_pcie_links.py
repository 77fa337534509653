from ansible_collections.gpufleet.nvidia.plugins.module_utils.pcie_links import gpu_link_report, parse_lspci_links

DEGRADED_GPU = """\
3b:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)
\tCapabilities: [60] Express (v2) Endpoint, MSI 00
\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM L1, Exit Latency L1 <4us
\t\tLnkSta:\tSpeed 16GT/s (downgraded), Width x8 (downgraded)
5d:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)
\tCapabilities: [60] Express (v2) Endpoint, MSI 00
\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM L1, Exit Latency L1 <4us
\t\tLnkSta:\tSpeed 32GT/s, Width x16
"""


def test_gpu_endpoint_running_below_its_capability_is_degraded():
    report = gpu_link_report(parse_lspci_links(DEGRADED_GPU))
    assert report["degraded_gpus"] == ["0000:3b:00.0"]
    first, second = report["gpus"]
    assert (first["gen_current"], first["gen_max"], first["width_current"], first["width_max"]) == (4, 5, 8, 16)
    # An lspci without the (ok)/(downgraded) notes is judged by comparing status with capability.
    assert second["healthy"] is True


def test_non_gpu_devices_are_not_judged():
    devices = parse_lspci_links("18:00.0 Non-Volatile memory controller: Micron Technology Inc Device 51c3\n"
                                "\t\tLnkCap:\tPort #0, Speed 16GT/s, Width x4\n"
                                "\t\tLnkSta:\tSpeed 8GT/s (downgraded), Width x4 (ok)\n")
    assert devices[0]["downgraded"] is True and devices[0]["nvidia_gpu"] is False
    report = gpu_link_report(devices)
    assert report == {"gpus": [], "degraded_gpus": [], "other_downgraded_ports": 1}


BEHIND_A_GEN4_PORT = """\
16:01.0 PCI bridge: Broadcom / LSI PEX890xx PCIe Gen 5 Switch (rev b0)
\tBus: primary=16, secondary=19, subordinate=19, sec-latency=0
\tCapabilities: [68] Express (v2) Downstream Port (Slot+), MSI 00
\t\tLnkCap:\tPort #1, Speed 16GT/s, Width x16, ASPM L1
\t\tLnkSta:\tSpeed 16GT/s (ok), Width x16 (ok)
19:00.0 3D controller: NVIDIA Corporation GH100 [H100 SXM5 80GB] (rev a1)
\tCapabilities: [60] Express (v2) Endpoint, MSI 00
\t\tLnkCap:\tPort #0, Speed 32GT/s, Width x16, ASPM L1
\t\tLnkSta:\tSpeed 16GT/s (downgraded), Width x16 (ok)
"""


def test_gpu_behind_a_port_that_allows_no_more_is_not_degraded():
    report = gpu_link_report(parse_lspci_links(BEHIND_A_GEN4_PORT), {"0000:19:00.0": False})
    gpu = report["gpus"][0]
    assert (gpu["upstream"], gpu["gen_attainable"], gpu["width_attainable"]) == ("0000:16:01.0", 4, 16)
    assert gpu["healthy"] is True and report["degraded_gpus"] == []
    assert "allows no more" in gpu["note"]


def test_speed_below_the_attainable_is_degraded_only_under_load_width_always():
    devices = parse_lspci_links(DEGRADED_GPU)
    # 0000:3b:00.0 runs Gen4 x8 of Gen5 x16: the width alone degrades it, idle or not.
    for idle in (True, None, False):
        assert gpu_link_report(devices, {"0000:3b:00.0": idle})["degraded_gpus"] == ["0000:3b:00.0"]
    speed_only = parse_lspci_links(DEGRADED_GPU.replace("Width x8 (downgraded)", "Width x16 (ok)"))
    busy = gpu_link_report(speed_only, {"0000:3b:00.0": False})
    assert busy["degraded_gpus"] == ["0000:3b:00.0"] and "under load" in busy["gpus"][0]["note"]
    for idle, word in ((True, "idle"), (None, "of unknown load")):
        report = gpu_link_report(speed_only, {"0000:3b:00.0": idle})
        assert report["degraded_gpus"] == [] and report["gpus"][0]["healthy"] is None
        assert word in report["gpus"][0]["note"]
