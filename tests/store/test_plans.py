"""The claim's plan: served by the partial index backwave_job_claim, never a scan-and-sort.

A regression guard for the SQL shapes in queries.sql: with finished rows piling up and a backlog
of ready ones, each queue is read through an ordered index scan, so a claim costs about
``limit`` index tuples per queue however large the table grows. The claim's suspect (at most one)
and the check that its lease runs none yet are probes of their own small partial indexes.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
from django.db import connection, transaction

from backwave.store.queries import QUERIES, native_statement

pytestmark = pytest.mark.django_db(transaction=True)


def plan_nodes(node: dict):
    yield node
    for child in node.get("Plans", ()):
        yield from plan_nodes(child)


def run_under_a_lease(cursor, selection: str) -> uuid.UUID:
    """A new live lease, and the jobs ``SELECT id FROM backwave_job <selection>`` running under it."""
    lease_id = uuid.uuid4()
    cursor.execute(
        'INSERT INTO backwave_lease (id, worker_id, "group", hostname, pid, created_at, renewed_at, expires_at)'
        " VALUES (%s, 'w', 'g', 'h', 1, now(), now(), now() + interval '1 hour')",
        [lease_id],
    )
    cursor.execute(
        f"UPDATE backwave_job SET state = 'running', lease_id = %s, attempts = 1 WHERE id IN (SELECT id FROM backwave_job {selection})",
        [lease_id],
    )
    return lease_id


def insert_ready_jobs(cursor, count: int, *, payload: str = '{"args": [0], "kwargs": {}}') -> None:
    """``count`` ready jobs of one queue, "default", all due now, in one statement."""
    cursor.execute(
        """
        INSERT INTO backwave_job (task_path, queue, priority, payload, state, backend, tags, run_at,
                                  enqueued_at, attempts, max_attempts, backoff_base, backoff_max, worker_id)
        SELECT 't.t', 'default', 0, %s::jsonb, 'ready', 'default', '{}', now(), now(), 0, 1, 1, 3600, ''
        FROM generate_series(1, %s)
        """,
        [payload, count],
    )


@pytest.fixture
def backlog(transactional_db):
    """20,000 finished and 5,000 ready jobs over three queues, 300 of them running under 15 leases
    (the other pumps of a cluster), with fresh statistics."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO backwave_job (task_path, queue, priority, payload, state, backend, tags, run_at,
                                      enqueued_at, attempts, max_attempts, backoff_base, backoff_max, worker_id)
            SELECT 't.t', (ARRAY['default', 'emails', 'reports'])[1 + g % 3], g % 7 - 3, '{}',
                   CASE WHEN g <= 20000 THEN 'succeeded' ELSE 'ready' END, 'default', '{}',
                   now() - make_interval(secs => g), now(), 0, 1, 1, 3600, ''
            FROM generate_series(1, 25000) AS g
        """)
        for _ in range(15):
            run_under_a_lease(cursor, "WHERE state = 'ready' ORDER BY id DESC LIMIT 20")
        cursor.execute("ANALYZE backwave_job")


def _counts_running(node: dict) -> bool:
    """The heap side of a bitmap scan of backwave_job_running_queue (a limited queue's count)."""
    children = node.get("Plans", ())
    return (
        node["Node Type"] == "Bitmap Heap Scan"
        and bool(children)
        and all(c.get("Index Name") == "backwave_job_running_queue" for c in children)
    )


def explain(name: str, params: dict, *, generic: bool = False) -> list[dict]:
    """The plan of the named statement for ``params``; with ``generic``, the generic plan a
    prepared statement gets (the worker prepares its statements), which EXPLAIN with parameters
    never shows: it plans for the values given."""
    with connection.cursor() as cursor:
        if not generic:
            cursor.execute(f"EXPLAIN (FORMAT JSON) {QUERIES[name]}", params)
            (document,) = cursor.fetchone()
        else:
            text, names = native_statement(QUERIES[name])
            cursor.execute("SET plan_cache_mode = force_generic_plan")
            cursor.execute("PREPARE backwave_explained AS " + text.decode())
            try:
                placeholders = ", ".join(["%s"] * len(names))
                cursor.execute(f"EXPLAIN (FORMAT JSON) EXECUTE backwave_explained({placeholders})", [params[n] for n in names])
                (document,) = cursor.fetchone()
            finally:
                cursor.execute("DEALLOCATE backwave_explained")
                cursor.execute("RESET plan_cache_mode")
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    return list(plan_nodes(plan))


@pytest.mark.parametrize(
    ("name", "queue_params"),
    [("claim_jobs_one_queue", {"queue": "default"}), ("claim_jobs_many_queues", {"queues": ["default", "emails", "reports"]})],
)
def test_the_claim_reads_the_partial_index_in_order(backlog, name, queue_params):
    nodes = explain(name, {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 32, **queue_params})

    # Every read of backwave_job besides the UPDATE's primary-key lookups of the picked ids and
    # the count of a limited queue's running jobs (its own partial index, checked below): the
    # ordered scan, the suspect's probe, and the probe of this lease's running suspects.
    job_scans = [
        n
        for n in nodes
        if n.get("Relation Name") == "backwave_job"
        and "Scan" in n["Node Type"]
        and n.get("Index Name") not in ("backwave_job_pkey", "backwave_job_running_queue")
        and not _counts_running(n)
    ]
    assert sorted(str(n.get("Index Name")) for n in job_scans) == [
        "backwave_job_claim",
        "backwave_job_claim_suspect",
        "backwave_job_running_suspect",
    ], [(n["Node Type"], n.get("Index Name")) for n in job_scans]
    assert all(n["Node Type"] in ("Index Scan", "Index Only Scan") for n in job_scans), job_scans
    (lease_check,) = [n for n in job_scans if n["Index Name"] == "backwave_job_running_suspect"]
    assert "lease_id" in lease_check["Index Cond"]
    running_counts = [n for n in nodes if n.get("Index Name") == "backwave_job_running_queue"]
    assert running_counts and all("Only Scan" in n["Node Type"] or "Index Scan" in n["Node Type"] for n in running_counts)
    # The rows come out of the index already in claim order: no Sort sits under a LockRows.
    for lock in (n for n in nodes if n["Node Type"] == "LockRows"):
        assert all(n["Node Type"] != "Sort" for n in plan_nodes(lock)), lock


@pytest.mark.parametrize(
    ("name", "queue_params"),
    [
        ("claim_jobs_one_queue", {"queue": "default"}),
        ("claim_jobs_many_queues", {"queues": ["default", "emails"]}),
        ("admin_queue_latency", {"names": ["default"]}),
        ("unserved_queues", {}),
    ],
)
def test_the_search_indexes_can_serve_no_statement_that_does_not_search(backlog, name, queue_params):
    """The GIN search indexes must be out of reach of every statement that does not search:
    measured in the workflow benchmark, with statistics from an empty table, the claim read the
    tags index (its predicate, NOT state = 'running', was implied by state = 'ready', and its cost
    comes from a metapage only VACUUM updates, which said empty) as a bitmap over every row,
    then sorted them all: 10 ms a claim at 20,000 jobs, against 0.6 through the claim index.
    Statistics can always say that, so the test does not depend on them: with every other index
    of the table gone (inside a transaction rolled back) and sequential scans priced out, a
    statement that could use a search index would."""
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'backwave_job'"
                " AND indexname NOT IN ('backwave_job_pkey', 'backwave_job_payload', 'backwave_job_tags')"
            )
            for (index,) in cursor.fetchall():
                cursor.execute(f'DROP INDEX "{index}"')
            cursor.execute("SET LOCAL enable_seqscan = off")
        params = {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 32, **queue_params}
        nodes = explain(name, params)
        transaction.set_rollback(True)
    reads = {n.get("Index Name") for n in nodes} - {None}
    assert not reads & {"backwave_job_tags", "backwave_job_payload"}, reads


