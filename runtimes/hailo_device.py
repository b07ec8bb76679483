"""What a Hailo backend must know without HailoRT: the chip a HEF was compiled for (read from the
file's header), the Hailo chips on this machine (``/dev/hailo*`` and their PCIe ids in sysfs),
and whether the one runs on the other. Light: no HailoRT import, so the board probe
(`agent.hardware.board`) and the registry may use it.

Read from ``hailo-ai/hailort`` v5.2.0 (and the same in v4.18.0-v4.23.0):

- ``hailort/libhailort/src/hef/hef_internal.hpp``: a HEF starts with a big-endian header,
  ``magic`` (0x01484546), ``version``, ``hef_proto_size``, then a part per version (header
  sizes 32, 28, 44 and 56 bytes for versions 0-3), then the ``ProtoHEFHef`` protobuf.
- ``hailort/libhailort/hef.proto``: ``ProtoHEFHef.header`` (field 1) is a ``ProtoHEFHeader``
  whose ``hw_arch`` (field 1, an enum, 0 = HAILO8 and so left out when 0) is the target and
  ``sdk_version`` (field 3, a string) the Dataflow Compiler release that made the HEF.
- ``hailort/libhailort/src/device_common/device_internal.cpp``
  (``hef_arch_to_device_compatible_archs``): the devices a HEF's ``hw_arch`` runs on; a HEF
  for Hailo-8L runs on Hailo-8 too, not the other way round, and a ``HAILO1XH`` one (the
  Hailo-10H's compiler target) on Hailo-10H and Hailo-15H.

PCIe ids, from ``hailo-ai/hailort-drivers`` v5.3.0 ``common/pcie_common.h`` (vendor 0x1e60,
Hailo-10H 0x45C4, Hailo-15L 0x43A2) and Hailo's ``lspci -d 1e60:`` (Hailo-8 and Hailo-8L
share 0x2864: the id cannot tell them apart, HailoRT's configure does).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from runtimes.base import ModelLoadError, NotAModelError

HEF_MAGIC = 0x01484546
#: the bytes before the protobuf, per header version (hef_internal.hpp, packed structs)
HEADER_SIZES: Mapping[int, int] = {0: 32, 1: 28, 2: 44, 3: 56}
#: how much of a HEF is read to find its header message: bounded before parsing
MAX_HEADER_READ = 64 * 1024
#: ``ProtoHEFHwArch`` (hef.proto) by value
HW_ARCHES: Mapping[int, str] = {
    0: "hailo8",
    1: "hailo8p",
    2: "hailo8r",
    3: "hailo8l",
    4: "hailo15m",
    5: "hailo10h",  # deprecated in hef.proto; older HEFs for Hailo-10H
    6: "hailo15l",
    100: "sage_a0",
    101: "sage_b0",
    102: "paprika_b0",
    103: "hailo1xh",
    104: "ginger",
    105: "lavender",
    106: "pluto",
    108: "mars",
}
#: the device architectures a HEF of each ``hw_arch`` runs on (device_internal.cpp)
COMPATIBLE: Mapping[str, frozenset[str]] = {
    "hailo8": frozenset({"hailo8"}),
    "hailo8p": frozenset({"hailo8"}),
    "hailo8r": frozenset({"hailo8"}),
    "sage_b0": frozenset({"hailo8"}),
    "paprika_b0": frozenset({"hailo8"}),
    "hailo8l": frozenset({"hailo8l", "hailo8"}),
    "hailo1xh": frozenset({"hailo15h", "hailo10h"}),
    "hailo10h": frozenset({"hailo15h", "hailo10h"}),
    "ginger": frozenset({"hailo15h", "hailo10h"}),
    "lavender": frozenset({"hailo15h", "hailo10h"}),
    "hailo15m": frozenset({"hailo15m", "hailo15h", "hailo10h"}),
    "pluto": frozenset({"hailo15l"}),
    "hailo15l": frozenset({"hailo15l"}),
    "mars": frozenset({"hailo12l"}),
}
VENDOR = 0x1E60
#: a PCIe device id -> the chips it may be (Hailo-8 and Hailo-8L share one id)
PCIE_CHIPS: Mapping[int, frozenset[str]] = {
    0x2864: frozenset({"hailo8", "hailo8l"}),
    0x45C4: frozenset({"hailo10h"}),
    0x43A2: frozenset({"hailo15l"}),
}
#: how a chip family is named to a person
FAMILY_NAMES: Mapping[frozenset[str], str] = {
    frozenset({"hailo8", "hailo8l"}): "Hailo-8/8L",
    frozenset({"hailo10h"}): "Hailo-10H",
    frozenset({"hailo15l"}): "Hailo-15L",
}


class TargetMismatch(ModelLoadError):
    """A HEF compiled for another Hailo chip than this device's (``TARGET_MISMATCH``)."""


