"""The capability shells: one module per thing rankscope can do, the imperative shell around the
pure analysis.

Each reads what it needs through the runtime layer (/proc, py-spy, subprocesses), hands the
data to ``rankscope.analysis`` and returns its models. They import each other directly
(``stacks`` uses ``discovery``), never the façade or a face: ``rankscope.api`` names them.
"""