@pytest.fixture
def waiting_backlog(backlog):
    """The backlog plus 20,000 waiting dependents, each after one of the running jobs (a workflow
    mid-flight), with fresh statistics."""
    with connection.cursor() as cursor:
        cursor.execute("""
            WITH ancestors AS (SELECT array_agg(id) AS ids FROM backwave_job WHERE state = 'running'),
            waiting AS (
                INSERT INTO backwave_job (task_path, queue, priority, payload, state, waiting_on, backend, tags,
                                          run_at, enqueued_at, attempts, max_attempts, backoff_base, backoff_max, worker_id)
                SELECT 't.t', (ARRAY['default', 'emails', 'reports'])[1 + g % 3], 0, '{}', 'waiting', 1, 'default',
                       '{}', now() - interval '1 day', now(), 0, 1, 1, 3600, ''
                FROM generate_series(1, 20000) AS g
                RETURNING id
            )
            INSERT INTO backwave_dependency (job_id, ancestor_id, on_failure, position)
            SELECT w.id, a.ids[1 + w.id % array_length(a.ids, 1)], 'cancel', 1 FROM waiting AS w, ancestors AS a
        """)
        cursor.execute("ANALYZE backwave_job")
        cursor.execute("ANALYZE backwave_dependency")


def test_waiting_dependents_stay_out_of_the_claims_index_scan(waiting_backlog):
    """Waiting rows (due long ago, in the claimed queues) are not in backwave_job_claim: the claim
    still reads only that index, in order, whatever the workflows hold back."""
    nodes = explain("claim_jobs_one_queue", {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 32, "queue": "default"})
    scans = {n.get("Index Name") for n in nodes if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]}
    assert "backwave_job_claim" in scans
    assert all(n["Node Type"] != "Seq Scan" for n in nodes), [(n["Node Type"], n.get("Relation Name")) for n in nodes]