@dataclass(frozen=True)
class HailoDevice:
    """One Hailo chip found: its node (``/dev/hailo0``), its PCIe device id (None where sysfs
    does not say) and the chips that id may be."""

    node: str
    pcie_id: int | None
    chips: frozenset[str]

    @property
    def family(self) -> str:
        """``Hailo-8/8L``, ``Hailo-10H``, or the id when it is not a known one."""
        if self.pcie_id is None:
            return "a Hailo device of unknown PCIe id"
        return FAMILY_NAMES.get(self.chips, f"a Hailo device with PCIe id 1e60:{self.pcie_id:04x}")


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _fields(data: bytes) -> list[tuple[int, int, int | bytes]]:
    """The top-level fields of a protobuf message in `data`: (number, wire type, value); stops
    at the end of `data` (a message cut by the read window yields its first fields only)."""
    fields: list[tuple[int, int, int | bytes]] = []
    pos = 0
    while pos < len(data):
        try:
            key, pos = _varint(data, pos)
            number, wire = key >> 3, key & 7
            if number == 0:  # no field is numbered 0: not a message here (the header misread)
                return fields
            if wire == 0:
                value, pos = _varint(data, pos)
                fields.append((number, wire, value))
            elif wire == 2:
                size, pos = _varint(data, pos)
                if pos + size > len(data):
                    fields.append((number, wire, data[pos:]))  # cut by the window: what there is
                    return fields
                fields.append((number, wire, data[pos : pos + size]))
                pos += size
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                raise ValueError(f"wire type {wire}")
        except ValueError:
            return fields
    return fields


#: the longest ``sdk_version`` kept from a header (a release such as ``3.31.0``)
MAX_SDK_VERSION = 64


@dataclass(frozen=True)
class HEFHeader:
    """What a HEF's header says: the ``hw_arch`` it was compiled for (``hailo8l``, ...) and the
    Dataflow Compiler release that compiled it (``sdk_version``; None where the header has none)."""

    hw_arch: str
    sdk_version: str | None


def hef_hw_arch(path: Path) -> str:
    """The ``hw_arch`` a HEF was compiled for (``hailo8``, ``hailo8l``, ``hailo1xh``, ...), read
    from its header (`read_hef_header`)."""
    return read_hef_header(path).hw_arch


def read_hef_header(path: Path) -> HEFHeader:
    """The header of the HEF `path`: its ``hw_arch`` and ``sdk_version``; `NotAModelError` when
    the file is not a HEF, `ModelLoadError` when it cannot be read or names an architecture this
    module does not know. Reads at most `MAX_HEADER_READ` bytes."""
    try:
        with path.open("rb") as file:
            data = file.read(MAX_HEADER_READ)
    except OSError as exc:
        raise ModelLoadError(f"cannot read {path.name}: {exc}") from exc
    if len(data) < 12:
        raise NotAModelError(f"{path.name} is not a HEF: {len(data)} bytes")
    magic, version, proto_size = struct.unpack(">III", data[:12])
    if magic != HEF_MAGIC:
        raise NotAModelError(f"{path.name} is not a HEF: magic {magic:#010x}, expected {HEF_MAGIC:#010x}")
    start = HEADER_SIZES.get(version)
    if start is None:
        raise ModelLoadError(f"{path.name}: HEF header version {version}, known: 0-3 (a newer Hailo compiler)")
    proto = data[start : start + proto_size]
    header = next((v for n, w, v in _fields(proto) if n == 1 and w == 2 and isinstance(v, bytes)), None)
    if header is None:
        raise ModelLoadError(f"{path.name}: no header message in the HEF's first {MAX_HEADER_READ} bytes")
    fields = _fields(header)
    value = next((v for n, w, v in fields if n == 1 and w == 0 and isinstance(v, int)), 0)
    arch = HW_ARCHES.get(value)
    if arch is None or arch not in COMPATIBLE:
        raise ModelLoadError(f"{path.name} was compiled for an unknown Hailo architecture ({value})")
    sdk = next((v for n, w, v in fields if n == 3 and w == 2 and isinstance(v, bytes)), b"")
    text = sdk[:MAX_SDK_VERSION].decode("ascii", "replace").strip()
    return HEFHeader(arch, text if text.isprintable() and text else None)


