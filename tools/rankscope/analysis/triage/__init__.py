"""Triage of a dead job: what its logs say, and one verdict from everything it left.

Modules, in reading order:

- ``log_rules``: the rule table (which log lines mean what, and what to do about them);
- ``logs``: the log scanner and its conclusion (victims and suspects);
- ``postmortem``: which source leads, the recorder's dumps, saved stacks or the logs.

The shell that sorts and reads the files is ``capabilities/triage.py``.
"""