def test_settling_dependents_reads_the_dependency_index(waiting_backlog):
    """The outcome statement finds the dependents of the jobs it ends through the ancestor
    index, never a scan of the dependency table."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT id, lease_id FROM backwave_job WHERE state = 'running' ORDER BY id LIMIT 32")
        running = cursor.fetchall()
    outcomes = json.dumps(
        [
            {
                "job_id": job_id,
                "attempt": 1,
                "kind": "succeeded",
                "retry_delay": 0,
                "boxed": {"v": None},
                "error_class": "",
                "traceback": "",
                "duration": 0,
                "progress": None,
                "metadata": None,
                "output": None,
                "tag_add": None,
                "tag_remove": None,
            }
            for job_id, _ in running
        ]
    )
    nodes = explain("write_outcomes_many", {"lease_id": running[0][1], "outcomes": outcomes, "observed": "[]"})
    dependency_reads = [n for n in nodes if n.get("Relation Name") == "backwave_dependency"]
    assert dependency_reads and all(n["Node Type"] != "Seq Scan" for n in dependency_reads), [
        (n["Node Type"], n.get("Index Name")) for n in dependency_reads
    ]
    # Each read is an index scan, or a bitmap heap scan over one: of the ancestor index.
    # (the job_pkey probes are the dependents' states, read per dependency row found)
    used = {n.get("Index Name") for read in dependency_reads for n in plan_nodes(read) if n.get("Index Name")}
    assert "backwave_dependency_ancestor" in used and used <= {"backwave_dependency_ancestor", "backwave_job_pkey"}, used
    assert all(not (n.get("Relation Name") == "backwave_job" and n["Node Type"] == "Seq Scan") for n in nodes)


CHAIN_LINKS = 3000


@pytest.fixture(params=["analyzed empty", "analyzed full"])
def chain_mid_flight(request, transactional_db):
    """A chain of 3,000 jobs as the workflow benchmark enqueues it (each waits on the one
    before), its head running under a lease: analyzed while the table was empty (the benchmark
    vacuums and analyzes it between runs, and the chain is enqueued after), or afresh."""
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE backwave_job")
        cursor.execute("VACUUM ANALYZE backwave_dependency")
        cursor.execute(
            """
            WITH links AS (
                INSERT INTO backwave_job (task_path, queue, priority, payload, state, waiting_on, backend, tags,
                                          run_at, enqueued_at, attempts, max_attempts, backoff_base, backoff_max, worker_id)
                SELECT 't.t', 'default', 0, '{}', CASE WHEN g = 1 THEN 'ready' ELSE 'waiting' END,
                       CASE WHEN g = 1 THEN 0 ELSE 1 END, 'default', '{}', now(), now(), 0, 1, 1, 3600, ''
                FROM generate_series(1, %s) AS g
                RETURNING id
            ), ordered AS (SELECT id, lag(id) OVER (ORDER BY id) AS before FROM links)
            INSERT INTO backwave_dependency (job_id, ancestor_id, on_failure, position)
            SELECT id, before, 'cancel', 0 FROM ordered WHERE before IS NOT NULL
        """,
            [CHAIN_LINKS],
        )
        cursor.execute(
            "UPDATE backwave_job SET has_dependents = true WHERE state IN ('ready', 'waiting') AND id < (SELECT max(id) FROM backwave_job)"
        )
        if request.param == "analyzed full":
            cursor.execute("ANALYZE backwave_job")
            cursor.execute("ANALYZE backwave_dependency")
        run_under_a_lease(cursor, "WHERE state = 'ready'")


@pytest.mark.parametrize("plan_cache_mode", ["custom", "generic"])
def test_a_chain_links_outcome_releases_the_next_by_its_primary_key(chain_mid_flight, plan_cache_mode):
    """The write that applies a link's success and readies the next link finds that dependent by
    one primary-key probe. Joined to the dependents found, with statistics taken before the chain
    was enqueued, the release walked the whole primary key (an index scan with no condition,
    filtering every job by its state): 1.4 ms a link at 3,000 links in the workflow benchmark,
    growing with the chain, so a chain of 10,000 drained at 11-13% of as many independent jobs."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_id, id, attempts FROM backwave_job WHERE state = 'running'")
        ((lease_id, job_id, attempt),) = cursor.fetchall()
    outcome = {
        "job_id": job_id,
        "attempt": attempt,
        "kind": "succeeded",
        "retry_delay": 0.0,
        "boxed": {"v": None},
        "error_class": "",
        "traceback": "",
        "duration": 0.001,
    }
    nodes = explain(
        "write_outcomes_many",
        {"lease_id": lease_id, "outcomes": json.dumps([outcome]), "observed": "[]"},
        generic=plan_cache_mode == "generic",
    )
    job_reads = [n for n in nodes if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]]
    walks = [
        (n["Node Type"], n.get("Index Name"), n.get("Filter"))
        for n in job_reads
        if not n.get("Index Cond") and not n["Node Type"].startswith("Bitmap")
    ]
    assert job_reads and not walks, walks
    assert {n.get("Index Name") for n in job_reads} <= {"backwave_job_pkey"}, [
        (n["Node Type"], n.get("Index Name")) for n in job_reads
    ]


