"""The compact, signed job-id list that names a demo run in its URL."""

import pytest

from project.demo.runs import MAX_RUN_SIZE, decode_ids, encode_ids, ids_from_token, run_token


@pytest.mark.parametrize(
    ("ids", "text"), [([7], "7"), ([1, 2, 3], "1-3"), ([5, 1, 2, 3, 9, 10], "1-3,5,9-10"), (list(range(101, 1101)), "101-1100")]
)
def test_ids_travel_as_ranges(ids, text):
    assert encode_ids(ids) == text
    assert decode_ids(text) == sorted(ids)


@pytest.mark.parametrize("text", ["", "x", "3-1", "0-4", "-2", "1-2-3", f"1-{MAX_RUN_SIZE + 1}", "1-600,700-1200"])
def test_malformed_or_oversized_ranges_are_refused(text):
    with pytest.raises(ValueError):
        decode_ids(text)


def test_token_round_trips_and_refuses_tampering():
    token = run_token([10, 11, 12])
    assert ids_from_token(token) == [10, 11, 12]
    tampered = token.replace("10-12", "1-12", 1)
    with pytest.raises(ValueError):
        ids_from_token(tampered)
