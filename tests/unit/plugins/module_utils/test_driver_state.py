# -*- coding: utf-8 -*-
# Copyright: gpufleet.nvidia contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Driver versions and the driver.state verdict: parsers, verdict rules and field cases 11, 17, 23, 24."""

import os

import pytest

from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_loaded
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_on_disk
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_packages
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_versions
from ansible_collections.gpufleet.nvidia.plugins.module_utils import installed_packages
from ansible_collections.gpufleet.nvidia.plugins.module_utils import smi_messages
from ansible_collections.gpufleet.nvidia.plugins.module_utils import driver_state as ds
from ansible_collections.gpufleet.nvidia.plugins.module_utils.kernel_log import parse_kernel_log

CASES = os.path.join(os.path.dirname(__file__), "..", "..", "..", "fixtures", "cases")


def read_case(folder, name):
    with open(os.path.join(CASES, folder, name), encoding="utf-8") as handle:
        return handle.read()


# --- versions ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "package_version, expected",
    [
        ("580.126.20-1", "580.126.20"),
        ("3:580.126.09-1.el9", "580.126.09"),
        ("460.73.01-0ubuntu0.20.04.1", "460.73.01"),
        ("580.105.08-0ubuntu1", "580.105.08"),
        ("570.124.06-1.el9", "570.124.06"),
        ("595.84", "595.84"),
        ("<none>", None),
        ("", None),
        (None, None),
    ],
)
def test_upstream_version_strips_epoch_and_revision(package_version, expected):
    assert driver_versions.upstream_version(package_version) == expected


def test_versions_match_is_exact():
    assert driver_versions.versions_match("580.126.09", "580.126.09")
    assert driver_versions.versions_match("580.126.20-1", "580.126.20")
    assert not driver_versions.versions_match("530.30.02", "530.41.03")  # same branch is not enough
    assert not driver_versions.versions_match("550.120", "550.127.05")
    assert not driver_versions.versions_match("595.71", "595.71.05")  # no prefix matching
    assert not driver_versions.versions_match(None, "580.82.07")
    assert not driver_versions.versions_match(None, None)


# --- /proc/driver/nvidia/version and /sys/module/nvidia/version -----------------------------

PROC_OPEN = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.82.07  Release Build  "
    "(dvs-builder@U16-I2-C03-12-4)  Wed Aug 13 00:49:54 UTC 2025\n"
    "GCC version:  gcc version 12.3.0 (Ubuntu 12.3.0-1ubuntu1~22.04)\n"
)
PROC_PROPRIETARY = (
    "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.54.03  Tue Jun  6 22:20:39 UTC 2023\n"
    "GCC version:  gcc version 11.3.0 (Ubuntu 11.3.0-1ubuntu1~22.04.1)\n"
)
PROC_OPEN_ARM = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  550.144.03  Release Build  "
    "(dvs-builder@U16-I2-C01-12-4)  Mon Dec 30 17:33:24 UTC 2024\n"
)
PROC_PROPRIETARY_ARM = "NVRM version: NVIDIA UNIX aarch64 Kernel Module  550.120  Fri Sep 13 11:01:10 UTC 2024\n"


def test_proc_version_open_module():
    parsed = driver_loaded.parse_proc_driver_version(PROC_OPEN)
    assert parsed == {
        "loaded_version": "580.82.07",
        "kernel_module_type": "open",
        "architecture": "x86_64",
        "gcc_version": "12.3.0",
    }


def test_proc_version_proprietary_module():
    parsed = driver_loaded.parse_proc_driver_version(PROC_PROPRIETARY)
    assert parsed["loaded_version"] == "535.54.03"
    assert parsed["kernel_module_type"] == "proprietary"
    assert parsed["architecture"] == "x86_64"
    assert parsed["gcc_version"] == "11.3.0"


def test_proc_version_aarch64_variants():
    open_arm = driver_loaded.parse_proc_driver_version(PROC_OPEN_ARM)
    assert (open_arm["loaded_version"], open_arm["kernel_module_type"], open_arm["architecture"]) == (
        "550.144.03",
        "open",
        "aarch64",
    )
    prop_arm = driver_loaded.parse_proc_driver_version(PROC_PROPRIETARY_ARM)
    assert (prop_arm["loaded_version"], prop_arm["kernel_module_type"], prop_arm["architecture"]) == (
        "550.120",
        "proprietary",
        "aarch64",
    )
    assert prop_arm["gcc_version"] is None


