"""Frames and allocation sites: how snapshot frames are filtered and named, as PyTorch's viewer does."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rankscope.analysis.code_origin import origin_of
from rankscope.analysis.units import MiB

BlockExtra = Callable[[Mapping[str, Any]], tuple[list[Any], int]]
Place = tuple[int, int, int]
"""A place's (site, script line, caller) site ids."""
FrameFilter = Callable[[str, str], bool]

SMALL_POOL_MAX = MiB  # requests <= 1 MiB come from the small pool (CUDACachingAllocator kSmallSize)
SKILL = "skill/oom.md"
NO_FRAMES = "<no frames: record_memory_history was off>"


# ------------------------------------------------------------------ frames


def block_extra_fallback(block: Mapping[str, Any]) -> tuple[list[Any], int]:
    """Same contract as ``torch.cuda._memory_viz._block_extra`` (new and legacy layouts)."""
    if "frames" in block:
        return list(block["frames"]), int(block.get("requested_size", block["size"]))
    if block.get("history"):
        first = block["history"][0]
        return list(first.get("frames", [])), int(first.get("real_size", block["size"]))
    return [], int(block.get("requested_size", block["size"]))


_NOISE_FUNCS = (
    "unwind::unwind",
    "CapturedTraceback::gather",
    "gather_with_cpp",
    "_start",
    "__libc_start_main",
)
_NATIVE_SUFFIX = (".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cu", ".cuh")


def _is_native(filename: str) -> bool:
    """C/C++ frames: symbolized with a source suffix, or '??' when symbols are missing."""
    return filename in ("??", "") or filename.endswith(_NATIVE_SUFFIX) or ".so" in filename


def frame_filter_fallback(name: str, filename: str) -> bool:
    """Keep frames the way ``_memory_viz._frame_filter`` does (drop interpreter/unwinder noise)."""
    return not any(n in name for n in _NOISE_FUNCS) and not name.startswith(("PyEval_", "PyObject_"))


def is_user_file(filename: str) -> bool:
    """True for frames of the job's own Python code (not torch, another library, the stdlib or
    native code)."""
    if not filename or filename == "??" or filename.endswith(_NATIVE_SUFFIX):
        return False
    return origin_of(filename) == "user"


def _fmt_frame(f: Mapping[str, Any]) -> str:
    return f"{f.get('filename', '?')}:{f.get('line', '?')} in {f.get('name', '?')}"