WAITING_HELD_INDEX = "backwave_job_waiting_held"


def test_the_queue_overview_counts_waiting_and_held_jobs_through_their_own_index(waiting_backlog):
    """20,000 waiting dependents (a tenth of them held): their counts per queue, and the search
    for the queues that have any, read the partial index of waiting and held rows; without it
    each would read the whole table, once per queue (no other index holds those rows)."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE backwave_job SET state = 'held' WHERE state = 'waiting' AND id % 10 = 0")
        cursor.execute("ANALYZE backwave_job")
    nodes = explain("admin_queue_overview", {"names": ["default"], "limit": 10_001})
    job_scans = [
        n for n in nodes if n.get("Relation Name") == "backwave_job" or n.get("Index Name", "").startswith("backwave_job")
    ]
    assert not [n for n in job_scans if n["Node Type"] == "Seq Scan"], [(n["Node Type"], n.get("Index Name")) for n in job_scans]
    waiting_reads = [
        n
        for n in job_scans
        if "waiting" in n.get("Index Cond", "") + n.get("Filter", "") or "held" in n.get("Index Cond", "") + n.get("Filter", "")
    ]
    assert waiting_reads and {n.get("Index Name") for n in waiting_reads} == {WAITING_HELD_INDEX}, [
        (n["Node Type"], n.get("Index Name"), n.get("Index Cond")) for n in waiting_reads
    ]


def _failing_outcomes_of_one_lease() -> dict:
    """write_outcomes_many's parameters: every job running under one of the backlog's leases
    failed for good (so the statement settles their dependents)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_id, id, attempts FROM backwave_job WHERE state = 'running' ORDER BY lease_id, id")
        rows = cursor.fetchall()
    outcomes = [
        {
            "job_id": job_id,
            "attempt": attempt,
            "kind": "failed",
            "retry_delay": 0.0,
            "boxed": None,
            "error_class": "x.E",
            "traceback": "",
            "duration": 0.001,
        }
        for lease, job_id, attempt in rows
        if lease == rows[0][0]
    ]
    return {"lease_id": rows[0][0], "outcomes": json.dumps(outcomes), "observed": "[]"}


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("claim_jobs_one_queue", {"queue": "default"}),
        ("claim_jobs_many_queues", {"queues": ["default", "emails"]}),
        ("claim_jobs_admitted", {"queues": ["default", "emails"]}),
        ("admin_queue_latency", {"names": ["default"]}),
        ("has_due_jobs", {"queues": ["default"]}),
        ("unserved_queues", {}),
        ("write_outcomes_many", None),
    ],
)
def test_the_waiting_and_held_index_can_serve_no_statement_but_the_overview(backlog, name, params):
    """No claim can read it: "state = 'ready'" does not imply state IN ('waiting', 'held'). The
    settling of dependents says "j.state IN ('waiting', 'held')" of the rows it updates by id,
    which does; with that predicate alone, and statistics that said no row was waiting, the
    outcome write read the whole index instead of probing the primary key. Its second conjunct
    (queue <> '') is stated by the overview alone. As for the search indexes: with every other
    index of the table gone (inside a transaction rolled back) and sequential scans priced out,
    a statement that could read it would."""
    params = (
        _failing_outcomes_of_one_lease()
        if params is None
        else {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 32, **params}
    )
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'backwave_job' AND indexname NOT IN ('backwave_job_pkey', %s)",
                [WAITING_HELD_INDEX],
            )
            for (index,) in cursor.fetchall():
                cursor.execute(f'DROP INDEX "{index}"')
            cursor.execute("SET LOCAL enable_seqscan = off")
        nodes = explain(name, params)
        transaction.set_rollback(True)
    assert WAITING_HELD_INDEX not in {n.get("Index Name") for n in nodes}


# ---- the statistics rollup and the dashboard's reads ---------------------------------------------


@pytest.fixture
def attempts(backlog):
    """An attempt per finished job, one in twenty failing, with fresh statistics."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO backwave_attempt (job_id, number, state, worker_id, started_at, finished_at, error_class, traceback)
            SELECT j.id, 1, CASE WHEN j.id % 20 = 0 THEN 'failed' ELSE 'succeeded' END, 'w', now() - interval '1 second', now(), '', ''
            FROM backwave_job AS j WHERE j.state = 'succeeded'
        """)
        cursor.execute("ANALYZE backwave_attempt")


def index_names(nodes) -> set[str]:
    return {node.get("Index Name") for node in nodes} - {None}


