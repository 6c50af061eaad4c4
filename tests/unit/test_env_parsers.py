"""Pure parsers and checks of `rankscope env`, against nvidia-smi / kernel-log fixture text."""

from __future__ import annotations

from rankscope.analysis.env_checks import check_env, diff_ranks
from rankscope.analysis.gpu_parsers import (
    non_nvlink_gpu_pairs,
    parse_gpu_query,
    parse_topology,
    parse_xid_lines,
)
from rankscope.capabilities.envinfo import parse_limits
from rankscope.models.env import GpuInfo, NetInterface, NodeInfo, RankEnv, ShmInfo
from tests.paths import DATA as DATA_ROOT

DATA = DATA_ROOT / "env"


def _node(**kw: object) -> NodeInfo:
    base: dict[str, object] = {
        "hostname": "gpu-node-01",
        "interfaces": [NetInterface(name="lo"), NetInterface(name="eth0"), NetInterface(name="ib0")],
        "shm": ShmInfo(size_bytes=32 * 1024**3, used_bytes=0),
    }
    base.update(kw)
    return NodeInfo.model_validate(base)


def _rank(rank: int, env: dict[str, str], **kw: object) -> RankEnv:
    full = {
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
        "TORCH_FR_BUFFER_SIZE": "2000",
        "NCCL_DEBUG": "WARN",
        **env,
    }
    return RankEnv.model_validate(
        {"rank": rank, "local_rank": rank, "pid": 1000 + rank, "host": "gpu-node-01", "env": full, **kw}
    )


def _kinds(node: NodeInfo, ranks: list[RankEnv]) -> dict[str, list[int]]:
    _, findings = check_env(node, ranks)
    return {f.kind: f.ranks for f in findings}


def test_gpu_query_rows_with_na_values() -> None:
    gpus = parse_gpu_query((DATA / "nvidia_smi_query.csv").read_text())
    assert [g.index for g in gpus] == [0, 1, 2]
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_total_mib == 81559
    assert gpus[0].driver_version == "550.54.15" and gpus[0].pci_bus_id == "00000000:18:00.0"
    assert gpus[1].ecc_uncorrected_volatile == 2 and gpus[1].ecc_uncorrected_aggregate == 17
    assert gpus[2].ecc_uncorrected_volatile is None and gpus[2].utilization_pct is None
    assert (
        parse_gpu_query("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.") == []
    )


def test_topology_matrix_with_nics_and_legend() -> None:
    topo = parse_topology((DATA / "topo_8gpu_nvlink.txt").read_text())
    assert topo is not None
    assert topo.devices == [f"GPU{i}" for i in range(8)] + ["NIC0", "NIC1"]
    assert topo.links["GPU0"]["GPU7"] == "NV18" and topo.links["GPU0"]["GPU0"] == "X"
    assert topo.links["GPU5"]["NIC1"] == "PIX" and topo.links["NIC0"]["GPU4"] == "SYS"
    assert topo.cpu_affinity["GPU4"] == "56-111,168-223" and topo.numa_affinity["GPU4"] == "1"
    assert "NIC0" not in topo.cpu_affinity
    assert topo.nic_names == {"NIC0": "mlx5_0", "NIC1": "mlx5_1"}
    assert non_nvlink_gpu_pairs(topo) == []


def test_topology_tab_separated_pcie_pair() -> None:
    topo = parse_topology((DATA / "topo_2gpu_pcie_tabs.txt").read_text())
    assert topo is not None and topo.devices == ["GPU0", "GPU1"]
    assert topo.links["GPU0"]["GPU1"] == "PHB"
    assert topo.cpu_affinity == {"GPU0": "0-63", "GPU1": "0-63"}
    assert non_nvlink_gpu_pairs(topo) == [("GPU0", "GPU1", "PHB")]
    assert parse_topology("garbage\n\x00\x01") is None


