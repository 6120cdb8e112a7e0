"""Hub ids resolve through huggingface_hub's cache, offline too, with nothing downloaded: the cache
is prepared here in the Hub's own layout (refs/main -> snapshots/<commit>/files)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pddflow.core.model_config import ModelSpecError
from pddflow.core.model_ref import is_hub_id
from pddflow.operators.hub import resolve_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _cache_repo(cache: Path, repo_id: str, files: Path | dict[str, str]) -> Path:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snap = repo / "snapshots" / COMMIT
    snap.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    if isinstance(files, Path):
        for f in files.iterdir():
            shutil.copy(f, snap / f.name)
    else:
        for name, text in files.items():
            (snap / name).write_text(text)
    return snap


@pytest.fixture
def offline_cache(tmp_path, monkeypatch):
    """huggingface_hub reads HF_HUB_CACHE / HF_HUB_OFFLINE at import: patch its constants."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return cache


def test_hub_ids_are_told_from_paths():
    assert is_hub_id("Qwen/Qwen3-0.6B") and is_hub_id("mistralai/Mistral-7B-v0.3")
    for spec in ("/abs/dir", "./rel", "../up/x", "a/b/c", "dir", "builtin:tiny-llama", "a/.."):
        assert not is_hub_id(spec), spec


def test_cached_hub_id_resolves_offline(offline_cache):
    snap = _cache_repo(offline_cache, "acme/tiny", {"config.json": "{}"})
    assert Path(resolve_model("acme/tiny")).resolve() == snap.resolve()


def test_missing_hub_id_offline_is_a_clear_error(offline_cache):
    with pytest.raises(ModelSpecError) as err:
        resolve_model("acme/absent")
    msg = str(err.value)
    assert "'acme/absent'" in msg and "HF_HUB_OFFLINE" in msg and str(offline_cache) in msg


def test_local_directory_wins_over_hub_id(tmp_path, monkeypatch, offline_cache):
    (tmp_path / "acme" / "tiny").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("acme/tiny") == str((tmp_path / "acme" / "tiny").resolve())


def test_neither_path_nor_hub_id():
    with pytest.raises(ModelSpecError, match="neither builtin:<name>"):
        resolve_model("/no/such/dir")


@pytest.mark.slow  # builds a checkpoint, two CLI runs
def test_generate_from_hub_cache_equals_local_directory(tiny_mistral_dir, tmp_path):
    cache = tmp_path / "hub"
    _cache_repo(cache, "acme/tiny-mistral", tiny_mistral_dir)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    cli = [sys.executable, "-m", "pddflow.cli", "generate", "--prompt", "Hello there"]
    args = ["--max-tokens", "8", "--json"]

    def run(model: str) -> dict:
        out = subprocess.run(
            [*cli, "--model", model, *args], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout)

    assert run("acme/tiny-mistral") == run(str(tiny_mistral_dir))
    missing = subprocess.run(
        [*cli, "--model", "acme/absent", *args], env=env, capture_output=True, text=True
    )
    assert missing.returncode == 2
    assert "HF_HUB_OFFLINE" in missing.stderr and "Traceback" not in missing.stderr