def hef_family(arch: str) -> str:
    """How a person names the chips a HEF of `arch` runs on: ``Hailo-8L (and Hailo-8)``."""
    names = {
        "hailo8": "Hailo-8",
        "hailo8l": "Hailo-8L",
        "hailo10h": "Hailo-10H",
        "hailo15h": "Hailo-15H",
        "hailo15m": "Hailo-15M",
        "hailo15l": "Hailo-15L",
        "hailo12l": "Hailo-12L",
    }
    runs_on = sorted(COMPATIBLE[arch])
    return "/".join(names.get(c, c) for c in runs_on)


def runs_on_family(arch: str, family: str | None) -> bool:
    """Whether a HEF of `arch` may run on the Hailo chip a board's probe named `family`
    (``Hailo-8/8L``, ``Hailo-10H``: `HailoDevice.family`); true where no chip or an unknown one
    was found (then the backend's own check, or HailoRT, decides)."""
    chips = next((c for c, name in FAMILY_NAMES.items() if name == family), None)
    return chips is None or arch not in COMPATIBLE or bool(chips & COMPATIBLE[arch])


def _read(root: Path, relative: str, limit: int = 64) -> str | None:
    try:
        with (root / relative).open("rb") as file:
            return file.read(limit).decode("ascii", "replace").strip()
    except OSError:
        return None


def _hex(text: str | None) -> int | None:
    try:
        return int(text, 16) if text else None
    except ValueError:
        return None


def find_devices(root: Path = Path("/")) -> list[HailoDevice]:
    """The Hailo chips under `root`: each ``dev/hailoN`` with the PCIe device id of
    ``sys/class/<driver class>/hailoN/device`` (HailoRT 4's driver: ``hailo_chardev``; 5's:
    ``hailo1x``); a node whose class folder is missing takes the first Hailo device of
    ``sys/bus/pci/devices``. Reads at most a few bytes per file; never raises."""
    try:
        nodes = sorted(n for n in os.listdir(root / "dev") if n.startswith("hailo") and n[5:].isdigit())[:16]
    except OSError:
        return []
    pci = _pci_ids(root)
    found = []
    for index, node in enumerate(nodes):
        device_id = None
        try:
            classes = sorted(os.listdir(root / "sys" / "class"))[:256]
        except OSError:
            classes = []
        for cls in classes:
            folder = f"sys/class/{cls}/{node}/device"
            if _hex(_read(root, f"{folder}/vendor")) == VENDOR:
                device_id = _hex(_read(root, f"{folder}/device"))
                break
        if device_id is None and index < len(pci):
            device_id = pci[index]
        chips = PCIE_CHIPS.get(device_id, frozenset()) if device_id is not None else frozenset()
        found.append(HailoDevice(f"/dev/{node}", device_id, chips))
    return found


def _pci_ids(root: Path) -> list[int]:
    """The device ids of Hailo's PCIe devices in ``sys/bus/pci/devices``, in address order."""
    try:
        addresses = sorted(os.listdir(root / "sys/bus/pci/devices"))[:256]
    except OSError:
        return []
    ids = []
    for address in addresses:
        folder = f"sys/bus/pci/devices/{address}"
        if _hex(_read(root, f"{folder}/vendor")) == VENDOR:
            device_id = _hex(_read(root, f"{folder}/device"))
            if device_id is not None:
                ids.append(device_id)
    return ids


def check_target(hef: Path, arch: str, device: HailoDevice) -> None:
    """`TargetMismatch` naming both when a HEF of `arch` cannot run on `device`'s chip: no chip
    the device may be is one the HEF runs on. (A Hailo-8 HEF on a Hailo-8L passes here: the
    PCIe id is the same; HailoRT refuses it when configuring, which `runtimes.hailo_backend`
    reports as ``TARGET_MISMATCH`` too.)"""
    if device.chips and not device.chips & COMPATIBLE[arch]:
        raise TargetMismatch(target_mismatch(hef, arch, f"this device's {device.node} is {device.family}"))


def target_mismatch(hef: Path, arch: str, here: str) -> str:
    """The ``TARGET_MISMATCH`` sentence for a HEF of `arch` that cannot run here: the chips it
    runs on, then `here` (what this device has, or what HailoRT said)."""
    return f"TARGET_MISMATCH: {hef.name} was compiled for {arch} (runs on {hef_family(arch)}), {here}"