def test_proc_version_tegra_wording_has_no_type():
    parsed = driver_loaded.parse_proc_driver_version(
        "NVRM version: NVIDIA UNIX Kernel Module for aarch64  34.1.1  Release Build  (buildbrain@mobile)\n"
    )
    assert parsed["loaded_version"] == "34.1.1"
    assert parsed["kernel_module_type"] is None
    assert parsed["architecture"] == "aarch64"


def test_proc_version_empty_or_garbage():
    for text in (None, "", "GCC version:  gcc version 12.2.0\n", "\x00\x01garbage"):
        assert driver_loaded.parse_proc_driver_version(text)["loaded_version"] is None


def test_sys_module_version():
    assert driver_loaded.parse_sys_module_version("580.82.07\n") == "580.82.07"
    assert driver_loaded.parse_sys_module_version("550.120") == "550.120"
    assert driver_loaded.parse_sys_module_version("") is None
    assert driver_loaded.parse_sys_module_version("not a version\n") is None
    assert driver_loaded.parse_sys_module_version(None) is None


# --- modinfo -------------------------------------------------------------------------------

# Real modinfo output has trailing blanks after "depends:" and "vermagic:"; kept here.
MODINFO_PROPRIETARY = "\n".join(
    [
        "filename:       /lib/modules/6.8.0-45-generic/updates/dkms/nvidia.ko.zst",
        "firmware:       nvidia/550.90.07/gsp_tu10x.bin",
        "version:        550.90.07",
        "supported:      external",
        "license:        NVIDIA",
        "srcversion:     0123456789ABCDEF0123456",
        "depends:        ",
        "name:           nvidia",
        "vermagic:       6.8.0-45-generic SMP preempt mod_unload modversions ",
        "parm:           NVreg_EnableGpuFirmware:int",
        "",
    ]
)


def test_modinfo_full_open_module_case_23():
    parsed = driver_on_disk.parse_modinfo(
        read_case("23-dkms-module-older-than-userspace-api-mismatch", "input-nvidia-all-394-modinfo.txt")
    )
    assert parsed["on_disk_version"] == "595.80"
    assert parsed["filename"] == "/lib/modules/7.0.12-zen1-1-zen/updates/dkms/nvidia.ko.zst"
    assert parsed["license"] == "Dual MIT/GPL"
    assert parsed["kernel_module_type"] == "open"
    assert parsed["kernel_release"] == "7.0.12-zen1-1-zen"
    assert parsed["firmware"] == ["nvidia/595.80/gsp_tu10x.bin", "nvidia/595.80/gsp_ga10x.bin"]
    assert parsed["not_found"] is False


def test_modinfo_full_proprietary_module():
    parsed = driver_on_disk.parse_modinfo(MODINFO_PROPRIETARY)
    assert parsed["on_disk_version"] == "550.90.07"
    assert parsed["kernel_module_type"] == "proprietary"
    assert parsed["vermagic"] == "6.8.0-45-generic SMP preempt mod_unload modversions"
    assert parsed["kernel_release"] == "6.8.0-45-generic"


def test_modinfo_kernel_release_from_vermagic_when_path_is_unusual():
    parsed = driver_on_disk.parse_modinfo("filename: /opt/x/nvidia.ko\nversion: 580.82.07\nvermagic: 5.14.0-427.el9.x86_64 SMP\n")
    assert parsed["kernel_release"] == "5.14.0-427.el9.x86_64"


def test_modinfo_bare_version():
    parsed = driver_on_disk.parse_modinfo("580.126.20\n")
    assert parsed["on_disk_version"] == "580.126.20"
    assert parsed["license"] is None
    assert parsed["not_found"] is False


def test_modinfo_module_not_found():
    parsed = driver_on_disk.parse_modinfo("modinfo: ERROR: Module nvidia not found.\n")
    assert parsed["on_disk_version"] is None
    assert parsed["not_found"] is True
    assert parsed["error"] is None


def test_modinfo_other_error_is_kept():
    parsed = driver_on_disk.parse_modinfo("modinfo: ERROR: could not get modinfo from 'nvidia': Exec format error\n")
    assert parsed["not_found"] is False
    assert parsed["error"].startswith("modinfo: ERROR: could not get modinfo")


