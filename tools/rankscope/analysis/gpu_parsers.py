"""Parsers for nvidia-smi and the kernel log, pure: text in, models out.

Written against the real formats: `nvidia-smi --query-gpu=... --format=csv,noheader,nounits`
prints one comma-separated row per GPU with "[N/A]" / "[Not Supported]" for
missing values; `nvidia-smi topo -m` prints a tab/space-aligned matrix whose
rows for NICs stop before the affinity columns, followed by a legend and (on
newer drivers) a "NIC Legend" mapping NIC0 to mlx5_0; the driver logs faults as
`NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., <text>`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from rankscope.analysis.triage.log_rules import XID_MEANING
from rankscope.models.env import GpuInfo, GpuTopology, XidEvent

QUERY_FIELDS: tuple[str, ...] = (
    "index",
    "name",
    "uuid",
    "pci.bus_id",
    "memory.total",
    "memory.used",
    "driver_version",
    "ecc.errors.uncorrected.volatile.total",
    "ecc.errors.uncorrected.aggregate.total",
    "temperature.gpu",
    "utilization.gpu",
)
"""The --query-gpu fields rankscope asks for, in this order."""

_XID = re.compile(
    r"NVRM: Xid \((?P<pci>[^)]*)\): (?P<xid>\d+),\s*(?:pid=(?P<pid>'?[^,]*?'?),\s*)?(?:name=(?P<name>[^,]*),\s*)?(?P<detail>.*)$"
)
_AFFINITY_HEADERS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def _int(value: str) -> int | None:
    value = value.strip()
    try:
        return int(float(value))
    except ValueError:
        return None  # [N/A], [Not Supported], [Unknown Error]


def parse_gpu_query(text: str) -> list[GpuInfo]:
    """Rows of `nvidia-smi --query-gpu=<QUERY_FIELDS> --format=csv,noheader,nounits`."""
    gpus: list[GpuInfo] = []
    for line in text.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) < len(QUERY_FIELDS):
            continue
        index = _int(cols[0])
        if index is None:
            continue

        opt = [None if not v or v.startswith("[") else v for v in cols]

        gpus.append(
            GpuInfo(
                index=index,
                name=cols[1],
                uuid=opt[2],
                pci_bus_id=opt[3],
                memory_total_mib=_int(cols[4]),
                memory_used_mib=_int(cols[5]),
                driver_version=opt[6],
                ecc_uncorrected_volatile=_int(cols[7]),
                ecc_uncorrected_aggregate=_int(cols[8]),
                temperature_c=_int(cols[9]),
                utilization_pct=_int(cols[10]),
            )
        )
    return gpus


def _is_header(tokens: list[str]) -> bool:
    # The header names the columns (GPU0 GPU1 ...); the GPU0 row starts "GPU0 X ...".
    return "GPU0" in tokens and (tokens[0] != "GPU0" or len(tokens) < 2 or tokens[1] != "X")


def parse_topology(text: str) -> GpuTopology | None:
    """`nvidia-smi topo -m` as a link matrix plus CPU/NUMA affinity and NIC names."""
    lines = text.splitlines()
    header_idx = next((i for i, ln in enumerate(lines) if _is_header(ln.split())), None)
    if header_idx is None:
        return None
    header = lines[header_idx]
    cut = min((header.find(h) for h in _AFFINITY_HEADERS if h in header), default=len(header))
    devices = header[:cut].split()
    extra = [h for h in _AFFINITY_HEADERS if h in header]
    topo = GpuTopology(devices=devices)
    for line in lines[header_idx + 1 :]:
        tokens = line.split()
        if not tokens:
            if topo.links:
                break
            continue
        name = tokens[0]
        if name not in devices:
            break
        values = tokens[1 : 1 + len(devices)]
        topo.links[name] = dict(zip(devices, values, strict=False))
        rest = tokens[1 + len(devices) :]
        for key, value in zip(extra, rest, strict=False):
            if key == "CPU Affinity":
                topo.cpu_affinity[name] = value
            elif key == "NUMA Affinity":
                topo.numa_affinity[name] = value
    for line in lines:
        m = re.match(r"^\s*(NIC\d+):\s*(\S+)\s*$", line)
        if m:
            topo.nic_names[m.group(1)] = m.group(2)
    return topo


def non_nvlink_gpu_pairs(topo: GpuTopology) -> list[tuple[str, str, str]]:
    """GPU pairs connected without NVLink (a, b, link), each pair once."""
    gpus = [d for d in topo.devices if d.startswith("GPU")]
    out: list[tuple[str, str, str]] = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1 :]:
            link = topo.links.get(a, {}).get(b)
            if link and not link.startswith("NV") and link != "X":
                out.append((a, b, link))
    return out


def parse_xid_lines(lines: Iterable[str]) -> list[XidEvent]:
    """Xid events from kernel-log lines (dmesg, journalctl -k)."""
    events: list[XidEvent] = []
    for line in lines:
        if "NVRM: Xid" not in line:
            continue
        m = _XID.search(line)
        if m is None:
            continue
        xid = int(m["xid"])
        events.append(
            XidEvent(
                xid=xid,
                pci=m["pci"],
                pid=(m["pid"] or "").strip("'") or None,
                process=(m["name"] or "").strip() or None,
                detail=m["detail"].strip(),
                meaning=XID_MEANING.get(xid, "See NVIDIA's Xid catalog for this code."),
                line=line.strip()[:400],
            )
        )
    return events
