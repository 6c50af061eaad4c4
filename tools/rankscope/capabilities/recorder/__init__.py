"""The flight recorder, as the shell sees it: its dumps read from files, picked up from a live job,
or asked of PyTorch's debug servers.

Modules, in reading order:

- ``flight``: ``rankscope fr``: per-rank dump files read safely (no class is unpickled), then
  analysed (:mod:`rankscope.analysis.recorder.flight`);
- ``pickup``: the dumps of a live job: the files this run wrote, dumps asked for through a
  channel the job opened (debug pipe, the probe's signal, a worker-server socket), the
  TCPStore's ``exception_dump`` key;
- ``debug_server``: the client of ``torch.distributed.debug.start_debug_server``: each rank's
  recorder trace (and its stacks, for ``rankscope stacks --via debug-server``).

The dumps' analysis is in ``analysis/recorder/``; the models in ``models/flight.py``, the
renderer in ``render/flight.py``, the in-job switch in ``probe/flight.py``.
"""
