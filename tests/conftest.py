"""The whole suite's: what collection imported (torch, transformers, every pddflow module: about
300,000 objects) is frozen out of the garbage collector, whose full passes would otherwise scan
it again and again (0.13 s a pass here) while the tests make and drop their own objects."""

from __future__ import annotations

import gc


def pytest_collection_finish(session) -> None:
    gc.freeze()
