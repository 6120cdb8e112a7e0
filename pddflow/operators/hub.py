"""Model references to local checkpoint directories: a local path as given, a Hub id through
`huggingface_hub` (its cache, `HF_HUB_CACHE`, `HF_TOKEN` and `HF_HUB_OFFLINE` apply). Resolved once
by whoever starts the model (deploy, generate), so workers only ever read a local directory."""

from __future__ import annotations

from pathlib import Path

from pddflow.core.model_config import ModelSpecError
from pddflow.core.model_ref import is_builtin, is_hub_id

# what the loader reads: config, tokenizer, chat template, generation config and the weights; never
# pickled checkpoints or the `original/` consolidated files some repositories carry too
HUB_FILES = ["*.json", "*.safetensors", "*.jinja"]


def resolve_model(spec: str) -> str:
    """`builtin:<name>` unchanged; an existing path as an absolute path; an `owner/name` Hub id as
    the local snapshot directory (downloaded unless cached); anything else a ModelSpecError."""
    spec = str(spec)
    if is_builtin(spec):
        return spec
    path = Path(spec).expanduser()
    if path.exists():
        return str(path.resolve())
    if not is_hub_id(spec):
        raise ModelSpecError(
            f"model {spec!r} is neither builtin:<name>, an existing checkpoint directory, "
            "nor a Hugging Face Hub id (owner/name)"
        )
    return str(_snapshot(spec))


def _snapshot(repo_id: str) -> Path:
    try:
        from huggingface_hub import constants, snapshot_download
    except ImportError:  # a dependency; only a broken install lacks it
        raise ModelSpecError(
            f"model {repo_id!r} looks like a Hub id but huggingface_hub is not installed"
        ) from None
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_FILES))
    except Exception as exc:  # hub errors span network, auth, offline and missing-repo types
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        where = f"cache {constants.HF_HUB_CACHE}"
        if constants.HF_HUB_OFFLINE:
            raise ModelSpecError(
                f"model {repo_id!r} is not a local directory and is not in the Hugging Face "
                f"{where} (HF_HUB_OFFLINE is set, so nothing is downloaded)"
            ) from None
        raise ModelSpecError(
            f"model {repo_id!r} is not a local directory and could not be fetched from the "
            f"Hugging Face Hub ({type(exc).__name__}: {why}); {where}"
        ) from None