# --- packages ------------------------------------------------------------------------------

DPKG_L = """Desired=Unknown/Install/Remove/Purge/Hold
| Status=Not/Inst/Conf-files/Unpacked/halF-conf/Half-inst/trig-aWait/Trig-pend
|/ Err?=(none)/Reinst-required (Status,Err: uppercase=bad)
||/ Name                           Version                   Architecture Description
+++-==============================-=========================-============-===================================
ii  adduser                        3.134                     all          add and remove users and groups
ii  cuda-toolkit-12-8              12.8.1-1                  amd64        CUDA Toolkit 12.8 meta-package
ii  libcudart12:amd64              12.8.90-1                 amd64        NVIDIA CUDA Runtime
hi  libnvidia-compute-580:amd64    580.105.08-0ubuntu1       amd64        NVIDIA libcompute package
hi  nvidia-dkms-580-open           580.105.08-0ubuntu1       amd64        NVIDIA DKMS package (open kernel module)
iF  nvidia-fabricmanager           580.105.08-1              amd64        Fabric Manager for NVSwitch based systems.
iU  libnvidia-nscq                 580.105.08-1              amd64        NVSwitch Configuration and Query library
iHR nvidia-utils-580               580.105.08-0ubuntu1       amd64        NVIDIA driver support binaries
ii  nvidia-container-toolkit       1.17.8-1                  amd64        NVIDIA Container toolkit
ii  nvidia-driver-pinning-580      580-5                     all          APT driver pinning file for driver branch 580
rc  nvidia-kernel-common-575       575.57.08-0ubuntu1        amd64        Shared files used with the kernel module
un  nvidia-driver-575              <none>                    <none>       (no description available)
ii  xserver-xorg-video-nvidia-580  580.105.08-0ubuntu1       amd64        NVIDIA binary Xorg driver
"""


def test_dpkg_l_keeps_only_driver_packages_with_status():
    packages = installed_packages.parse_dpkg_l(DPKG_L)
    by_name = {p["name"]: p for p in packages}
    assert sorted(by_name) == [
        "libnvidia-compute-580",
        "libnvidia-nscq",
        "nvidia-dkms-580-open",
        "nvidia-driver-575",
        "nvidia-driver-pinning-580",
        "nvidia-fabricmanager",
        "nvidia-kernel-common-575",
        "nvidia-utils-580",
        "xserver-xorg-video-nvidia-580",
    ]
    compute = by_name["libnvidia-compute-580"]
    assert compute["version"] == "580.105.08-0ubuntu1"
    assert compute["upstream_version"] == "580.105.08"
    assert compute["architecture"] == "amd64"
    assert (compute["status"], compute["held"], compute["installed"], compute["half_configured"]) == (
        "hi",
        True,
        True,
        False,
    )
    assert by_name["nvidia-fabricmanager"]["status"] == "iF"
    assert by_name["nvidia-fabricmanager"]["half_configured"] is True
    assert by_name["libnvidia-nscq"]["half_configured"] is True
    assert by_name["nvidia-utils-580"]["status"] == "iHR"
    assert by_name["nvidia-utils-580"]["half_configured"] is True
    assert by_name["nvidia-kernel-common-575"]["installed"] is False
    assert by_name["nvidia-kernel-common-575"]["half_configured"] is False
    assert by_name["nvidia-driver-575"]["version"] is None
    assert by_name["nvidia-driver-575"]["installed"] is False
    assert by_name["nvidia-driver-pinning-580"]["upstream_version"] == "580"


def test_dpkg_l_all_packages_when_asked():
    names = [p["name"] for p in installed_packages.parse_dpkg_l(DPKG_L, driver_only=False)]
    assert "adduser" in names and "libcudart12" in names and len(names) == 13


