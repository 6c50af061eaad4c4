"""Where a frame's code comes from: told by the roots the rank imports from, else by the path's
structure, never by a word in the path (issue 41)."""

from __future__ import annotations

import os
import sys
import sysconfig

import pytest

from rankscope.analysis.code_origin import (
    OWN_ROOT,
    label_stacks,
    merge_roots,
    origin_of,
    roots_of,
    structural_origin,
)
from rankscope.analysis.hang.frames import find_call_site, is_internal_frame, is_user_frame
from rankscope.models.compact import compact
from rankscope.models.core import CodeRoots, Frame, FrameOrigin, RankStack, ThreadStack
from rankscope.runtime import procfs

PY = "/home/u/.pyenv/versions/3.12.4"
VENV = "/home/u/proj/.venv"
SITE = f"{VENV}/lib/python3.12/site-packages"
MAPPED = (
    f"{PY}/lib/python3.12/lib-dynload/_json.cpython-312-x86_64-linux-gnu.so",
    f"{PY}/lib/libpython3.12.so.1.0",
    f"{SITE}/torch/lib/libtorch_cpu.so",
    f"{SITE}/numpy/_core/_multiarray_umath.cpython-312-x86_64-linux-gnu.so",
)
ROOTS = roots_of(f"{PY}/bin/python3.12", f"{VENV}/bin/python", {"HOME": "/home/u"}, MAPPED)


@pytest.mark.parametrize(
    "path",
    [
        "/x/torch/train.py",
        "/x/rankscope/train.py",
        "/x/rankscope/probe/train.py",
        "/x/site-packages-notes/train.py",
        "/x/lib/python3.12/train.py",
        "/x/torch/distributed/my_helpers.py",
        "/work/dist-packages-old/torch/train.py",
        "train.py",
    ],
)
def test_a_script_under_a_folder_named_like_a_library_is_the_jobs_own(path: str) -> None:
    assert origin_of(path) == "user"
    assert origin_of(path, ROOTS) == "user"
    assert is_user_frame(Frame(function="main", file=path, line=3))


@pytest.mark.parametrize(
    ("path", "origin"),
    [
        (f"{SITE}/torch/distributed/distributed_c10d.py", "torch"),
        (f"{SITE}/numpy/_core/fromnumeric.py", "library"),
        (f"{SITE}/rankscope/probe/flight.py", "rankscope"),
        ("/usr/lib/python3/dist-packages/yaml/loader.py", "library"),
        ("/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py", "torch"),
        (f"{PY}/lib/python3.12/threading.py", "stdlib"),
        (f"{PY}/lib/python3.12/multiprocessing/queues.py", "stdlib"),
        ("<frozen importlib._bootstrap>", "stdlib"),
        ("/tmp/torchinductor_alice/fc/cfcm3sauo5csx.py", "generated"),
        (f"{OWN_ROOT}/probe/flight.py", "rankscope"),
        ("C:\\py\\Lib\\site-packages\\torch\\autograd\\graph.py", "torch"),
    ],
)
def test_libraries_the_stdlib_and_rankscope_are_told_by_where_they_live(
    path: str, origin: FrameOrigin
) -> None:
    assert origin_of(path) == origin
    assert origin_of(path, ROOTS) == origin


def test_the_roots_come_from_what_proc_shows_of_a_rank() -> None:
    assert ROOTS.stdlib == [f"{PY}/lib/python3.12"]  # lib-dynload's folder and the interpreter's prefix agree
    assert SITE in ROOTS.site  # the venv the rank was started from, and its mapped libraries
    assert ROOTS.torch == []  # torch sits in a site folder: the site says it
    assert ROOTS.rankscope == [OWN_ROOT]
    # a venv behind a symlink: the frames name the folder the rank was started from
    linked = roots_of(f"{PY}/bin/python3.12", "/w/wt/.venv/bin/python", {}, MAPPED)
    assert "/w/wt/.venv/lib/python3.12/site-packages" in linked.site
    assert origin_of("/w/wt/.venv/lib/python3.12/site-packages/torch/_tensor.py", linked) == "torch"