def test_xid_lines_from_dmesg() -> None:
    events = parse_xid_lines((DATA / "dmesg_xid.txt").read_text().splitlines())
    assert [e.xid for e in events] == [79, 48]
    assert events[0].pci == "PCI:0000:3b:00" and events[0].pid == "48213" and events[0].process == "python"
    assert "fallen off the bus" in events[0].detail and "drain" in events[0].meaning
    assert events[1].pid == "<unknown>" and "double bit" in events[1].detail
    node = _node(xid_events=events, gpus=parse_gpu_query((DATA / "nvidia_smi_query.csv").read_text()))
    _, findings = check_env(node, [])
    kinds = [f.kind for f in findings]
    assert kinds.count("gpu_xid") == 2 and "gpu_ecc_errors" in kinds
    assert findings[0].severity == "critical"


def test_proc_limits() -> None:
    text = (
        "Limit                     Soft Limit           Hard Limit           Units     \n"
        "Max open files            1024                 1048576              files     \n"
        "Max locked memory         unlimited            unlimited            bytes     \n"
    )
    lim = parse_limits(text)
    assert (lim.open_files_soft, lim.open_files_hard) == (1024, 1048576)
    assert lim.locked_memory_soft is None and lim.locked_memory_hard is None


def test_diff_ignores_per_rank_variables_and_flags_the_rest() -> None:
    a = _rank(0, {"NCCL_PROTO": "Simple", "CUDA_VISIBLE_DEVICES": "0", "TORCHELASTIC_RUN_ID": "j1"})
    b = _rank(1, {"CUDA_VISIBLE_DEVICES": "1", "TORCHELASTIC_RUN_ID": "j2"})
    diffs = {d.name: d.values for d in diff_ranks([a, b])}
    assert diffs == {"NCCL_PROTO": {"0": "Simple", "1": None}, "TORCHELASTIC_RUN_ID": {"0": "j1", "1": "j2"}}
    _, findings = check_env(_node(), [a, b])
    sev = {f.facts["variable"]: f.severity for f in findings if f.kind == "env_mismatch"}
    assert sev == {"NCCL_PROTO": "error", "TORCHELASTIC_RUN_ID": "critical"}
    assert "gpu_shared" not in {f.kind for f in findings}


def test_gpu_sharing_by_visible_devices_and_local_rank() -> None:
    same = [_rank(0, {"CUDA_VISIBLE_DEVICES": "3"}), _rank(1, {"CUDA_VISIBLE_DEVICES": "3"})]
    assert _kinds(_node(), same)["gpu_shared"] == [0, 1]
    listed = [_rank(0, {"CUDA_VISIBLE_DEVICES": "2,3"}), _rank(1, {"CUDA_VISIBLE_DEVICES": "2,3"})]
    assert "gpu_shared" not in _kinds(_node(), listed)
    both_local0 = [_rank(0, {"LOCAL_RANK": "0"}, local_rank=0), _rank(1, {"LOCAL_RANK": "0"}, local_rank=0)]
    gpu_node = _node(gpus=[GpuInfo(index=0), GpuInfo(index=1)])
    assert _kinds(gpu_node, both_local0)["gpu_shared"] == [0, 1]
    assert "gpu_shared" not in _kinds(_node(), both_local0)  # no GPUs: nothing is shared


def test_settings_checks() -> None:
    ranks = [
        _rank(
            0,
            {
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "0",
                "CUDA_LAUNCH_BLOCKING": "1",
                "NCCL_P2P_DISABLE": "1",
                "NCCL_IB_DISABLE": "1",
                "TORCH_FR_BUFFER_SIZE": "0",
            },
        )
    ]
    kinds = _kinds(_node(), ranks)
    for kind in (
        "async_error_handling_off",
        "cuda_launch_blocking",
        "nccl_p2p_disable",
        "nccl_ib_disable",
        "flight_recorder_off",
    ):
        assert kinds[kind] == [0], kind
    healthy = _kinds(_node(), [_rank(0, {})])
    assert healthy == {}, healthy
    assert "flight_recorder_off" not in _kinds(
        _node(), [_rank(0, {"TORCH_FR_BUFFER_SIZE": "", "TORCH_NCCL_TRACE_BUFFER_SIZE": "500"})]
    )
    unset = _rank(0, {})
    unset.env.pop("NCCL_DEBUG")
    assert "nccl_debug_unset" in _kinds(_node(gpus=[GpuInfo(index=0)]), [unset])