@pytest.mark.parametrize(
    "name, expected",
    [
        ("libnvidia-ml1", True),
        ("libcuda1:amd64", True),
        ("firmware-nvidia-gsp", True),
        ("cuda-drivers-580", True),
        ("cuda-drivers-fabricmanager-550", True),
        ("kmod-nvidia-open-dkms", True),
        ("nvidia-imex", True),
        ("libnvidia-nscq-575", True),
        ("libxnvctrl0", False),
        ("libglx-nvidia0", True),
        ("libgl1-nvidia-glvnd-glx", True),
        ("linux-modules-nvidia-580-server-open-6.8.0-45-generic", True),
        ("nvidia-fabric-manager", True),
        ("cuda-toolkit-12-8", False),
        ("libcudart12", False),
        ("cuda-compat-12-8", False),
        ("nvidia-cuda-toolkit", False),
        ("nvidia-container-toolkit", False),
        ("libnvidia-container1", False),
        ("nvidia-fs-dkms", False),
        ("nvidia-l4t-core", False),
        ("libglx-mesa0", False),
    ],
)
def test_driver_package_filter(name, expected):
    assert driver_packages.is_driver_package(name) is expected


RPM_QA = """kernel-5.14.0-427.13.1.el9_4.x86_64
gpg-pubkey-d42d0685-62e2ac48
nvidia-driver-580.82.07-1.el9.x86_64
nvidia-driver-cuda-libs-580.82.07-1.el9.x86_64
libnvidia-ml-580.82.07-1.el9.x86_64
kmod-nvidia-open-dkms-580.82.07-1.el9.noarch
nvidia-fabric-manager-580.82.07-1.x86_64
cuda-toolkit-12-8-12.8.1-1.x86_64
nvidia-container-toolkit-1.17.8-1.x86_64
"""


def test_rpm_qa():
    packages = installed_packages.parse_rpm_qa(RPM_QA)
    assert [p["name"] for p in packages] == [
        "nvidia-driver",
        "nvidia-driver-cuda-libs",
        "libnvidia-ml",
        "kmod-nvidia-open-dkms",
        "nvidia-fabric-manager",
    ]
    kmod = packages[3]
    assert kmod["version"] == "580.82.07-1.el9"
    assert kmod["upstream_version"] == "580.82.07"
    assert kmod["architecture"] == "noarch"
    assert kmod["status"] == "installed"
    assert kmod["held"] is False and kmod["half_configured"] is False
    assert driver_packages.userspace_version_from_packages(packages) == "580.82.07"
    assert driver_packages.fabricmanager_version_from_packages(packages) == "580.82.07"


def test_rpm_epoch_forms():
    packages = installed_packages.parse_rpm_qa(
        "nvidia-driver-3:580.126.09-1.el9.x86_64\nlibnvidia-ml 3:580.126.09-1.el9 x86_64\n"
    )
    assert [(p["name"], p["version"]) for p in packages] == [
        ("nvidia-driver", "3:580.126.09-1.el9"),
        ("libnvidia-ml", "3:580.126.09-1.el9"),
    ]
    assert driver_packages.userspace_version_from_packages(packages) == "580.126.09"


def test_apt_mark_showhold_marks_packages_held():
    held = installed_packages.parse_apt_mark_showhold("nvidia-fabricmanager\nlibnvidia-nscq:amd64\n\n")
    assert held == ["nvidia-fabricmanager", "libnvidia-nscq"]
    packages = installed_packages.mark_held(installed_packages.parse_dpkg_l(DPKG_L), held)
    by_name = {p["name"]: p for p in packages}
    assert by_name["nvidia-fabricmanager"]["held"] is True
    assert by_name["libnvidia-nscq"]["held"] is True
    assert by_name["xserver-xorg-video-nvidia-580"]["held"] is False


def test_userspace_version_prefers_nvml_library_package():
    packages = [
        {"name": "nvidia-utils-580", "version": "580.105.08-0ubuntu1", "installed": True},
        {"name": "libnvidia-ml1", "version": "580.126.20-1", "installed": True},
    ]
    assert driver_packages.userspace_version_from_packages(packages) == "580.126.20"
    assert driver_packages.userspace_version_from_packages(installed_packages.parse_dpkg_l(DPKG_L)) == "580.105.08"
    removed_only = [{"name": "libnvidia-ml1", "version": "580.126.20-1", "installed": False}]
    assert driver_packages.userspace_version_from_packages(removed_only) is None
    assert driver_packages.userspace_version_from_packages([]) is None


