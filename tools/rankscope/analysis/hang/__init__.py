"""Hang analysis: the stacks of a job's ranks (live or saved) in, hung or slow and who is to blame out.

Modules, in reading order:

- ``stacks``: :func:`~rankscope.analysis.hang.stacks.analyze`, the entry point: annotates each
  rank's main thread, groups the ranks, and hands the facts to the verdict;
- what one rank's stack says: ``frames`` (the job's own code, the main thread), ``collectives``
  (frames that mean "in a torch.distributed operation"), ``waits`` (what it waits for),
  ``counters`` (its loop counters), ``conditions`` (the condition above its call),
  ``group_members`` (who is in the group it waits on), ``library_calls`` (the library call it is
  in that is itself a collective: ZeRO's consolidate_state_dict), ``workers`` (what its DataLoader
  workers wait on, read by the shell);
- what the job's other signs say: ``backend`` (NCCL or gloo, from /proc or native frames),
  ``gpu_busy`` (nvidia-smi), ``ras`` (NCCL RAS's launch counts);
- ``progress`` and ``progress_verdict``: the progress window (moving, busy, blocked) and the
  verdicts of a job that is not hung; ``progress_signals`` (I/O, kernel waits and locals: motion
  that is not a counter) and ``progress_stuck`` (the loop a rank stands in with nothing moving);
- ``verdict``: the hang verdict, from ``verdict_facts`` (what the rules read and return),
  ``verdict_rules`` with ``verdict_nccl`` and ``verdict_mismatch`` (the rules), ``verdict_texts``
  (their words), ``verdict_phrases`` and ``verdict_evidence`` (how they name what they saw);
- ``stack_files``: saved stacks (py-spy output, faulthandler tracebacks) parsed into the same threads;
- ``stall`` (is a running job stalled? the one detector of `run` and `watch`, from cheap /proc
  samples) and ``job_timeout`` (the job's collective timeout, and the thresholds derived from it).

The shells that feed it: ``capabilities/stacks.py``, ``progress_watch.py``, ``gpu_read.py``,
``ras_read.py``, ``saved_stacks.py``, ``remote.py``, ``watch.py`` and ``launch.py``.
"""
