"""The flight recorder's dumps, analysed: align the ranks by sequence id, find the first disagreement.

Modules: ``flight`` (dumps in, a :class:`~rankscope.models.flight.FlightReport` out).

The shells that read the dumps are in ``capabilities/recorder/``; the models in
``models/flight.py``, the renderer in ``render/flight.py``, the in-job switch in
``probe/flight.py``.
"""
