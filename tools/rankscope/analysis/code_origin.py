"""Where a frame's code comes from: the job's own, torch, another library, rankscope, the stdlib.

Told by the folders the job's interpreter imports from (:class:`CodeRoots`, read from the ranks),
never by a word in the path: a script in a folder named ``torch``, ``rankscope``,
``site-packages-notes`` or ``lib/python3.12`` is the job's own. Where the roots are unknown (saved
stacks, logs, recorder dumps) or do not cover a file, the path's structure decides: an installed
package sits in ``lib/pythonX.Y/site-packages/<package>/`` (or ``dist-packages``), a standard module
in ``lib/pythonX.Y/<module>``, and rankscope in its own install folder. This module is the one place
that tells them apart; every rule that needs to know asks it.
"""

from __future__ import annotations

import functools
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence

import rankscope
from rankscope.models.core import CodeRoots, Frame, FrameOrigin, RankStack

OWN_ROOT = os.path.dirname(rankscope.__file__).replace("\\", "/")
"""The folder this rankscope runs from: a job that imports ``rankscope.probe`` from the same install
has its frames there."""

_PY_DIR = re.compile(r"^python\d+(\.\d+)?t?$")
"""``python3.12``, ``python3``, ``python3.13t``: the folder under ``lib`` a Python install keeps."""
_SITE_DIRS = frozenset({"site-packages", "dist-packages"})
_STDLIB_NAMES = frozenset(sys.stdlib_module_names) | {"__future__", "__phello__"}
GENERATED_PREFIX = "torchinductor_"
"""torch.compile's generated code lives in inductor's cache (``/tmp/torchinductor_<user>/``)."""

NOT_OWN: frozenset[FrameOrigin] = frozenset({"torch", "rankscope", "stdlib"})
"""Origins whose locals and loops say nothing of the job (a third-party training loop does)."""


def _norm(path: str) -> str:
    return path.replace("\\", "/")


def _under(path: str, roots: Iterable[str]) -> str | None:
    """The rest of ``path`` below the first of ``roots`` that holds it, else None."""
    for root in roots:
        root = root.rstrip("/")
        if root and path.startswith(root + "/"):
            return path[len(root) + 1 :]
    return None


def _package(rest: str) -> FrameOrigin:
    """The origin of a file ``rest`` below a site-packages folder, by its top-level package."""
    top = rest.split("/", 1)[0]
    if top == "torch":
        return "torch"
    return "rankscope" if top == "rankscope" else "library"


def _site_layout(parts: Sequence[str], i: int) -> bool:
    """Whether the site folder ``parts[i]`` sits where an install keeps one: ``lib/pythonX.Y/``,
    Debian's ``lib/python3/``, Windows' ``Lib/``."""
    above = parts[i - 1] if i >= 1 else ""
    if above.lower() == "lib":
        return True
    return bool(_PY_DIR.match(above)) and i >= 2 and parts[i - 2].lower() in ("lib", "lib64")


@functools.lru_cache(maxsize=16384)
def structural_origin(path: str, layout: bool = False) -> FrameOrigin:
    """The origin of ``path`` (``/``-separated) by its structure alone, for files no root covers.

    An installed package: a ``site-packages`` (or ``dist-packages``) folder, then the package;
    with ``layout``, only one where an install keeps it (``lib/pythonX.Y/site-packages``, Debian's
    ``lib/python3/dist-packages``): the roots are known then, and a folder named so elsewhere is
    the job's own. A standard module: ``.../lib[64]/pythonX.Y/<name>`` where ``<name>`` is one of
    Python's standard modules. rankscope: its own install folder. Code torch.compile generated: a
    ``torchinductor_<user>`` folder. Anything else is the job's own.
    """
    if path.startswith("<"):
        return "stdlib"  # <frozen importlib._bootstrap>, <string>: made by the interpreter
    if _under(path, (OWN_ROOT,)) is not None:
        return "rankscope"
    parts = path.split("/")
    if any(p.startswith(GENERATED_PREFIX) for p in parts[:-1]):
        return "generated"
    for i in range(len(parts) - 2, -1, -1):
        if parts[i] in _SITE_DIRS and (not layout or _site_layout(parts, i)):
            return _package("/".join(parts[i + 1 :]))
    for i in range(len(parts) - 2, 0, -1):
        if _PY_DIR.match(parts[i]) and parts[i - 1].lower() in ("lib", "lib64"):
            top = parts[i + 1].removesuffix(".py")
            return "stdlib" if top in _STDLIB_NAMES else "user"
    return "user"


def origin_of(path: str, roots: CodeRoots | None = None) -> FrameOrigin:
    """Where the file ``path`` comes from, told by ``roots`` (the job's interpreter's folders) first,
    then by the path's structure (:func:`structural_origin`).

    Where the roots are known, a folder is a site folder only where an install keeps one (a
    ``--target`` install or a distribution's ``dist-packages`` the roots missed is still told by
    that layout), and where they name the standard library, a file outside it is never the
    standard library's, whatever its folders are called.
    """
    path = _norm(path)
    if not path:
        return "stdlib"
    if roots is None or path.startswith("<"):
        return structural_origin(path)
    if _under(path, roots.rankscope) is not None:
        return "rankscope"
    if _under(path, roots.torch) is not None:
        return "torch"
    rest = _under(path, roots.site)
    if rest is not None:
        return _package(rest)
    if _under(path, roots.stdlib) is not None:
        return "stdlib"
    found = structural_origin(path, layout=True)
    return "user" if found == "stdlib" and roots.stdlib else found


