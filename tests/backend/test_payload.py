"""encode_payload: only plain JSON goes in, so the worker decodes exactly what the caller passed."""

from datetime import datetime
from decimal import Decimal

import pytest
from django.tasks.exceptions import InvalidTask

from backwave.tasking.payload import encode_payload, json_problem

from . import sample_tasks


def encode(args=(), kwargs=None, max_bytes=1024 * 1024):
    return encode_payload(sample_tasks.add, args, kwargs or {}, max_bytes=max_bytes)


def test_plain_json_passes_and_tuples_become_lists():
    payload = encode((1, "x", [2, (3, 4)]), {"flag": True, "none": None, "f": 1.5, "d": {"k": [1]}})
    assert payload == {"args": [1, "x", [2, (3, 4)]], "kwargs": {"flag": True, "none": None, "f": 1.5, "d": {"k": [1]}}}


@pytest.mark.parametrize(
    ("args", "kwargs", "where"),
    [
        (({1, 2},), {}, r"payload\['args'\]\[0\] is a set"),
        ((), {"when": datetime(2030, 1, 1)}, r"payload\['kwargs'\]\['when'\] is a datetime.datetime"),
        ((object(),), {}, r"payload\['args'\]\[0\] is a object"),
        ((Decimal("1.5"),), {}, r"is a decimal.Decimal"),
        ((b"bytes",), {}, r"is a bytes"),
        ((float("nan"),), {}, r"payload\['args'\]\[0\] is nan, which JSON cannot represent"),
        (({1: "a"},), {}, r"has the key 1 \(int\); JSON object keys must be strings"),
        (("a\x00b",), {}, r"contains a NUL character"),
        (([1, [2, {"deep": {3}}]],), {}, r"payload\['args'\]\[0\]\[1\]\[1\]\['deep'\] is a set"),
    ],
)
def test_non_json_arguments_raise_naming_where_and_what(args, kwargs, where):
    with pytest.raises(InvalidTask, match=r"Arguments of task 'tests.backend.sample_tasks.add' must be plain JSON") as excinfo:
        encode(args, kwargs)
    assert excinfo.match(where)


def test_self_referencing_arguments_raise():
    loop = []
    loop.append(loop)
    with pytest.raises(InvalidTask, match="refer to themselves"):
        encode((loop,))


def test_args_and_kwargs_must_have_the_right_shape():
    with pytest.raises(InvalidTask, match="args .* must be a list or tuple, got str"):
        encode_payload(sample_tasks.add, "ab", {}, max_bytes=100)
    with pytest.raises(InvalidTask, match="kwargs .* must be a dict, got list"):
        encode_payload(sample_tasks.add, (), [("a", 1)], max_bytes=100)


def test_size_limit_names_the_size_and_the_limit():
    encode(("x" * 72,), max_bytes=100)  # {"args": ["xxx..."], "kwargs": {}} is 100 bytes
    with pytest.raises(InvalidTask, match=r"encode to 101 bytes of JSON; the limit is 100 \(MAX_PAYLOAD_BYTES\)"):
        encode(("x" * 73,), max_bytes=100)


def test_json_problem_is_none_for_good_values():
    assert json_problem({"a": [1, 2.5, None, True, "s"]}, "x") is None


def test_a_backslash_u0000_text_is_not_mistaken_for_a_nul():
    assert encode(("\\u0000",)) == {"args": ["\\u0000"], "kwargs": {}}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "opening"),
    [
        ((datetime(2030, 1, 1),), "Unsupported type: <class 'datetime.datetime'>. "),
        (({1, 2},), "Unsupported type: <class 'set'>. "),
        ((float("nan"),), ""),  # a value, not a type: BackWave's sentence alone
    ],
)
def test_non_json_arguments_raise_a_type_error_as_in_django(args, opening):
    # Django's contract raises TypeError ("Unsupported type: ...") for arguments JSON cannot hold;
    # BackWave's error is that TypeError and still an InvalidTask, with the path to the value.
    from backwave.models import Job

    with pytest.raises(TypeError) as excinfo:
        sample_tasks.add.enqueue(*args)
    assert isinstance(excinfo.value, InvalidTask)
    assert str(excinfo.value).startswith(f"{opening}Arguments of task 'tests.backend.sample_tasks.add' must be plain JSON")
    assert "payload['args'][0]" in str(excinfo.value)
    assert not Job.objects.exists()
