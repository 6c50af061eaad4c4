"""Install the skill into agent harnesses and print MCP registrations.

``install_skill`` copies SKILL.md, skill/ and repro_templates/ into a skill
folder. It records the hash of every file it writes in a manifest, so a second
run can tell three cases apart: a file rankscope wrote and nobody touched
(safe to update), a file someone edited (kept unless ``force``), and a file
rankscope never wrote (treated as an edit). Nothing is written when any edit
would be lost, so a refused install leaves the folder as it was.

``mcp_config`` answers the one question every client asks differently: what
to put where so that it starts ``rankscope mcp``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from rankscope import __version__
from rankscope.errors import InvalidInput, LocalEditsFound
from rankscope.models.install import (
    FileAction,
    InstalledFile,
    InstallReport,
    InstallTarget,
    McpClient,
    McpConfig,
)
from rankscope.resources import bundle_root

SKILL_NAME = "rankscope"
MANIFEST = ".rankscope-manifest.json"
BUNDLED = ("SKILL.md", "skill", "repro_templates")
_IGNORED_PARTS = ("__pycache__",)
_IGNORED_SUFFIXES = (".pyc",)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _source_files(root: Path) -> dict[str, Path]:
    """Relative path (POSIX) -> source file, for everything the skill ships."""
    files: dict[str, Path] = {}
    for name in BUNDLED:
        src = root / name
        if src.is_file():
            files[name] = src
        elif src.is_dir():
            for path in sorted(src.rglob("*")):
                rel = path.relative_to(root)
                if (
                    not path.is_file()
                    or any(p in _IGNORED_PARTS for p in rel.parts)
                    or path.suffix in _IGNORED_SUFFIXES
                ):
                    continue
                files[rel.as_posix()] = path
    return files


def _read_manifest(dest: Path) -> dict[str, str]:
    path = dest / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text())
        files = data.get("files", {})
        return {str(k): str(v) for k, v in files.items()}
    except (OSError, ValueError, AttributeError):
        return {}  # an unreadable manifest protects nothing: every differing file counts as an edit


def _skill_name(skill_md: Path) -> str:
    """The `name` from SKILL.md's frontmatter (only what install needs, not a YAML parser)."""
    lines = skill_md.read_text(encoding="utf-8").splitlines()
    if not lines or lines[0].strip() != "---":
        return ""
    for line in lines[1:]:
        if line.strip() == "---":
            break
        key, _, value = line.partition(":")
        if key.strip() == "name":
            return value.strip().strip("'\"")
    return ""


def resolve_destination(
    target: Literal["project", "user"] | None, dir: str | None, cwd: str | None
) -> tuple[InstallTarget, Path]:
    """Where the skill folder goes: ./.claude/skills/rankscope, ~/.claude/skills/rankscope or DIR."""
    if target is not None and dir is not None:
        raise InvalidInput(
            f"Choose one destination, got target={target!r} and dir={dir!r}.",
            fix="Pass one of --project, --user or --dir DIR.",
        )
    base = Path(cwd) if cwd is not None else Path.cwd()
    if dir is not None:
        path = Path(dir).expanduser()
        return "dir", (path if path.is_absolute() else base / path).resolve()
    if target == "user":
        return "user", Path.home() / ".claude" / "skills" / SKILL_NAME
    if target in (None, "project"):
        return "project", base.resolve() / ".claude" / "skills" / SKILL_NAME
    raise InvalidInput(f"Unknown target {target!r}.", fix="Use 'project', 'user', or pass dir.")


def _plan(
    sources: Mapping[str, Path], dest: Path, manifest: Mapping[str, str]
) -> tuple[list[tuple[str, FileAction]], list[str], list[str]]:
    """What to do with each shipped file, which installed files were edited, which are stale.

    A file rankscope wrote and nobody touched is updated; one that differs from what the
    manifest recorded was edited by someone and is only overwritten when forced; a file
    rankscope no longer ships is removed unless it was edited (never delete an edit).
    """
    plan: list[tuple[str, FileAction]] = []
    edited: list[str] = []
    for rel, src in sources.items():
        installed = dest / rel
        if not installed.exists():
            plan.append((rel, "created"))
            continue
        have = _sha256(installed) if installed.is_file() else ""
        if have == _sha256(src):
            plan.append((rel, "unchanged"))
        elif manifest.get(rel) == have:
            plan.append((rel, "updated"))
        else:
            edited.append(rel)
            plan.append((rel, "overwritten"))
    stale: list[str] = []
    for rel, recorded in manifest.items():
        installed = dest / rel
        if rel in sources or not installed.is_file():
            continue
        if _sha256(installed) == recorded:
            stale.append(rel)
        else:
            edited.append(rel)
    return plan, edited, stale


