"""install-skill and mcp-config, from a source checkout and from a freshly built wheel."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path
from typing import cast

import anyio
import pytest
from mcp import Client, StdioServerParameters

from rankscope.capabilities.install import MANIFEST, LocalEditsFound, install_skill, mcp_config
from rankscope.errors import InvalidInput
from rankscope.models.install import McpClient
from rankscope.render.mcp_config import render_mcp_config
from rankscope.resources import bundle_root
from tests.paths import ROOT

VENV_BIN = Path(sys.executable).parent
RANKSCOPE = str(VENV_BIN / "rankscope")
CLIENTS = ("claude-code", "claude-desktop", "cursor", "vscode")


def shipped_files() -> set[str]:
    root = bundle_root()
    out = {"SKILL.md"}
    for folder in ("skill", "repro_templates"):
        out |= {
            p.relative_to(root).as_posix()
            for p in (root / folder).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        }
    return out


def cli(
    *args: str, cwd: Path | None = None, exe: str = RANKSCOPE, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [exe, *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=str(cwd) if cwd else None,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def stdio_tools(command: str, args: list[str], env: dict[str, str] | None = None) -> list[str]:
    params = StdioServerParameters(command=command, args=args, env=env, cwd="/")

    async def main() -> list[str]:
        with anyio.fail_after(120):
            async with Client(params) as client:
                return [t.name for t in (await client.list_tools()).tools]

    return anyio.run(main)


# -- install-skill -------------------------------------------------------------------------------


def test_install_is_idempotent_and_keeps_local_edits(tmp_path: Path) -> None:
    dest = tmp_path / "skills" / "rankscope"
    first = install_skill(dir=str(dest))
    assert first.target == "dir" and first.directory == str(dest) and first.changed
    assert {f.path for f in first.files} == shipped_files()
    assert all(f.action == "created" for f in first.files)
    assert (dest / "SKILL.md").read_bytes() == (bundle_root() / "SKILL.md").read_bytes()
    assert (dest / "skill" / "hangs.md").is_file()
    manifest = json.loads((dest / MANIFEST).read_text())
    assert manifest["files"]["SKILL.md"] == hashlib.sha256((dest / "SKILL.md").read_bytes()).hexdigest()

    second = install_skill(dir=str(dest))
    assert not second.changed and {f.action for f in second.files} == {"unchanged"}

    edited = dest / "skill" / "hangs.md"
    edited.write_text(edited.read_text() + "\nOur cluster: always check the IB switch first.\n")
    mine = edited.read_text()
    with pytest.raises(LocalEditsFound) as exc:
        install_skill(dir=str(dest))
    assert "skill/hangs.md" in exc.value.message and "Nothing was changed" in exc.value.message
    assert "--force" in exc.value.render()
    assert edited.read_text() == mine

    forced = install_skill(dir=str(dest), force=True)
    actions = {f.path: f.action for f in forced.files}
    assert actions["skill/hangs.md"] == "overwritten" and actions["SKILL.md"] == "unchanged"
    assert edited.read_bytes() == (bundle_root() / "skill" / "hangs.md").read_bytes()


def test_install_updates_untouched_files_and_removes_stale_ones(tmp_path: Path) -> None:
    dest = tmp_path / "rankscope"
    install_skill(dir=str(dest))
    # what an older rankscope left behind: a different SKILL.md and a playbook no longer shipped,
    # both recorded in the manifest (so not edited by anyone)
    (dest / "SKILL.md").write_text("---\nname: rankscope\ndescription: old\n---\nold body\n")
    (dest / "skill" / "retired.md").write_text("# retired\n")
    manifest = json.loads((dest / MANIFEST).read_text())
    for rel in ("SKILL.md", "skill/retired.md"):
        manifest["files"][rel] = hashlib.sha256((dest / rel).read_bytes()).hexdigest()
    (dest / MANIFEST).write_text(json.dumps(manifest))

    report = install_skill(dir=str(dest))
    actions = {f.path: f.action for f in report.files}
    assert actions["SKILL.md"] == "updated" and actions["skill/retired.md"] == "removed"
    assert not (dest / "skill" / "retired.md").exists()
    assert (dest / "SKILL.md").read_bytes() == (bundle_root() / "SKILL.md").read_bytes()


def test_files_not_written_by_rankscope_count_as_edits(tmp_path: Path) -> None:
    dest = tmp_path / "rankscope"
    dest.mkdir()
    (dest / "SKILL.md").write_text("my own skill\n")
    with pytest.raises(LocalEditsFound, match=r"SKILL\.md"):
        install_skill(dir=str(dest))
    assert (dest / "SKILL.md").read_text() == "my own skill\n" and not (dest / MANIFEST).exists()


def test_project_and_user_destinations(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = install_skill(target="project", cwd=str(tmp_path))
    assert project.directory == str(tmp_path.resolve() / ".claude" / "skills" / "rankscope")
    default = install_skill(cwd=str(tmp_path))
    assert default.target == "project" and not default.changed
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    user = install_skill(target="user")
    assert user.directory == str(tmp_path / "home" / ".claude" / "skills" / "rankscope")
    assert (Path(user.directory) / "SKILL.md").is_file()
    with pytest.raises(InvalidInput, match="Choose one destination"):
        install_skill(target="user", dir=str(tmp_path / "x"))


def test_install_skill_cli(tmp_path: Path) -> None:
    out = cli("install-skill", "--project", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert f"installed in {tmp_path.resolve()}/.claude/skills/rankscope" in out.stdout
    again = cli("install-skill", "--json", cwd=tmp_path)
    assert again.returncode == 0 and json.loads(again.stdout)["changed"] is False
    skill = tmp_path / ".claude" / "skills" / "rankscope" / "SKILL.md"
    skill.write_text(skill.read_text() + "\nlocal note\n")
    refused = cli("install-skill", cwd=tmp_path)
    assert refused.returncode == 2
    assert (
        "differ from what rankscope installed there: SKILL.md" in refused.stderr
        and "--force" in refused.stderr
    )
    assert "Traceback" not in refused.stderr
    forced = cli("install-skill", "--force", cwd=tmp_path)
    assert forced.returncode == 0 and "overwritten" in forced.stdout
    both = cli("install-skill", "--user", "--dir", str(tmp_path), cwd=tmp_path)
    assert both.returncode == 2 and "not allowed with argument" in both.stderr


# -- mcp-config ----------------------------------------------------------------------------------


@pytest.mark.parametrize("client", CLIENTS)
def test_mcp_config_for_every_client(client: str) -> None:
    out = cli("mcp-config", "--client", client, "--json")
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    key = "servers" if client == "vscode" else "mcpServers"
    assert cfg["top_level_key"] == key and list(cfg["snippet"]) == [key]
    entry = cfg["snippet"][key]["rankscope"]
    assert (
        entry["command"] == RANKSCOPE
        and os.path.isabs(entry["command"])
        and os.access(entry["command"], os.X_OK)
    )
    assert entry["args"] == ["mcp"]
    assert ("type" in entry) == (client == "vscode") and entry.get("type", "stdio") == "stdio"
    if client == "claude-code":
        assert cfg["command_line"] == f"claude mcp add rankscope -- {RANKSCOPE} mcp"
    else:
        assert cfg.get("command_line") is None
    # what `rankscope mcp-config` prints without --json
    text = "\n".join(render_mcp_config(mcp_config(cast(McpClient, client))))
    assert json.dumps(cfg["snippet"], indent=2) in text


def test_mcp_config_prepares_the_servers_schema_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Registering the server writes its output-schema cache, so the client's first start is not the slow one."""
    from rankscope.cli import main

    monkeypatch.setenv("RANKSCOPE_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["mcp-config", "--client", "cursor", "--json"]) == 0
    cfg = json.loads(capsys.readouterr().out)
    cache = tmp_path / "cache" / "mcp-output-schemas.json"
    assert cache.is_file()
    tools = json.loads(cache.read_text())["tools"]
    assert {"list_jobs", "dump_stacks", "triage_logs"} <= set(tools)
    assert not any("could not be prepared" in note for note in cfg["notes"])


def test_mcp_config_rejects_unknown_clients() -> None:
    with pytest.raises(InvalidInput, match="Unknown MCP client"):
        mcp_config("emacs")  # type: ignore[arg-type]
    out = cli("mcp-config", "--client", "emacs")
    assert out.returncode == 2 and "invalid choice" in out.stderr


def test_the_registered_command_starts_a_working_server() -> None:
    entry = mcp_config("vscode").snippet["servers"]["rankscope"]
    names = stdio_tools(entry["command"], entry["args"], env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert {"list_jobs", "dump_stacks"} <= set(names)


# -- the wheel -----------------------------------------------------------------------------------


def _source_copy(dest: Path) -> Path:
    """A copy of the source tree (other builds may run in the checkout), as git would check it out."""
    for name in (
        "pyproject.toml",
        "setup.py",
        "SKILL.md",
        "README.md",
        "LICENSE",
        "MANIFEST.in",
        "ARCHITECTURE.md",
    ):
        shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "_bundle", "*.egg-info")
    for name in ("tools", "skill", "repro_templates"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    return dest


def _run(*cmd: str, cwd: Path | None = None) -> None:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=300, cwd=cwd)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def sdist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sdist, as `python -m build` makes it first (offline: the build backend is installed)."""
    src = _source_copy(tmp_path_factory.mktemp("src"))
    out = tmp_path_factory.mktemp("dist")
    _run(sys.executable, "-m", "build", "--sdist", "--no-isolation", "--outdir", str(out), str(src))
    (found,) = out.glob("rankscope-*.tar.gz")
    return found


@pytest.fixture(scope="module", params=["pip wheel", "wheel from sdist"])
def wheel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel both ways a release is built: from the tree, and from the sdist (`python -m build`)."""
    out = tmp_path_factory.mktemp("wheelhouse")
    if request.param == "pip wheel":
        src = _source_copy(tmp_path_factory.mktemp("src"))
        _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", str(out), str(src))  # fmt: skip
    else:
        sdist = request.getfixturevalue("sdist")
        unpacked = tmp_path_factory.mktemp("unpacked")
        with tarfile.open(sdist) as tf:
            tf.extractall(unpacked, filter="data")
        (tree,) = unpacked.iterdir()
        _run(sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(tree))
    (whl,) = out.glob("rankscope-*.whl")
    return whl


def test_sdist_carries_the_skill_templates_and_license(sdist: Path) -> None:
    with tarfile.open(sdist) as tf:
        names = {n.split("/", 1)[1] for n in tf.getnames() if "/" in n}
    assert {
        "LICENSE",
        "SKILL.md",
        "setup.py",
        "MANIFEST.in",
        "skill/hangs.md",
        "repro_templates/catalog.json",
    } <= names
    assert {f"skill/{p.name}" for p in (ROOT / "skill").glob("*.md")} <= names


def test_project_metadata_names_the_license_urls_and_classifiers(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = zf.read(meta_name).decode()
        assert any(n.endswith("LICENSE") and ".dist-info/" in n for n in zf.namelist())
    assert "Project-URL: Source" in meta and "Project-URL: Documentation" in meta
    assert "Classifier: Topic :: Software Development :: Debuggers" in meta
    assert "License-Expression: Apache-2.0" in meta
    torch_required = [
        line
        for line in meta.splitlines()
        if line.startswith("Requires-Dist: torch") and "extra ==" not in line
    ]
    assert torch_required == []  # users bring their own torch; only the test extra names it


def test_wheel_carries_skill_playbooks_and_templates(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
    bundled = {n.removeprefix("rankscope/_bundle/") for n in names if n.startswith("rankscope/_bundle/")}
    assert shipped_files() <= bundled
    assert {
        "rankscope/cli.py",
        "rankscope/mcp_server.py",
        "rankscope/mcp_tools/jobs.py",
        "rankscope/py.typed",
    } <= names
    assert not [n for n in names if n.endswith(".pyc")]


def test_wheel_in_a_fresh_venv_installs_the_skill_and_serves_mcp(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "--quiet", str(wheel)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    # Dependencies (pydantic, mcp, ...) come from the test environment, offline: a path entry,
    # not a site dir, so the checkout's editable install (a .pth there) is not picked up.
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True
        ).strip()
    )
    (site / "_deps_from_test_env.pth").write_text(str(_deps_without_torch(tmp_path / "deps")) + "\n")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path / "home")}
    exe = str(venv / "bin" / "rankscope")

    where = subprocess.run(
        [str(py), "-c", "import rankscope, rankscope.resources as r; print(rankscope.__file__); print(r.bundle_root())"],
        capture_output=True, text=True, timeout=60, env=env, cwd="/",
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    module, bundle = where.stdout.split()
    assert module.startswith(str(site)) and bundle == str(site / "rankscope" / "_bundle")

    dest = tmp_path / "agent-skills" / "rankscope"
    installed = cli("install-skill", "--dir", str(dest), "--json", exe=exe, env=env)
    assert installed.returncode == 0, installed.stderr
    report = json.loads(installed.stdout)
    assert report["source"] == bundle and report["skill_name"] == "rankscope"
    with zipfile.ZipFile(wheel) as zf:
        prefix = "rankscope/_bundle/"
        in_wheel = {n.removeprefix(prefix): zf.read(n) for n in zf.namelist() if n.startswith(prefix)}
    assert {f["path"] for f in report["files"]} == set(in_wheel)
    assert (dest / "skill" / "hangs.md").read_bytes() == in_wheel["skill/hangs.md"]

    no_torch = subprocess.run(
        [str(py), "-c", "import torch"], capture_output=True, timeout=60, env=env, cwd="/"
    )
    assert no_torch.returncode != 0  # rankscope installs and serves without torch

    config = cli("mcp-config", "--client", "claude-code", "--json", exe=exe, env=env)
    assert json.loads(config.stdout)["command"] == exe
    names, resources = stdio_tools_and_resources(exe, ["mcp"], env=env)
    assert {"list_jobs", "dump_stacks"} <= set(names)
    assert {"rankscope://skill/SKILL.md", "rankscope://skill/hangs.md"} <= set(resources)


_TORCH_PARTS = ("torch", "functorch", "torchgen", "nvidia", "triton")


def _deps_without_torch(dest: Path) -> Path:
    """The test environment's packages, torch left out: links in a folder a .pth names (offline)."""
    dest.mkdir()
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        if entry.name.split("-")[0].split(".")[0] in _TORCH_PARTS or entry.suffix == ".pth":
            continue
        (dest / entry.name).symlink_to(entry)
    return dest


def stdio_tools_and_resources(
    command: str, args: list[str], env: dict[str, str] | None = None
) -> tuple[list[str], list[str]]:
    params = StdioServerParameters(command=command, args=args, env=env, cwd="/")

    async def main() -> tuple[list[str], list[str]]:
        with anyio.fail_after(120):
            async with Client(params) as client:
                tools = [t.name for t in (await client.list_tools()).tools]
                resources = [str(r.uri) for r in (await client.list_resources()).resources]
                return tools, resources

    return anyio.run(main)


@pytest.mark.parametrize("client", ["claude-code", "claude-desktop", "cursor", "vscode"])
def test_mcp_config_stdout_is_only_the_json(client: str) -> None:
    """`rankscope mcp-config --client X > file.json` gives a file a client can read; notes go to stderr."""
    from tests.jobs import run_cli

    done = run_cli("mcp-config", "--client", client)
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert "rankscope" in json.dumps(data)
    assert "#" in done.stderr


@pytest.mark.parametrize("client", CLIENTS)
def test_mcp_config_over_ssh_for_a_client_on_another_machine(client: str) -> None:
    cfg = mcp_config(
        cast(McpClient, client), ssh="me@gpu01.example.com", remote_cmd="/opt/my env/bin/rankscope"
    )
    assert cfg.server_name == "rankscope-gpu01-example-com" and cfg.command == "ssh"
    assert cfg.args[:1] == ["-T"] and "BatchMode=yes" in cfg.args
    assert cfg.args[-2:] == ["me@gpu01.example.com", "'/opt/my env/bin/rankscope' mcp"]
    (entry,) = next(iter(cfg.snippet.values())).values()
    assert entry["command"] == "ssh" and entry["args"] == cfg.args
    if client == "claude-code":
        assert cfg.command_line is not None
        assert cfg.command_line.startswith("claude mcp add rankscope-gpu01-example-com -- ssh -T ")
    assert any("BatchMode=yes me@gpu01.example.com true" in n for n in cfg.notes)
    out = cli("mcp-config", "--client", client, "--ssh", "gpu01")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)  # still only JSON on stdout
    assert "--remote-cmd" in out.stderr  # rankscope must be on the remote PATH, or named


