"""Pure analysis: data in, pydantic models out.

Nothing here touches /proc, subprocesses, files, the clock or stdout; it is
tested against captured data in tests/data.
"""
