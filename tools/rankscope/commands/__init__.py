"""One module per CLI subcommand, each a ``Command`` subclass (memray style).

Command modules must import cheaply: heavy work (torch, mcp, py-spy) is
imported inside ``run``. ``rankscope.cli.COMMANDS`` is the one registry: it maps each command name to its
module (tests check it against every module's ``COMMANDS``).
"""
