"""One module per CLI subcommand, each a ``Command`` subclass (memray style).

Command modules must import cheaply: heavy work (torch, mcp, py-spy) is
imported inside ``run``. ``rankscope.cli`` lists them in ``COMMAND_MODULES`` and maps each
command name to its module in ``COMMAND_TABLE`` (tests/test_cli_table.py checks the two agree).
"""
