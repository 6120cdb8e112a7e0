"""What a model reference (`model.weights`, `--model`) names, decided without touching disk or
network: shared by the graph compiler (which resolves relative paths) and the model loader."""

from __future__ import annotations

import re

# `owner/name` as the Hugging Face Hub spells repository ids; a path that exists wins over an id.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_builtin(spec: str) -> bool:
    return spec.startswith("builtin:")


def is_hub_id(spec: str) -> bool:
    """True for `owner/name` (no `..`, no trailing `.git`): a candidate Hub repository id."""
    return bool(_HUB_ID.match(spec)) and ".." not in spec and not spec.endswith(".git")
