"""Build hook: ship SKILL.md, skill/ and repro_templates/ inside the wheel.

They live at the repository root (where agents and people read them), outside
the src-layout package, so build_py copies them into ``rankscope/_bundle``.
An installed rankscope finds them there (``rankscope.resources``); a source
checkout finds them at the repository root.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
BUNDLED = ("SKILL.md", "skill", "repro_templates")


class BuildWithBundle(build_py):
    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "rankscope" / "_bundle"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        for name in BUNDLED:
            src = ROOT / name
            if src.is_dir():
                shutil.copytree(src, target / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
            elif src.is_file():
                shutil.copy2(src, target / name)


setup(cmdclass={"build_py": BuildWithBundle})
