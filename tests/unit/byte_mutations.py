"""Byte-level edits of an encoded file, for the decoders' fuzz tests: a hypothesis strategy of
one edit and the function that applies a list of them."""

from __future__ import annotations

from hypothesis import strategies as st

MUTATION = st.tuples(st.sampled_from(["flip", "set", "insert", "delete", "truncate"]),
                     st.integers(0, 10 ** 6), st.integers(0, 255))


def mutate(blob: bytes, ops) -> bytes:
    """``blob`` with each (op, where, byte) edit applied in turn (``where`` wraps around)."""
    b = bytearray(blob)
    for op, where, byte in ops:
        i = where % (len(b) + 1)
        if op == "insert":
            b.insert(i, byte)
        elif op == "truncate":
            del b[i:]
        elif i < len(b):
            if op == "flip":
                b[i] ^= 1 << (byte % 8)
            elif op == "set":
                b[i] = byte
            else:
                del b[i]
    return bytes(b)
