"""rankscope: debug distributed PyTorch jobs from the outside.

The package is layered (see README): ``analysis`` is pure, the shells do I/O,
``api`` is the façade that the CLI and the MCP server both call, and ``probe``
is imported by training code.
"""

__version__ = "0.1.0"