# --- nvidia-smi messages -------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Failed to initialize NVML: Driver/library version mismatch\n", "LibRmVersionMismatch"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure "
            "that the latest NVIDIA driver is installed and running.\n",
            "DriverNotLoaded",
        ),
        (
            "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that "
            "the NVIDIA Display Driver is properly installed and present in your system.\n",
            "LibraryNotFound",
        ),
        ("Failed to initialize NVML: Insufficient Permissions\n", "NoPermission"),
        ("Failed to initialize NVML: Unknown Error\n", "Unknown"),
        ("Fri Jun  6 10:00:00 2025\n| NVIDIA-SMI 580.82.07 |\n", None),
        (None, None),
    ],
)
def test_nvml_error_from_text(text, expected):
    assert smi_messages.nvml_error_from_text(text) == expected


# --- field case 23: on-disk module older than the userspace -> broken ---------------------


def _mismatch_versions(mismatch):
    """The client and the two versions of one ``api_mismatches`` entry of ``kernel_log.parse_kernel_log``."""
    return dict((key, mismatch[key]) for key in ("client", "pid", "client_version", "kernel_module_version"))


def test_case_23_nvidia_all_modinfo_older_than_userspace_is_broken():
    folder = "23-dkms-module-older-than-userspace-api-mismatch"
    mismatches = parse_kernel_log(read_case(folder, "input-nvidia-all-394-dmesg.log"))["api_mismatches"]
    assert [_mismatch_versions(m) for m in mismatches] == [
        {"client": "kwin_wayland", "pid": 1005, "client_version": "595.84", "kernel_module_version": "595.80"}
    ]
    modinfo = driver_on_disk.parse_modinfo(read_case(folder, "input-nvidia-all-394-modinfo.txt"))
    userspace = mismatches[0]["client_version"]
    loaded = mismatches[0]["kernel_module_version"]

    state, reasons = ds.driver_state(
        userspace,
        loaded,
        modinfo["on_disk_version"],
        None,
        {"running_kernel": modinfo["kernel_release"], "live": False},
    )
    assert state == "broken"  # not reboot_pending: the module that loads at every boot is 595.80
    assert any("595.80" in r and "595.84" in r and "reboot will not fix" in r for r in reasons)


def test_case_23_nobara_nvml_mismatch_with_stale_module_source_is_broken():
    folder = "23-dkms-module-older-than-userspace-api-mismatch"
    smi = smi_messages.parse_nvidia_smi_error(read_case(folder, "input-nobara-525-nvidia-smi.txt"))
    assert smi["nvml_error"] == "LibRmVersionMismatch"
    assert smi["nvml_library_version_short"] == "595.71"
    assert smi["message"] == "Failed to initialize NVML: Driver/library version mismatch"
    # The short library version is not an exact version: it must not be taken as equal to 595.71.05.
    assert not driver_versions.versions_match(smi["nvml_library_version_short"], "595.71.05")
    # Package 3:dkms-nvidia-595.71.05-1.fc43 built a 595.58.03 module (case.md).
    state, reasons = ds.driver_state(
        driver_versions.upstream_version("3:595.71.05-1.fc43"),
        None,
        "595.58.03",
        None,
        {"nvml_error": smi["nvml_error"], "live": False},
    )
    assert state == "broken"
    assert any("595.58.03" in r and "595.71.05" in r for r in reasons)


def test_api_mismatch_old_wording_with_syslog_prefix():
    text = (
        "Apr 23 18:55:23 host kernel: [    7.039052] NVRM: API mismatch: the client has the version 352.79, but\n"
        "Apr 23 18:55:23 host kernel: [    7.039052] NVRM: this kernel module has the version 361.42.  Please\n"
    )
    assert [_mismatch_versions(m) for m in parse_kernel_log(text)["api_mismatches"]] == [
        {"client": None, "pid": None, "client_version": "352.79", "kernel_module_version": "361.42"}
    ]


# --- field case 24: no module for the running kernel -> broken, not a GPU failure ----------


