"""The runtime layer: the only code that reads /proc, starts processes or runs py-spy.

``procfs`` reads /proc/PID/*; ``proctree`` finds and reaps process trees; ``subproc`` runs an
external command with a timeout; ``pyspy`` runs and parses py-spy; ``redact`` scrubs secrets
from everything that leaves rankscope. The capability shells call these; the pure core
(``analysis``, ``models``) never does.
"""