def test_a_rollup_page_walks_the_attempts_primary_key_from_the_watermark(attempts):
    from backwave import taskstats

    nodes = explain("roll_up_task_stats", {"limit": 5000, "settle": 300.0, **taskstats.SQL_PARAMS})
    scans = [node for node in nodes if node.get("Relation Name") == "backwave_attempt"]
    assert scans and all(node["Node Type"] == "Index Scan" and node["Index Name"] == "backwave_attempt_pkey" for node in scans), (
        scans
    )
    assert all("id >" in node.get("Index Cond", "") for node in scans), (
        "the scan starts at the watermark, not at the first attempt"
    )
    assert not any(
        node["Node Type"] == "Seq Scan" and node.get("Relation Name") in ("backwave_attempt", "backwave_job") for node in nodes
    )


def test_recent_failures_read_the_failing_attempts_index_backwards(attempts):
    nodes = explain("admin_recent_failures", {"limit": 10})
    scan = next(node for node in nodes if node.get("Relation Name") == "backwave_attempt")
    assert (scan["Node Type"], scan["Index Name"], scan["Scan Direction"]) == (
        "Index Scan",
        "backwave_attempt_failing",
        "Backward",
    )


def test_queue_latency_probes_the_claim_index_once_per_priority(backlog):
    nodes = explain("admin_queue_latency", {"names": ["default", "emails", "reports"]})
    job_scans = [node for node in nodes if node.get("Relation Name") == "backwave_job"]
    assert job_scans and {node["Index Name"] for node in job_scans} == {"backwave_job_claim"}
    assert all(node["Node Type"] in ("Index Scan", "Index Only Scan") for node in job_scans)


def test_unserved_queues_probe_the_claim_index_once_per_queue_and_priority(backlog):
    """Its distinct queues come from a loose scan of the claim index, never a read of the backlog."""
    nodes = explain("unserved_queues", {})
    job_scans = [node for node in nodes if node.get("Relation Name") == "backwave_job"]
    assert job_scans and {node["Index Name"] for node in job_scans} == {"backwave_job_claim"}, [
        (n["Node Type"], n.get("Index Name")) for n in job_scans
    ]
    assert all(node["Node Type"] in ("Index Scan", "Index Only Scan") for node in job_scans)


def test_the_charts_live_tail_starts_at_the_watermark(attempts):
    """Measured at 1,000,000 attempts: joined from a CTE the bound was a filter, and the scan read
    every attempt (1.5 s); as an InitPlan it is the scan's start (5 ms)."""
    nodes = explain("admin_stats_series", {"seconds": 3600, "resolution": 60, "tail": 50_000})
    (scan,) = [node for node in nodes if node.get("Relation Name") == "backwave_attempt"]
    # An InitPlan's value ("$n", or "(InitPlan n).col1" on newer servers), fixed before the scan
    # starts: a bound joined in from the CTE can be planned as a per-row filter (as at a million
    # rows), whatever this small table gets.
    assert scan["Index Name"] == "backwave_attempt_pkey" and re.search(
        r"id > (\$\d|\(InitPlan \d+\))", scan.get("Index Cond", "")
    ), scan


@pytest.fixture
def queue_analyzed_idle(transactional_db):
    """10,000 ready jobs analyzed before anything ran (every lease_id NULL), as the throughput
    benchmark leaves them, then 16 claimed under one lease: the planner expects the fence's
    "lease_id = ..." to match about one row, and on a table this small a plan that filters the
    whole table by it first looks cheap."""
    with connection.cursor() as cursor:
        insert_ready_jobs(cursor, 10000)
        cursor.execute("ANALYZE backwave_job")
        run_under_a_lease(cursor, "ORDER BY id LIMIT 16")


@pytest.mark.parametrize("statement", ["write_outcomes_many", "write_outcomes_plain"])
@pytest.mark.parametrize("plan_cache_mode", ["custom", "generic"])
@pytest.mark.parametrize("statistics", ["backlog", "queue_analyzed_idle"])
def test_the_outcome_write_finds_each_job_by_its_primary_key(statistics, plan_cache_mode, statement, request):
    """The write's fence names the lease and the running state, which the partial indexes on
    running rows also do; those hold a dead entry for every job finished since the last VACUUM,
    so reading them would make every write walk a run's whole history. One primary-key probe per
    outcome, and nothing else read from the job table (the settling of dependents reads theirs
    by primary key too: one probe per dependency row found, none here, where nothing waits).
    Measured in the throughput benchmark with idle statistics: a hash join over a sequential
    scan of the job table, 2.96 ms a batch of 16 at 10,000 rows against 0.69 ms by probes. The
    worker's statements are prepared, so the generic plan must hold as well as the custom one."""
    request.getfixturevalue(statistics)
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_id, id, attempts FROM backwave_job WHERE state = 'running' ORDER BY lease_id, id LIMIT 16")
        rows = cursor.fetchall()
    lease_id = rows[0][0]
    outcomes = [
        {
            "job_id": job_id,
            "attempt": attempt,
            "kind": "succeeded",
            "retry_delay": 0.0,
            "boxed": {"v": 1},
            "error_class": "",
            "traceback": "",
            "duration": 0.001,
        }
        for lease, job_id, attempt in rows
        if lease == lease_id
    ]
    nodes = explain(
        statement,
        {"lease_id": lease_id, "outcomes": json.dumps(outcomes), "observed": "[]"},
        generic=plan_cache_mode == "generic",
    )

    job_reads = [n for n in nodes if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]]
    assert {(n["Node Type"], n.get("Index Name")) for n in job_reads} == {("Index Scan", "backwave_job_pkey")}, job_reads
    # The fence's probes: the batch's ids, as one array, through the primary key.
    assert re.fullmatch(r"\(id = ANY \((\$\d+|\(InitPlan \d+\)\.col1)\)\)", job_reads[0]["Index Cond"]), job_reads[0][
        "Index Cond"
    ]