def test_case_24_module_only_for_previous_kernel_is_broken():
    text = read_case("24-no-module-for-running-kernel-after-kernel-update", "input.txt")
    running = driver_on_disk.kernel_release_from_uname(
        "\n".join(line for line in text.splitlines() if line.startswith("Linux "))
    )
    assert running == "3.13.0-116-generic"
    modules = driver_on_disk.nvidia_modules_by_kernel(text)
    assert modules == {
        "3.13.0-88-generic": [
            "/lib/modules/3.13.0-88-generic/kernel/drivers/video/nvidia.ko",
        ]
    }
    assert running not in modules
    nvml_error = smi_messages.nvml_error_from_text(text)
    assert nvml_error == "DriverNotLoaded"

    state, reasons = ds.driver_state(
        None,
        None,
        None,
        None,
        {
            "nvml_error": nvml_error,
            "module_found_for_running_kernel": running in modules,
            "running_kernel": running,
            "module_present_for": sorted(modules),
            "live": False,
        },
    )
    assert state == "broken"
    joined = " ".join(reasons)
    assert "not built for the running kernel 3.13.0-116-generic" in joined
    assert "3.13.0-88-generic" in joined
    assert "not a GPU failure" in joined


def test_no_module_for_running_kernel_with_packages_is_broken():
    packages = [{"name": "nvidia-dkms-580-open", "version": "580.105.08-0ubuntu1", "installed": True}]
    state, reasons = ds.driver_state(
        "580.105.08",
        None,
        None,
        packages,
        {"module_found_for_running_kernel": False, "running_kernel": "6.8.0-50-generic"},
    )
    assert state == "broken"
    assert "6.8.0-50-generic" in reasons[-1]


# --- field case 11: Fabric Manager must match the driver exactly ---------------------------


# --- field case 17: unattended-upgrade moved libnvidia-common-460 --------------------------


def test_case_17_unattended_upgrade_leaves_a_reboot_pending():
    folder = "17-unattended-upgrade-libnvidia-nvml-mismatch"
    nvml_error = smi_messages.nvml_error_from_text(read_case(folder, "input-nvidia-smi.txt"))
    assert nvml_error == "LibRmVersionMismatch"
    installed = [{"name": "libnvidia-common-460", "version": "460.73.01-0ubuntu0.20.04.1", "installed": True}]
    userspace = driver_packages.userspace_version_from_packages(installed)
    assert userspace == "460.73.01"

    # A bundle without modinfo cannot say a reboot fixes it: it names the evidence it lacks.
    state, reasons = ds.driver_state(userspace, None, None, installed, {"nvml_error": nvml_error, "live": False})
    assert state is None
    assert any("460.73.01" in r and "mismatch" in r and "modinfo-nvidia.txt" in r for r in reasons)
    # On a live host (modinfo read, here matching the libraries) NVML's mismatch is a pending reboot.
    state, reasons = ds.driver_state(userspace, None, "460.73.01", installed, {"nvml_error": nvml_error})
    assert state == "reboot_pending"

    # With the loaded module read (/sys/module/nvidia/version), both versions are named.
    state, reasons = ds.driver_state(userspace, "460.56", None, installed, {"nvml_error": nvml_error})
    assert state == "reboot_pending"
    assert "460.56" in reasons[-1] and "460.73.01" in reasons[-1]


# --- the verdict: one test per rule ---------------------------------------------------------

INSTALLED_580 = [
    {"name": "libnvidia-ml1", "version": "580.126.20-1", "installed": True, "half_configured": False},
    {"name": "nvidia-kernel-open-dkms", "version": "580.126.20-1", "installed": True, "half_configured": False},
]


def test_state_ok_when_all_three_agree():
    state, reasons = ds.driver_state("580.126.20", "580.126.20", "580.126.20", INSTALLED_580, {})
    assert state == "ok"
    assert reasons == ["Userspace, loaded and on-disk driver versions agree: 580.126.20."]


def test_state_ok_without_modinfo_says_on_disk_unchecked():
    state, reasons = ds.driver_state("580.126.20", "580.126.20", None, INSTALLED_580, {})
    assert state == "ok"
    assert "not checked" in reasons[-1]


def test_state_reboot_pending_when_loaded_is_old_and_disk_is_new():
    state, reasons = ds.driver_state(
        "580.126.20", "580.105.08", "580.126.20", INSTALLED_580, {"nvml_error": "LibRmVersionMismatch"}
    )
    assert state == "reboot_pending"
    assert "580.105.08" in reasons[-1] and "580.126.20" in reasons[-1]