def test_known_roots_decide_where_the_layout_alone_would_not() -> None:
    # a folder laid out like a standard library, outside the one the rank imports from
    assert structural_origin("/usr/lib64/python3.11/queue.py") == "stdlib"
    assert structural_origin("/x/lib/python3.12/threading.py") == "stdlib"
    assert origin_of("/x/lib/python3.12/threading.py", ROOTS) == "user"
    # a folder merely named site-packages holds the job's files once the rank's site folders are known
    assert origin_of("/x/site-packages/train.py") == "library"
    assert origin_of("/x/site-packages/train.py", ROOTS) == "user"
    # torch built from source, outside any site folder: its mapped libraries say where it lives
    built = roots_of(f"{PY}/bin/python3.12", None, {}, [*MAPPED, "/opt/pytorch/torch/lib/libtorch_cpu.so"])
    assert built.torch == ["/opt/pytorch/torch"]
    assert origin_of("/opt/pytorch/torch/distributed/distributed_c10d.py", built) == "torch"
    assert origin_of("/opt/pytorch/train.py", built) == "user"


def test_roots_read_apart_are_merged_once() -> None:
    other = roots_of("/usr/bin/python3.11", None, {}, ["/usr/lib/python3.11/lib-dynload/_ssl.so"])
    merged = merge_roots([ROOTS, None, other, ROOTS])
    assert merged is not None and merged.stdlib == [f"{PY}/lib/python3.12", "/usr/lib/python3.11"]
    assert merge_roots([None]) is None


def test_this_interpreters_roots_read_from_proc_hold_its_stdlib_and_site() -> None:
    """The reader on a live process: this one (pydantic_core's library is mapped from its site folder)."""
    roots = procfs.code_roots(os.getpid())
    assert roots is not None
    paths = sysconfig.get_paths()
    stdlib = os.path.realpath(paths["stdlib"])
    assert any(os.path.realpath(p) == stdlib for p in roots.stdlib), roots
    assert origin_of(os.path.join(paths["stdlib"], "threading.py"), roots) == "stdlib"
    assert origin_of(os.path.join(paths["purelib"], "pydantic", "main.py"), roots) == "library"
    assert (
        origin_of(os.path.join(os.path.dirname(sys.executable), "..", "x", "rankscope", "t.py"), roots)
        == "user"
    )


def test_a_frames_origin_is_told_once_and_never_serialised() -> None:
    frames = [
        Frame(function="all_reduce", file=f"{SITE}/torch/distributed/distributed_c10d.py", line=2800),
        Frame(function="step", file="/x/torch/train.py", line=12),
        Frame(function="<module>", file="/x/torch/train.py", line=40),
    ]
    stack = RankStack(
        rank=0, pid=1, host="h", threads=[ThreadStack(thread_id=1, is_main=True, frames=frames)]
    )
    [told] = label_stacks([stack], ROOTS)
    told_frames = told.threads[0].frames
    assert [f.origin for f in told_frames] == ["torch", "user", "user"]
    assert is_internal_frame(told_frames[0]) and not is_internal_frame(told_frames[1])
    site = find_call_site(told_frames)
    assert site is not None and site.function == "step"
    # the JSON never carries it (the roots travel instead), and a frame read back equals the one written
    assert "origin" not in told.model_dump_json() and "origin" not in str(compact(told))
    assert RankStack.model_validate_json(told.model_dump_json()) == told
    # a frame told by the roots keeps what they said, whatever its path looks like alone
    odd = Frame(function="f", file="/x/lib/python3.12/threading.py", line=1)
    assert not is_user_frame(odd) and is_user_frame(label_stacks_frame(odd, ROOTS))


def label_stacks_frame(frame: Frame, roots: CodeRoots) -> Frame:
    stack = RankStack(rank=0, pid=1, host="h", threads=[ThreadStack(thread_id=1, frames=[frame])])
    return label_stacks([stack], roots)[0].threads[0].frames[0]


def test_a_site_folder_on_pythonpath_is_a_library_root_and_other_entries_stay_the_users() -> None:
    """`pip install --target /x/site-packages pkg` with PYTHONPATH=/x/site-packages:/x/src: the
    package is a library, the job's own src folder is the user's."""
    env = {"PYTHONPATH": "/x/site-packages:/x/src"}
    roots = roots_of(f"{PY}/bin/python3.12", f"{VENV}/bin/python", env, MAPPED)
    assert origin_of("/x/site-packages/trainlib/metrics.py", roots) != "user"
    assert origin_of("/x/src/train.py", roots) == "user"