def test_the_heartbeat_reads_only_its_own_leases_running_jobs(backlog):
    """The heartbeat runs on every pump every few seconds with 25,000 rows about: its cancels and
    its progress writes reach the lease's jobs through backwave_job_running_lease (or by primary
    key), never a scan of the table."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT lease_id FROM backwave_job WHERE state = 'running' LIMIT 1")
        (lease_id,) = cursor.fetchone()
    progress = json.dumps([{"job_id": 1, "attempt": 1, "progress": 5, "metadata": None}])
    nodes = explain("heartbeat", {"lease_id": lease_id, "duration": 60.0, "progress": progress})
    job_scans = [n for n in nodes if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]]
    assert job_scans, nodes
    assert all(n.get("Index Name") in ("backwave_job_running_lease", "backwave_job_pkey") for n in job_scans), [
        (n["Node Type"], n.get("Index Name")) for n in job_scans
    ]
    assert all(n["Node Type"] != "Seq Scan" for n in nodes if n.get("Relation Name") == "backwave_job")


@pytest.fixture
def transitions_backlog(transactional_db):
    """50,000 transitions, 49,000 of them dead or due later (a backlog the loop must not scan)."""
    with connection.cursor() as cursor:
        cursor.execute("""
            INSERT INTO backwave_transition (job_id, attempt, kind, task_path, queue, occurred_at, state, deliveries,
                                             next_attempt_at, delivered_to, failed_observer, last_error)
            SELECT g, 1, 'succeeded', 't.t', 'default', now(), CASE WHEN g % 2 = 0 THEN 'dead' ELSE 'pending' END, 1,
                   CASE WHEN g <= 1000 THEN now() - interval '1 second' ELSE now() + interval '1 hour' END, '{}', '', ''
            FROM generate_series(1, 50000) AS g
        """)
        cursor.execute("ANALYZE backwave_transition")


def test_the_observer_loops_claim_reads_the_due_index_in_order(transitions_backlog):
    nodes = explain(
        "claim_transitions",
        {
            "token": uuid.uuid4(),
            "limit": 32,
            "lease": 60.0,
            "registered": ["app.watch"],
            "deliverer": "host:1:default",
            "hostname": "host",
            "pid": 1,
        },
    )
    scans = [n for n in nodes if n.get("Relation Name") == "backwave_transition" and "Scan" in n["Node Type"]]
    assert [n["Node Type"] for n in scans] == ["Index Scan", "Index Scan"], scans  # the pick, then the UPDATE by id
    assert [n["Index Name"] for n in scans] == ["backwave_transition_due", "backwave_transition_pkey"]
    assert not [n for n in nodes if n["Node Type"] == "Sort"]


def _job_reads_of_a_write(observed: str) -> int:
    """Run write_outcomes_many under EXPLAIN ANALYZE for the 20 jobs of one of the backlog's
    leases: how many plan nodes read backwave_job at least once."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT lease_id, id, attempts FROM backwave_job WHERE state = 'running' AND lease_id = "
            "(SELECT lease_id FROM backwave_job WHERE state = 'running' LIMIT 1)"
        )
        running = cursor.fetchall()
        outcomes = json.dumps(
            [
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "kind": "succeeded",
                    "retry_delay": 0,
                    "boxed": {"v": None},
                    "error_class": "",
                    "traceback": "",
                    "duration": 0.001,
                }
                for _, job_id, attempt in running
            ]
        )
        cursor.execute(
            f"EXPLAIN (ANALYZE, FORMAT JSON) {QUERIES['write_outcomes_many']}",
            {"lease_id": running[0][0], "outcomes": outcomes, "observed": observed},
        )
        (document,) = cursor.fetchone()
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    return sum(1 for n in plan_nodes(plan) if n.get("Relation Name") == "backwave_job" and n.get("Actual Loops", 0) > 0)


