"""A process's start-up without the cyclic garbage collector: importing torch and building an
engine allocate hundreds of thousands of objects that live as long as the process, so the
collector's passes during start-up scan them and free nothing. After start-up what it made is
frozen (`gc.freeze`): later passes, while the process serves, skip it too (vLLM's engine core
and SGLang's scheduler do the same). docs/runtime.md has the measurement."""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def starting() -> Iterator[None]:
    """The collector off for the block; on again after it, with what the block made frozen."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if was:
            gc.enable()
