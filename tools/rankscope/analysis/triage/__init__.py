"""Triage of a dead job: what its logs say, and one verdict from everything it left.

Modules, in reading order:

- ``log_rules``: the rule table (which log lines mean what, and what to do about them);
- ``logs``: the log scanner, which routes each line to its reader, and its conclusion (victims and
  suspects);
- ``torchrun_lines``: the launcher's own lines (its failure table, worker exits, NCCL's pid-to-rank map);
- ``tracebacks``: Python tracebacks (a finding's call site, the exception that ended a dead thread);
- ``rule_facts``: what one rule's line says (its facts and its wording for them);
- ``accumulator``: one finding per (kind, rank, source), however often a log repeats it;
- ``after_scan``: what needs the whole log (findings from the failure records, folding, watchdog aborts);
- ``postmortem``: which source leads, the recorder's dumps, saved stacks or the logs;
- ``silent``: a rank that left no traceback while the others timed out: where they waited, and the story;
- ``blocking_calls``: the calls the code has that rank pass before the collective, and what each waits on.

The shell that sorts and reads the files is ``capabilities/triage.py``.
"""