def test_an_outcome_write_with_nothing_observed_never_reads_for_transitions(backlog):
    """The "noted" CTE's gate is a one-time filter: with no observer its probe of the job table
    never runs; with one it is one more (primary-key) read for the batch."""
    quiet = _job_reads_of_a_write("[]")
    watched = _job_reads_of_a_write(json.dumps([{"kind": "succeeded", "task_path": None, "queue": None}]))
    assert watched == quiet + 1
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM backwave_transition")
        assert cursor.fetchone() == (20,)  # the second write's 20 outcomes, noted


@pytest.fixture
def keyed_backlog(backlog):
    """The backlog, each job under one of 100 limit keys, the running ones too; "default" under
    a per-key concurrency limit, a rate limit and a per-key rate limit."""
    with connection.cursor() as cursor:
        cursor.execute("UPDATE backwave_job SET limit_key = 'customer-' || (id % 100) WHERE state IN ('ready', 'running')")
        cursor.execute(
            "INSERT INTO backwave_queue (name, paused, updated_at, key_concurrency_limit, rate_limit, key_rate_limit, rate_period, rate_window_used)"
            " VALUES ('default', false, now(), 2, 1000, 10, 1, 0)"
        )
        # Key windows of many queues (the table holds every queue's active keys).
        cursor.execute(
            "INSERT INTO backwave_key_rate_window (queue, limit_key, window_start, used)"
            " SELECT 'q' || (g % 50), 'customer-' || g, date_trunc('second', now()), 1 FROM generate_series(1, 20000) AS g"
        )
        cursor.execute("ANALYZE backwave_job")
        cursor.execute("ANALYZE backwave_key_rate_window")


@pytest.mark.parametrize("queues", [["default"], ["default", "emails", "reports"]])
def test_the_admitted_claim_reads_indexes_only(keyed_backlog, queues):
    nodes = explain("claim_jobs_admitted", {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 32, "queues": queues})
    job_scans = [n for n in nodes if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]]
    # Running rows (a limited queue's count, the keys at their limit) may be read through a bitmap
    # of their small partial indexes; everything else is a plain index scan.
    bitmaps = [n for n in job_scans if n["Node Type"] == "Bitmap Heap Scan"]
    assert all(
        c.get("Index Name") in ("backwave_job_running_queue", "backwave_job_running_key") for b in bitmaps for c in b["Plans"]
    ), bitmaps
    job_scans = [n for n in job_scans if n not in bitmaps] + [c for b in bitmaps for c in b["Plans"]]
    assert all(n["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan") for n in job_scans), [
        (n["Node Type"], n.get("Index Name")) for n in job_scans
    ]
    used = {n.get("Index Name") for n in job_scans}
    # The ordered claim scan, and the per-key counts from the partial index of running keyed jobs.
    assert {"backwave_job_claim", "backwave_job_running_key"} <= used, used
    assert used <= {
        "backwave_job_claim",
        "backwave_job_claim_suspect",
        "backwave_job_running_suspect",
        "backwave_job_running_key",
        "backwave_job_running_queue",
        "backwave_job_pkey",
    }, used
    for lock in (n for n in nodes if n["Node Type"] == "LockRows"):
        assert all(n["Node Type"] != "Sort" for n in plan_nodes(lock)), lock
    # The per-key rate windows are read by key or by this window, never scanned whole.
    windows = [n for n in nodes if n.get("Relation Name") == "backwave_key_rate_window" and "Scan" in n["Node Type"]]
    assert windows and all(n["Node Type"] != "Seq Scan" for n in windows), [
        (n["Node Type"], n.get("Index Name")) for n in windows
    ]


def test_a_unique_enqueue_is_arbitrated_by_the_partial_unique_index(transactional_db):
    jobs = json.dumps(
        [
            {
                "task_path": "t.t",
                "payload": {"args": [], "kwargs": {}},
                "queue": "default",
                "priority": 0,
                "max_attempts": 1,
                "backoff_base": 1,
                "backoff_max": 1,
                "backend": "default",
                "tags": [],
                "unique_key": "k",
                "unique_states": ["ready"],
                "unique_replace": [],
            }
        ]
    )
    nodes = explain("enqueue_unique_many", {"jobs": jobs, "hint": False})
    (insert,) = [n for n in nodes if n.get("Operation") == "Insert"]
    # DO NOTHING: a duplicate locks no row (see test_application_locks.py).
    assert insert["Conflict Resolution"] == "NOTHING"
    assert insert["Conflict Arbiter Indexes"] == ["backwave_job_unique_key"]
    # The job holding a key is read by that index, not by a scan.
    reads = [n for n in nodes if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]]
    assert reads and all(n.get("Index Name") in ("backwave_job_unique_key", "backwave_job_pkey") for n in reads), [
        (n["Node Type"], n.get("Index Name")) for n in reads
    ]