def test_socket_ifname_semantics() -> None:
    def missing(spec: str, var: str = "NCCL_SOCKET_IFNAME") -> bool:
        return "socket_ifname_missing" in _kinds(_node(), [_rank(0, {var: spec})])

    assert not missing("eth")  # prefix match: eth0
    assert not missing("ib0,eth1")
    assert missing("=eth")  # exact match wanted
    assert not missing("=eth0")
    assert missing("enp65s0")
    assert not missing("^docker,lo")  # excludes: eth0 and ib0 remain
    assert missing("^eth,ib,lo")  # excludes everything
    assert missing("bond0", "GLOO_SOCKET_IFNAME")
    # each rank's own value is checked, not only the first one seen
    two = [_rank(0, {"NCCL_SOCKET_IFNAME": "eth"}), _rank(1, {"NCCL_SOCKET_IFNAME": "enp65s0"})]
    _, findings = check_env(_node(), two)
    assert [f.ranks for f in findings if f.kind == "socket_ifname_missing"] == [[1]]
    assert {f.facts["variable"]: f.severity for f in findings if f.kind == "env_mismatch"} == {
        "NCCL_SOCKET_IFNAME": "warning"
    }


def test_shm_too_small_for_workers_and_mixed_versions() -> None:
    tiny = _node(shm=ShmInfo(size_bytes=64 * 1024**2, used_bytes=10 * 1024**2))
    ranks = [
        _rank(0, {}, children=4, torch_version="2.13.0+cu128", python="/venv/bin/python"),
        _rank(1, {}, children=4, torch_version="2.12.1+cu126", python="/opt/conda/bin/python"),
    ]
    _, findings = check_env(tiny, ranks)
    by = {f.kind: f for f in findings}
    assert by["shm_too_small"].severity == "error" and by["shm_too_small"].facts["workers"] == 8
    assert by["mixed_torch_versions"].ranks == [0, 1]
    assert by["mixed_interpreters"].ranks == [0, 1]
    no_workers = [_rank(0, {}, children=0)]
    assert "shm_too_small" not in _kinds(tiny, no_workers)


def test_nccl_recorder_findings_only_on_nccl_jobs() -> None:
    off = {"TORCH_FR_BUFFER_SIZE": "0", "TORCH_NCCL_DUMP_ON_TIMEOUT": "0", "TORCH_NCCL_BLOCKING_WAIT": "1"}
    nccl = _kinds(_node(), [_rank(0, off, backend="nccl"), _rank(1, off, backend="nccl")])
    for kind in ("flight_recorder_off", "fr_dump_on_timeout_off", "nccl_blocking_wait"):
        assert nccl[kind] == [0, 1], kind
    gloo = _kinds(_node(), [_rank(0, off, backend="gloo")])
    assert not {"flight_recorder_off", "fr_dump_on_timeout_off", "nccl_blocking_wait"} & set(gloo)
    # the recorder is on by default in torch 2.13: unset is not off
    unset = _rank(0, {}, backend="nccl")
    unset.env.pop("TORCH_FR_BUFFER_SIZE")
    assert "flight_recorder_off" not in _kinds(_node(), [unset])


def test_nccl_recorder_findings_say_what_changing_costs() -> None:
    from rankscope.analysis.env_checks import nccl_recorder_findings

    [blocking] = nccl_recorder_findings([_rank(0, {"TORCH_NCCL_BLOCKING_WAIT": "1"}, backend="mixed")])
    assert "no timeout" in blocking.message and "Costs nothing" in blocking.fix
    assert blocking.next_steps[0].skill_section == "skill/hangs.md#nccl-hangs"
