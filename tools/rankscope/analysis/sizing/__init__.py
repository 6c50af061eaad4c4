"""Answer sizing: every answer an agent reads fits its budget, and says what it left out.

Modules, in reading order:

- ``bound``: each answer type's bound, which folds what it holds as secondary;
- ``fit``: the net under every bound, which cuts what still exceeds the budget and names each cut.

The other two pieces sit in the layers that own them: ``models/compact.py`` (the compact
structured content) and ``render/answer.py`` (the registry of answers, each with its bound and
renderers, and the two forms of an answer).
"""