def test_state_from_nvml_mismatch_alone_needs_the_module_on_disk_in_a_bundle():
    state, reasons = ds.driver_state(None, None, None, None, {"nvml_error": "LibRmVersionMismatch", "live": False})
    assert state is None and "undetermined" in reasons[-1] and "modinfo" in reasons[-1]
    state, _reasons = ds.driver_state(None, None, None, None, {"nvml_error": "LibRmVersionMismatch"})
    assert state == "reboot_pending"
    # With the module on disk captured, the bundle says what a reboot does: loads the libraries' version.
    state, _reasons = ds.driver_state("580.126.20", "580.105.08", "580.126.20", INSTALLED_580,
                                      {"nvml_error": "LibRmVersionMismatch", "live": False})
    assert state == "reboot_pending"


def test_state_broken_when_disk_differs_from_userspace_even_if_loaded_matches():
    state, reasons = ds.driver_state("580.126.20", "580.126.20", "580.105.08", INSTALLED_580, {})
    assert state == "broken"
    assert "580.105.08" in reasons[-1]


def test_state_broken_when_nvml_mismatch_and_disk_equals_loaded():
    state, _reasons = ds.driver_state(
        None, "580.105.08", "580.105.08", None, {"nvml_error": "LibRmVersionMismatch", "live": False}
    )
    assert state == "broken"


def test_state_broken_when_packages_half_configured():
    packages = installed_packages.parse_dpkg_l(DPKG_L)
    state, reasons = ds.driver_state("580.105.08", "580.105.08", "580.105.08", packages, {})
    assert state == "broken"
    assert "nvidia-fabricmanager 580.105.08-1 (iF)" in reasons[0]
    assert "nvidia-utils-580 580.105.08-0ubuntu1 (iHR)" in reasons[0]


def test_state_not_loaded_on_driver_not_loaded():
    state, reasons = ds.driver_state(
        "580.126.20", None, "580.126.20", INSTALLED_580, {"nvml_error": "DriverNotLoaded"}
    )
    assert state == "not_loaded"
    assert "DriverNotLoaded" in reasons[-1] and "580.126.20" in reasons[-1]


def test_state_not_loaded_on_live_host_without_module():
    state, _reasons = ds.driver_state("580.126.20", None, "580.126.20", INSTALLED_580, {"live": True})
    assert state == "not_loaded"


def test_state_not_installed_on_bare_live_host():
    state, reasons = ds.driver_state(
        None, None, None, [], {"nvml_error": "LibraryNotFound", "module_found_for_running_kernel": False}
    )
    assert state == "not_installed"
    assert reasons[-1].startswith("No NVIDIA driver is installed")


def test_state_not_installed_ignores_removed_packages():
    removed = [{"name": "libnvidia-ml1", "version": "580.126.20-1", "installed": False, "status": "rc"}]
    state, _reasons = ds.driver_state(None, None, None, removed, {})
    assert state == "not_installed"


def test_state_undetermined_for_capture_without_driver_sources():
    state, reasons = ds.driver_state(None, None, None, None, {"live": False})
    assert state is None
    assert "undetermined" in reasons[-1]


def test_state_broken_when_module_loaded_without_any_userspace_on_live_host():
    state, reasons = ds.driver_state(None, "580.126.20", "580.126.20", [], {})
    assert state == "broken"
    assert "580.126.20 is loaded but no NVIDIA userspace driver" in reasons[-1]
    state, reasons = ds.driver_state(None, None, "580.126.20", [], {"running_kernel": "6.1.0-28-amd64"})
    assert state == "broken"
    assert "on disk for the running kernel 6.1.0-28-amd64" in reasons[-1]


def test_state_ok_in_capture_when_nvml_answered_without_proc_file():
    # nvidia-smi -q -x (or NVML) answered: the loaded module has the library's version.
    state, reasons = ds.driver_state("535.54.03", None, None, None, {"nvml_initialized": True, "live": False})
    assert state == "ok"
    assert "535.54.03" in reasons[0]


def test_state_in_capture_without_loaded_evidence_is_undetermined():
    # Same versions from packages only, in a capture without /proc or /sys files: unknown, not "not_loaded".
    state, _reasons = ds.driver_state("580.126.20", None, "580.126.20", INSTALLED_580, {"live": False})
    assert state is None
    state, _reasons = ds.driver_state(
        "580.126.20", None, "580.126.20", INSTALLED_580, {"live": False, "module_loaded": False}
    )
    assert state == "not_loaded"
