"""The runtime layer: the only code that starts processes, sends signals, opens sockets or reads /proc.

``procfs`` reads /proc/PID/*; ``proctree`` finds and reaps process trees; ``subproc`` runs an
external command with a timeout; ``pyspy`` runs and parses py-spy. The capability shells call
these; the pure core (``analysis``, ``models``, ``render``) never does. Redaction does no I/O, so
it lives in the core (``rankscope.analysis.redact``).
"""
