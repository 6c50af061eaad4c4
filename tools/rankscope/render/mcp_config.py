"""Lines for a person: the text view of `rankscope mcp-config` (typed on its model; pure)."""

from __future__ import annotations

import json
from collections.abc import Iterator

from rankscope.models.install import McpConfig


def render_mcp_config(cfg: McpConfig) -> Iterator[str]:
    if cfg.command_line:
        yield "# Register with Claude Code:"
        yield cfg.command_line
        yield ""
        yield "# Or put this in .mcp.json:"
    else:
        yield f"# Put this in {cfg.config_file}"
        yield f"# (merge it under the existing {cfg.top_level_key!r} key if the file exists):"
    yield json.dumps(cfg.snippet, indent=2)
    for note in cfg.notes:
        yield f"# {note}"
