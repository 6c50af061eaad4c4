"""The base of every rankscope model (its own module, so that answer modules can be imported by
:mod:`rankscope.models.core` without a cycle)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Model(BaseModel):
    """Base for all rankscope models: forbid typos in field names at construction.

    ``defer_build``: a model's validator and serializer are built on its first use, not at
    import, so a command or the MCP server pays only for the models it touches (about 80
    are defined; `rankscope stacks` uses a dozen, and `rankscope mcp` none until a tool runs).
    """

    model_config = ConfigDict(extra="forbid", defer_build=True)


__all__ = ["Model"]
