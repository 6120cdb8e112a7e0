"""A deployment's run directory: the worker logs, the wiring file (it holds the deployment's
token), the TLS keys; private (0700), marked with its deployer so a later deployer can remove the
ones whose deployer died, and left with its secrets removed when kept (--run-dir)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

RUN_DIR_PREFIX = "pddflow-run-"  # default run directories: the temp dir's pddflow-run-*
OWNER_FILE = "deployer"  # in a default run directory: "PID START_TICKS" of the deployer owning it
WIRING_FILE = "wiring.json"


def private_file(path: Path) -> None:
    """An empty file at path only its owner can read and write (0600), before anything secret is
    written into it; whatever was there is replaced."""
    path.unlink(missing_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _start_ticks(pid: int) -> int | None:
    """When the process started (clock ticks since boot; Linux), so a reused PID is told apart."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _owner_alive(run_dir: Path) -> bool | None:
    """Whether the deployer that made run_dir still runs; None when it has no readable marker
    (not ours to judge: another tool's, or one being created right now)."""
    try:
        pid_s, start_s = (run_dir / OWNER_FILE).read_text().split()
        pid, start = int(pid_s), int(start_s)
    except (OSError, ValueError):
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # someone else's process: the PID was reused, unless the start time says otherwise
    now = _start_ticks(pid)
    return now is None or start == 0 or now == start  # 0: its start time was unknown


def clean_stale_run_dirs(parent: Path) -> list[Path]:
    """Remove the default run directories under parent whose deployer has gone (killed with
    SIGKILL, or the machine lost power); returns them."""
    removed = []
    for d in sorted(parent.glob(f"{RUN_DIR_PREFIX}*")):
        try:
            st = d.lstat()
        except OSError:
            continue
        if not d.is_dir() or d.is_symlink() or st.st_uid != os.getuid():
            continue
        if _owner_alive(d) is False:
            shutil.rmtree(d, ignore_errors=True)
            removed.append(d)
    return removed


def make_run_dir(keep: str | None, parent: Path | None = None) -> Path:
    """keep (--run-dir), made 0700 if it is new; else a fresh 0700 directory under parent (the
    temp dir), marked with this process as its owner, after removing stale ones."""
    if keep:
        p = Path(keep)
        p.mkdir(mode=0o700, parents=True, exist_ok=True)
        return p
    parent = Path(parent or tempfile.gettempdir())
    clean_stale_run_dirs(parent)
    p = Path(tempfile.mkdtemp(prefix=RUN_DIR_PREFIX, dir=parent))  # 0700
    me = os.getpid()
    tmp = p / f".{OWNER_FILE}.tmp"
    tmp.write_text(f"{me} {_start_ticks(me) or 0}\n")
    tmp.rename(p / OWNER_FILE)  # whole or absent: a half-written marker is never judged
    return p


def remove_run_dir(path: Path, kept: bool) -> None:
    """The whole directory, or for a kept one (--run-dir) only its secrets: the wiring file (the
    bearer token) and the TLS keys (the ray backend's CA key too)."""
    if not kept:
        shutil.rmtree(path, ignore_errors=True)
        return
    for secret in (path / WIRING_FILE, path / "tls" / "key.pem", path / "tls" / "ca-key.pem"):
        secret.unlink(missing_ok=True)


def remove_disk_tiers(plan, wiring) -> None:
    """The disk-tier arenas of every instance whose graph does not ask them to persist."""
    for op in plan.operators.values():
        if op.disk_cache is None or op.disk_cache.persist:
            continue
        for inst in op.instances:
            shutil.rmtree(wiring.disk_cache_dir(op, inst), ignore_errors=True)
    if wiring.cache_dir:
        with contextlib.suppress(OSError):  # the default tiers' parent, once empty
            Path(wiring.cache_dir).rmdir()
