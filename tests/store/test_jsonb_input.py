"""The in-memory store reads a JSON document as a ``%s::jsonb`` parameter reaches PostgreSQL:
what psycopg or the server refuses, it refuses the same way (a ValueError in the client, or the
server's SQLSTATE); what the server takes, it decodes to the same value. Python's json module
alone accepts NaN, Infinity, lone surrogates and \\u0000, so without this the simulator (which
runs on the in-memory store) could never see a task's value break an outcome write."""

from __future__ import annotations

import json
import re

import pytest
from django.db import DataError, connection, transaction

from backwave.store.contract import StoreError
from backwave.testing.memory_store import jsonb_input

DOCUMENTS = {
    "plain": '{"v": "plain", "n": [1, 2.5, null, true]}',
    "surrogate pair": '"emoji \\ud83d\\ude00"',
    "raw astral character": '"emoji \U0001f600"',
    "lone high surrogate": '"\\ud800"',
    "lone low surrogate": '"\\udcff"',
    "high surrogate then a letter": '"\\ud800x"',
    "two high surrogates": '"\\ud800\\ud800"',
    "reversed pair": '"\\ude00\\ud83d"',
    "lone surrogate in a key": '{"\\udc80": 1}',
    "lone surrogate deep inside": '[{"a": ["ok", "\\udc80"]}]',
    "as the outcome batch carries a traceback": json.dumps([{"traceback": "cannot open caf\udce9.txt"}]),
    "NUL escape": '"a\\u0000b"',
    "escaped backslash before u0000": '"\\\\u0000"',
    "NaN": '{"v": NaN}',
    "Infinity": "[Infinity]",
    "-Infinity": "-Infinity",
    "raw lone surrogate": '"caf\udce9"',
    "not JSON": "{'v': 1}",
}


def postgresql_reads(document: str):
    """('ok', value), ('refused', SQLSTATE), or ('client', exception class) from the real server."""
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SELECT %s::jsonb::text", [document])
            return "ok", json.loads(cursor.fetchone()[0])
    except DataError as error:
        return "refused", error.__cause__.sqlstate
    except ValueError as error:
        return "client", type(error)


def memory_reads(document: str):
    try:
        return "ok", jsonb_input(document, "a_statement")
    except StoreError as error:
        return "refused", re.search(r"\[(\w{5})\]", str(error)).group(1)
    except ValueError as error:
        return "client", type(error)


@pytest.mark.django_db
@pytest.mark.parametrize("document", DOCUMENTS.values(), ids=DOCUMENTS.keys())
def test_the_memory_store_reads_a_document_as_postgresql_jsonb_does(document):
    assert memory_reads(document) == postgresql_reads(document)


def test_a_refusal_names_the_statement_and_the_sqlstate():
    with pytest.raises(StoreError, match=r"^write_outcomes_many failed \[22P02\]: invalid input syntax for type json"):
        jsonb_input('"\\ud800"', "write_outcomes_many")
    with pytest.raises(StoreError, match=r"^enqueue_many failed \[22P05\]: unsupported Unicode escape sequence"):
        jsonb_input('"\\u0000"', "enqueue_many")
