"""Pack the t2t checkout that the TPU workers install (code and configs/, no build junk)."""
from __future__ import annotations

import os
import pathlib
import subprocess
import tarfile
from typing import List, Optional

from t2t.launch.gcloud import LaunchError

_SKIP_DIRS = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", "runs", "build", "dist",
              ".jax_cache"}


def default_checkout() -> Optional[pathlib.Path]:
    """The checkout this t2t runs from (an editable install), or None for a wheel."""
    root = pathlib.Path(__file__).resolve().parents[2]
    return root if (root / "pyproject.toml").is_file() and (root / "configs").is_dir() else None


def files(root: pathlib.Path) -> List[str]:
    """Paths (relative to `root`) to ship: git's tracked and unignored files in a git
    checkout, else every file outside build, cache and run directories."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "-co", "--exclude-standard",
                              "-z"], capture_output=True, check=True).stdout
        names = [n for n in out.decode().split("\0") if n]
        return sorted(n for n in names if (root / n).is_file())
    except (OSError, subprocess.CalledProcessError):
        found = []
        for top, dirs, names in os.walk(root):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.endswith(".egg-info"))
            found += [os.path.relpath(os.path.join(top, n), root) for n in names]
        return sorted(found)


def check(root: Optional[pathlib.Path]) -> None:
    """A LaunchError unless `root` is a checkout to install from."""
    if root is None:
        raise LaunchError("t2t is not running from a checkout: pass --source=PATH_TO_T2T_CLONE")
    if not (pathlib.Path(root) / "pyproject.toml").is_file():
        raise LaunchError(f"--source {root}: not a t2t checkout (no pyproject.toml); pass the "
                          "directory of your t2t clone")


def pack(root: pathlib.Path, archive: pathlib.Path) -> pathlib.Path:
    """Write `root`'s files into the gzipped tar `archive` (paths relative to `root`)."""
    check(root)
    root = pathlib.Path(root)
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:gz") as tar:
        for name in files(root):
            tar.add(root / name, arcname=name, recursive=False)
    return archive
