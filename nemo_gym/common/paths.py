"""Path containment: a name that comes from a user, a file or the network becomes a path only inside its folder.

`resolve_inside(base, name)` is the one check every such call site uses (run ids, dataset file names from a
registry, checkpoint tags read from `latest_step`, viewer files, server folders, template names). It resolves
symlinks (`Path.resolve`) before comparing (`Path.is_relative_to`), so `..`, an absolute path elsewhere and a
symlink that points out of `base` are all refused, and a name that stays inside is returned resolved.
"""

from __future__ import annotations

import os
from pathlib import Path

from nemo_gym.common.errors import NemoGymError

__all__ = ["PathEscapeError", "resolve_inside", "check_name"]


class PathEscapeError(NemoGymError, ValueError):
    """A user-, file- or network-supplied path points outside the folder it must stay in."""


def resolve_inside(base: str | os.PathLike[str], name: str | os.PathLike[str], *, what: str = "path") -> Path:
    """`base / name` resolved (symlinks followed), after checking that it stays inside `base`.

    `name` may be relative (the usual case) or absolute (accepted only when it lies inside `base`). The result
    may be `base` itself (e.g. `name` is `.`). Whether the path exists is not checked.

    Raises:
        PathEscapeError: `name` is empty or holds a NUL byte, or the resolved path is outside the resolved `base`
            (`..` components, an absolute path elsewhere, a symlink whose target is outside). The message names
            `what` and the offending value.
    """
    text = os.fspath(name)
    if not text or "\0" in text:
        raise PathEscapeError(f"{what} {text!r} is empty or contains a NUL byte")
    root = Path(base).resolve()
    target = (root / text).resolve()
    if not target.is_relative_to(root):
        raise PathEscapeError(
            f"{what} {text!r} points outside {root} (to {target}); only names inside that folder are accepted"
        )
    return target


def check_name(name: str, *, what: str = "name") -> str:
    """`name` if it is a single path component (no separator, not `.` or `..`, no NUL byte), for ids and tags.

    Raises:
        PathEscapeError: it is not one plain path component.
    """
    if not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name or os.sep in name:
        raise PathEscapeError(f"{what} {name!r} is not a plain name (no '/', '\\', '..', '.' or NUL byte allowed)")
    return name
