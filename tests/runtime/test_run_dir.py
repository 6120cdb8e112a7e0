"""The deployment's run directory: private (0700, the wiring file 0600: it holds the bearer token),
marked with its deployer, and removed later if that deployer died without cleaning up."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from pddflow.runtime.deploy.run_dir import (
    OWNER_FILE,
    RUN_DIR_PREFIX,
    WIRING_FILE,
    clean_stale_run_dirs,
    make_run_dir,
    private_file,
    remove_run_dir,
)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _stale(parent: Path, name: str, marker: str | None) -> Path:
    d = parent / f"{RUN_DIR_PREFIX}{name}"
    d.mkdir()
    (d / "prefill-0.log").write_text("old log")
    if marker is not None:
        (d / OWNER_FILE).write_text(marker)
    return d


def _my_start_ticks() -> int:
    return int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])


def test_default_run_dir_is_private_and_marked(tmp_path):
    rd = make_run_dir(None, parent=tmp_path)
    assert rd.parent == tmp_path and rd.name.startswith(RUN_DIR_PREFIX)
    assert _mode(rd) == 0o700
    pid, start = (rd / OWNER_FILE).read_text().split()
    assert int(pid) == os.getpid() and int(start) == _my_start_ticks()
    wiring = rd / WIRING_FILE
    wiring.write_text("old, readable by all")
    wiring.chmod(0o644)
    private_file(wiring)  # what the backend does before writing the token into it
    assert _mode(wiring) == 0o600 and wiring.read_text() == ""
    remove_run_dir(rd, kept=False)
    assert not rd.exists()


def test_stale_run_dirs_of_dead_deployers_are_removed(tmp_path):
    dead = _stale(tmp_path, "dead", f"{_dead_pid()} 1234\n")
    # a live PID whose start time differs: the deployer died and its PID was reused
    reused = _stale(tmp_path, "reused", f"{os.getpid()} {_my_start_ticks() + 1}\n")
    alive = _stale(tmp_path, "alive", f"{os.getpid()} {_my_start_ticks()}\n")
    unmarked = _stale(tmp_path, "unmarked", None)  # another tool's, or one being created
    garbled = _stale(tmp_path, "garbled", "12")
    other = tmp_path / "someone-else"
    other.mkdir()
    assert clean_stale_run_dirs(tmp_path) == [dead, reused]
    assert not dead.exists() and not reused.exists()
    assert alive.exists() and unmarked.exists() and garbled.exists() and other.exists()
    # a new deployment cleans up before making its own
    dead2 = _stale(tmp_path, "dead2", f"{_dead_pid()} 99\n")
    rd = make_run_dir(None, parent=tmp_path)
    assert not dead2.exists() and rd.exists() and alive.exists()


def test_kept_run_dir_is_never_removed_only_its_secrets(tmp_path):
    keep = tmp_path / f"{RUN_DIR_PREFIX}mine"  # even named like a default one
    rd = make_run_dir(str(keep))
    assert rd == keep and _mode(rd) == 0o700 and not (rd / OWNER_FILE).exists()
    (rd / WIRING_FILE).write_text("{}")
    (rd / "tls").mkdir()
    (rd / "tls" / "key.pem").write_text("private")
    (rd / "tls" / "cert.pem").write_text("public")
    (rd / "main-0.log").write_text("log")
    remove_run_dir(rd, kept=True)
    assert sorted(p.relative_to(rd).as_posix() for p in rd.rglob("*")) == [
        "main-0.log",
        "tls",
        "tls/cert.pem",
    ]
    assert clean_stale_run_dirs(tmp_path) == [] and rd.exists()  # no marker: never judged stale
    existing = tmp_path / "existing"
    existing.mkdir(mode=0o755)
    existing.chmod(0o755)
    assert _mode(make_run_dir(str(existing))) == 0o755  # the user's directory keeps its mode
