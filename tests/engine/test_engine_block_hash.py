import subprocess
import sys

import pytest

from pddflow.core.block_hash import chain_block_hashes, partial_block_hash


def test_only_full_blocks_are_hashed():
    assert chain_block_hashes(list(range(15)), 16) == []
    assert len(chain_block_hashes(list(range(16)), 16)) == 1
    assert len(chain_block_hashes(list(range(47)), 16)) == 2


def test_hashes_chain_on_the_prefix():
    a = chain_block_hashes([1] * 8 + [2] * 8, 8)
    b = chain_block_hashes([3] * 8 + [2] * 8, 8)
    assert a[1] != b[1], "the same block after a different prefix must hash differently"
    assert chain_block_hashes([1] * 8 + [2] * 8 + [5] * 3, 8) == a


def test_incremental_hashing_with_parent_matches_one_shot():
    tokens = list(range(100))
    whole = chain_block_hashes(tokens, 10)
    first = chain_block_hashes(tokens[:40], 10)
    rest = chain_block_hashes(tokens[40:], 10, parent=first[-1])
    assert first + rest == whole


def test_scheme_is_pinned():
    # blake2b(digest 8) over parent hash (8 bytes LE) + token IDs as int32 LE; a change here would
    # silently invalidate every router mirror and simulator trace built on the old scheme.
    import hashlib
    import struct

    expect = int.from_bytes(
        hashlib.blake2b(struct.pack("<4i", 1, 2, 3, 4), digest_size=8).digest(), "little"
    )
    h = chain_block_hashes([1, 2, 3, 4], 4)
    assert h == [expect]
    second = hashlib.blake2b(
        expect.to_bytes(8, "little") + struct.pack("<4i", 5, 6, 7, 8), digest_size=8
    )
    assert chain_block_hashes([1, 2, 3, 4, 5, 6, 7, 8], 4)[1] == int.from_bytes(
        second.digest(), "little"
    )


def test_partial_block_hash_differs_from_full():
    full = chain_block_hashes([1, 2, 3, 4], 4)[0]
    assert partial_block_hash([1, 2, 3]) != full
    assert partial_block_hash([9], parent=full) != partial_block_hash([9])


def test_bad_block_size():
    with pytest.raises(ValueError):
        chain_block_hashes([1, 2], 0)


def test_pure_python_modules_do_not_import_torch():
    code = (
        "import sys; import pddflow.core.block_hash, pddflow.operators.radix_cache, "
        "pddflow.operators.block_allocator, pddflow.core.model_config, pddflow.operators.sequence; "
        "print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
