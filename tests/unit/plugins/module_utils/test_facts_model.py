from ansible_collections.gpufleet.nvidia.plugins.module_utils import facts_model as fm


def test_null_words_become_none():
    for word in ("N/A", "[N/A]", "[Not Supported]", "[Requested functionality has been deprecated]", "", "  "):
        assert fm.null_if_na(word) is None
    assert fm.null_if_na(" 535.54.03 ") == "535.54.03"


def test_units_are_parsed_not_invented():
    assert fm.parse_number("67.03 W") == 67.03
    assert fm.parse_int("16x") == 16
    assert fm.parse_number("N/A") is None
    assert fm.parse_number("Enabled") is None


def test_clocks_event_reasons_decode_bits():
    assert fm.clocks_event_reason_names(0) == []
    assert fm.clocks_event_reason_names(0x4 | 0x1) == ["gpu_idle", "sw_power_cap"]
    assert fm.clocks_event_reason_names(0x1000) == ["bit_0x1000"]
    assert fm.clocks_event_reason_names(None) is None


def test_power_and_memory_units():
    assert fm.watts_from_milliwatts(700000) == 700.0
    assert fm.mib_from_bytes(85899345920) == 81920
    assert fm.branch_of("580.126.20") == "580"
    assert fm.branch_of("garbage") is None


def test_pci_bus_ids_from_every_source_normalise_alike():
    assert fm.normalize_pci_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert fm.normalize_pci_bus_id("PCI:0000:9b:00") == "0000:9b:00.0"
    assert fm.normalize_pci_bus_id("0000:9B:00.1") == "0000:9b:00.1"
    assert fm.normalize_pci_bus_id("N/A") is None
    assert fm.normalize_pci_bus_id("gpu0") is None