def _apply(
    plan: Sequence[tuple[str, FileAction]], stale: Sequence[str], sources: Mapping[str, Path], dest: Path
) -> list[InstalledFile]:
    """Copy, update and remove files as planned; every file the report lists, with its hash."""
    files: list[InstalledFile] = []
    for rel, action in plan:
        src, installed = sources[rel], dest / rel
        if action != "unchanged":
            installed.parent.mkdir(parents=True, exist_ok=True)
            if installed.is_dir():
                shutil.rmtree(installed)
            shutil.copyfile(src, installed)
        files.append(InstalledFile(path=rel, action=action, sha256=_sha256(installed)))
    for rel in stale:
        (dest / rel).unlink()
        files.append(InstalledFile(path=rel, action="removed"))
    return files


def _install_notes(kind: str, name: str, dest: Path) -> list[str]:
    notes: list[str] = []
    if name != dest.name:
        notes.append(
            f"The skill is named {name!r} but its folder is {dest.name!r}; harnesses that follow the Agent Skills "
            f"spec expect them to match. Install into a folder named {name!r}."
        )
    if kind == "project":
        notes.append(
            "Claude Code loads project skills from .claude/skills/ when started in this project's root."
        )
    return notes


def install_skill(
    target: Literal["project", "user"] | None = None,
    dir: str | None = None,
    force: bool = False,
    cwd: str | None = None,
) -> InstallReport:
    """Copy SKILL.md, skill/ and repro_templates/ into a skill folder; idempotent, keeps local edits unless forced."""
    kind, dest = resolve_destination(target, dir, cwd)
    root = bundle_root()
    sources = _source_files(root)
    if dest.exists() and not dest.is_dir():
        raise InvalidInput(
            f"{dest} exists and is not a folder.", fix="Pick another --dir, or remove that file."
        )
    manifest = _read_manifest(dest) if dest.is_dir() else {}
    plan, edited, stale = _plan(sources, dest, manifest)
    if edited and not force:
        shown = ", ".join(sorted(edited)[:10]) + (" ..." if len(edited) > 10 else "")
        raise LocalEditsFound(
            f"{len(edited)} file(s) in {dest} differ from what rankscope installed there: {shown}. "
            "Nothing was changed."
        )
    files = _apply(plan, stale, sources, dest)
    changed = any(f.action != "unchanged" for f in files) or not (dest / MANIFEST).is_file()
    recorded = {f.path: f.sha256 for f in files if f.action != "removed"}
    if changed or manifest != recorded:
        dest.mkdir(parents=True, exist_ok=True)
        data = {"tool": "rankscope", "version": __version__, "files": recorded}
        (dest / MANIFEST).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    name = _skill_name(dest / "SKILL.md")
    return InstallReport(
        target=kind,
        directory=str(dest),
        skill_name=name,
        version=__version__,
        source=str(root),
        manifest=str(dest / MANIFEST),
        files=files,
        changed=changed,
        notes=_install_notes(kind, name, dest),
    )


def rankscope_command() -> list[str]:
    """Absolute command that starts this rankscope: the console script next to this interpreter, if any."""
    candidates = [Path(sys.executable).parent / "rankscope"]
    found = shutil.which("rankscope")
    if found:
        candidates.append(Path(found))
    for exe in candidates:
        if exe.is_file() and os.access(exe, os.X_OK):
            return [os.path.abspath(exe)]
    return [os.path.abspath(sys.executable), "-m", "rankscope"]


