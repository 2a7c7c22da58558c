"""Acks of generated keys: the check of a whole batch at once (generated_ids)
names the same messages as checking each key (generated_id, PROTOCOL §3 Keys)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from ppmq.core.settlement import ID_DIGITS, generated_id, generated_ids

ID_LIMIT = 10 ** (ID_DIGITS - 1)

# Keys that name no message, or not the one their digits suggest.
ODD_KEYS = ["0", "00", "007", "+5", " 5", "5 ", "1_000", "-3", "٣", "", "x", "1,2", ",0", "²", str(ID_LIMIT), str(ID_LIMIT - 1)]


@st.composite
def batches(draw: st.DrawFn) -> list[str]:
    """A run of generated keys, in order or shuffled (a batch comes by priority),
    sometimes spoiled at one place."""
    first = draw(st.one_of(st.integers(1, 10**6), st.integers(ID_LIMIT - 50, ID_LIMIT + 5)))
    keys = [str(m) for m in range(first, first + draw(st.integers(0, 120)))]
    if draw(st.booleans()):
        keys = draw(st.permutations(keys))
    if keys and draw(st.booleans()):
        keys[draw(st.integers(0, len(keys) - 1))] = draw(st.sampled_from(ODD_KEYS + ["9", keys[0]]))
    return keys


@settings(max_examples=400)
@given(batches())
def test_a_batch_names_what_its_keys_name_one_by_one(keys: list[str]) -> None:
    assert generated_ids(keys) == [generated_id(key) for key in keys]


def test_a_batch_of_good_keys_is_their_ids() -> None:
    assert generated_ids(["41", "44", "42"]) == [41, 44, 42]
    assert generated_ids(["41", "043", "42"]) == [41, None, 42]
    assert generated_ids(["5", "", "7"]) == [5, None, 7]
    assert generated_ids(["5", "1,2"]) == [5, None]
    assert generated_ids([]) == []


def test_a_key_names_an_id_only_in_its_canonical_spelling() -> None:
    assert [generated_id(key) for key in ODD_KEYS] == [None] * (len(ODD_KEYS) - 1) + [ID_LIMIT - 1]
    assert generated_id("17") == 17
