"""Answers of `rankscope install-skill` and `rankscope mcp-config`."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rankscope.models.core import Model

InstallTarget = Literal["project", "user", "dir"]
McpClient = Literal["claude-code", "claude-desktop", "cursor", "vscode"]
FileAction = Literal["created", "updated", "unchanged", "removed", "overwritten"]


class InstalledFile(Model):
    """One file of the skill and what installing did to it."""

    path: str = Field(description="Path relative to the skill folder, e.g. 'skill/hangs.md'.")
    action: FileAction
    sha256: str = Field(default="", description="Hash of the installed content (empty for removed files).")


class InstallReport(Model):
    """Answer of `rankscope install-skill`."""

    target: InstallTarget
    directory: str = Field(description="Absolute path of the installed skill folder (holds SKILL.md).")
    skill_name: str = Field(
        description="The `name` in SKILL.md's frontmatter; harnesses expect it to equal the folder name."
    )
    version: str = Field(description="rankscope version the files came from.")
    source: str = Field(description="Folder the files were copied from.")
    manifest: str = Field(description="File recording the installed hashes, used to detect local edits.")
    files: list[InstalledFile] = Field(default_factory=list)
    changed: bool = Field(default=False, description="False when the installation was already up to date.")
    notes: list[str] = Field(default_factory=list)


class McpConfig(Model):
    """Answer of `rankscope mcp-config`: how to register the rankscope MCP server with one client."""

    client: McpClient
    server_name: str = "rankscope"
    command: str = Field(description="Absolute path of the executable the client starts.")
    args: list[str] = Field(default_factory=list)
    command_line: str | None = Field(
        default=None, description="A shell command that registers the server (Claude Code)."
    )
    config_file: str = Field(description="Where the JSON snippet goes.")
    top_level_key: str = Field(description="'servers' for VS Code, 'mcpServers' for the others.")
    snippet: dict[str, Any] = Field(description="JSON to merge into config_file.")
    notes: list[str] = Field(default_factory=list)
