"""Where SKILL.md, skill/ and repro_templates/ live.

An installed wheel carries them in ``rankscope/_bundle`` (setup.py copies them
at build time); a source checkout or editable install finds them at the
repository root, two levels above this package.
"""

from __future__ import annotations

from pathlib import Path

from rankscope.errors import RankscopeError

_PKG = Path(__file__).resolve().parent


def bundle_root() -> Path:
    """The folder that holds SKILL.md, skill/ and repro_templates/."""
    for candidate in (_PKG / "_bundle", _PKG.parent.parent):
        if (candidate / "SKILL.md").is_file():
            return candidate
    raise RankscopeError(
        "rankscope's skill files (SKILL.md, skill/, repro_templates/) are missing from this installation.",
        fix="Reinstall rankscope from a wheel or a full source checkout: `pip install --force-reinstall rankscope`.",
    )


def skill_md() -> Path:
    return bundle_root() / "SKILL.md"


def playbooks_dir() -> Path:
    return bundle_root() / "skill"


def templates_dir() -> Path:
    return bundle_root() / "repro_templates"
