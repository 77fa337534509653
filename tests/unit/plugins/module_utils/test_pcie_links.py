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
