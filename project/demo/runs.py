"""A demo run in a URL: the ids of the jobs one form post enqueued, compact and signed.

Ids from one enqueue are mostly consecutive, so they travel as ranges ("101-600,605"), which
keeps a 1,000-job run short. The signature stops anyone from reading arbitrary jobs through
the results page by editing the URL.
"""

from django.core import signing

MAX_RUN_SIZE = 1000
_signer = signing.Signer(salt="project.demo.run")


def encode_ids(ids):
    """Sorted ids as ranges: [1, 2, 3, 7] -> "1-3,7"."""
    parts = []
    ordered = sorted(set(ids))
    start = previous = None
    for job_id in ordered:
        if previous is not None and job_id == previous + 1:
            previous = job_id
            continue
        if start is not None:
            parts.append(_range(start, previous))
        start = previous = job_id
    if start is not None:
        parts.append(_range(start, previous))
    return ",".join(parts)


def decode_ids(text):
    """Inverse of encode_ids; ValueError on anything malformed or longer than MAX_RUN_SIZE."""
    ids = []
    for part in text.split(","):
        first, _, last = part.partition("-")
        first = int(first)
        last = int(last) if last else first
        if first <= 0 or last < first or len(ids) + (last - first + 1) > MAX_RUN_SIZE:
            raise ValueError(f"bad run range {part!r}")
        ids.extend(range(first, last + 1))
    return ids


def run_token(ids):
    """The signed, URL-safe token naming a run."""
    return _signer.sign(encode_ids(ids))


def ids_from_token(token):
    """The job ids of a token; ValueError when it was not signed here or is malformed."""
    try:
        return decode_ids(_signer.unsign(token))
    except signing.BadSignature as exc:
        raise ValueError("bad run token") from exc


def _range(first, last):
    return str(first) if first == last else f"{first}-{last}"