@pytest.fixture
def claim_index_outgrown(transactional_db):
    """A queue that held 20,000 ready jobs, all since run and purged, then VACUUM: the heap shrinks
    back to a few pages, the claim index keeps every page it grew to (an index never shrinks),
    and 20 jobs are ready now, analyzed. The planner charges an index scan for the pages of the
    whole index against its few live entries: a bloated claim index looked dearer than a
    sequential scan and a sort of the whole table, on every claim (a chain drained at 6% of its
    baseline in the workflow benchmark, each claim 2.4 ms)."""
    with connection.cursor() as cursor:
        insert_ready_jobs(cursor, 20000, payload="{}")
        cursor.execute("UPDATE backwave_job SET state = 'succeeded'")
        cursor.execute("DELETE FROM backwave_job")
        cursor.execute("VACUUM backwave_job")
        insert_ready_jobs(cursor, 20, payload="{}")
        cursor.execute("ANALYZE backwave_job")
        cursor.execute("SELECT relpages FROM pg_class WHERE relname IN ('backwave_job', 'backwave_job_claim') ORDER BY relname")
        heap_pages, index_pages = (row[0] for row in cursor.fetchall())
        assert index_pages > 10 * heap_pages  # the shape this fixture is for


def test_the_claim_reads_its_index_however_large_the_index_grew(claim_index_outgrown):
    """Under the worker's transaction settings (set_transaction_settings heads every round-trip)."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            QUERIES["set_transaction_settings"], {"statement_timeout": None, "lock_timeout": None, "synchronous_commit": None}
        )
        nodes = explain(
            "claim_jobs_one_queue", {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 16, "queue": "default"}, generic=True
        )
    job_scans = [
        (n["Node Type"], n.get("Index Name"))
        for n in nodes
        if n.get("Relation Name") == "backwave_job" and "Scan" in n["Node Type"]
    ]
    assert ("Index Scan", "backwave_job_claim") in job_scans and not any(kind == "Seq Scan" for kind, _ in job_scans), job_scans


@pytest.fixture
def emptied_then_refilled(transactional_db):
    """A queue drained, purged and vacuumed but for two rows at the end of the table, so that
    VACUUM cannot give its pages back: the statistics say two rows on every page the table grew
    to. Then a burst of 2,000 ready jobs, not yet analyzed. The state the workflow benchmark
    leaves between runs (two jobs of another queue), and a production queue's after a quiet
    night: a worker that starts now builds its generic plans from "two rows"."""
    with connection.cursor() as cursor:
        insert_ready_jobs(cursor, 3000)
        cursor.execute("DELETE FROM backwave_job WHERE id < (SELECT max(id) - 1 FROM backwave_job)")
        cursor.execute("VACUUM ANALYZE backwave_job")
        insert_ready_jobs(cursor, 2000)
        cursor.execute("SELECT relpages, reltuples FROM pg_class WHERE relname = 'backwave_job'")
        pages, rows = cursor.fetchone()
        assert rows == 2 and pages > 20  # the shape this fixture is for


@pytest.mark.parametrize(
    ("name", "queue_params"),
    [
        ("claim_jobs_one_queue", {"queue": "default"}),
        ("claim_jobs_many_queues", {"queues": ["default", "emails"]}),
        ("claim_jobs_admitted", {"queues": ["default"]}),
    ],
)
def test_the_claim_finds_its_picked_rows_by_their_ids_whatever_the_statistics_say(emptied_then_refilled, name, queue_params):
    """The claim's UPDATE reaches each picked row through the primary key by its id. Joined to
    the picked rows instead, with statistics of two rows both sides look like one row or two,
    and the generic plan walked the whole primary key once per claim, filtering every row
    against the picked ids (13.5 ms for a claim of 16 among 3,000 rows, "Rows Removed by Join
    Filter: 48016", in the workflow benchmark's baseline, seen by auto_explain). Which join a
    given set of statistics gets is the planner's call; an array of ids leaves it none."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            QUERIES["set_transaction_settings"], {"statement_timeout": None, "lock_timeout": None, "synchronous_commit": None}
        )
        nodes = explain(name, {"lease_id": uuid.uuid4(), "worker_id": "w", "limit": 16, **queue_params}, generic=True)
    (update,) = [n for n in nodes if n["Node Type"] == "ModifyTable" and n.get("Relation Name") == "backwave_job"]
    (target,) = [n for n in update["Plans"] if n["Parent Relationship"] == "Outer"]
    if target["Node Type"] == "Bitmap Heap Scan":
        (target,) = target["Plans"]  # its bitmap: the probes themselves
    assert (target["Node Type"], target.get("Index Name")) in {
        ("Index Scan", "backwave_job_pkey"),
        ("Bitmap Index Scan", "backwave_job_pkey"),
    }, (target["Node Type"], target.get("Index Name"))
    assert re.fullmatch(r"\(id = ANY \((\$\d+|\(InitPlan \d+\)\.col1)\)\)", target["Index Cond"]), target["Index Cond"]