class SiteNamer:
    """Names allocation sites by innermost user frame, as small integer ids.

    Symbolized snapshots share one dict per distinct frame, so each frame is
    classified once (keyed by identity: the snapshot outlives the namer, so the
    ids stay unique while they are used). Every allocation has its own frames
    list, but most stacks start with the same run of native and torch frames
    before the first user frame: ``prefixes`` remembers, per first frame, the
    last such run seen, so a stack costs one C-level list comparison and one
    lookup instead of a lookup per frame. Frames equal to known non-user ones
    classify the same (the verdict depends only on filename, line and name),
    so a match is exact. Site ids index ``names``; 0 is no site.
    """

    def __init__(self, frame_filter: FrameFilter) -> None:
        self.frame_filter = frame_filter
        self.names: list[str] = [""]
        self.ids: dict[str, int] = {}
        self._user: dict[int, int] = {}  # id(frame) -> site id of its text, 0 when not a user frame
        self.frame_site = self._user.get  # bound once: the hot loop inlines the lookup
        # id(first frame) -> (k, frames[:k]): a stack whose first user frame was at index k
        self.prefixes: dict[int, tuple[int, list[Any]]] = {}
        self._python: dict[int, int] = {}  # id(frame) -> site id of its text, 0 when native
        self._unknown = itertools.repeat(-1)  # the lookup default: truthy, so a scan stops there
        self.files: dict[int, str] = {}  # user site id -> its file
        # place id -> (site, script, caller) site ids; 0 is no place, and no script or caller
        self.places: list[Place] = [(0, 0, 0)]
        self._place_ids: dict[Place, int] = {}
        self._by_user: dict[tuple[int, ...], int] = {}  # a stack's user site ids -> its place id
        # a stack's frames, by identity -> its place id (a call path shares its frame dicts)
        self.stack_places: dict[tuple[int, ...], int] = {}

    def site_id(self, name: str) -> int:
        """The id of a site text, registering it on first sight."""
        sid = self.ids.get(name)
        if sid is None:
            sid = self.ids[name] = len(self.names)
            self.names.append(name)
        return sid

    def _classify(self, f: Mapping[str, Any]) -> int:
        filename = str(f.get("filename", ""))
        user = self.frame_filter(str(f.get("name", "")), filename) and is_user_file(filename)
        sid = self.site_id(_fmt_frame(f)) if user else 0
        if sid:
            self.files[sid] = filename
        self._user[id(f)] = sid
        return sid

    def of(self, frames: Sequence[Mapping[str, Any]]) -> int:
        """Site id of a non-empty stack: its innermost user frame, else its innermost Python frame."""
        get = self._user.get
        known = self.prefixes.get(id(frames[0]))
        matched = known is not None and frames[: known[0]] == known[1]
        if matched and known is not None and len(frames) > known[0]:
            sid = get(id(frames[known[0]]), 0)
            if sid > 0:
                return sid
        for k, f in enumerate(frames):
            sid = get(id(f), -1)
            if sid < 0:
                sid = self._classify(f)
            if sid:
                if not matched:  # a prefix that still matches stays: most stacks share it
                    self.prefixes[id(frames[0])] = (k, list(frames[:k]))
                return sid
        return self._fallback(frames)

    def _fallback(self, frames: Sequence[Mapping[str, Any]]) -> int:
        """No user frame: the innermost Python frame, else the innermost frame."""
        py = self._python
        sid: int = next(filter(None, map(py.get, map(id, frames), self._unknown)), 0)
        if sid > 0:
            return sid
        if sid < 0:
            for f in frames:
                sid = py.get(id(f), -1)
                if sid < 0:
                    sid = py[id(f)] = (
                        0 if _is_native(str(f.get("filename", ""))) else self.site_id(_fmt_frame(f))
                    )
                if sid:
                    return sid
        return self.site_id(_fmt_frame(frames[0]))

    def site(self, frames: Sequence[Mapping[str, Any]]) -> str:
        return self.names[self.of(frames)] if frames else NO_FRAMES

    def place_of(self, frames: Sequence[Mapping[str, Any]], sid: int | None = None) -> int:
        """The place of a stack (``sid``: its site, when the caller named it already).

        A place is a site with the job's script line that led there and the caller of that line:
        the innermost frame of the file of the outermost user frame (train.py:40 in evaluate),
        and the next user frame out (train.py:95 in main). One library line (model.py:48 in
        forward) reached from two script lines (the training forward, an evaluation) is two
        places: the blocks one of them keeps are that place's, and its line is the one to fix.
        Script and caller are 0 when the site is already in the script's file, or alone.
        """
        if not frames:
            return self._place((self.site_id(NO_FRAMES), 0, 0))
        stack = tuple(map(id, frames))  # the same call path shares its frames: one lookup
        pid = self.stack_places.get(stack)
        if pid is None:
            pid = self.stack_places[stack] = self._place_of(frames, sid)
        return pid

    def _place_of(self, frames: Sequence[Mapping[str, Any]], sid: int | None) -> int:
        get = self._user.get
        user = tuple(filter(None, map(get, map(id, frames), self._unknown)))
        if -1 in user:  # a frame seen for the first time: classify it, then read the stack again
            for f in frames:
                if get(id(f), -1) < 0:
                    self._classify(f)
            user = tuple(filter(None, map(get, map(id, frames))))
        if not user:  # no user frame: the site is the namer's fallback, alone
            return self._place((sid if sid is not None else self.of(frames), 0, 0))
        pid = self._by_user.get(user)  # the site is user[0]: the user frames decide the place
        if pid is None:
            pid = self._by_user[user] = self._place(self._from_user(user))
        return pid

    def _from_user(self, user: tuple[int, ...]) -> Place:
        """(site, script, caller) of a stack's user frames, innermost first."""
        files = self.files
        script_file = files[user[-1]]
        k = next(i for i, u in enumerate(user) if files[u] == script_file)
        if k == 0:
            return (user[0], 0, 0)
        return (user[0], user[k], user[k + 1] if k + 1 < len(user) else 0)

    def _place(self, key: Place) -> int:
        pid = self._place_ids.get(key)
        if pid is None:
            pid = self._place_ids[key] = len(self.places)
            self.places.append(key)
        return pid

    def place(self, pid: int) -> tuple[str, str | None]:
        """(site, script line) of a place, as text: the script line with its caller when that is
        a function (``train.py:40 in evaluate <- train.py:95 in main``; a module's top level,
        which every stack has, is left out)."""
        site, script, caller = self.places[pid]
        called = self.names[caller]
        if not script:
            return self.names[site], None
        if called and not called.endswith(" in <module>"):
            return self.names[site], f"{self.names[script]} <- {called}"
        return self.names[site], self.names[script]

    def script(self, frames: Sequence[Mapping[str, Any]]) -> str | None:
        """The job's own script line on a stack (see :meth:`place_of`); None when the site is in
        the script's file already, or the stack has no user frame."""
        return self.place(self.place_of(frames))[1] if frames else None

    def stack(self, frames: Sequence[Mapping[str, Any]], limit: int = 8) -> list[str]:
        out = [
            _fmt_frame(f)
            for f in frames
            if self.frame_filter(str(f.get("name", "")), str(f.get("filename", "")))
        ]
        python = [s for s in out if not _is_native(s.split(":", 1)[0])]
        return (python or out)[:limit]