def test_mcp_config_over_ssh_refuses_what_ssh_would_read_as_an_option() -> None:
    with pytest.raises(InvalidInput, match="not a host name"):
        mcp_config("cursor", ssh="-oProxyCommand=touch /tmp/x")
    with pytest.raises(InvalidInput, match="needs --ssh"):
        mcp_config("cursor", remote_cmd="/usr/bin/rankscope")


def test_the_ssh_registration_starts_a_working_server(tmp_path: Path) -> None:
    """The registered argv, run with a stand-in ssh that runs the remote command here."""
    fake = tmp_path / "bin" / "ssh"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\nfor last; do :; done\nexec /bin/sh -c "$last"\n')
    fake.chmod(0o755)
    cfg = mcp_config("vscode", ssh="gpu01", remote_cmd=RANKSCOPE)
    names = stdio_tools(str(fake), cfg.args, env={"PATH": "/usr/bin:/bin", "HOME": "/tmp"})
    assert {"list_jobs", "dump_stacks"} <= set(names)


def test_install_skill_dir_warns_when_the_folder_is_not_named_for_the_skill(tmp_path: Path) -> None:
    out = cli("install-skill", "--dir", str(tmp_path / "my-skills"))
    assert out.returncode == 0, out.stderr
    assert "named 'rankscope' but its folder is 'my-skills'" in out.stdout + out.stderr
    report = install_skill(dir=str(tmp_path / "rankscope"))
    assert not any("its folder is" in n for n in report.notes)