def frame_origin(frame: Frame, roots: CodeRoots | None = None) -> FrameOrigin:
    """``frame``'s origin: as told when it was read (:attr:`Frame.origin`), else from ``roots``."""
    if frame.origin is not None:
        return frame.origin
    return "native" if frame.native else origin_of(frame.file, roots)


def labelled(
    frames: Sequence[Frame], roots: CodeRoots | None, told: dict[str, FrameOrigin] | None = None
) -> list[Frame]:
    """``frames`` each with its origin told (the ones already told are kept as they are); ``told``:
    the origins of the files seen so far, so that each file is asked about once."""
    told = {} if told is None else told
    out: list[Frame] = []
    for f in frames:
        if f.origin is not None:
            out.append(f)
            continue
        if f.native:
            origin: FrameOrigin = "native"
        else:
            origin = told.get(f.file) or told.setdefault(f.file, origin_of(f.file, roots))
        out.append(f.model_copy(update={"origin": origin}))
    return out


def label_stacks(stacks: Sequence[RankStack], roots: CodeRoots | None) -> list[RankStack]:
    """``stacks`` with every frame's origin told by ``roots`` (a merged or saved capture, whose
    frames lost theirs on the way: only the roots travel)."""
    if roots is None:
        return list(stacks)
    told: dict[str, FrameOrigin] = {}
    out: list[RankStack] = []
    for s in stacks:
        threads = [
            t
            if all(f.origin is not None for f in t.frames)
            else t.model_copy(update={"frames": labelled(t.frames, roots, told)})
            for t in s.threads
        ]
        out.append(s.model_copy(update={"threads": threads}))
    return out


# -- the roots, from what /proc shows of a rank --------------------------------------------------


_VERSION = re.compile(r"python(\d+\.\d+)t?")


def _versions(exe: str, mapped: Iterable[str]) -> list[str]:
    """The interpreter's ``X.Y`` versions seen: its executable's name, its mapped libpython/lib-dynload."""
    seen: list[str] = []
    for text in [os.path.basename(exe), *mapped]:
        for m in _VERSION.finditer(text):
            if m.group(1) not in seen:
                seen.append(m.group(1))
    return seen


def _prefix(executable: str) -> str | None:
    """``/usr`` for ``/usr/bin/python3.12``: the install the executable belongs to."""
    parent = os.path.dirname(executable)
    return os.path.dirname(parent) if os.path.basename(parent) == "bin" else None


def roots_of(
    exe: str | None,
    argv0: str | None,
    env: Mapping[str, str],
    mapped: Iterable[str],
    own: str = OWN_ROOT,
) -> CodeRoots:
    """A rank's roots from what /proc shows of it, without running anything in it.

    ``exe``: /proc/PID/exe (the interpreter, symlinks resolved: its prefix holds the standard
    library); ``argv0``: how it was started (a venv's ``bin/python``: the folders the frames name);
    ``env``: its environment (``VIRTUAL_ENV``, ``CONDA_PREFIX``, ``PYTHONUSERBASE``); ``mapped``: the
    files it has mapped (``lib-dynload/*.so`` sits in the standard library, ``site-packages/*/*.so``
    in a site folder, ``torch/lib/libtorch*.so`` in torch's); ``own``: rankscope's install folder.
    """
    paths = [_norm(m) for m in mapped]
    versions = _versions(exe or "", [m for m in paths if "python" in m])
    stdlib: list[str] = []
    site: list[str] = []
    torch: list[str] = []
    for path in paths:
        parts = path.split("/")
        if "lib-dynload" in parts:
            stdlib.append("/".join(parts[: parts.index("lib-dynload")]))
        site_at = [i for i, p in enumerate(parts) if p in _SITE_DIRS]
        if site_at:
            site.append("/".join(parts[: site_at[-1] + 1]))
        elif len(parts) > 3 and parts[-3:-1] == ["torch", "lib"] and parts[-1].startswith("lib"):
            torch.append("/".join(parts[:-2]))  # torch built from source, outside any site folder
    base = _prefix(_norm(exe or ""))
    if base:
        stdlib += [f"{base}/lib/python{v}" for v in versions]
    envs = [
        _prefix(_norm(argv0 or "")),
        *(env.get(k) for k in ("VIRTUAL_ENV", "CONDA_PREFIX", "PYTHONUSERBASE")),
    ]
    for prefix in [base, *envs]:
        if prefix:
            site += [f"{_norm(prefix)}/lib/python{v}/site-packages" for v in versions]
    for entry in env.get("PYTHONPATH", "").split(":"):
        if entry and _norm(entry).rsplit("/", 1)[-1] in _SITE_DIRS:
            site.append(_norm(entry))  # `pip install --target DIR/site-packages` put on the path
    return CodeRoots(stdlib=_unique(stdlib), site=_unique(site), torch=_unique(torch), rankscope=[own])


def merge_roots(roots: Iterable[CodeRoots | None]) -> CodeRoots | None:
    """One set of roots for ranks read apart (several ranks, several hosts); None when none was read."""
    known = [r for r in roots if r is not None]
    if not known:
        return None
    return CodeRoots(
        stdlib=_unique(p for r in known for p in r.stdlib),
        site=_unique(p for r in known for p in r.site),
        torch=_unique(p for r in known for p in r.torch),
        rankscope=_unique(p for r in known for p in r.rankscope),
    )


def _unique(paths: Iterable[str]) -> list[str]:
    out: list[str] = []
    for p in paths:
        p = p.rstrip("/")
        if p and p not in out:
            out.append(p)
    return out


__all__ = [
    "GENERATED_PREFIX",
    "NOT_OWN",
    "OWN_ROOT",
    "frame_origin",
    "label_stacks",
    "labelled",
    "merge_roots",
    "origin_of",
    "roots_of",
    "structural_origin",
]
