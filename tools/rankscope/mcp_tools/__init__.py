"""MCP tool adapters, one module per capability, each with ``register(server)``.

Adapters are thin: they call ``rankscope.api`` and return its model, turning
``RankscopeError`` into ``ToolError`` (see ``_common.guard``).
"""
