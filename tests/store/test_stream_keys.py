"""Coding a batch's stream keys (store/format/streamkeys.py): the array fast path agrees with the
per-key path, codes index the keys in order of first appearance, and bad keys are typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from replaystore.errors import StreamKeyError
from replaystore.store.format.streamkeys import group_positions, per_record_keys, stream_codes

INT_KEYS = st.lists(st.integers(-5, 5), max_size=40)
STR_KEYS = st.lists(st.sampled_from(["a", "b", "ep-7", "é"]), max_size=40)


@given(st.one_of(INT_KEYS, STR_KEYS))
def test_codes_index_the_keys_in_order_of_first_appearance(keys: list) -> None:
    for stream in (keys, np.array(keys) if keys else keys):  # the array path and the per-key path
        codes, uniq = stream_codes(stream, len(keys))
        assert [uniq[c] for c in codes] == keys
        assert uniq == list(dict.fromkeys(keys))
        assert all(type(k) in (int, str) for k in uniq)  # plain Python keys, never numpy scalars
        assert codes.dtype == np.int32


@given(st.one_of(INT_KEYS, STR_KEYS))
def test_group_positions_partition_the_records_by_code(keys: list) -> None:
    codes, uniq = stream_codes(keys, len(keys))
    groups = group_positions(codes, len(uniq))
    assert len(groups) == len(uniq)
    assert sorted(int(i) for g in groups for i in g) == list(range(len(keys)))
    for code, pos in enumerate(groups):
        assert list(pos) == sorted(pos) and all(codes[i] == code for i in pos)


def test_one_key_for_every_record() -> None:
    codes, uniq = stream_codes(np.int64(7), 3)
    assert list(codes) == [0, 0, 0] and uniq == [7]
    assert per_record_keys("ep", 2) == ["ep", "ep"]


@pytest.mark.parametrize(("stream", "n", "expected"), [
    (True, 2, "bool"),
    (1.5, 2, "float"),
    (None, 2, "None"),
    ([1, 2], 3, "2"),
    ([1, None], 2, "NoneType"),
])
def test_bad_keys_name_the_field_and_what_was_expected(stream: object, n: int, expected: str) -> None:
    with pytest.raises(StreamKeyError, match="stream") as info:
        stream_codes(stream, n)
    assert expected in str(info.value)