_CONFIG_FILES: dict[str, str] = {
    "claude-code": ".mcp.json in the project root (shared), or run the command_line",
    "claude-desktop": (
        "claude_desktop_config.json: ~/Library/Application Support/Claude/ (macOS), %APPDATA%\\Claude\\ (Windows)"
    ),
    "cursor": ".cursor/mcp.json in the project, or ~/.cursor/mcp.json for every project",
    "vscode": ".vscode/mcp.json in the workspace, or the user profile's mcp.json (command 'MCP: Open User Configuration')",
}


_SSH_HOST = re.compile(r"^(?!-)[A-Za-z0-9_.@:\[\]-]+$")


def _ssh_argv(host: str, remote_cmd: str | None) -> list[str]:
    """``ssh -T ... HOST 'rankscope mcp'``: stdio over ssh, no terminal, no password prompt."""
    if not _SSH_HOST.match(host):
        raise InvalidInput(
            f"--ssh {host!r} is not a host name (letters, digits, '.', '-', '_', '@', ':'; not starting with '-').",
            fix="Pass the GPU host as ssh knows it, e.g. --ssh gpu01 or --ssh me@gpu01.example.com.",
        )
    remote = shlex.join([remote_cmd or "rankscope", "mcp"])
    return ["ssh", "-T", "-o", "BatchMode=yes", "-o", "ServerAliveInterval=30", host, remote]


def mcp_config(client: McpClient, ssh: str | None = None, remote_cmd: str | None = None) -> McpConfig:
    """The exact registration of `rankscope mcp` for one MCP client, with absolute paths.

    With ``ssh`` the client (on a laptop) starts the server on the GPU host over ssh: the
    server must run where the job runs, since it reads /proc and attaches py-spy there.
    Building the server ahead of its first start is the face's part
    (``rankscope.mcp_server.with_server_prepared``): the server imports the façade, which imports
    this module, so doing it here would close a circle.
    """
    if client not in _CONFIG_FILES:
        raise InvalidInput(
            f"Unknown MCP client {client!r}.",
            fix="Use one of: " + ", ".join(sorted(_CONFIG_FILES)) + ".",
        )
    if remote_cmd is not None and ssh is None:
        raise InvalidInput("--remote-cmd needs --ssh HOST.", fix="Add --ssh with the GPU host's name.")
    argv = _ssh_argv(ssh, remote_cmd) if ssh else [*rankscope_command(), "mcp"]
    name = f"rankscope-{re.sub(r'[^A-Za-z0-9_-]', '-', ssh.split('@')[-1])}" if ssh else "rankscope"
    command, args = argv[0], argv[1:]
    entry: dict[str, object] = {"command": command, "args": args}
    key = "servers" if client == "vscode" else "mcpServers"
    if client == "vscode":
        entry = {"type": "stdio", **entry}
    command_line = f"claude mcp add {name} -- " + shlex.join(argv) if client == "claude-code" else None
    notes = _config_notes(client, ssh, remote_cmd)
    return McpConfig(
        client=client,
        server_name=name,
        command=command,
        args=args,
        command_line=command_line,
        config_file=_CONFIG_FILES[client],
        top_level_key=key,
        snippet={key: {name: entry}},
        notes=notes,
    )


def _config_notes(client: McpClient, ssh: str | None, remote_cmd: str | None) -> list[str]:
    notes: list[str] = []
    if client == "claude-code":
        notes.append(
            "Add `--scope user` before the name to use it in every project, `--scope project` to write .mcp.json."
        )
    if ssh:
        notes.append(
            f"The client runs the server on {ssh} over ssh: the key must work without a prompt "
            f"(try `ssh -T -o BatchMode=yes {ssh} true`), and the ssh user must be the job's user or root."
        )
        if remote_cmd is None:
            notes.append(
                "`rankscope` must be on the PATH of a non-interactive ssh session there; else pass "
                "--remote-cmd with its absolute path (`command -v rankscope` on that host)."
            )
        return notes
    notes.append(
        "The server must run on the host of the job it inspects, as the job's user or root (it reads /proc and "
        "uses ptrace through py-spy). From a laptop, register it with --ssh GPU_HOST."
    )
    return notes
