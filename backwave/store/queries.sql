-- BackWave's hot-path SQL, one named block per Storage Contract operation.
--
-- Loaded once at import by backwave/store/queries.py: a block runs from its "-- name:" line to
-- the next one; whole-line comments are stripped before the text is sent. Parameters are
-- psycopg's named placeholders.
--
-- Locking order, the same in every statement, so these statements cannot deadlock one another:
--   1. the lease row first (FOR KEY SHARE by claims and fenced writes, FOR UPDATE or DELETE by
--      expiry and release);
--   2. job rows after.
-- Expiry takes leases with SKIP LOCKED, so it never waits behind a claim or a write in flight;
-- the heartbeat's UPDATE of the lease is a no-key update, which FOR KEY SHARE does not block.
--
-- Every timestamp is the database's now(): no host clock is ever passed in.


-- name: set_transaction_settings
-- The head of every round-trip of a PostgresStore, in the same implicit transaction as the
-- operation's statements (one pipeline, one Sync). set_config(..., is_local => true) is SET
-- LOCAL: the value ends with the transaction, so it never outlives it on a connection that a
-- pooler hands to another client. A NULL leaves that setting alone (set_config would reset it
-- to the session's default). Fixed calls rather than unnest() over arrays: this runs on every
-- round-trip, and the arrays cost more to send and plan than the settings themselves.
SELECT CASE WHEN %(statement_timeout)s::text IS NOT NULL
            THEN set_config('statement_timeout', %(statement_timeout)s::text, true) END,
       CASE WHEN %(lock_timeout)s::text IS NOT NULL
            THEN set_config('lock_timeout', %(lock_timeout)s::text, true) END,
       CASE WHEN %(synchronous_commit)s::text IS NOT NULL
            THEN set_config('synchronous_commit', %(synchronous_commit)s::text, true) END,
       -- JIT off: these are short statements, and a plan whose estimate passes jit_above_cost
       -- (the outcome write's settling CTEs beside a wide fan-in) would spend about half a
       -- second compiling itself on every execution.
       set_config('jit', 'off', true),
       -- Generic plans: every statement here is written so that its plan does not depend on
       -- its parameters' values (ids as arrays, states behind sub-selects), and each is
       -- prepared. Left to choose, PostgreSQL kept planning the outcome write and the claim
       -- afresh on every call whenever the statistics made a custom plan look cheaper (1.2 ms
       -- and 0.65 ms of planning a call, measured with statistics from an empty table).
       set_config('plan_cache_mode', 'force_generic_plan', true),
       -- No sequential scan where an index can serve: every statement here reads the job table
       -- through an index by design, and an index never shrinks. After a backlog is drained
       -- and purged, the claim index keeps every page it grew to while the heap shrinks back;
       -- the planner charges an index scan for those pages against the few live entries, and
       -- chose a scan and sort of the whole table on every claim instead (a chain drained at 6%
       -- of its baseline, 2.4 ms a claim). A table no index serves is still scanned.
       set_config('enable_seqscan', 'off', true)


-- name: open_lease
INSERT INTO backwave_lease (id, worker_id, "group", hostname, pid, created_at, renewed_at, expires_at)
VALUES (%(lease_id)s, %(worker_id)s, %(group)s, %(hostname)s, %(pid)s,
        now(), now(), now() + make_interval(secs => %(duration)s))


-- name: renew_lease
-- "expires_at > now()": a lease that already lapsed is not revived, even before maintenance
-- has deleted it. The fence has refused its writes since the moment it lapsed, and the driver
-- has been told those jobs are lost; reviving the lease would leave them running under a live
-- lease that no one works for.
UPDATE backwave_lease
SET renewed_at = now(), expires_at = now() + make_interval(secs => %(duration)s)
WHERE id = %(lease_id)s AND expires_at > now()
RETURNING id


-- name: heartbeat
-- renew_lease, plus what rides on the heartbeat (never a statement per job): the progress and
-- metadata the pump's handlers reported since the last one, and the cancels requested of jobs
-- running under the lease (the safety net under the NOTIFY that cancel_jobs sends).
-- Locking order as everywhere: the lease row first. "(SELECT count(*) FROM renewed) > 0" is an
-- InitPlan, so the lease UPDATE finishes before "reported" touches a job row, and a lease that
-- lapsed writes nothing (its jobs are maintenance's). The job rows are fenced like outcomes
-- (this lease, still running, this attempt). The cancels are read through the partial index
-- backwave_job_running_lease: one probe of the lease's running jobs.
-- The renewal never waits for a job row: an application's transaction may hold a running job's
-- row for as long as it stays open (an enqueue after= it, a cancel, a select_for_update()), and
-- a lease must not lapse for that. The reports' rows are locked with SKIP LOCKED ("reportable"),
-- and the reports of the rows passed over come back as "busy" (their job ids), for the pump to
-- send again with the next heartbeat. The cancels are a plain read, which no lock stops.
WITH renewed AS MATERIALIZED (
    UPDATE backwave_lease
    SET renewed_at = now(), expires_at = now() + make_interval(secs => %(duration)s)
    WHERE id = %(lease_id)s AND expires_at > now()
    RETURNING id
), report AS MATERIALIZED (
    SELECT p.job_id, p.attempt, p.progress, p.metadata
    FROM jsonb_to_recordset(%(progress)s::jsonb) AS p(job_id bigint, attempt int, progress jsonb, metadata jsonb)
    WHERE (SELECT count(*) FROM renewed) > 0
), fenced AS MATERIALIZED (
    SELECT j.id
    FROM backwave_job AS j
    WHERE j.id = ANY(ARRAY(SELECT r.job_id FROM report AS r))
      AND j.lease_id = %(lease_id)s AND j.state = 'running'
      AND EXISTS (SELECT FROM report AS r WHERE r.job_id = j.id AND r.attempt = j.attempts)
), reportable AS MATERIALIZED (
    SELECT j.id
    FROM backwave_job AS j
    WHERE j.id = ANY(ARRAY(SELECT f.id FROM fenced AS f))
    FOR NO KEY UPDATE SKIP LOCKED
), reported AS (
    UPDATE backwave_job AS j
    SET progress = coalesce(r.progress, j.progress),
        metadata = coalesce(r.metadata, j.metadata)
    FROM report AS r
    WHERE j.id = r.job_id AND j.attempts = r.attempt
      AND j.id = ANY(ARRAY(SELECT k.id FROM reportable AS k))
      AND j.lease_id = %(lease_id)s AND j.state = 'running'
    RETURNING j.id
)
SELECT (SELECT count(*) FROM renewed) > 0 AS held,
       (SELECT jsonb_object_agg(j.id::text, j.cancel_requested_by)
        FROM backwave_job AS j
        WHERE j.lease_id = %(lease_id)s AND j.state = 'running' AND j.cancel_requested_at IS NOT NULL
          AND (SELECT count(*) FROM renewed) > 0) AS cancels,
       (SELECT count(*) FROM reported) AS reported,
       ARRAY(SELECT f.id FROM fenced AS f WHERE f.id NOT IN (SELECT k.id FROM reportable AS k) ORDER BY f.id) AS busy


-- name: release_lease
-- The lease row is locked first, before any job row: "(SELECT count(*) FROM lease_row) >= 0"
-- is always true, but as an InitPlan it makes the lock come before "running" scans a job. That
-- keeps the locking order of expire_leases (lease, then jobs), so a release racing an expiry of
-- the same lease waits instead of deadlocking, and then finds the jobs already handed back.
-- Jobs are released even when the lease row is already gone. A job row another transaction
-- holds (an application's, open for as long as it likes) is not waited for: passed over
-- (SKIP LOCKED), it keeps the lease, which is made lapsed instead of deleted, and lease expiry
-- gives it back once it can (see expire_leases).
WITH lease_row AS MATERIALIZED (
    SELECT id FROM backwave_lease WHERE id = %(lease_id)s FOR UPDATE
), running AS MATERIALIZED (
    SELECT j.id FROM backwave_job AS j
    WHERE j.lease_id = %(lease_id)s AND j.state = 'running'
      AND (SELECT count(*) FROM lease_row) >= 0
), taken AS MATERIALIZED (
    SELECT j.id FROM backwave_job AS j
    WHERE j.id = ANY(ARRAY(SELECT r.id FROM running AS r))
      AND j.lease_id = %(lease_id)s AND j.state = 'running'
    FOR NO KEY UPDATE SKIP LOCKED
), gone AS (
    DELETE FROM backwave_lease
    WHERE id = %(lease_id)s
      AND NOT EXISTS (SELECT FROM running AS r WHERE r.id NOT IN (SELECT t.id FROM taken AS t))
), lapsed AS (
    UPDATE backwave_lease SET expires_at = least(expires_at, now())
    WHERE id = %(lease_id)s
      AND EXISTS (SELECT FROM running AS r WHERE r.id NOT IN (SELECT t.id FROM taken AS t))
), released AS (
    UPDATE backwave_job AS j
    SET state = 'ready',
        lease_id = NULL,
        run_at = now(),
        attempts = greatest(j.attempts - 1, 0),
        started_at = CASE WHEN j.attempts <= 1 THEN NULL ELSE j.started_at END
    WHERE j.id = ANY(ARRAY(SELECT t.id FROM taken AS t))
    RETURNING j.id
)
SELECT id FROM released ORDER BY id


-- name: claimed_jobs
-- Not a statement: the claims' shared CTE ({{claimed_jobs}}), after a CTE "picked"(id) of the
-- rows each locked. It claims them under the lease and returns what the driver needs (the limit
-- key for the admitted claim's debits; the other claims do not read it). The picked ids come
-- as one array, as the outcome write's do, so the UPDATE is a primary-key probe per id whatever
-- the statistics say: joined to "picked" instead, a generic plan built while the statistics
-- counted two rows (a drained, vacuumed table refilled since) walked the whole primary key on
-- every claim and filtered each row against the picked ids.
claimed AS (
    UPDATE backwave_job AS j
    SET state = 'running',
        lease_id = %(lease_id)s,
        worker_id = %(worker_id)s,
        attempts = j.attempts + 1,
        last_attempted_at = now(),
        started_at = coalesce(j.started_at, now())
    WHERE j.id = ANY (ARRAY(SELECT p.id FROM picked AS p))
    RETURNING j.id, j.task_path, j.queue, j.priority, j.payload, j.attempts, j.max_attempts,
              j.backoff_base, j.backoff_max, j.backend, j.enqueued_at, j.started_at,
              j.last_attempted_at, j.run_at, j.forgiven_attempts, j.suspect, j.trace_context, j.timeout,
              j.cancel_requested_at, j.cancel_requested_by, j.limit_key, j.has_dependents
)


-- name: claimed_rows
-- Not a statement: the claims' final SELECT ({{claimed_rows}}), over "claimed". RETURNING
-- order is unspecified, so it puts the batch back in claim order; it lists who ran the job's
-- earlier attempts (one probe of the attempt table's unique (job_id, number) index per job, none
-- for a first attempt).
SELECT c.id, c.task_path, c.queue, c.priority, c.payload, c.attempts, c.max_attempts,
       c.backoff_base, c.backoff_max, c.backend, c.enqueued_at, c.started_at,
       c.last_attempted_at,
       CASE WHEN c.attempts > 1  -- a first attempt has no history: skip the lookup
            THEN ARRAY(SELECT a.worker_id FROM backwave_attempt AS a
                       WHERE a.job_id = c.id ORDER BY a.number) END AS previous_worker_ids,
       c.forgiven_attempts, c.suspect, c.trace_context, c.timeout,
       -- A cancel requested while an earlier attempt ran (its worker died, or gave it back):
       -- the driver cancels it instead of running it.
       CASE WHEN c.cancel_requested_at IS NOT NULL THEN c.cancel_requested_by END,
       -- The store writes the outcome of a job nobody waited for without settling (see
       -- write_outcomes_plain).
       c.has_dependents
FROM claimed AS c
ORDER BY c.priority DESC, c.run_at, c.id


-- name: claim_jobs_one_queue
-- One queue. "queue = %(queue)s" pins the leading column of the partial index
-- backwave_job_claim (queue, priority DESC, run_at, id) WHERE state = 'ready', so an ordered
-- index scan yields rows already in claim order; "run_at <= now()" is checked on index tuples.
-- The plan is Limit -> LockRows -> Index Scan: it stops after `limit` rows it could lock, and a
-- row another claimer holds is skipped and replaced by the next one, never waited for.
--
-- Suspects (jobs whose last attempt lapsed with its worker and that had no outcome since, see
-- expire_leases): a claim takes at most one, and none while its lease already runs one, so no
-- two suspects ever share a pump and a worker that dies again convicts the one it ran. The
-- suspect comes from its own partial index (backwave_job_claim_suspect: usually empty, one
-- probe); the other rows from the ordered scan, "NOT j.suspect" checked before their LIMIT, so
-- suspects waiting their turn never hold back a job that may run. The two picks are merged in
-- claim order and cut to the room: a suspect keeps its place in line, and one that falls behind
-- the batch is not taken (it stays locked only until this statement commits). "Its lease runs
-- one" is a probe of backwave_job_running_suspect; a pump's claims run one after another on its
-- connection, so each sees the suspect the one before took.
--
-- The lease CTE is an uncorrelated EXISTS, so it runs once as an InitPlan before any job row is
-- touched: claiming under a lease that lapsed or is gone claims nothing (otherwise its jobs
-- would run under a lease no maintenance run can ever expire). FOR KEY SHARE holds the lease row
-- until the claim commits, so expiry (FOR UPDATE SKIP LOCKED) cannot delete it in between.
--
-- The CTE fences the LIMIT: as a MATERIALIZED CTE the pick runs exactly once and locks at most
-- `limit` rows (plus the one suspect). Written inline as "UPDATE ... WHERE id IN (SELECT ...
-- LIMIT ...)", the planner may flatten or re-execute the sub-select, locking and updating more
-- rows than asked for.
--
-- FOR NO KEY UPDATE, not FOR UPDATE: the claim changes no key column, and the weaker lock does
-- not conflict with the FOR KEY SHARE that foreign-key checks (backwave_attempt.job_id) take on
-- the job row. The UPDATE that follows needs no stronger lock either.
--
-- RETURNING order is unspecified, so the outer SELECT puts the batch back in claim order. It
-- also lists who ran the job's earlier attempts (one probe of the attempt table's unique
-- (job_id, number) index per job; none for a first attempt).
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), room AS MATERIALIZED (
    -- The queue's room: nothing when paused, and under a concurrency limit no more than the
    -- limit less what runs now (lock_limited_queues, sent first in the same transaction, has
    -- serialized claimers on the queue row, so this count sees every earlier claim). What runs
    -- includes the overruns under live leases: handlers whose attempt their worker already ended
    -- (see forget_overruns).
    -- A queue under an admission limit (per-key concurrency, rate) is claimed only through
    -- claim_jobs_admitted: here it has no room, so a worker that does not know of the limit
    -- claims nothing from it rather than overrun it.
    SELECT coalesce((SELECT CASE WHEN q.paused THEN 0
                                 WHEN q.key_concurrency_limit IS NOT NULL OR q.rate_limit IS NOT NULL
                                      OR q.key_rate_limit IS NOT NULL THEN 0
                                 WHEN q.concurrency_limit IS NULL THEN %(limit)s
                                 ELSE greatest(0, least(%(limit)s, q.concurrency_limit - (
                                     SELECT count(*) FROM backwave_job AS r
                                     WHERE r.state = 'running' AND r.queue = q.name) - (
                                     SELECT count(*) FROM backwave_overrun AS o
                                     JOIN backwave_lease AS l ON l.id = o.lease_id
                                     WHERE o.queue = q.name AND l.expires_at > now())))
                            END
                     FROM backwave_queue AS q WHERE q.name = %(queue)s), %(limit)s) AS n
), suspect AS MATERIALIZED (
    SELECT j.id, j.priority, j.run_at
    FROM backwave_job AS j
    WHERE j.state = 'ready' AND j.suspect AND j.queue = %(queue)s AND j.run_at <= now()
      AND EXISTS (SELECT FROM lease)
      AND NOT EXISTS (SELECT FROM backwave_job AS r
                      WHERE r.lease_id = %(lease_id)s AND r.state = 'running' AND r.suspect)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT least(1, (SELECT n FROM room))
    FOR NO KEY UPDATE SKIP LOCKED
), picked AS MATERIALIZED (
    SELECT c.id FROM (
        SELECT s.id, s.priority, s.run_at FROM suspect AS s
        UNION ALL
        SELECT o.id, o.priority, o.run_at FROM (
            SELECT j.id, j.priority, j.run_at
            FROM backwave_job AS j
            WHERE j.state = 'ready' AND NOT j.suspect AND j.queue = %(queue)s AND j.run_at <= now()
              AND EXISTS (SELECT FROM lease)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT (SELECT n FROM room)
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS o
        ORDER BY priority DESC, run_at, id
        LIMIT (SELECT n FROM room)
    ) AS c
    -- A constant LIMIT on top: the planner cannot read the room's value and would otherwise
    -- expect a large pick and look the ids up with a scan of the table instead of the primary key.
    LIMIT %(limit)s
), {{claimed_jobs}}
{{claimed_rows}}


-- name: claim_jobs_many_queues
-- Several queues, in the order given (a Strict policy's): queue order first, then priority,
-- run_at and id, so a later queue gets only what the earlier ones leave of the limit. "queue = ANY(...)" cannot use the index for ordering: the index is sorted by
-- queue first, so the planner would fetch every due ready row of those queues and sort them all
-- (a Sort under the LockRows), paying for the whole backlog on every claim. Instead each queue
-- gets its own ordered index scan through LATERAL (the single-queue plan, limited to its room),
-- and the outer ORDER BY merges at most queues * limit rows and keeps the best `limit`.
--
-- The lock is taken inside each LATERAL, where the scan is ordered, so a row another claimer
-- holds is skipped and replaced by that queue's next row; locking only after the merge would
-- make concurrent claimers pick the same candidates and come back short. The cost: up to
-- (queues - 1) * limit rows are locked but not claimed, until this statement commits;
-- concurrent claimers skip them for that instant and they stay ready. The caller passes each
-- queue once (a queue listed twice would see its own locked rows again).
--
-- Suspects as in claim_jobs_one_queue: one at most across all the queues (each queue's first
-- suspect is looked up, the best in claim order is kept), merged into its queue's pick, which
-- is then cut to that queue's room (row_number per queue), so the suspect shares its queue's
-- room and never pushes the queue past a concurrency limit.
--
-- The lease CTE, the CTE fence and FOR NO KEY UPDATE are as in claim_jobs_one_queue.
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), rooms AS MATERIALIZED (
    -- Each queue's room, as in claim_jobs_one_queue (paused or admission-limited: none;
    -- limited: what is left, its live overruns counted as running).
    SELECT q.name, q.position,
           coalesce((SELECT CASE WHEN qs.paused THEN 0
                                 WHEN qs.key_concurrency_limit IS NOT NULL OR qs.rate_limit IS NOT NULL
                                      OR qs.key_rate_limit IS NOT NULL THEN 0
                                 WHEN qs.concurrency_limit IS NULL THEN %(limit)s
                                 ELSE greatest(0, least(%(limit)s, qs.concurrency_limit - (
                                     SELECT count(*) FROM backwave_job AS r
                                     WHERE r.state = 'running' AND r.queue = qs.name) - (
                                     SELECT count(*) FROM backwave_overrun AS o
                                     JOIN backwave_lease AS l ON l.id = o.lease_id
                                     WHERE o.queue = qs.name AND l.expires_at > now())))
                            END
                     FROM backwave_queue AS qs WHERE qs.name = q.name), %(limit)s) AS n
    FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(name, position)
), suspect AS MATERIALIZED (
    SELECT c.id, q.position, c.priority, c.run_at
    FROM rooms AS q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM backwave_job AS j
        WHERE j.state = 'ready' AND j.suspect AND j.queue = q.name AND j.run_at <= now()
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT least(1, q.n)
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE EXISTS (SELECT FROM lease)
      AND NOT EXISTS (SELECT FROM backwave_job AS r
                      WHERE r.lease_id = %(lease_id)s AND r.state = 'running' AND r.suspect)
    ORDER BY q.position, c.priority DESC, c.run_at, c.id
    LIMIT 1
), picked AS MATERIALIZED (
    SELECT t.id
    FROM (
        SELECT c.id, q.position, c.priority, c.run_at, q.n,
               row_number() OVER (PARTITION BY q.position ORDER BY c.priority DESC, c.run_at, c.id) AS rank
        FROM rooms AS q
        CROSS JOIN LATERAL (
            SELECT s.id, s.priority, s.run_at FROM suspect AS s WHERE s.position = q.position
            UNION ALL
            SELECT o.id, o.priority, o.run_at FROM (
                SELECT j.id, j.priority, j.run_at
                FROM backwave_job AS j
                WHERE j.state = 'ready' AND NOT j.suspect AND j.queue = q.name AND j.run_at <= now()
                ORDER BY j.priority DESC, j.run_at, j.id
                LIMIT q.n
                FOR NO KEY UPDATE SKIP LOCKED
            ) AS o
        ) AS c
        WHERE EXISTS (SELECT FROM lease)
    ) AS t
    WHERE t.rank <= t.n
    ORDER BY t.position, t.priority DESC, t.run_at, t.id
    LIMIT %(limit)s
), {{claimed_jobs}}
{{claimed_rows}}


-- name: claim_jobs_admitted
-- The claim for queues under an admission limit (BACKWAVE["QUEUES"]: key_concurrency_limit,
-- rate_limit, key_rate_limit), chosen by the store only when one of the queues it claims has one, so the plain
-- claims above stay as they are. Otherwise claim_jobs_many_queues (queue order, the LATERAL
-- per queue, suspects, the lease CTE, the CTE fence, FOR NO KEY UPDATE), plus:
--
-- Serialized claimers. lock_admitted_queues, sent first in the same transaction, locks the row
-- of every limited queue claimed, so claimers of one such queue take turns, and under READ
-- COMMITTED this statement's snapshot (taken after the lock was granted) sees every earlier
-- claim: its counts of running jobs per key and its rate window are exact, cluster-wide.
--
-- Rate limit: at most rate_limit starts per window of rate_period seconds, windows aligned to
-- the database clock's epoch. The queue row holds the current window and what it has used; the
-- room is what is left of it, and "debited" adds this claim's starts in the same statement (no
-- statement per job). In any aligned window the limit holds exactly; a sliding window across
-- a boundary can see up to twice it (as any fixed-window limiter).
--
-- Per-key rate limit: the same windows per limit_key, one backwave_key_rate_window row per key
-- that started jobs in the current window. Keys whose row is used up are "saturated" (read
-- through the (queue, window_start) index: this window's rows only), the others are cut to what
-- is left of theirs, and "key_debited" upserts the claimed keys' rows, moving a row from a past
-- window on in place; "key_expired" deletes the rows of past windows of the keys not claimed, so
-- the table holds no more than the keys active in a window.
--
-- Per-key concurrency: at most key_concurrency_limit running jobs per limit_key in the queue,
-- the key's overruns under live leases counted as running (handlers whose attempt their worker
-- ended, see forget_overruns; so is the queue's concurrency limit's count).
-- "saturated" lists the keys already at the limit, from the partial index of running keyed
-- jobs (backwave_job_running_key: at most the jobs in flight) and backwave_overrun_queue_key
-- (usually empty); the ordered scan passes over
-- their rows without counting them against its LIMIT, so a saturated key's backlog never stalls
-- the queue: other keys' jobs behind it are claimed. Keys with some room left are cut to it by
-- rank per key. The scan over-fetches (four times the room) so that a key with little room
-- does not make the claim come back short; when one key's rows fill even that, the claim is
-- short once and that key is saturated for the next. Rows fetched but not taken stay locked
-- only until this statement commits, and claimers of the queue are serialized anyway.
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), rooms AS MATERIALIZED (
    SELECT q.name, q.position, qs.key_concurrency_limit AS key_limit, qs.key_rate_limit AS key_rate,
           qs.rate_limit, w.window_start,
           CASE WHEN qs.paused THEN 0
                ELSE greatest(0, least(
                    %(limit)s,
                    CASE WHEN qs.concurrency_limit IS NOT NULL
                         THEN qs.concurrency_limit - (SELECT count(*) FROM backwave_job AS r
                                                      WHERE r.state = 'running' AND r.queue = q.name)
                                                   - (SELECT count(*) FROM backwave_overrun AS o
                                                      JOIN backwave_lease AS l ON l.id = o.lease_id
                                                      WHERE o.queue = q.name AND l.expires_at > now()) END,
                    qs.rate_limit - CASE WHEN qs.rate_window_start = w.window_start
                                         THEN qs.rate_window_used ELSE 0 END))
           END AS n,
           CASE WHEN qs.key_concurrency_limit IS NOT NULL OR qs.key_rate_limit IS NOT NULL THEN ARRAY(
               SELECT r.limit_key FROM (
                   SELECT r.limit_key FROM backwave_job AS r
                   WHERE r.state = 'running' AND r.queue = q.name AND r.limit_key IS NOT NULL
                   UNION ALL
                   SELECT o.limit_key FROM backwave_overrun AS o
                   JOIN backwave_lease AS l ON l.id = o.lease_id
                   WHERE o.queue = q.name AND o.limit_key IS NOT NULL AND l.expires_at > now()
               ) AS r
               WHERE qs.key_concurrency_limit IS NOT NULL
               GROUP BY r.limit_key
               HAVING count(*) >= qs.key_concurrency_limit
               UNION ALL
               SELECT k.limit_key FROM backwave_key_rate_window AS k
               WHERE qs.key_rate_limit IS NOT NULL
                 AND k.queue = q.name AND k.window_start = w.window_start AND k.used >= qs.key_rate_limit) END AS saturated
    FROM unnest(%(queues)s::text[]) WITH ORDINALITY AS q(name, position)
    -- least() and greatest() skip NULLs: a queue without a row, or without a limit, keeps the room.
    LEFT JOIN backwave_queue AS qs ON qs.name = q.name
    LEFT JOIN LATERAL (
        SELECT to_timestamp(floor(extract(epoch FROM now()) / qs.rate_period) * qs.rate_period) AS window_start
    ) AS w ON true
), suspect AS MATERIALIZED (
    SELECT c.id, q.position, c.priority, c.run_at, c.limit_key
    FROM rooms AS q
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at, j.limit_key
        FROM backwave_job AS j
        WHERE j.state = 'ready' AND j.suspect AND j.queue = q.name AND j.run_at <= now()
          AND (j.limit_key IS NULL OR q.saturated IS NULL OR j.limit_key <> ALL(q.saturated))
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT least(1, q.n)
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE EXISTS (SELECT FROM lease)
      AND NOT EXISTS (SELECT FROM backwave_job AS r
                      WHERE r.lease_id = %(lease_id)s AND r.state = 'running' AND r.suspect)
    ORDER BY q.position, c.priority DESC, c.run_at, c.id
    LIMIT 1
), candidates AS MATERIALIZED (
    SELECT c.id, q.position, c.priority, c.run_at, c.limit_key, q.n, q.key_limit, q.key_rate, q.window_start, q.name AS queue
    FROM rooms AS q
    CROSS JOIN LATERAL (
        SELECT s.id, s.priority, s.run_at, s.limit_key FROM suspect AS s WHERE s.position = q.position
        UNION ALL
        SELECT o.id, o.priority, o.run_at, o.limit_key FROM (
            SELECT j.id, j.priority, j.run_at, j.limit_key
            FROM backwave_job AS j
            WHERE j.state = 'ready' AND NOT j.suspect AND j.queue = q.name AND j.run_at <= now()
              AND (j.limit_key IS NULL OR q.saturated IS NULL OR j.limit_key <> ALL(q.saturated))
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT CASE WHEN q.key_limit IS NULL AND q.key_rate IS NULL THEN q.n ELSE q.n * 4 END
            FOR NO KEY UPDATE SKIP LOCKED
        ) AS o
    ) AS c
    WHERE EXISTS (SELECT FROM lease)
), within_key AS MATERIALIZED (
    -- Each key cut to its room: the limit less what runs now (one probe of the running-key
    -- index per key among the candidates), and what is left of its rate window (one probe).
    SELECT k.*
    FROM (
        SELECT c.*, row_number() OVER (PARTITION BY c.position, c.limit_key
                                       ORDER BY c.priority DESC, c.run_at, c.id) AS key_rank
        FROM candidates AS c
    ) AS k
    WHERE k.limit_key IS NULL OR (k.key_limit IS NULL AND k.key_rate IS NULL)
       OR k.key_rank <= least(
              CASE WHEN k.key_limit IS NOT NULL
                   THEN k.key_limit - (SELECT count(*) FROM backwave_job AS r
                                       WHERE r.state = 'running' AND r.queue = k.queue
                                         AND r.limit_key = k.limit_key)
                                    - (SELECT count(*) FROM backwave_overrun AS o
                                       JOIN backwave_lease AS l ON l.id = o.lease_id
                                       WHERE o.queue = k.queue AND o.limit_key = k.limit_key
                                         AND l.expires_at > now()) END,
              CASE WHEN k.key_rate IS NOT NULL
                   THEN k.key_rate - coalesce((SELECT w.used FROM backwave_key_rate_window AS w
                                               WHERE w.queue = k.queue AND w.limit_key = k.limit_key
                                                 AND w.window_start = k.window_start), 0) END)
), picked AS MATERIALIZED (
    SELECT t.id
    FROM (
        SELECT w.id, w.position, w.priority, w.run_at, w.n,
               row_number() OVER (PARTITION BY w.position ORDER BY w.priority DESC, w.run_at, w.id) AS rank
        FROM within_key AS w
    ) AS t
    WHERE t.rank <= t.n
    ORDER BY t.position, t.priority DESC, t.run_at, t.id
    LIMIT %(limit)s
), {{claimed_jobs}}, debited AS (
    -- A data-modifying CTE runs whether or not it is referenced.
    UPDATE backwave_queue AS qs
    SET rate_window_used = CASE WHEN qs.rate_window_start = r.window_start THEN qs.rate_window_used ELSE 0 END + d.started,
        rate_window_start = r.window_start
    FROM (SELECT c.queue, count(*) AS started FROM claimed AS c GROUP BY c.queue) AS d
    JOIN rooms AS r ON r.name = d.queue
    WHERE qs.name = d.queue AND qs.rate_limit IS NOT NULL
), key_debited AS (
    INSERT INTO backwave_key_rate_window AS w (queue, limit_key, window_start, used)
    SELECT c.queue, c.limit_key, r.window_start, count(*)
    FROM claimed AS c
    JOIN rooms AS r ON r.name = c.queue
    WHERE r.key_rate IS NOT NULL AND c.limit_key IS NOT NULL
    GROUP BY c.queue, c.limit_key, r.window_start
    ON CONFLICT (queue, limit_key) DO UPDATE
    SET used = CASE WHEN w.window_start = EXCLUDED.window_start THEN w.used + EXCLUDED.used ELSE EXCLUDED.used END,
        window_start = EXCLUDED.window_start
), key_expired AS (
    -- Rows disjoint from key_debited's (a statement must not change one row twice).
    DELETE FROM backwave_key_rate_window AS w
    USING rooms AS r
    WHERE r.key_rate IS NOT NULL AND w.queue = r.name AND w.window_start < r.window_start
      AND NOT EXISTS (SELECT FROM claimed AS c WHERE c.queue = w.queue AND c.limit_key = w.limit_key)
)
{{claimed_rows}}


-- name: write_outcomes_many
-- The Effect-Once fence is the WHERE clause of the UPDATE. A row changes only when
--   * j.lease_id is this writer's lease: the job was not released, expired or re-claimed;
--   * j.state = 'running': it has not been finished already (a repeated write is a no-op);
--   * j.attempts = o.attempt: the outcome is for the attempt now running, not an older one
--     whose lease lapsed before the job was claimed again under the same lease;
--   * the lease row exists and has not expired by the database clock: once it lapses its jobs
--     belong to maintenance, even before maintenance has got round to them.
-- The lease row is taken FOR KEY SHARE first (an InitPlan, before any job row), so expiry,
-- which only deletes leases it can lock with SKIP LOCKED, cannot release these jobs while the
-- write is in flight. If expiry got there first, the write waits for its lock and then finds
-- the lease row gone: nothing applies, and the jobs are expiry's (ready again or failed).
--
-- RETRY and FAILED both log a 'failed' attempt; only RETRY makes the job ready again, due
-- retry_delay seconds after now() by the database clock. SNOOZED is ready again the same way
-- but is no failure: it logs a 'snoozed' attempt and adds it to forgiven_attempts, so it counts
-- neither against max_attempts nor towards the backoff (attempt numbers still go up: the log
-- keeps every try). CANCELLED ends the job like FAILED, with a 'cancelled' attempt. Progress and
-- metadata, when the attempt reported any, replace what the row holds (a value the attempt did
-- not set, NULL, keeps the last one). Any outcome clears suspect: the attempt
-- ended without taking its worker down (see expire_leases). Attempt rows are inserted from the
-- UPDATE's RETURNING, so only applied outcomes are logged; the unique (job_id, number)
-- constraint would turn a double apply into an error rather than a second row.
--
-- Workflows ride the same statement. The attempt's Job Output is merged into the job's (a
-- name recorded again wins) and its runtime tag deltas applied to its tags, whatever the kind:
-- a handler that recorded them and then raised keeps them. An outcome that ends its job
-- ("settling": succeeded, failed for good or discarded, cancelled, quarantined; not a retry nor
-- a snooze, which make it ready again) settles the job's dependents
-- (settle_dependents, included below): a dependent whose last ancestor succeeded here is ready
-- when this statement commits. A dependency committed on one of these jobs after this
-- statement's snapshot changed the job's row (backwave_settle_new_dependent, migration 0022,
-- flags it at the enqueue's commit), so that
-- job is busy here (see "taken"), and written by a later statement that sees the dependency.
-- A job whose open dependent another transaction holds is busy as well ("writable"): settling
-- it would wait for that row, and with it every other outcome of the batch.
-- The count of dependents made ready rides on every returned row; busy ones come back as rows
-- of their own (busy true), neither applied nor refused.
WITH RECURSIVE {{outcome_taken}}
, ancestors_taken AS MATERIALIZED (
    -- The jobs taken whose outcome ends them and that have dependents: settle_dependents
    -- updates those dependents' rows, which an application may hold too (a cancel of one, a
    -- select_for_update()).
    SELECT t.id
    FROM taken AS t JOIN outcome AS o ON o.job_id = t.id
    WHERE t.unchanged AND t.has_dependents AND o.kind NOT IN ('retry', 'snoozed')
), dependents_taken AS MATERIALIZED (
    -- Their open dependents, locked without waiting, in id order. A dependent's own dependents,
    -- which a failure may cancel in turn (dep_doomed), are not: a cancel policy two links deep
    -- waits for a holder of that row, as it always did.
    SELECT w.id
    FROM backwave_job AS w
    WHERE w.id = ANY(ARRAY(SELECT d.job_id FROM backwave_dependency AS d
                           WHERE d.ancestor_id = ANY(ARRAY(SELECT a.id FROM ancestors_taken AS a))))
      AND w.state IN ('waiting', 'held')
    ORDER BY w.id
    FOR NO KEY UPDATE OF w SKIP LOCKED
), writable AS MATERIALIZED (
    -- An ancestor one of whose open dependents another transaction holds is busy too, as its
    -- own row held would make it: the rest of the batch lands, and it is written again later.
    SELECT t.id FROM taken AS t
    WHERE t.unchanged
      AND NOT EXISTS (
          SELECT FROM backwave_dependency AS d
          WHERE d.ancestor_id = t.id
            AND t.id = ANY(ARRAY(SELECT a.id FROM ancestors_taken AS a))
            AND d.job_id <> ALL (ARRAY(SELECT x.id FROM dependents_taken AS x))
            AND (SELECT w.state FROM backwave_job AS w WHERE w.id = d.job_id) IN ('waiting', 'held'))
), {{outcome_applied}}
    RETURNING j.id, j.worker_id, j.last_attempted_at, o.attempt, o.kind, o.return_value,
              o.error_class, o.traceback, o.duration, o.overrun, j.queue, j.limit_key
), settling AS (
    SELECT a.id, CASE a.kind WHEN 'succeeded' THEN 'succeeded'
                             WHEN 'quarantined' THEN 'quarantined'
                             WHEN 'cancelled' THEN 'cancelled'
                             ELSE 'failed' END AS state
    FROM applied AS a
    WHERE a.kind NOT IN ('retry', 'snoozed')
), {{outcome_noted}}, {{outcome_overran}}, watching AS NOT MATERIALIZED (
    -- The observed transitions, for the cancelled dependents' own (see settle_dependents).
    SELECT %(observed)s::jsonb AS observed
)
{{settle_dependents}}
, logged AS (
{{outcome_attempts}}
    RETURNING job_id
)
SELECT l.job_id, (SELECT count(*) FROM dep_released AS r WHERE r.state = 'ready') AS released, false AS busy
FROM logged AS l
UNION ALL
SELECT b.id, 0, true FROM busy AS b


-- name: write_outcomes_plain
-- write_outcomes_many for a batch none of whose jobs had dependents when claimed (the store
-- knows from the claim's has_dependents): no settling, so no probe of the dependency table. The
-- fence has one more condition, NOT has_dependents: a dependent enqueued while the job ran
-- flagged it (backwave_settle_new_dependent, at the enqueue's commit; committed since this statement's
-- snapshot, the job is busy here), so such a job is left as this statement found it. The store
-- then writes the outcomes neither applied nor busy here with write_outcomes_many (a refused one
-- is refused again: the same fence). "released" is always 0.
WITH {{outcome_taken}}, writable AS MATERIALIZED (
    SELECT t.id FROM taken AS t WHERE t.unchanged
), {{outcome_applied}}
      AND NOT j.has_dependents
      -- A dependent enqueued in the writer's own transaction (the test pump's, in a test's
      -- transaction that never commits, so the trigger never flags the job): one probe of the
      -- ancestor index.
      AND NOT EXISTS (SELECT FROM backwave_dependency AS d WHERE d.ancestor_id = j.id)
    RETURNING j.id, j.worker_id, j.last_attempted_at, o.attempt, o.kind, o.return_value,
              o.error_class, o.traceback, o.duration, o.overrun, j.queue, j.limit_key
), {{outcome_noted}}, {{outcome_overran}}, logged AS (
{{outcome_attempts}}
    RETURNING job_id
)
SELECT l.job_id, 0::bigint AS released, false AS busy FROM logged AS l
UNION ALL
SELECT b.id, 0, true FROM busy AS b


-- name: outcome_taken
-- Not a statement: the outcome writes' fence and row locks (the CTEs lease, outcome, seen and
-- taken), shared by write_outcomes_many and write_outcomes_plain. Each then says which jobs
-- taken it may write (a CTE "writable"(id)) before outcome_applied.
lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), outcome AS (
    -- The batch travels as one JSON array: encoding it is one C call in the worker, where
    -- eight Python-built arrays cost more CPU than the statement itself. The return value
    -- comes boxed as {"v": value} so that a task returning None stores JSON null, a value,
    -- while the other kinds (box absent) store SQL NULL.
    SELECT b.job_id, b.attempt, b.kind, b.retry_delay, b.boxed -> 'v' AS return_value,
           b.error_class, b.traceback, b.duration, b.progress, b.metadata, b.output, b.tag_add, b.tag_remove,
           b.overrun
    FROM jsonb_to_recordset(%(outcomes)s::jsonb)
         AS b(job_id bigint, attempt int, kind text, retry_delay float8, boxed jsonb,
              error_class text, traceback text, duration float8, progress jsonb, metadata jsonb,
              output jsonb, tag_add varchar[], tag_remove varchar[], overrun boolean)
), seen AS MATERIALIZED (
    -- The batch's jobs the fence lets through, as this statement's snapshot has them, and the
    -- version of each ("id = ANY(ARRAY(...))": the ids as one array, see below).
    SELECT j.id, j.xmin AS version
    FROM backwave_job AS j
    WHERE j.id = ANY(ARRAY(SELECT i.job_id FROM outcome AS i))
      AND j.lease_id = %(lease_id)s
      AND j.state = (SELECT 'running')
      AND EXISTS (SELECT FROM lease)
), taken AS MATERIALIZED (
    -- Locked without waiting: a row another transaction holds (an application's, open for as
    -- long as it likes: an enqueue after= the job, a cancel, a select_for_update()) is passed
    -- over, so one held row never holds the batch. So is a row changed since the snapshot (the
    -- lock is then taken on its newer version, which READ COMMITTED returns): this statement
    -- would not see what committed with that change, such as a dependent enqueued after= the
    -- job (see backwave_settle_new_dependent, migration 0022). Both are "busy": not written, the
    -- writer sends them again, and a new statement then sees what the holder committed.
    -- The join is a primary-key probe per row of "seen" (its estimate, one row, keeps it so).
    SELECT j.id, j.xmin = s.version AS unchanged, j.has_dependents
    FROM seen AS s
    JOIN backwave_job AS j ON j.id = s.id
    FOR NO KEY UPDATE OF j SKIP LOCKED
)


-- name: outcome_applied
-- Not a statement: the outcome writes' update (the CTEs busy and the head of applied, up to its
-- RETURNING), after outcome_taken and a CTE "writable".
busy AS MATERIALIZED (
    SELECT s.id FROM seen AS s
    WHERE s.id <> ALL (ARRAY(SELECT t.id FROM writable AS t))
), applied AS (
    UPDATE backwave_job AS j
    SET state = CASE o.kind WHEN 'succeeded' THEN 'succeeded'
                            WHEN 'retry' THEN 'ready'
                            WHEN 'snoozed' THEN 'ready'
                            WHEN 'failed' THEN 'failed'
                            WHEN 'cancelled' THEN 'cancelled'
                            WHEN 'quarantined' THEN 'quarantined' END,
        run_at = CASE WHEN o.kind IN ('retry', 'snoozed')
                      THEN now() + make_interval(secs => greatest(coalesce(o.retry_delay, 0), 0))
                      ELSE j.run_at END,
        finished_at = CASE WHEN o.kind IN ('retry', 'snoozed') THEN NULL ELSE now() END,
        forgiven_attempts = j.forgiven_attempts + CASE WHEN o.kind = 'snoozed' THEN 1 ELSE 0 END,
        return_value = o.return_value,
        progress = coalesce(o.progress, j.progress),
        metadata = coalesce(o.metadata, j.metadata),
        lease_id = NULL,
        suspect = false,
        output = CASE WHEN o.output IS NULL THEN j.output ELSE coalesce(j.output, '{}'::jsonb) || o.output END,
        -- Tags kept in their order, those added appended, each once, those removed left out.
        tags = CASE WHEN o.tag_add IS NULL AND o.tag_remove IS NULL THEN j.tags
                    ELSE ARRAY(SELECT t.tag
                               FROM unnest(j.tags || coalesce(o.tag_add, '{}'::varchar[])) WITH ORDINALITY AS t(tag, n)
                               WHERE t.tag <> ALL (coalesce(o.tag_remove, '{}'::varchar[]))
                               GROUP BY t.tag ORDER BY min(t.n))::varchar(64)[] END
    FROM outcome AS o
    WHERE j.id = o.job_id
      -- The ids taken, as one array (an InitPlan): the planner reads "id = ANY(...)" through the
      -- primary key. Joined from the JSON alone (which it takes for 100 rows), and with
      -- statistics taken while nothing ran (every lease_id NULL, so "lease_id = ..." looks like
      -- one row), it filtered the whole table by lease first: a sequential scan per batch
      -- (2.96 ms for 16 outcomes at 10,000 rows, against 0.69 ms by probes).
      AND j.id = ANY(ARRAY(SELECT t.id FROM writable AS t))
      AND j.lease_id = %(lease_id)s
      -- A sub-select, not the literal: with "j.state = 'running'" the planner may read the
      -- partial indexes on running rows (backwave_job_running_lease, _running_queue), which it
      -- believes hold a handful of rows; they also hold a dead entry for every job finished since
      -- the last VACUUM (under this lease, or in the queue), so each write would walk all of them
      -- and slow down as a run goes on. The planner cannot match a parameter to those indexes'
      -- predicate, which leaves one primary-key probe per outcome.
      AND j.state = (SELECT 'running')
      AND j.attempts = o.attempt
      AND EXISTS (SELECT FROM lease)


-- name: outcome_noted
-- Not a statement: the outcome writes' "noted" CTE, over "applied".
noted AS (
    -- The durable record of applied transitions that observers are fed from (see
    -- noted_transitions below expire_leases): written from "applied", so an outcome the fence
    -- refused never gets one, and in this statement, so a crash never loses one. Only the
    -- transitions some observer watches ("observed": [{kind, task_path, queue, observer}], NULL
    -- matching any), each row naming the observers it is for (an entry without an observer name
    -- notes a row any deliverer may settle); with none watched the gate is one constant test
    -- and the job table is not read.
    INSERT INTO backwave_transition (job_id, attempt, kind, task_path, queue, occurred_at, state,
                                     deliveries, next_attempt_at, delivered_to, failed_observer, last_error, observers)
    SELECT a.id, a.attempt, t.kind, j.task_path, j.queue, now(), 'pending', 0, now(), '{}', '', '', coalesce(o.names, ARRAY[]::varchar[])
    FROM applied AS a
    CROSS JOIN LATERAL (SELECT CASE a.kind WHEN 'retry' THEN 'retried' ELSE a.kind END AS kind) AS t
    JOIN backwave_job AS j ON j.id = a.id
    CROSS JOIN LATERAL (
        -- The observers it is for: each delivery belongs to one (see claim_transitions).
        SELECT array_agg(DISTINCT w.observer ORDER BY w.observer) FILTER (WHERE w.observer IS NOT NULL) AS names, count(*) AS watchers
        FROM jsonb_to_recordset(%(observed)s::jsonb) AS w(kind text, task_path text, queue text, observer text)
        WHERE w.kind = t.kind AND (w.task_path IS NULL OR w.task_path = j.task_path)
          AND (w.queue IS NULL OR w.queue = j.queue)
    ) AS o
    WHERE %(observed)s::jsonb <> '[]'::jsonb
      AND o.watchers > 0
)


-- name: outcome_overran
-- Not a statement: the outcome writes' "overran" CTE, over "applied". An outcome the worker
-- decided without its handler, which still runs (a time limit, a cancel's grace: "overrun"),
-- leaves an overrun row under the writer's lease, in the statement that ends the attempt: from
-- the commit on, the claims count the handler where they counted its running row until then,
-- so no claim ever sees the attempt ended and its handler uncounted. Only applied outcomes:
-- a refused one's handler runs under a lease that lost the row, and counts no more.
overran AS (
    INSERT INTO backwave_overrun (job_id, attempt, lease_id, queue, limit_key, since)
    SELECT a.id, a.attempt, %(lease_id)s, a.queue, a.limit_key, now()
    FROM applied AS a
    WHERE a.overrun
)


-- name: outcome_attempts
-- Not a statement: the outcome writes' INSERT of the attempt log, over "applied", without its
-- RETURNING.
INSERT INTO backwave_attempt (job_id, number, state, worker_id, started_at, finished_at,
                              error_class, traceback, return_value)
SELECT a.id, a.attempt,
       CASE a.kind WHEN 'succeeded' THEN 'succeeded'
                   WHEN 'quarantined' THEN 'quarantined'
                   WHEN 'cancelled' THEN 'cancelled'
                   WHEN 'snoozed' THEN 'snoozed'
                   ELSE 'failed' END,
       a.worker_id,
       a.last_attempted_at,
       coalesce(a.last_attempted_at, now()) + make_interval(secs => greatest(a.duration, 0)),
       a.error_class, a.traceback, a.return_value
FROM applied AS a


-- name: lock_outcome_jobs
-- An atomic task's outcome only (backwave/store/in_transaction.py), sent just before
-- write_outcomes_many in the handler's transaction: the outcome statements pass over a job row
-- another transaction holds (busy), and the handler's transaction cannot be written again later,
-- so it waits here, on the handler's thread (never the pump's), for whoever holds the row. The
-- outcome statement that follows takes a fresh snapshot (READ COMMITTED) that sees what the
-- holder committed (a dependent enqueued after= the job), and finds the row its own. The lease
-- row first and job rows in id order, as every statement locks (see the top of this file);
-- then the job's open dependents, in id order, which the write would otherwise find held by
-- another transaction (an outcome busy, which this write cannot send again).
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), locked AS MATERIALIZED (
    SELECT j.id
    FROM backwave_job AS j
    -- The ids travel as the text of an array literal ("{1,2,3}"): psycopg adapts a Python list
    -- element by element, which cost the worker more than the lock itself.
    WHERE j.id = ANY(%(job_ids)s::text::bigint[])
      AND j.lease_id = %(lease_id)s
      AND j.state = 'running'
      AND EXISTS (SELECT FROM lease)
    ORDER BY j.id
    FOR NO KEY UPDATE OF j
)
SELECT w.id
FROM backwave_job AS w
WHERE w.id = ANY(ARRAY(SELECT d.job_id FROM backwave_dependency AS d
                       WHERE d.ancestor_id = ANY(ARRAY(SELECT l.id FROM locked AS l))))
  AND w.state IN ('waiting', 'held')
ORDER BY w.id
FOR NO KEY UPDATE OF w


-- name: settle_dependents
-- Not a statement: the CTEs every statement that ends jobs includes ({{settle_dependents}}),
-- after a CTE "settling"(id, state) of the jobs it ends and their new state, and a CTE
-- "watching"(observed), one row: the statement's observed transitions (jsonb, as its own "noted"
-- CTE reads them). The statement must be WITH RECURSIVE. No parameters (act_on_jobs formats its
-- text, and takes positional ones), hence "watching"; no braces either (cancel_jobs is formatted
-- after this block is included).
--
-- What an ended ancestor does to its dependents (backwave_dependency, found through its
-- ancestor index, so a fan-out of 10,000 is one index range scan):
--   * succeeded: the dependent's waiting_on goes down by one; at 0 it is ready (due at once, or
--     at its own run_at if that is later);
--   * failed, cancelled or quarantined, by the dependency's on_failure: "cancel" cancels the
--     dependent, and that cancels its own "cancel" dependents in turn (dep_doomed, recursive:
--     a DAG has no cycle, and UNION stops on a row found twice anyway); "run" counts as a
--     success; "hold" holds the dependent for an operator (state held: retrying the ancestor
--     from the admin re-arms it).
-- A dependent cancelled here gets its 'cancelled' transition here too (dep_noted), for the
-- observers that watch it, as the including statement notes the jobs it ends: an outcome the
-- fence refused cancels nothing, so it notes nothing, and a crash cannot lose one. Held is no
-- transition observers can watch (backwave/observers.py KINDS): nothing ended.
-- A dependent is updated once however many of its ancestors end here (dep_effects aggregates
-- them), and never when the statement ends it itself. Each reason names the ancestor.
-- "ancestor_id = ANY(ARRAY(...))": the ids as one array (an InitPlan), which the planner reads
-- through the ancestor index; as a join on a CTE it guesses the CTE's size and may scan the
-- whole dependency table instead (tests/store/test_plans.py). A dependent's state is read by
-- a correlated primary-key probe for the same reason: as a join, the planner may prefer to
-- scan every waiting job.
-- Concurrent statements ending two ancestors of one dependent serialize on its row, and READ
-- COMMITTED re-reads its waiting_on before subtracting, so a fan-in is released exactly once.
, dep_doomed(id, via) AS (
    SELECT d.job_id, d.ancestor_id
    FROM backwave_dependency AS d
    WHERE d.ancestor_id = ANY(ARRAY(SELECT s.id FROM settling AS s WHERE s.state <> 'succeeded'))
      AND d.on_failure = 'cancel'
      AND (SELECT w.state FROM backwave_job AS w WHERE w.id = d.job_id) IN ('waiting', 'held')
      AND d.job_id NOT IN (SELECT id FROM settling)
    UNION
    -- The recursive step cannot use an array of the worktable (a recursive reference may not sit
    -- in a subquery), so it probes the ancestor index per row found: LATERAL with OFFSET 0,
    -- which the planner cannot flatten into a hash join over the whole dependency table.
    SELECT d.job_id, x.id
    FROM dep_doomed AS x
    CROSS JOIN LATERAL (
        SELECT c.job_id FROM backwave_dependency AS c
        WHERE c.ancestor_id = x.id AND c.on_failure = 'cancel'
        OFFSET 0
    ) AS d
    WHERE (SELECT w.state FROM backwave_job AS w WHERE w.id = d.job_id) IN ('waiting', 'held')
      AND d.job_id NOT IN (SELECT id FROM settling)
), dep_ended AS MATERIALIZED (
    SELECT s.id, s.state FROM settling AS s
    UNION ALL
    SELECT DISTINCT x.id, 'cancelled' FROM dep_doomed AS x
), dep_cause AS MATERIALIZED (
    SELECT DISTINCT ON (x.id) x.id, x.via, e.state AS via_state
    FROM dep_doomed AS x JOIN dep_ended AS e ON e.id = x.via
    ORDER BY x.id, x.via
), dep_effects AS MATERIALIZED (
    SELECT d.job_id,
           count(*) FILTER (WHERE e.state = 'succeeded' OR d.on_failure = 'run') AS satisfied,
           min(d.ancestor_id) FILTER (WHERE e.state <> 'succeeded' AND d.on_failure = 'hold') AS held_by,
           min(e.state) FILTER (WHERE e.state <> 'succeeded' AND d.on_failure = 'hold') AS held_by_state
    FROM backwave_dependency AS d
    JOIN dep_ended AS e ON e.id = d.ancestor_id
    WHERE d.ancestor_id = ANY(ARRAY(SELECT id FROM dep_ended))
      AND d.job_id NOT IN (SELECT id FROM settling)
    GROUP BY d.job_id
), dep_released AS (
    UPDATE backwave_job AS j
    SET state = CASE WHEN c.id IS NOT NULL THEN 'cancelled'
                     WHEN j.state = 'held' OR f.held_by IS NOT NULL THEN 'held'
                     WHEN j.waiting_on - f.satisfied <= 0 THEN 'ready'
                     ELSE 'waiting' END,
        waiting_on = greatest(j.waiting_on - f.satisfied, 0),
        run_at = CASE WHEN c.id IS NULL AND f.held_by IS NULL AND j.state = 'waiting'
                           AND j.waiting_on - f.satisfied <= 0
                      THEN greatest(j.run_at, now()) ELSE j.run_at END,
        finished_at = CASE WHEN c.id IS NOT NULL THEN now() ELSE j.finished_at END,
        reason = CASE WHEN c.id IS NOT NULL
                      THEN 'Cancelled: ancestor #' || c.via::text
                           || CASE c.via_state WHEN 'failed' THEN ' failed.' ELSE ' was ' || c.via_state || '.' END
                      WHEN f.held_by IS NOT NULL AND j.state = 'waiting'
                      THEN 'Held: ancestor #' || f.held_by::text
                           || CASE f.held_by_state WHEN 'failed' THEN ' failed' ELSE ' was ' || f.held_by_state END
                           || '. Retry it to re-arm this job, retry this job to run it now, or cancel it.'
                      ELSE j.reason END
    FROM dep_effects AS f
    LEFT JOIN dep_cause AS c ON c.id = f.job_id
    WHERE j.id = f.job_id AND j.state IN ('waiting', 'held')
      -- The dependents' ids again, as one array (an InitPlan), so each is a primary-key probe.
      -- Joined from dep_effects alone, with statistics taken before a chain was enqueued, the
      -- planner walked the whole table (or its primary key) filtering by state, once per link.
      AND j.id = ANY(ARRAY(SELECT e.job_id FROM dep_effects AS e))
    -- A released dependent wakes the pumps of its queue, as an enqueue does: it may be a queue
    -- the pump that wrote this outcome does not serve, whose pumps would otherwise wait for
    -- their next poll. One pg_notify per row; PostgreSQL delivers one per queue at commit.
    RETURNING j.id, j.state, j.attempts, j.task_path, j.queue,
              CASE WHEN j.state = 'ready' THEN pg_notify('backwave_hint', j.queue) END AS hinted
), dep_noted AS (
    -- The attempt is the job's attempts so far, as a cancel's always is: 0 for a dependent that
    -- never ran. With nothing watched, the gate is one constant test ("watching" is inlined).
    INSERT INTO backwave_transition (job_id, attempt, kind, task_path, queue, occurred_at, state,
                                     deliveries, next_attempt_at, delivered_to, failed_observer, last_error, observers)
    SELECT r.id, r.attempts, 'cancelled', r.task_path, r.queue, now(), 'pending', 0, now(), ARRAY[]::varchar[], '', '', coalesce(o.names, ARRAY[]::varchar[])
    FROM dep_released AS r
    CROSS JOIN watching AS k
    CROSS JOIN LATERAL (
        -- The observers it is for: each delivery belongs to one (see claim_transitions).
        SELECT array_agg(DISTINCT w.observer ORDER BY w.observer) FILTER (WHERE w.observer IS NOT NULL) AS names, count(*) AS watchers
        FROM jsonb_to_recordset(k.observed) AS w(kind text, task_path text, queue text, observer text)
        WHERE w.kind = 'cancelled' AND (w.task_path IS NULL OR w.task_path = r.task_path)
          AND (w.queue IS NULL OR w.queue = r.queue)
    ) AS o
    WHERE r.state = 'cancelled' AND k.observed <> '[]'::jsonb
      AND o.watchers > 0
)


-- name: release_jobs_many
-- Fenced like write_outcomes_many (this lease, live, job still running), minus the attempt
-- number: a release gives back whatever attempt is running. The attempt is refunded (the job
-- did not run to an outcome), and started_at is cleared when that was the first attempt.
-- A row another transaction holds is passed over (SKIP LOCKED), never waited for: it stays
-- running under the lease, held by no one, so it comes back busy (busy true) and the pump sends
-- it again (see ******** in core/transitions.py). Released rows come back with busy false.
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), seen AS MATERIALIZED (
    SELECT j.id FROM backwave_job AS j
    WHERE j.id = ANY(%(job_ids)s::bigint[])
      AND j.lease_id = %(lease_id)s
      AND j.state = 'running'
      AND EXISTS (SELECT FROM lease)
), taken AS MATERIALIZED (
    SELECT j.id FROM backwave_job AS j
    WHERE j.id = ANY(ARRAY(SELECT s.id FROM seen AS s))
      AND j.lease_id = %(lease_id)s
      AND j.state = 'running'
    FOR NO KEY UPDATE SKIP LOCKED
), released AS (
    UPDATE backwave_job AS j
    SET state = 'ready',
        lease_id = NULL,
        run_at = now(),
        attempts = greatest(j.attempts - 1, 0),
        started_at = CASE WHEN j.attempts <= 1 THEN NULL ELSE j.started_at END
    WHERE j.id = ANY(ARRAY(SELECT t.id FROM taken AS t))
    RETURNING j.id
)
SELECT r.id, false AS busy FROM released AS r
UNION ALL
SELECT s.id, true FROM seen AS s WHERE s.id <> ALL (ARRAY(SELECT t.id FROM taken AS t))


-- name: expire_leases
-- Maintenance: any number of nodes may run this at once. FOR UPDATE SKIP LOCKED gives each run
-- a disjoint set of lapsed leases (and skips a lease a claim or write holds FOR KEY SHARE right
-- now; the next run takes it), so each lease is expired and its jobs released exactly once.
--
-- Who pays for a lapse. A worker that dies (os._exit, a segfault, the OOM killer, kill -9) takes
-- every job under its lease down, and at most one of them caused it. So the lapse of a job that
-- was not suspect is forgiven: it is ready again at once, marked suspect, and the lapsed attempt
-- is counted in forgiven_attempts, which the attempt limit leaves out (attempts - forgiven <
-- max_attempts; attempts itself only ever grows, attempt numbers stay unique). A suspect is never
-- claimed beside another suspect by one pump (claim_jobs_*), so when a lease with a suspect on
-- it lapses again, that suspect pays: its attempt counts, and with none left the job fails
-- (which is what ends a job that kills its worker every time). Any outcome clears suspect.
-- Either way the attempt is logged as 'lapsed', its text saying whether it counted.
--
-- "j.state = 'running'" is the re-check that never resurrects a finished job: a job finished
-- before this statement's snapshot is not running; one changed since (an outcome committed a
-- moment ago, an operator's cancel in flight) has a newer row version, which the row lock in
-- "stranded" waits for if need be, and READ COMMITTED re-evaluates the WHERE clause on that
-- version (finished, lease_id NULL), so the job is skipped. "stranded" reads (and locks) the
-- jobs before the UPDATE so that the text can say what each was before (RETURNING only sees
-- the new row). A job failed here settles its dependents (settle_dependents).
--
-- Expiry never waits for a job row either: an application's transaction may hold a running
-- job's row for as long as it stays open (an enqueue after= it, a cancel, a select_for_update()).
-- "stranded" locks with SKIP LOCKED, and a lease whose running jobs were not all taken (some
-- held, or changed since the snapshot) is not deleted: it stays lapsed, its writes fenced off,
-- and a later run releases the rest.
WITH RECURSIVE lapsed AS MATERIALIZED (
    SELECT id, worker_id, expires_at, renewed_at FROM backwave_lease
    WHERE expires_at < now()
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), lapsed_running AS MATERIALIZED (
    SELECT j.id, j.lease_id
    FROM backwave_job AS j
    WHERE j.lease_id IN (SELECT l.id FROM lapsed AS l) AND j.state = 'running'
), stranded AS MATERIALIZED (
    SELECT j.id, j.suspect AS was_suspect, l.worker_id AS lease_worker_id, l.expires_at AS lease_expired_at,
           l.renewed_at AS lease_renewed_at
    FROM backwave_job AS j
    JOIN lapsed AS l ON j.lease_id = l.id
    WHERE j.id = ANY(ARRAY(SELECT r.id FROM lapsed_running AS r)) AND j.state = 'running'
    FOR NO KEY UPDATE OF j SKIP LOCKED
), gone AS MATERIALIZED (
    DELETE FROM backwave_lease AS l
    USING lapsed
    WHERE l.id = lapsed.id
      AND NOT EXISTS (SELECT FROM lapsed_running AS r WHERE r.lease_id = l.id AND r.id NOT IN (SELECT s.id FROM stranded AS s))
    RETURNING l.id
), released AS (
    UPDATE backwave_job AS j
    SET state = CASE WHEN NOT s.was_suspect OR j.attempts - j.forgiven_attempts < j.max_attempts
                     THEN 'ready' ELSE 'failed' END,
        run_at = CASE WHEN NOT s.was_suspect OR j.attempts - j.forgiven_attempts < j.max_attempts
                      THEN now() ELSE j.run_at END,
        finished_at = CASE WHEN NOT s.was_suspect OR j.attempts - j.forgiven_attempts < j.max_attempts
                           THEN NULL ELSE now() END,
        forgiven_attempts = j.forgiven_attempts + CASE WHEN s.was_suspect THEN 0 ELSE 1 END,
        suspect = true,
        lease_id = NULL
    FROM stranded AS s
    WHERE j.id = s.id
    RETURNING j.id, j.state, j.attempts, j.max_attempts, j.forgiven_attempts, j.worker_id,
              j.last_attempted_at, s.was_suspect, s.lease_worker_id, s.lease_expired_at, s.lease_renewed_at
), logged AS (
    -- lease_renewed_at: the last moment the attempt is known to have been running (a job
    -- claimed after that renewal: its claim), where finished_at is when the lapse was noticed.
    INSERT INTO backwave_attempt (job_id, number, state, worker_id, started_at, finished_at,
                                  lease_renewed_at, error_class, traceback)
    SELECT r.id, r.attempts, 'lapsed', r.worker_id, r.last_attempted_at, now(),
           greatest(r.lease_renewed_at, r.last_attempted_at),
           'backwave.results.LeaseLapsed',
           'backwave.results.LeaseLapsed: the lease of worker ' || r.lease_worker_id
               || ' expired at ' || r.lease_expired_at::text
               || ' (database clock) without being renewed, so this attempt''s outcome was never'
               || ' written; the worker died, hung or lost its database connection. '
               || CASE WHEN NOT r.was_suspect
                       THEN 'Attempt ' || r.attempts::text || ' is not counted against max_attempts:'
                            || ' every job under that lease lapsed with it, and this one may only have'
                            || ' been running beside the cause. The job is ready to run again, never'
                            || ' beside another such job on one pump.'
                       ELSE 'Attempt ' || r.attempts::text || ' counts (' || (r.attempts - r.forgiven_attempts)::text
                            || ' of ' || r.max_attempts::text || '): the job was already suspect (its'
                            || ' previous attempt lapsed too) and ran as the only suspect of its pump; '
                            || CASE WHEN r.state = 'ready' THEN 'the job is ready to run again.'
                                    ELSE 'no attempts left, the job failed.' END
                  END
    FROM released AS r
), settling AS (
    SELECT r.id, r.state FROM released AS r WHERE r.state = 'failed'
), noted AS (
    -- A 'lapsed' transition per released job that an observer watches, as write_outcomes_many
    -- notes its outcomes. (The job row read here is the version before "released": task_path
    -- and queue never change.)
    INSERT INTO backwave_transition (job_id, attempt, kind, task_path, queue, occurred_at, state,
                                     deliveries, next_attempt_at, delivered_to, failed_observer, last_error, observers)
    SELECT r.id, r.attempts, 'lapsed', j.task_path, j.queue, now(), 'pending', 0, now(), '{}', '', '', coalesce(o.names, ARRAY[]::varchar[])
    FROM released AS r
    JOIN backwave_job AS j ON j.id = r.id
    CROSS JOIN LATERAL (
        -- The observers it is for: each delivery belongs to one (see claim_transitions).
        SELECT array_agg(DISTINCT w.observer ORDER BY w.observer) FILTER (WHERE w.observer IS NOT NULL) AS names, count(*) AS watchers
        FROM jsonb_to_recordset(%(observed)s::jsonb) AS w(kind text, task_path text, queue text, observer text)
        WHERE w.kind = 'lapsed' AND (w.task_path IS NULL OR w.task_path = j.task_path)
          AND (w.queue IS NULL OR w.queue = j.queue)
    ) AS o
    WHERE %(observed)s::jsonb <> '[]'::jsonb
      AND o.watchers > 0
), watching AS NOT MATERIALIZED (
    SELECT %(observed)s::jsonb AS observed
)
{{settle_dependents}}
SELECT count(*) FROM released


-- ---- transition observers ----------------------------------------------------------------------

-- name: claim_transitions
-- The observer loop's claim (backwave/shell/observers.py), any number of workers at once: SKIP
-- LOCKED gives each a disjoint set of due rows, ordered by the partial index
-- backwave_transition_due (next_attempt_at, id) WHERE state = 'pending'. Claiming pushes
-- next_attempt_at a lease ahead and stamps the claimer's token: a deliverer that dies or hangs
-- past that moment has its rows claimed again by another (at-least-once), and the token fences
-- its late settle_transitions out.
-- A delivery belongs to the observers a row was noted for (its "observers"): a claimer takes
-- only rows waiting for an observer it has registered ("registered", text[]), so a worker of an
-- older release that lacks one (a rolling deploy) leaves that part to a worker that has it; a
-- row that names none (noted by a writer that named none) is anyone's. The claim also records
-- the claimer ("deliverer", NULL: none) and what it registered, at most every 10 s, so the
-- Transitions page can tell a delivery that waits its turn from one no live worker can make;
-- deliverers silent for a day are forgotten here too.
WITH due AS MATERIALIZED (
    SELECT t.id FROM backwave_transition AS t
    WHERE t.state = 'pending' AND t.next_attempt_at <= now()
      AND (cardinality(t.observers) = 0
           OR EXISTS (SELECT FROM unnest(t.observers) AS o(name)
                      WHERE o.name = ANY(%(registered)s::text[]) AND NOT o.name = ANY(t.delivered_to)))
    ORDER BY t.next_attempt_at, t.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), seen AS (
    INSERT INTO backwave_deliverer AS d (id, hostname, pid, observers, seen_at)
    SELECT %(deliverer)s::text, %(hostname)s::text, %(pid)s::int, %(registered)s::text[]::varchar[], now()
    WHERE %(deliverer)s::text IS NOT NULL
    ON CONFLICT (id) DO UPDATE
    SET observers = EXCLUDED.observers, seen_at = EXCLUDED.seen_at
    WHERE d.seen_at < now() - interval '10 seconds' OR d.observers IS DISTINCT FROM EXCLUDED.observers
), forgotten AS (
    DELETE FROM backwave_deliverer AS d
    WHERE %(deliverer)s::text IS NOT NULL AND d.seen_at < now() - interval '1 day'
)
UPDATE backwave_transition AS t
SET claim_token = %(token)s,
    deliveries = t.deliveries + 1,
    next_attempt_at = now() + make_interval(secs => %(lease)s)
FROM due
WHERE t.id = due.id
RETURNING t.id, t.job_id, t.attempt, t.kind, t.task_path, t.queue, t.occurred_at, t.deliveries, t.delivered_to, t.observers


-- name: settle_transitions
-- What one delivery pass did, fenced by the claim's token (a claim that lapsed and was taken
-- again is the new claimer's to settle): a row every observer of which has now run is deleted;
-- a row whose observers this claimer does not have (see claim_transitions) keeps the ones that
-- ran and is due at once for the others; a row with a failed observer keeps the observers that
-- did run (they are not run again), and is due again after its backoff, or left 'dead' for an
-- operator. Returns the ids settled.
WITH result AS (
    SELECT r.* FROM jsonb_to_recordset(%(results)s::jsonb)
         AS r(id bigint, delivered text[], failed_observer text, error text, retry_delay float8, dead boolean)
), done AS (
    DELETE FROM backwave_transition AS t
    USING result AS r
    WHERE t.id = r.id AND t.claim_token = %(token)s AND t.state = 'pending' AND r.failed_observer IS NULL
      AND t.observers::text[] <@ (t.delivered_to::text[] || coalesce(r.delivered, '{}'))
    RETURNING t.id
), passed AS (
    UPDATE backwave_transition AS t
    SET delivered_to = t.delivered_to || coalesce(r.delivered, '{}'),
        next_attempt_at = now(),
        claim_token = NULL
    FROM result AS r
    WHERE t.id = r.id AND t.claim_token = %(token)s AND t.state = 'pending' AND r.failed_observer IS NULL
      AND NOT t.observers::text[] <@ (t.delivered_to::text[] || coalesce(r.delivered, '{}'))
    RETURNING t.id
), failed AS (
    UPDATE backwave_transition AS t
    SET delivered_to = t.delivered_to || coalesce(r.delivered, '{}'),
        failed_observer = r.failed_observer,
        last_error = r.error,
        state = CASE WHEN r.dead THEN 'dead' ELSE 'pending' END,
        next_attempt_at = now() + make_interval(secs => greatest(coalesce(r.retry_delay, 0), 0)),
        claim_token = NULL
    FROM result AS r
    WHERE t.id = r.id AND t.claim_token = %(token)s AND t.state = 'pending' AND r.failed_observer IS NOT NULL
    RETURNING t.id
)
SELECT id FROM done UNION ALL SELECT id FROM passed UNION ALL SELECT id FROM failed


-- ---- schedules ---------------------------------------------------------------------------------

-- name: sync_schedules
-- Worker start: the declared schedules become rows (keyed by name), and enabled rows no longer
-- declared are disabled, not deleted, so their jobs keep their link. Any number of workers may
-- start at once: ON CONFLICT settles concurrent inserts, and updates of one row serialize.
-- next_run goes back to NULL when the expression changed or the schedule was disabled: the first
-- maintenance run then computes the next slot from the database clock and mints nothing, so a
-- redefined or re-enabled schedule never catches up on slots from before.
WITH declared AS (
    SELECT d.*
    FROM jsonb_to_recordset(%(schedules)s::jsonb)
         AS d(name text, task_path text, cron text, args jsonb, kwargs jsonb, queue text,
              priority smallint, max_attempts int, backoff_base float8, backoff_max float8,
              backend text, tags varchar[], enabled boolean, timeout float8, limit_key text)
), written AS (
    INSERT INTO backwave_schedule AS s (name, task_path, cron, args, kwargs, queue, priority,
                                        max_attempts, backoff_base, backoff_max, backend, tags,
                                        enabled, last_slot, next_run, created_at, updated_at, timeout, limit_key)
    SELECT d.name, d.task_path, d.cron, d.args, d.kwargs, d.queue, d.priority, d.max_attempts,
           d.backoff_base, d.backoff_max, d.backend, coalesce(d.tags, '{}'::varchar[]), d.enabled,
           NULL, NULL, now(), now(), d.timeout, d.limit_key
    FROM declared AS d
    ON CONFLICT (name) DO UPDATE
    SET task_path = excluded.task_path,
        cron = excluded.cron,
        args = excluded.args,
        kwargs = excluded.kwargs,
        queue = excluded.queue,
        priority = excluded.priority,
        max_attempts = excluded.max_attempts,
        backoff_base = excluded.backoff_base,
        backoff_max = excluded.backoff_max,
        backend = excluded.backend,
        tags = excluded.tags,
        timeout = excluded.timeout,
        limit_key = excluded.limit_key,
        enabled = excluded.enabled,
        next_run = CASE WHEN s.cron = excluded.cron AND s.enabled AND excluded.enabled
                        THEN s.next_run END,
        updated_at = now()
    RETURNING s.id
), retired AS (
    UPDATE backwave_schedule AS s
    SET enabled = false, next_run = NULL, updated_at = now()
    WHERE s.enabled AND NOT EXISTS (SELECT FROM declared AS d WHERE d.name = s.name)
    RETURNING s.name
)
-- (written runs although nothing reads it: data-modifying CTEs always run to completion.)
SELECT name FROM retired ORDER BY name


-- name: due_schedules
-- Maintenance, step one: which schedules have a slot due, and the database clock to evaluate
-- their cron expressions against (the worker's own clock is never used, so a skewed host changes
-- nothing). The schedule table is small: a sequential scan is the right plan.
SELECT s.id, s.name, s.cron, s.next_run, now() AS db_now
FROM backwave_schedule AS s
WHERE s.enabled AND (s.next_run IS NULL OR s.next_run <= now())
ORDER BY s.next_run NULLS FIRST, s.id
LIMIT %(limit)s


-- name: mint_schedules_many
-- Maintenance, step two: mint the slots the worker computed from due_schedules' clock. Any
-- number of nodes may run this at once; each slot still becomes one job:
--   * the schedule row is locked FOR UPDATE SKIP LOCKED, so one minter at a time handles it and
--     the others skip it (the row is re-checked when it changed since the snapshot: READ
--     COMMITTED re-evaluates the WHERE clause on the newest version, so a minter that computed
--     its slot before another minter moved next_run on finds the schedule no longer due);
--   * a slot not later than last_slot is never minted again (a slow minter's older slot);
--   * and, whatever happens, the partial unique index on (schedule_id, schedule_slot) with
--     ON CONFLICT DO NOTHING: a slot is one job, by constraint, not by luck.
-- After downtime due_schedules' caller passes only the latest slot that has passed, so missed
-- slots are minted once, not once per missed tick. "s.cron = d.cron" skips a schedule redefined
-- since its slots were computed. The minted job is due at its slot (already past) and wakes the
-- pumps of its queue with a hint, as an enqueue does.
WITH due AS (
    SELECT d.*
    FROM jsonb_to_recordset(%(slots)s::jsonb)
         AS d(schedule_id bigint, cron text, slot timestamptz, next_run timestamptz)
), locked AS MATERIALIZED (
    SELECT s.id, s.task_path, s.args, s.kwargs, s.queue, s.priority, s.max_attempts,
           s.backoff_base, s.backoff_max, s.backend, s.tags, s.timeout, s.limit_key, s.last_slot, d.slot, d.next_run
    FROM backwave_schedule AS s
    JOIN due AS d ON d.schedule_id = s.id
    WHERE s.enabled AND s.cron = d.cron
      AND (s.next_run IS NULL OR s.next_run <= now())
    FOR UPDATE OF s SKIP LOCKED
), minted AS (
    INSERT INTO backwave_job (task_path, payload, queue, priority, run_at, max_attempts,
                              backoff_base, backoff_max, backend, tags, state, attempts,
                              enqueued_at, worker_id, schedule_id, schedule_slot, timeout, limit_key)
    SELECT l.task_path, jsonb_build_object('args', l.args, 'kwargs', l.kwargs), l.queue,
           l.priority, l.slot, l.max_attempts, l.backoff_base, l.backoff_max, l.backend, l.tags,
           'ready', 0, now(), '', l.id, l.slot, l.timeout, l.limit_key
    FROM locked AS l
    WHERE l.slot IS NOT NULL AND (l.last_slot IS NULL OR l.slot > l.last_slot)
    ON CONFLICT (schedule_id, schedule_slot) WHERE schedule_id IS NOT NULL DO NOTHING
    RETURNING id, queue
), advanced AS (
    UPDATE backwave_schedule AS s
    SET last_slot = greatest(s.last_slot, l.slot), next_run = l.next_run
    FROM locked AS l
    WHERE s.id = l.id
), hinted AS (
    SELECT count(pg_notify('backwave_hint', q.queue)) AS sent
    FROM (SELECT DISTINCT queue FROM minted) AS q
)
-- hinted is a plain SELECT, which runs only when read: hence the cross join.
SELECT m.id FROM minted AS m CROSS JOIN hinted ORDER BY m.id


-- ---- retention ---------------------------------------------------------------------------------

-- name: purge_jobs
-- One bounded batch of the retention purge; the caller repeats it while pages come back full.
-- Each listed state gets its own ordered scan of the partial index backwave_job_finished
-- (state, finished_at), oldest first, through LATERAL: one OR across states would make the
-- planner collect every matching row in a bitmap before the LIMIT. The state list repeats the
-- index's predicate because r.state is only known at run time, and the planner uses a partial
-- index only for a query it can prove stays inside it.
-- FOR UPDATE SKIP LOCKED: concurrent purges on other nodes take disjoint rows, and a row an
-- operator is touching right now waits for the next run. Attempts go with their job (the
-- foreign key is ON DELETE CASCADE).
WITH doomed AS MATERIALIZED (
    SELECT c.id
    FROM jsonb_to_recordset(%(older_than)s::jsonb) AS r(state text, seconds float8)
    CROSS JOIN LATERAL (
        SELECT j.id
        FROM backwave_job AS j
        WHERE j.state = r.state
          AND j.state IN ('succeeded', 'failed', 'cancelled', 'quarantined')
          AND j.finished_at < now() - make_interval(secs => r.seconds)
          -- An ancestor stays while a dependent of it may still run and read its Job Output
          -- (one probe of the ancestor index; none for a job that has no dependents).
          AND NOT EXISTS (
              SELECT FROM backwave_dependency AS d JOIN backwave_job AS w ON w.id = d.job_id
              WHERE d.ancestor_id = j.id AND w.state IN ('waiting', 'held', 'ready', 'running'))
          -- Not before its attempts are in the task statistics (roll_up_task_stats, which
          -- maintenance runs first): one probe of the (job_id, number) index per job. Without
          -- the rollup's row (never in a migrated database) nothing is held back.
          AND NOT EXISTS (
              SELECT FROM backwave_attempt AS a
              WHERE a.job_id = j.id
                AND a.id > (SELECT w.watermark FROM backwave_stats_rollup AS w WHERE w.id = 1)
          )
        ORDER BY j.finished_at
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS c
    LIMIT %(limit)s
), deleted AS (
    DELETE FROM backwave_job AS j
    USING doomed
    WHERE j.id = doomed.id
    RETURNING j.id
)
SELECT count(*) FROM deleted


-- ---- per-task statistics -------------------------------------------------------------------------

-- name: roll_up_task_stats
-- Maintenance: fold up to %(limit)s finished attempts past the watermark into backwave_task_stat,
-- one bucket per task, resolution (a minute, an hour) and time. Any number of nodes may run it at
-- once: the rollup's one row is taken FOR UPDATE SKIP LOCKED, so one node rolls up and the others
-- do nothing this time. A row missing (a flushed database) is written again, and rolls up nothing
-- in that run.
--
-- How far is safe. Attempt ids come from a sequence, and a transaction may commit id 10 after
-- id 11 is visible; a watermark moved past 11 would never see 10. So each run that has caught up
-- takes a horizon (the sequence's last value) and notes pg_current_snapshot()'s xmax; a later run
-- rolls up to that horizon only once no transaction older than that xmax is still running (the
-- snapshot's in-progress list: our own transaction is never in it), or once the horizon is older
-- than %(settle)s seconds, so a transaction left open elsewhere in the cluster delays the
-- statistics by that much at most. An outcome write still open that long (one statement) would be
-- left out of the statistics, and of nothing else.
--
-- Outcomes: a 'failed' attempt is "failed" when it was its job's last (the job is failed at that
-- attempt now), else "retried"; the other states count as themselves. Durations are finished_at - started_at, which the outcome write
-- records from the worker's own clock; a lapsed attempt has none (its end is when the lapse was
-- noticed). The histogram bins are backwave/taskstats.py's bin_of(), computed here alike.
WITH ensured AS (
    -- Only when the row is missing from this snapshot: an INSERT that found it would wait for a
    -- rollup in flight on another node (its UPDATE of the row) before doing nothing.
    INSERT INTO backwave_stats_rollup (id, watermark, horizon, horizon_xmax, rolled_up)
    SELECT 1, 0, 0, 0, 0
    WHERE NOT EXISTS (SELECT FROM backwave_stats_rollup WHERE id = 1)
    ON CONFLICT DO NOTHING
), state AS MATERIALIZED (
    SELECT r.watermark, r.horizon,
           (NOT EXISTS (SELECT FROM pg_snapshot_xip(pg_current_snapshot()) AS x(xid)
                        WHERE x.xid::text::bigint < r.horizon_xmax)
            OR r.horizon_at IS NULL
            OR r.horizon_at <= now() - make_interval(secs => %(settle)s)) AS settled
    FROM backwave_stats_rollup AS r
    WHERE r.id = 1
    FOR UPDATE SKIP LOCKED
), page AS MATERIALIZED (
    SELECT a.id, a.job_id, a.number, a.state, a.started_at, a.finished_at
    FROM state AS s
    CROSS JOIN LATERAL (
        SELECT a.*
        FROM backwave_attempt AS a
        WHERE s.settled AND a.id > s.watermark AND a.id <= s.horizon
        ORDER BY a.id
        LIMIT %(limit)s
    ) AS a
), fact AS (
    SELECT j.task_path, p.finished_at, p.number > 1 AS rerun,
           CASE WHEN p.state = 'failed' AND j.state = 'failed' AND j.attempts = p.number THEN 'failed'
                WHEN p.state = 'failed' THEN 'retried'
                ELSE p.state END AS outcome,
           CASE WHEN p.state <> 'lapsed' AND p.started_at IS NOT NULL
                THEN greatest(extract(epoch FROM p.finished_at - p.started_at)::float8, 0) END AS duration
    FROM page AS p
    JOIN backwave_job AS j ON j.id = p.job_id
), binned AS (
    SELECT f.task_path, f.outcome, f.rerun, f.duration, r.resolution,
           to_timestamp(floor(extract(epoch FROM f.finished_at) / r.resolution) * r.resolution) AS bucket,
           CASE WHEN f.duration IS NULL THEN NULL
                WHEN f.duration < %(bin_base)s THEN 0
                ELSE least(%(max_bin)s, floor(%(bins_per_octave)s * ln(f.duration / %(bin_base)s) / ln(2))::int + 1)
           END AS bin
    FROM fact AS f
    CROSS JOIN (VALUES (60), (3600)) AS r(resolution)
), histogram AS (
    SELECT c.task_path, c.resolution, c.bucket, jsonb_object_agg(c.bin::text, c.n) AS bins
    FROM (SELECT task_path, resolution, bucket, bin, count(*) AS n
          FROM binned WHERE bin IS NOT NULL
          GROUP BY task_path, resolution, bucket, bin) AS c
    GROUP BY c.task_path, c.resolution, c.bucket
), totals AS (
    SELECT b.task_path, b.resolution, b.bucket,
           count(*) FILTER (WHERE b.outcome = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE b.outcome = 'retried') AS retried,
           count(*) FILTER (WHERE b.outcome = 'failed') AS failed,
           count(*) FILTER (WHERE b.outcome = 'quarantined') AS quarantined,
           count(*) FILTER (WHERE b.outcome = 'lapsed') AS lapsed,
           count(*) FILTER (WHERE b.outcome = 'cancelled') AS cancelled,
           count(*) FILTER (WHERE b.outcome = 'snoozed') AS snoozed,
           count(*) FILTER (WHERE b.rerun) AS reruns,
           count(b.duration) AS timed,
           coalesce(sum(b.duration), 0) AS duration_sum,
           coalesce(max(b.duration), 0) AS duration_max
    FROM binned AS b
    GROUP BY b.task_path, b.resolution, b.bucket
), upserted AS (
    INSERT INTO backwave_task_stat AS t (task_path, resolution, bucket, succeeded, retried, failed,
                                         quarantined, lapsed, cancelled, snoozed, reruns, timed,
                                         duration_sum, duration_max, duration_histogram)
    SELECT o.task_path, o.resolution, o.bucket, o.succeeded, o.retried, o.failed, o.quarantined,
           o.lapsed, o.cancelled, o.snoozed, o.reruns, o.timed, o.duration_sum, o.duration_max,
           coalesce(h.bins, '{}'::jsonb)
    FROM totals AS o
    LEFT JOIN histogram AS h USING (task_path, resolution, bucket)
    ON CONFLICT (resolution, bucket, task_path) DO UPDATE
    SET succeeded = t.succeeded + excluded.succeeded,
        retried = t.retried + excluded.retried,
        failed = t.failed + excluded.failed,
        quarantined = t.quarantined + excluded.quarantined,
        lapsed = t.lapsed + excluded.lapsed,
        cancelled = t.cancelled + excluded.cancelled,
        snoozed = t.snoozed + excluded.snoozed,
        reruns = t.reruns + excluded.reruns,
        timed = t.timed + excluded.timed,
        duration_sum = t.duration_sum + excluded.duration_sum,
        duration_max = greatest(t.duration_max, excluded.duration_max),
        duration_histogram = (
            SELECT coalesce(jsonb_object_agg(e.bin, e.n), '{}'::jsonb)
            FROM (SELECT m.key AS bin, sum(m.value::bigint) AS n
                  FROM (SELECT * FROM jsonb_each_text(t.duration_histogram)
                        UNION ALL
                        SELECT * FROM jsonb_each_text(excluded.duration_histogram)) AS m
                  GROUP BY m.key) AS e
        )
    RETURNING 1
), paged AS (
    SELECT count(*) AS n, max(id) AS last_id FROM page
), moved AS (
    UPDATE backwave_stats_rollup AS r
    SET watermark = CASE WHEN p.n = %(limit)s THEN p.last_id
                         WHEN s.settled THEN s.horizon
                         ELSE r.watermark END,
        horizon = CASE WHEN s.settled AND p.n < %(limit)s
                       THEN coalesce(pg_sequence_last_value(pg_get_serial_sequence('backwave_attempt', 'id')::regclass), 0)
                       ELSE r.horizon END,
        horizon_xmax = CASE WHEN s.settled AND p.n < %(limit)s
                            THEN pg_snapshot_xmax(pg_current_snapshot())::text::bigint
                            ELSE r.horizon_xmax END,
        horizon_at = CASE WHEN s.settled AND p.n < %(limit)s THEN now() ELSE r.horizon_at END,
        rolled_up = r.rolled_up + p.n,
        rolled_at = now()
    FROM state AS s, paged AS p
    WHERE r.id = 1
    RETURNING p.n
)
SELECT coalesce((SELECT n FROM moved), 0), (SELECT count(*) FROM upserted)


-- ---- pump health -------------------------------------------------------------------------------

-- name: record_pumps_many
-- At a pump's start, on each heartbeat and whenever its status changes: never per job.
INSERT INTO backwave_pump AS p (worker_id, "group", hostname, pid, status, reason, in_flight,
                                queues, lease_duration, started_at, last_heartbeat_at)
SELECT r.worker_id, r."group", r.hostname, r.pid, r.status, r.reason, r.in_flight,
       ARRAY(SELECT jsonb_array_elements_text(r.queues))::varchar(64)[], r.lease_duration, now(), now()
FROM jsonb_to_recordset(%(pumps)s::jsonb)
     AS r(worker_id text, "group" text, hostname text, pid int, status text, reason text,
          in_flight int, queues jsonb, lease_duration float8)
ON CONFLICT (worker_id) DO UPDATE
SET status = excluded.status,
    reason = excluded.reason,
    in_flight = excluded.in_flight,
    queues = excluded.queues,
    lease_duration = excluded.lease_duration,
    last_heartbeat_at = now()


-- name: unserved_queues
-- The queues with a due ready job that no live pump serves, each with how long its oldest due
-- job has waited: what the dashboard, the Queues page and a worker's health call degraded. A
-- pump serves the queues its row lists while it is not halted and holds a live lease (the
-- database clock's verdict, as the Pumps page has it: a stale heartbeat under a live lease still
-- serves). A paused queue is left out: its jobs wait on purpose. The distinct queues of ready
-- rows come from a loose index scan of the claim index (queue first: one probe per queue, never
-- a scan of the backlog), and each unserved queue's oldest due job from one probe per priority,
-- as admin_queue_latency finds it.
WITH RECURSIVE served AS MATERIALIZED (
    SELECT DISTINCT q.name
    FROM backwave_pump AS p
    CROSS JOIN LATERAL unnest(p.queues) AS q(name)
    WHERE p.status <> 'halted'
      AND EXISTS (SELECT FROM backwave_lease AS l WHERE l.worker_id = p.worker_id AND l.expires_at > now())
), ready_queues(name) AS (
    (SELECT j.queue FROM backwave_job AS j WHERE j.state = 'ready' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM backwave_job AS j WHERE j.state = 'ready' AND j.queue > r.name ORDER BY j.queue LIMIT 1)
    FROM ready_queues AS r
    WHERE r.name IS NOT NULL
), heads(queue, priority, run_at) AS (
    SELECT r.name, h.priority, h.run_at
    FROM ready_queues AS r
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_at FROM backwave_job AS j
        WHERE j.state = 'ready' AND j.queue = r.name
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT 1
    ) AS h
    WHERE r.name IS NOT NULL
      AND r.name NOT IN (SELECT name FROM served)
      AND NOT EXISTS (SELECT FROM backwave_queue AS q WHERE q.name = r.name AND q.paused)
    UNION ALL
    SELECT p.queue, n.priority, n.run_at
    FROM heads AS p
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_at FROM backwave_job AS j
        WHERE j.state = 'ready' AND j.queue = p.queue AND j.priority < p.priority
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT 1
    ) AS n
)
SELECT h.queue, extract(epoch FROM now() - min(h.run_at))::float8
FROM heads AS h
WHERE h.run_at <= now()
GROUP BY h.queue
ORDER BY h.queue


-- name: forget_pumps_many
WITH gone AS (
    DELETE FROM backwave_pump WHERE worker_id = ANY(%(worker_ids)s::text[]) RETURNING 1
)
SELECT count(*) FROM gone


-- name: stale_statistics
-- The tables of %(tables)s whose planner statistics fell behind: changed since their last
-- ANALYZE (by anyone, autovacuum included) by more than base + fraction * their rows. With
-- statistics taken while a table was empty, every estimate of it is about one row, and plans
-- that are right for one row (a sequential scan for the outcome write) are kept for 20,000.
-- The counters come from the cumulative statistics system, which lags its writers by up to a
-- second: a refresh can come one maintenance run late, never wrong.
SELECT s.relname::text
FROM pg_stat_user_tables AS s
JOIN pg_class AS c ON c.oid = s.relid
WHERE s.relid IN (SELECT to_regclass(t) FROM unnest(%(tables)s::text[]) AS t)
  AND s.n_mod_since_analyze > %(base)s + %(fraction)s * greatest(c.reltuples, 0)
ORDER BY s.relname


-- name: analyze_backwave_job
-- refresh_statistics' ANALYZE of each table stale_statistics may name, one fixed statement a
-- table (no identifier is ever built from data). SKIP_LOCKED: a table another session is
-- vacuuming or analyzing is left to it.
ANALYZE (SKIP_LOCKED) backwave_job


-- name: analyze_backwave_attempt
ANALYZE (SKIP_LOCKED) backwave_attempt


-- name: analyze_backwave_dependency
ANALYZE (SKIP_LOCKED) backwave_dependency


-- name: analyze_backwave_transition
ANALYZE (SKIP_LOCKED) backwave_transition


-- name: purge_pumps
-- Pumps that stopped reporting long ago (killed, host gone): forgotten by maintenance.
WITH gone AS (
    DELETE FROM backwave_pump
    WHERE last_heartbeat_at < now() - make_interval(secs => %(older_than)s)
    RETURNING 1
)
SELECT count(*) FROM gone


-- name: purge_task_stats
-- Maintenance: the per-task statistics grow a row per task a minute (and an hour) for as long as
-- tasks run, so buckets older than their resolution's retention are dropped, at most %(limit)s
-- a run (the next run takes the rest). Each resolution's cutoff is a range of the unique index
-- (resolution, bucket, task_path); rows another node is deleting are skipped, not waited for.
WITH keep(resolution, seconds) AS (
    SELECT * FROM unnest(%(resolutions)s::int[], %(seconds)s::float8[])
), doomed AS (
    SELECT s.ctid
    FROM keep AS k
    CROSS JOIN LATERAL (
        SELECT t.ctid FROM backwave_task_stat AS t
        WHERE t.resolution = k.resolution AND t.bucket < now() - make_interval(secs => k.seconds)
        LIMIT %(limit)s
        FOR UPDATE SKIP LOCKED
    ) AS s
    LIMIT %(limit)s
), gone AS (
    DELETE FROM backwave_task_stat WHERE ctid IN (SELECT ctid FROM doomed)
    RETURNING 1
)
SELECT count(*) FROM gone


-- name: forget_overruns
-- The handlers of these overruns returned: they count against no limit any more. Only the
-- worker's own (its lease's); a lease that is expired or released takes its overruns with it
-- (the foreign key cascades), and the claims count only those of live leases, so a worker that
-- dies or is cut off holds no key for ever. No lock but the overrun rows' own.
WITH forgotten AS (
    DELETE FROM backwave_overrun AS o
    USING unnest(%(job_ids)s::bigint[], %(attempts)s::int[]) AS f(job_id, attempt)
    WHERE o.job_id = f.job_id AND o.attempt = f.attempt AND o.lease_id = %(lease_id)s
    RETURNING 1
)
SELECT count(*) FROM forgotten


-- name: lock_limited_queues
-- Sent just before a claim, in the same transaction (one pipelined round-trip). It locks the
-- rows of the claim's queues that carry a concurrency limit, so claimers of a limited queue take
-- turns: READ COMMITTED gives the claim that follows a fresh snapshot, taken after this lock was
-- granted, and its count of the queue's running jobs includes every claim committed before it.
-- A queue without a limit has nothing to lock and costs one index probe. The ORDER BY makes
-- every claimer lock in the same order (no deadlock between pumps serving several queues).
SELECT name FROM backwave_queue
WHERE name = ANY(%(queues)s) AND concurrency_limit IS NOT NULL AND NOT paused
ORDER BY name
FOR NO KEY UPDATE


-- name: lock_admitted_queues
-- lock_limited_queues for claim_jobs_admitted: the rows of the queues claimed that carry any
-- limit, in name order, so claimers of each such queue take turns (see claim_jobs_admitted).
SELECT name FROM backwave_queue
WHERE name = ANY(%(queues)s)
  AND (concurrency_limit IS NOT NULL OR key_concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL
       OR key_rate_limit IS NOT NULL)
  AND NOT paused
ORDER BY name
FOR NO KEY UPDATE


-- name: reconcile_lease
-- After a claim whose answer was lost: it may have committed, leaving jobs running under this
-- lease that the pump never heard of (they would sit there for as long as the pump lives). Give
-- back every job running under the lease at an attempt the pump does not hold, as
-- release_jobs_many does (ready, due now, attempt refunded). By (job, attempt), not by job: a
-- retry due at once whose write committed with the lost claim was taken back as the next
-- attempt, while the pump still holds the outcome of the one before. The pump sends this before
-- its next claim, so nothing it is about to claim can be among them. Returns (id, attempt) of
-- what it gave back, the attempt as it ran (read before the refund, the rows locked meanwhile),
-- busy false; and, busy true (attempt NULL), the ids of such jobs whose rows another transaction
-- held: not waited for, they stay under the lease and the pump releases them later (see ********
-- in core/transitions.py).
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), unknown AS MATERIALIZED (
    SELECT j.id
    FROM backwave_job AS j
    WHERE j.lease_id = %(lease_id)s
      AND j.state = 'running'
      AND NOT EXISTS (
          SELECT FROM unnest(%(known_ids)s::bigint[], %(known_attempts)s::int[]) AS k(id, attempt)
          WHERE k.id = j.id AND k.attempt = j.attempts)
      AND EXISTS (SELECT FROM lease)
), stray AS MATERIALIZED (
    SELECT j.id, j.attempts
    FROM backwave_job AS j
    WHERE j.id = ANY(ARRAY(SELECT u.id FROM unknown AS u))
      AND j.lease_id = %(lease_id)s
      AND j.state = 'running'
      AND NOT EXISTS (
          SELECT FROM unnest(%(known_ids)s::bigint[], %(known_attempts)s::int[]) AS k(id, attempt)
          WHERE k.id = j.id AND k.attempt = j.attempts)
    FOR NO KEY UPDATE SKIP LOCKED
), given AS (
    UPDATE backwave_job AS j
    SET state = 'ready',
        lease_id = NULL,
        run_at = now(),
        attempts = greatest(j.attempts - 1, 0),
        started_at = CASE WHEN j.attempts <= 1 THEN NULL ELSE j.started_at END
    FROM stray AS s
    WHERE j.id = s.id
    RETURNING j.id, s.attempts
)
SELECT g.id, g.attempts, false AS busy FROM given AS g
UNION ALL
SELECT u.id, NULL, true FROM unknown AS u WHERE u.id <> ALL (ARRAY(SELECT s.id FROM stray AS s))


-- name: enqueue_many
-- Shared by the tasks backend (on Django's connection, inside the caller's transaction) and the
-- stores (on their own). One statement for any number of jobs, with the batch as one parameter:
-- a JSON array that jsonb_to_recordset() turns into rows. The parameter count stays the same
-- however many jobs there are (a multi-row VALUES list hits PostgreSQL's 65,535-parameter limit
-- at a few thousand jobs), and encoding the batch is one C call (json.dumps) instead of ten
-- Python-built arrays. A NULL run_at means "due now" by the database clock.
-- With hint true, one Wake-Up Hint per distinct queue: pg_notify() inside the enqueuing
-- transaction goes out only on commit (a rolled-back enqueue wakes nobody), and PostgreSQL folds
-- identical notifications of one transaction into one, so a bulk enqueue sends one per queue.
-- With hint false the filter is a one-time gate: no queue is even read. The SELECT-only CTE runs
-- only when referenced, hence the cross join with its one-row count. Ids come from the sequence
-- in insertion order, which WITH ORDINALITY plus the ORDER BY makes the input order, so ORDER BY
-- id gives ids in input order. A job's limit_key is left out of the JSON when it has none (NULL).
-- Jobs with a uniqueness key go through enqueue_unique_many instead. Each row also carries the
-- stored enqueued_at (the transaction's now()), which the TaskResult enqueue hands back shows.
WITH inserted AS (
    INSERT INTO backwave_job (
        task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
        backend, tags, state, attempts, enqueued_at, worker_id, trace_context, timeout, limit_key
    )
    SELECT n.task_path, n.payload, n.queue, n.priority, coalesce(n.run_at, now()), n.max_attempts,
           n.backoff_base, n.backoff_max, n.backend,
           coalesce(n.tags, '{}'::varchar[]),
           'ready', 0, now(), '', n.trace_context, n.timeout, n.limit_key
    FROM ROWS FROM (
             jsonb_to_recordset(%(jobs)s::jsonb)
             AS (task_path text, payload jsonb, queue text, priority smallint, run_at timestamptz,
                 max_attempts int, backoff_base float8, backoff_max float8, backend text, tags varchar[],
                 trace_context jsonb, timeout float8, limit_key text)
         ) WITH ORDINALITY
         AS n(task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
              backend, tags, trace_context, timeout, limit_key, position)
    ORDER BY n.position
    RETURNING id, queue, enqueued_at
), hinted AS (
    SELECT count(pg_notify('backwave_hint', q.queue)) AS sent
    FROM (SELECT DISTINCT queue FROM inserted) AS q
    WHERE %(hint)s::boolean
)
SELECT inserted.id, inserted.enqueued_at FROM inserted CROSS JOIN hinted ORDER BY inserted.id


-- name: enqueue_with_dependencies
-- enqueue_many for a batch in which some job waits for others (after=, a chain, a group, a
-- DAG): the jobs and their dependency rows in one statement, or nothing at all. Each job's
-- "after" is a JSON array of {job, pos, on_failure}: an existing job's id, or the 1-based
-- position of a job of this batch (the caller has refused cycles). An existing ancestor is read
-- without a lock (beyond the foreign key's FOR KEY SHARE, which no engine statement conflicts
-- with: they all change no key): the enqueuing transaction may stay open for as long as its
-- caller likes, and a running ancestor's row is the engine's to write meanwhile. An ancestor
-- that ends between this read and the commit is settled at the commit, by the deferred trigger
-- backwave_settle_new_dependent (migration 0022), which also flags it has_dependents; the
-- observers it notes a cancelled dependent's transition for are this statement's (set as
-- backwave.observed for the transaction). A job waits (state waiting, waiting_on = ancestors
-- not yet succeeded) or, when every ancestor has already succeeded, is ready.
-- Refused, with nothing inserted: an ancestor id that names no job ("refused" returns it with a
-- NULL state) and one that already failed, was cancelled or quarantined when its dependency's
-- on_failure is not "run" (returned with its state: a dependent cancelled or held at birth is a
-- mistake to report, not to store). Rows: the new ids in input order (each with its state and
-- stored enqueued_at), or the refused ancestors, each with the caller's enable_seqscan (see
-- "checked").
--
-- Each edge's two foreign keys are checked when this statement ends (NOT DEFERRABLE, migration
-- 0017), by lookups of backwave_job planned under key_lookups_by_index: planned as sequential
-- scans, a fan-in of 20,000 read the whole table 40,000 times (50 s).
WITH {{key_lookups_by_index}}, given AS MATERIALIZED (
    SELECT n.*
    FROM ROWS FROM (
             jsonb_to_recordset(%(jobs)s::jsonb)
             AS (task_path text, payload jsonb, queue text, priority smallint, run_at timestamptz,
                 max_attempts int, backoff_base float8, backoff_max float8, backend text,
                 tags varchar[], trace_context jsonb, timeout float8, limit_key text, after jsonb)
         ) WITH ORDINALITY
         AS n(task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
              backend, tags, trace_context, timeout, limit_key, after, position)
), wanted AS MATERIALIZED (
    SELECT g.position AS job_position, e.job AS ancestor_id, e.pos AS ancestor_position,
           e.on_failure, e.n AS dependency_position
    FROM given AS g
    CROSS JOIN LATERAL ROWS FROM (
        jsonb_to_recordset(coalesce(g.after, '[]'::jsonb)) AS (job bigint, pos bigint, on_failure text)
    ) WITH ORDINALITY AS e(job, pos, on_failure, n)
), ancestors AS MATERIALIZED (
    SELECT j.id, j.state
    FROM backwave_job AS j
    WHERE j.id IN (SELECT w.ancestor_id FROM wanted AS w WHERE w.ancestor_id IS NOT NULL)
), refused AS MATERIALIZED (
    SELECT DISTINCT w.ancestor_id, a.state
    FROM wanted AS w
    LEFT JOIN ancestors AS a ON a.id = w.ancestor_id
    WHERE w.ancestor_id IS NOT NULL
      AND (a.id IS NULL OR (a.state IN ('failed', 'cancelled', 'quarantined') AND w.on_failure <> 'run'))
), waits AS (
    SELECT w.job_position,
           count(*) FILTER (WHERE w.ancestor_position IS NOT NULL
                               OR a.state NOT IN ('succeeded', 'failed', 'cancelled', 'quarantined')) AS n
    FROM wanted AS w
    LEFT JOIN ancestors AS a ON a.id = w.ancestor_id
    GROUP BY w.job_position
), inserted AS (
    INSERT INTO backwave_job (
        task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
        backend, tags, state, waiting_on, attempts, enqueued_at, worker_id, trace_context, timeout, limit_key,
        has_dependents
    )
    SELECT g.task_path, g.payload, g.queue, g.priority, coalesce(g.run_at, now()), g.max_attempts,
           g.backoff_base, g.backoff_max, g.backend, coalesce(g.tags, '{}'::varchar[]),
           CASE WHEN coalesce(x.n, 0) > 0 THEN 'waiting' ELSE 'ready' END, coalesce(x.n, 0),
           0, now(), '', g.trace_context, g.timeout, g.limit_key,
           EXISTS (SELECT FROM wanted AS w WHERE w.ancestor_position = g.position)
    FROM given AS g
    LEFT JOIN waits AS x ON x.job_position = g.position
    WHERE NOT EXISTS (SELECT FROM refused)
    ORDER BY g.position
    RETURNING id, queue, state, enqueued_at
), numbered AS MATERIALIZED (
    -- Ids come from the sequence in insertion order, which is input order (see enqueue_many).
    SELECT i.id, i.queue, i.state, i.enqueued_at, row_number() OVER (ORDER BY i.id) AS position
    FROM inserted AS i
), linked AS (
    INSERT INTO backwave_dependency (job_id, ancestor_id, on_failure, position)
    SELECT dependent.id, coalesce(w.ancestor_id, batch_ancestor.id), w.on_failure, w.dependency_position
    FROM wanted AS w
    JOIN numbered AS dependent ON dependent.position = w.job_position
    LEFT JOIN numbered AS batch_ancestor ON batch_ancestor.position = w.ancestor_position
), hinted AS (
    SELECT count(pg_notify('backwave_hint', q.queue)) AS sent
    FROM (SELECT DISTINCT queue FROM numbered WHERE state = 'ready') AS q
    WHERE %(hint)s::boolean
)
SELECT n.id, NULL::bigint AS refused_id, NULL::text AS refused_state, k.enable_seqscan, n.state, n.enqueued_at
FROM numbered AS n CROSS JOIN hinted CROSS JOIN checked AS k
CROSS JOIN (SELECT set_config('backwave.observed', %(observed)s, true)) AS watching
UNION ALL
SELECT NULL, r.ancestor_id, r.state, k.enable_seqscan, NULL, NULL FROM refused AS r CROSS JOIN checked AS k
ORDER BY 1, 2


-- name: key_lookups_by_index
-- Not a statement: the head CTEs ({{key_lookups_by_index}}) of the statements on a caller's
-- connection whose foreign-key lookups run per row (enqueue_with_dependencies' key checks,
-- purge_selected_jobs' cascades). PostgreSQL plans each such lookup once per session and keeps
-- it (after five custom plans, a generic one, used whatever the tables grow to); planned while
-- the tables were a page or two (just emptied and vacuumed, a session's first small workflow or
-- purge), it is a sequential scan, run once per row. "checked" turns enable_seqscan off for the
-- rest of the transaction, so whenever a lookup is planned (first use, or again after an
-- ANALYZE invalidated the plan) it is an index scan; a plan kept is not re-planned when the
-- setting changes back, so it stays one. SET LOCAL: an autocommit statement's transaction ends
-- with it; inside a caller's transaction, the caller puts back the value "caller" read, which
-- the including statement returns (restore_enable_seqscan). The including statement's own plan
-- was made before it ran, under the caller's setting.
caller AS MATERIALIZED (
    SELECT current_setting('enable_seqscan') AS enable_seqscan
), checked AS MATERIALIZED (
    SELECT c.enable_seqscan, set_config('enable_seqscan', 'off', true) FROM caller AS c
)


-- name: restore_enable_seqscan
-- After enqueue_with_dependencies or purge_selected_jobs inside a caller's transaction: the
-- caller's enable_seqscan, which that statement returned, back in force before the caller's
-- next statement. A SET LOCAL of the caller's own value: it ends with the transaction, as the
-- statement's did.
SELECT set_config('enable_seqscan', %(enable_seqscan)s, true)


-- name: enqueue_unique_many
-- enqueue_many for a batch in which some job declares uniqueness. The plain statement stays as
-- it is, so enqueues without a key pay nothing for this one.
--
-- The stored key is the task path, the caller's key and, for a key with a period, the period and
-- the number of the period's window that now() (the database clock) falls in, so "unique per
-- hour" is one key per clock hour. The partial unique index backwave_job_unique_key (WHERE
-- unique_key IS NOT NULL) is the arbiter of ON CONFLICT DO NOTHING: a key that a transaction
-- still in flight holds makes the insert wait for it, then insert (it rolled back) or find the
-- key taken (it committed). Two enqueues in two transactions make one job either way. A key is
-- held only while its job is in a covered state (the trigger of migration 0008).
--
-- DO NOTHING, not DO UPDATE: a duplicate must lock no row the engine writes. DO UPDATE locks the
-- job it finds (FOR NO KEY UPDATE, and writes it even when nothing changes) until the caller's
-- transaction ends, and the pump's outcome write, heartbeat and lease expiry of a running job
-- all wait for that lock. The job holding a key the insert found taken is read instead
-- ("held"), without a lock, as this statement's snapshot sees it. Only what a duplicate's
-- unique_replace asks for is written, and only to a job still ready ("replaced"): 'args'
-- replaces the payload, 'run_at' pushes the run time to the later of the two (a debounce). A
-- ready row so locked is one the claim passes over (SKIP LOCKED) until the caller commits;
-- nothing waits for it.
--
-- "retry" marks a key this statement could not settle, for the caller to send again in a new
-- statement (a new snapshot): taken by a transaction that committed while the insert waited for
-- it (this snapshot does not see that job), or a job to replace that stopped being ready (or
-- let go of the key) after the snapshot was taken. Sent again, such a key is inserted, or found.
--
-- A batch may name one key twice: "first" keeps the first row of each key, and the later ones
-- get its job back as duplicates, each replacing what its own unique_replace asks for, in input
-- order ("folded"): the batch ends as the same calls enqueued one after another would. Ids are drawn from the table's sequence beforehand ("input"),
-- so the answer can tell an inserted row (its id is the one drawn) from a duplicate.
-- Returns per input row, in input order: id, duplicate, the job's state, payload and times (for
-- the TaskResult of a duplicate), retry, and the duplicate's reason (why BackWave holds it).
WITH input AS MATERIALIZED (
    SELECT n.*, nextval(pg_get_serial_sequence('backwave_job', 'id')) AS new_id,
           CASE WHEN n.unique_key IS NOT NULL
                THEN n.task_path || ':' || n.unique_key
                     || CASE WHEN n.unique_period IS NOT NULL
                             THEN '@' || n.unique_period::text || 's#'
                                  || floor(extract(epoch FROM now()) / n.unique_period)::bigint::text
                             ELSE '' END
           END AS stored_key
    FROM ROWS FROM (
             jsonb_to_recordset(%(jobs)s::jsonb)
             AS (task_path text, payload jsonb, queue text, priority smallint, run_at timestamptz,
                 max_attempts int, backoff_base float8, backoff_max float8, backend text, tags varchar[],
                 trace_context jsonb, timeout float8, limit_key text, unique_key text, unique_period float8,
                 unique_states varchar[], unique_replace varchar[])
         ) WITH ORDINALITY
         AS n(task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
              backend, tags, trace_context, timeout, limit_key, unique_key, unique_period, unique_states,
              unique_replace, position)
), first AS MATERIALIZED (
    SELECT DISTINCT ON (coalesce(i.stored_key, i.new_id::text)) i.*
    FROM input AS i
    ORDER BY coalesce(i.stored_key, i.new_id::text), i.position
), folded AS MATERIALIZED (
    -- What the calls of each key replace, folded in input order as if enqueued one by one: the
    -- last arguments of a call whose replace has 'args', the latest run time of those with
    -- 'run_at'. "later": the calls after the key's first (the first's own job gets them);
    -- "all": every call (a job that already held the key gets them).
    SELECT i.stored_key,
           (array_agg(i.payload ORDER BY i.position DESC)
                FILTER (WHERE 'args' = ANY(i.unique_replace) AND i.position > f.position))[1] AS later_payload,
           max(coalesce(i.run_at, now())) FILTER (WHERE 'run_at' = ANY(i.unique_replace) AND i.position > f.position) AS later_run_at,
           (array_agg(i.payload ORDER BY i.position DESC) FILTER (WHERE 'args' = ANY(i.unique_replace)))[1] AS all_payload,
           max(coalesce(i.run_at, now())) FILTER (WHERE 'run_at' = ANY(i.unique_replace)) AS all_run_at,
           coalesce(bool_or('args' = ANY(i.unique_replace)), false) AS replace_args,
           coalesce(bool_or('run_at' = ANY(i.unique_replace)), false) AS replace_run_at
    FROM input AS i
    JOIN first AS f ON f.stored_key = i.stored_key
    GROUP BY i.stored_key
), written AS (
    INSERT INTO backwave_job AS j (
        id, task_path, payload, queue, priority, run_at, max_attempts, backoff_base, backoff_max,
        backend, tags, state, attempts, enqueued_at, worker_id, trace_context, timeout, limit_key,
        unique_key, unique_states, unique_replace
    )
    SELECT f.new_id, f.task_path, coalesce(d.later_payload, f.payload), f.queue, f.priority,
           greatest(coalesce(f.run_at, now()), d.later_run_at), f.max_attempts,
           f.backoff_base, f.backoff_max, f.backend, coalesce(f.tags, '{}'::varchar[]),
           'ready', 0, now(), '', f.trace_context, f.timeout, f.limit_key,
           f.stored_key, CASE WHEN f.stored_key IS NOT NULL THEN f.unique_states END,
           CASE WHEN f.stored_key IS NOT NULL THEN f.unique_replace END
    FROM first AS f
    LEFT JOIN folded AS d ON d.stored_key = f.stored_key
    ORDER BY f.position
    ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
    RETURNING j.id, j.unique_key, j.queue, j.payload, j.enqueued_at
), taken AS MATERIALIZED (
    -- The keys the insert found taken, with what their duplicates would replace.
    SELECT f.stored_key, d.all_payload AS payload, d.all_run_at AS run_at, d.replace_args, d.replace_run_at
    FROM first AS f
    JOIN folded AS d ON d.stored_key = f.stored_key
    WHERE NOT EXISTS (SELECT FROM written AS w WHERE w.id = f.new_id)
), held AS MATERIALIZED (
    SELECT j.id, j.unique_key, j.state, j.payload, j.enqueued_at, j.started_at, j.last_attempted_at, j.finished_at,
           j.reason, j.state = 'ready' AND (t.replace_args OR t.replace_run_at) AS to_replace
    FROM taken AS t
    JOIN backwave_job AS j ON j.unique_key = t.stored_key
), replaced AS (
    -- A row that changed since the snapshot is checked again as it is now (READ COMMITTED): one
    -- claimed meanwhile is no longer ready, and is left alone. By primary key, the ids as one
    -- array and the state as a sub-select, as the outcome write reads its rows (see there): the
    -- partial indexes on ready rows are not the way to a row whose id is known.
    UPDATE backwave_job AS j
    SET payload = CASE WHEN t.replace_args THEN t.payload ELSE j.payload END,
        run_at = CASE WHEN t.replace_run_at THEN greatest(j.run_at, t.run_at) ELSE j.run_at END
    FROM held AS h
    JOIN taken AS t ON t.stored_key = h.unique_key
    WHERE j.id = h.id AND h.to_replace
      AND j.id = ANY(ARRAY(SELECT r.id FROM held AS r WHERE r.to_replace))
      AND j.state = (SELECT 'ready') AND j.unique_key = h.unique_key
    RETURNING j.id, j.payload
), hinted AS (
    SELECT count(pg_notify('backwave_hint', q.queue)) AS sent
    FROM (SELECT DISTINCT queue FROM written) AS q
    WHERE %(hint)s::boolean
)
SELECT coalesce(own.id, sibling.id, h.id),
       own.id IS NULL,
       coalesce(h.state, 'ready'),
       coalesce(r.payload, sibling.payload, h.payload, own.payload),
       coalesce(own.enqueued_at, sibling.enqueued_at, h.enqueued_at),
       h.started_at, h.last_attempted_at, h.finished_at,
       own.id IS NULL AND sibling.id IS NULL AND (h.id IS NULL OR (h.to_replace AND r.id IS NULL)) AS retry,
       coalesce(h.reason, '')
FROM input AS i
LEFT JOIN written AS own ON own.id = i.new_id
LEFT JOIN written AS sibling ON own.id IS NULL AND sibling.unique_key = i.stored_key
LEFT JOIN held AS h ON own.id IS NULL AND sibling.id IS NULL AND h.unique_key = i.stored_key
LEFT JOIN replaced AS r ON r.id = h.id
CROSS JOIN hinted
ORDER BY i.position


-- name: has_due_jobs
-- Whether a ready job of these queues (not paused) is due: the deterministic test pump's check
-- that a drain is finished (backwave/testing/store.py). Not a Storage Contract operation.
SELECT EXISTS (
    SELECT FROM backwave_job AS j
    WHERE j.state = 'ready' AND j.queue = ANY(%(queues)s::text[]) AND j.run_at <= now()
      AND NOT EXISTS (SELECT FROM backwave_queue AS q WHERE q.name = j.queue AND q.paused)
)


-- ===========================================================================================
-- The operator's statements: the admin's pages and actions, manage.py backwave_queue, a
-- worker's start-up write of BACKWAVE["QUEUES"] and the connection-budget check. They run on
-- Django's connection (backwave/store/operator.py takes its cursor), so an action commits with
-- the request and each one counts as one query where the admin's query counts are pinned.
-- The blocks that act on a Django queryset's selection take positional parameters: "{selection}"
-- is that queryset's SQL of ids, with its own positional parameters first. Two blocks are SET
-- lists, not statements: the job actions' assignments, which act_on_jobs takes.
-- ===========================================================================================


-- name: act_on_jobs
-- "target" locks the selected rows in id order (the ORDER BY is applied before the locks are
-- taken) and reads each one's state as it is once locked: after waiting for a worker's claim,
-- the row it re-reads is running; a row deleted while it waited is skipped. "changed" updates
-- the locked rows that are in an allowed state; nobody else can change them in between.
-- "{assignments}" is the action's SET list: retry_job_assignments or cancel_job_assignments,
-- and "{then}" what the change does to the changed jobs' dependents (retry_job_dependents,
-- cancel_job_dependents). Parameters: the selection's, then the allowed states (text[]).
-- The task path comes back for the admin's history (LogEntry's object_repr).
WITH RECURSIVE target AS MATERIALIZED (
    SELECT j.id, j.state, j.task_path FROM backwave_job AS j WHERE j.id IN ({selection})
    ORDER BY j.id
    FOR UPDATE OF j
), changed AS (
    UPDATE backwave_job AS j
    SET {assignments}
    FROM target AS t
    WHERE j.id = t.id AND j.state = ANY(%s)
    RETURNING j.id, j.attempts, j.task_path, j.queue
), watching AS NOT MATERIALIZED (
    -- Parameters: the action's transition (a cancel's; NULL for a retry, which observers do not
    -- watch), then the observed transitions (jsonb), which a cancel's dependents are noted by too.
    SELECT %s::text AS kind, %s::jsonb AS observed
), noted AS (
    -- The action's transition for each changed job some observer watches, as
    -- write_outcomes_many notes outcomes.
    INSERT INTO backwave_transition (job_id, attempt, kind, task_path, queue, occurred_at, state,
                                     deliveries, next_attempt_at, delivered_to, failed_observer, last_error, observers)
    SELECT c.id, c.attempts, k.kind, c.task_path, c.queue, now(), 'pending', 0, now(), '{{}}', '', '', coalesce(o.names, ARRAY[]::varchar[])
    FROM changed AS c
    CROSS JOIN watching AS k
    CROSS JOIN LATERAL (
        -- The observers it is for: each delivery belongs to one (see claim_transitions).
        SELECT array_agg(DISTINCT w.observer ORDER BY w.observer) FILTER (WHERE w.observer IS NOT NULL) AS names, count(*) AS watchers
        FROM jsonb_to_recordset(k.observed) AS w(kind text, task_path text, queue text, observer text)
        WHERE w.kind = k.kind AND (w.task_path IS NULL OR w.task_path = c.task_path)
          AND (w.queue IS NULL OR w.queue = c.queue)
    ) AS o
    WHERE k.kind IS NOT NULL
      AND o.watchers > 0
){then}
SELECT t.id, t.state, c.id IS NOT NULL, t.task_path
FROM target AS t LEFT JOIN changed AS c ON c.id = t.id
ORDER BY t.id


-- name: purge_selected_jobs
-- manage.py backwave_jobs purge and the admin's purge: deletes the selected jobs that are
-- finished (their attempts, dependency rows and transitions go with them, ON DELETE CASCADE),
-- locking in id order like act_on_jobs; a job that is ready or running is reported and left
-- alone. Parameters: the selection's, then the finished states.
-- The cascades are lookups planned under key_lookups_by_index: planned as sequential scans,
-- each deleted job scanned those tables whole (1,000 jobs with 20,000 dependency rows: 2.35 s).
-- The first row carries the caller's value (restore_enable_seqscan puts it back inside a
-- caller's transaction), and there is one row even when nothing was selected (its id NULL).
WITH {{key_lookups_by_index}}, target AS MATERIALIZED (
    SELECT j.id, j.state, j.task_path FROM backwave_job AS j WHERE j.id IN ({selection})
    ORDER BY j.id
    FOR UPDATE OF j
), deleted AS (
    DELETE FROM backwave_job AS j
    USING target AS t
    WHERE j.id = t.id AND j.state = ANY(%s)
    RETURNING j.id
)
SELECT t.id, t.state, d.id IS NOT NULL, t.task_path, k.enable_seqscan
FROM checked AS k
LEFT JOIN target AS t ON true
LEFT JOIN deleted AS d ON d.id = t.id
ORDER BY t.id


-- name: retry_job_assignments
-- "Retry now", for act_on_jobs. "max_attempts = greatest(max_attempts, attempts -
-- forgiven_attempts + 1)" grants the one more attempt that "retry now" promises even when the
-- job used all of its attempts (as Oban's retry_job does); attempts forgiven after a lapse never
-- counted, so they are left out here as they are everywhere the limit is checked. Attempt
-- numbers keep counting up, so the attempt log keeps every earlier try.
state = 'ready', run_at = now(), finished_at = NULL, return_value = NULL, reason = '',
max_attempts = greatest(j.max_attempts, j.attempts - j.forgiven_attempts + 1),
cancel_requested_at = NULL, cancel_requested_by = ''


-- name: cancel_job_assignments
-- "Cancel", for act_on_jobs.
state = 'cancelled', finished_at = now(), reason = ''


-- name: cancel_job_dependents
-- What cancelling does to the dependents, for act_on_jobs: settle_dependents, as when a worker
-- writes the end of an ancestor.
, settling AS (
    SELECT c.id, 'cancelled'::text AS state FROM changed AS c
)
{{settle_dependents}}


-- name: retry_job_dependents
-- "Retry now" re-arms the dependents that an on_failure="hold" dependency on a retried job
-- holds: waiting again, unless another "hold" ancestor of theirs is still failed, cancelled or
-- quarantined (and not retried by this action). Their waiting_on never counted the failure, so
-- the retried ancestor's success releases them as usual.
, rearmed AS (
    UPDATE backwave_job AS w
    SET state = 'waiting', reason = ''
    FROM (SELECT DISTINCT d.job_id
          FROM changed AS c JOIN backwave_dependency AS d ON d.ancestor_id = c.id
          WHERE d.on_failure = 'hold') AS h
    WHERE w.id = h.job_id AND w.state = 'held'
      AND w.id NOT IN (SELECT id FROM changed)
      AND NOT EXISTS (
          SELECT FROM backwave_dependency AS other
          JOIN backwave_job AS a ON a.id = other.ancestor_id
          WHERE other.job_id = w.id AND other.on_failure = 'hold'
            AND a.state IN ('failed', 'cancelled', 'quarantined')
            AND a.id NOT IN (SELECT id FROM changed))
)


-- name: cancel_jobs
-- "Cancel", from the admin, backwave.cancel() and manage.py backwave_cancel. Locks the selected
-- rows in id order, as act_on_jobs does (so it cannot deadlock with the other job actions), and
-- acts on those in an allowed state: a ready (due or scheduled) job is cancelled at once; a
-- running one gets a cancel request, and the worker holding it is told with a NOTIFY on the
-- hint channel ('cancel:<id>:<who>': queue names cannot hold a ':', so no pump mistakes it for
-- a queue's hint); its heartbeat re-reads the request should the NOTIFY be lost. The first
-- request's author stays: a second click changes nothing. Parameters: the selection's, who
-- cancels (text), the allowed states (text[]), the observed transitions (jsonb), then who
-- cancels again (for the NOTIFY).
-- A job cancelled at once (ready, or a workflow's waiting or held job) settles its dependents
-- as a cancelled ancestor does (settle_dependents); a running one settles them when its
-- worker writes the cancelled outcome.
WITH RECURSIVE target AS MATERIALIZED (
    SELECT j.id, j.state, j.task_path FROM backwave_job AS j WHERE j.id IN ({selection})
    ORDER BY j.id
    FOR UPDATE OF j
), changed AS (
    UPDATE backwave_job AS j
    SET state = CASE WHEN t.state <> 'running' THEN 'cancelled' ELSE j.state END,
        finished_at = CASE WHEN t.state <> 'running' THEN now() ELSE j.finished_at END,
        reason = CASE WHEN t.state <> 'running' THEN '' ELSE j.reason END,
        cancel_requested_by = CASE WHEN j.cancel_requested_at IS NULL THEN %s ELSE j.cancel_requested_by END,
        cancel_requested_at = coalesce(j.cancel_requested_at, now())
    FROM target AS t
    WHERE j.id = t.id AND j.state = ANY(%s)
    RETURNING j.id, t.state, j.attempts, j.task_path, j.queue
), watching AS NOT MATERIALIZED (
    -- Parameter: the observed transitions (jsonb), for the cancelled jobs and their dependents.
    SELECT %s::jsonb AS observed
), noted AS (
    -- A job cancelled at once gets its 'cancelled' transition here, for the observers that watch
    -- it, as act_on_jobs notes its cancels (a running job's comes with its cancelled outcome,
    -- from write_outcomes_many).
    INSERT INTO backwave_transition (job_id, attempt, kind, task_path, queue, occurred_at, state,
                                     deliveries, next_attempt_at, delivered_to, failed_observer, last_error, observers)
    SELECT c.id, c.attempts, 'cancelled', c.task_path, c.queue, now(), 'pending', 0, now(), '{{}}', '', '', coalesce(o.names, ARRAY[]::varchar[])
    FROM changed AS c
    CROSS JOIN watching AS k
    CROSS JOIN LATERAL (
        -- The observers it is for: each delivery belongs to one (see claim_transitions).
        SELECT array_agg(DISTINCT w.observer ORDER BY w.observer) FILTER (WHERE w.observer IS NOT NULL) AS names, count(*) AS watchers
        FROM jsonb_to_recordset(k.observed) AS w(kind text, task_path text, queue text, observer text)
        WHERE w.kind = 'cancelled' AND (w.task_path IS NULL OR w.task_path = c.task_path)
          AND (w.queue IS NULL OR w.queue = c.queue)
    ) AS o
    WHERE c.state <> 'running'
      AND o.watchers > 0
), notified AS (
    SELECT count(pg_notify('backwave_hint', 'cancel:' || c.id::text || ':' || %s)) AS sent
    FROM changed AS c WHERE c.state = 'running'
), settling AS (
    SELECT c.id, 'cancelled'::text AS state FROM changed AS c WHERE c.state <> 'running'
)
{{settle_dependents}}
SELECT t.id, t.state, c.id IS NOT NULL, t.task_path
FROM target AS t LEFT JOIN changed AS c ON c.id = t.id CROSS JOIN notified
ORDER BY t.id


-- name: set_schedules_enabled
-- Locks in id order for the same reason as the job actions; a schedule toggled meanwhile is
-- re-read once locked and left alone when it is already as asked. Parameters: the selection's,
-- then enabled twice.
WITH target AS MATERIALIZED (
    SELECT s.id FROM backwave_schedule AS s WHERE s.id IN ({selection}) AND s.enabled <> %s
    ORDER BY s.id
    FOR UPDATE OF s
)
UPDATE backwave_schedule AS s
SET enabled = %s, next_run = NULL, updated_at = now()
FROM target AS t
WHERE s.id = t.id


-- name: upsert_queues
-- Writes the given columns into the rows of the queues named, creating the missing rows; a
-- column not set (its set_ flag false) keeps what the row holds, or its default in a new row.
-- The names come sorted and the rows are inserted in that order, which is the order the upsert
-- locks them in: overlapping actions lock in the same order, so one waits for the other instead
-- of deadlocking. updated_at is the statement's time, as the column's db_default.
INSERT INTO backwave_queue (name, concurrency_limit, paused, updated_at)
SELECT n.name,
       CASE WHEN %(set_limit)s THEN %(concurrency_limit)s::int END,
       CASE WHEN %(set_paused)s THEN %(paused)s::bool ELSE false END,
       statement_timestamp()
FROM unnest(%(names)s::text[]) WITH ORDINALITY AS n(name, position)
ORDER BY n.position
ON CONFLICT (name) DO UPDATE
SET concurrency_limit = CASE WHEN %(set_limit)s THEN EXCLUDED.concurrency_limit ELSE backwave_queue.concurrency_limit END,
    paused = CASE WHEN %(set_paused)s THEN EXCLUDED.paused ELSE backwave_queue.paused END,
    updated_at = EXCLUDED.updated_at


-- name: admin_table_statistics
-- The planner's statistics of backwave_job (its row estimate, and the null fraction, distinct
-- count and most common values of the columns the admin filters on), with the Queue rows'
-- names: one read, never a scan of the job table.
-- For tags, an array column, the planner keeps its most common elements instead (the tag
-- filter's choices); they come back as the row's values and frequencies too.
SELECT c.reltuples::float8,
       s.attname, s.null_frac, s.n_distinct,
       CASE WHEN s.attname = 'tags' THEN s.most_common_elems ELSE s.most_common_vals END::text::text[],
       CASE WHEN s.attname = 'tags' THEN s.most_common_elem_freqs ELSE s.most_common_freqs END,
       ARRAY(SELECT q.name FROM backwave_queue AS q ORDER BY q.name)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stats AS s
       ON s.schemaname = n.nspname AND s.tablename = c.relname
      AND s.attname IN ('state', 'queue', 'task_path', 'tags')
WHERE c.oid = 'backwave_job'::regclass


-- name: admin_queue_overview
-- The loose index scans ("recursive skip scans") find each distinct queue with one probe of an
-- index whose leading column is queue: the claim index for ready rows, the failed-queue index
-- for failed and quarantined ones, backwave_job_waiting_held for the workflow jobs held back.
-- Running rows are few (at most the jobs in flight). Every depth is counted up to "limit" rows
-- only, each through the index its state has (no other index holds waiting or held rows: without
-- theirs, each of those counts would read the whole table). "j.queue <> ''" is what lets the
-- waiting and held reads use backwave_job_waiting_held: the second conjunct of its predicate,
-- which no other statement states (see the index in models.py); no queue name is empty.
-- statement_timestamp(), not now(): the same clock as Django's Now() (the job filters, and the
-- db_default of run_at), and the moment of this read even inside a long transaction.
WITH RECURSIVE ready_queues(name) AS (
    (SELECT j.queue FROM backwave_job AS j WHERE j.state = 'ready' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM backwave_job AS j
            WHERE j.state = 'ready' AND j.queue > r.name ORDER BY j.queue LIMIT 1)
    FROM ready_queues AS r WHERE r.name IS NOT NULL
), failed_queues(name) AS (
    (SELECT j.queue FROM backwave_job AS j
     WHERE j.state IN ('failed', 'quarantined') ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM backwave_job AS j
            WHERE j.state IN ('failed', 'quarantined') AND j.queue > f.name
            ORDER BY j.queue LIMIT 1)
    FROM failed_queues AS f WHERE f.name IS NOT NULL
), waiting_queues(name) AS (
    (SELECT j.queue FROM backwave_job AS j
     WHERE j.state IN ('waiting', 'held') AND j.queue <> '' ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM backwave_job AS j
            WHERE j.state IN ('waiting', 'held') AND j.queue <> '' AND j.queue > w.name
            ORDER BY j.queue LIMIT 1)
    FROM waiting_queues AS w WHERE w.name IS NOT NULL
), names(name) AS (
    SELECT name FROM ready_queues WHERE name IS NOT NULL
    UNION SELECT name FROM failed_queues WHERE name IS NOT NULL
    UNION SELECT name FROM waiting_queues WHERE name IS NOT NULL
    UNION SELECT j.queue FROM backwave_job AS j WHERE j.state = 'running'
    UNION SELECT q.name FROM backwave_queue AS q
    UNION SELECT unnest(%(names)s::text[])
)
SELECT n.name, q.name IS NOT NULL, q.concurrency_limit, coalesce(q.paused, false),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'ready' AND j.queue = n.name AND j.run_at <= statement_timestamp() LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'ready' AND j.queue = n.name AND j.run_at > statement_timestamp() LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'running' AND j.queue = n.name LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'failed' AND j.queue = n.name LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'quarantined' AND j.queue = n.name LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'waiting' AND j.queue = n.name AND j.queue <> '' LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'held' AND j.queue = n.name AND j.queue <> '' LIMIT %(limit)s) AS c),
       q.key_concurrency_limit, q.rate_limit, q.rate_period, q.key_rate_limit
FROM names AS n
LEFT JOIN backwave_queue AS q ON q.name = n.name
ORDER BY n.name


-- name: admin_throughput
-- Outcomes per queue and minute over the last "minutes". One branch per finished state a worker
-- writes (succeeded, failed, quarantined), each a backward scan of the partial finished index
-- (state, finished_at), newest first, stopping after "limit" rows; a constant state per branch
-- is what lets the planner use that partial index. When a branch is cut short, the minutes
-- older than its oldest row are incomplete for every queue, so only the minutes since then are
-- counted.
WITH recent AS MATERIALIZED (
    (SELECT 'succeeded'::text AS state, j.queue, j.finished_at FROM backwave_job AS j
     WHERE j.state = 'succeeded' AND j.finished_at > statement_timestamp() - make_interval(mins => %(minutes)s)
     ORDER BY j.finished_at DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT 'failed'::text AS state, j.queue, j.finished_at FROM backwave_job AS j
     WHERE j.state = 'failed' AND j.finished_at > statement_timestamp() - make_interval(mins => %(minutes)s)
     ORDER BY j.finished_at DESC LIMIT %(limit)s)
    UNION ALL
    (SELECT 'quarantined'::text AS state, j.queue, j.finished_at FROM backwave_job AS j
     WHERE j.state = 'quarantined' AND j.finished_at > statement_timestamp() - make_interval(mins => %(minutes)s)
     ORDER BY j.finished_at DESC LIMIT %(limit)s)
), cut AS (
    SELECT max(oldest) AS covered_from FROM (
        SELECT min(r.finished_at) AS oldest FROM recent AS r
        GROUP BY r.state HAVING count(*) >= %(limit)s
    ) AS full_branches
)
SELECT r.queue,
       floor(extract(epoch FROM statement_timestamp() - r.finished_at) / 60)::int AS minutes_ago,
       count(*),
       (SELECT floor(extract(epoch FROM statement_timestamp() - covered_from) / 60)::int FROM cut)
FROM recent AS r
WHERE r.finished_at >= coalesce((SELECT covered_from FROM cut), '-infinity'::timestamptz)
GROUP BY 1, 2


-- name: admin_pumps_in_flight
-- The running jobs of each of these pumps, counted live (a pump writes its own in_flight only at
-- its heartbeats, so a killed one would show its last count forever). Through the pumps' leases,
-- a lapsed one included until maintenance expires it (its jobs are still held), and the partial
-- index of running jobs by lease: the work is bounded by the page's pumps and what they run.
SELECT l.worker_id, count(*)
FROM backwave_lease AS l
JOIN backwave_job AS j ON j.lease_id = l.id AND j.state = 'running'
WHERE l.worker_id = ANY(%(worker_ids)s::text[])
GROUP BY l.worker_id


-- name: ancestor_outputs
-- A JobContext's ancestors (their Job Output): one statement per job however many ancestors,
-- through the dependency table's primary key (job_id leading), in the after= order.
SELECT a.id, a.task_path, a.state, a.output
FROM backwave_dependency AS d
JOIN backwave_job AS a ON a.id = d.ancestor_id
WHERE d.job_id = %(job_id)s
ORDER BY d.position, a.id


-- name: admin_job_links
-- The job page's workflow: up to "limit" ancestors (in after= order) and dependents (by id),
-- each with its state and the dependency's policy, and how many there are of each (the window
-- count runs over the index range before the LIMIT). One statement: both directions have an
-- index (the primary key leads with job_id, backwave_dependency_ancestor with ancestor_id).
(SELECT 'ancestor' AS side, j.id, j.task_path, j.state, d.on_failure, count(*) OVER () AS total
 FROM backwave_dependency AS d JOIN backwave_job AS j ON j.id = d.ancestor_id
 WHERE d.job_id = %(job_id)s
 ORDER BY d.position, j.id
 LIMIT %(limit)s)
UNION ALL
(SELECT 'dependent', j.id, j.task_path, j.state, d.on_failure, count(*) OVER ()
 FROM backwave_dependency AS d JOIN backwave_job AS j ON j.id = d.job_id
 WHERE d.ancestor_id = %(job_id)s
 ORDER BY j.id
 LIMIT %(limit)s)


-- name: admin_jobs_page_details
-- What the Jobs list shows beside each row of its page, for the page's ids only: the latest
-- attempt's error (the tail of its traceback, where the exception's message is) and duration
-- (through the unique (job_id, number) index: one probe per job), how long a running job has
-- run so far by the database clock, and whether the job's pump still has a row to link to.
SELECT j.id, a.error_class, right(a.traceback, %(tail)s::int), extract(epoch FROM a.finished_at - a.started_at),
       CASE WHEN j.state = 'running' THEN extract(epoch FROM statement_timestamp() - j.last_attempted_at) END,
       EXISTS (SELECT FROM backwave_pump AS p WHERE p.worker_id = j.worker_id)
FROM backwave_job AS j
LEFT JOIN LATERAL (
    SELECT a.error_class, a.traceback, a.started_at, a.finished_at FROM backwave_attempt AS a
    WHERE a.job_id = j.id ORDER BY a.number DESC LIMIT 1
) AS a ON true
WHERE j.id = ANY(%(ids)s::bigint[])


-- name: available_connections
-- The connections the server accepts from ordinary roles.
SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int


-- ---- the dashboard and the task statistics page -------------------------------------------------

-- name: admin_rollup_status
-- Where the statistics stand: the rollup's watermark and last run (any node's: the dashboard's
-- "last maintenance"), and how many attempts are not rolled up yet, counted up to "limit" along
-- the attempt table's primary key.
SELECT w.watermark, w.rolled_at, statement_timestamp() - w.rolled_at,
       (SELECT count(*) FROM (SELECT FROM backwave_attempt AS a WHERE a.id > w.watermark LIMIT %(limit)s) AS c),
       statement_timestamp()
FROM (SELECT coalesce(max(r.watermark), 0) AS watermark, max(r.rolled_at) AS rolled_at
      FROM backwave_stats_rollup AS r WHERE r.id = 1) AS w


-- name: admin_stats_series
-- Attempts per bucket over the last "seconds": succeeded and not (retried, failed, quarantined,
-- lapsed), all tasks together. The rolled-up buckets are read through the unique (resolution,
-- bucket, task_path) index; the attempts past the watermark (two maintenance runs at most, when
-- maintenance keeps up) are read live along the primary key, at most "tail" of them, so the last
-- minutes are drawn before the rollup has them. Buckets start at whole multiples of the
-- resolution (UTC), as the rollup's do.
WITH w AS (
    SELECT coalesce((SELECT r.watermark FROM backwave_stats_rollup AS r WHERE r.id = 1), 0) AS watermark,
           to_timestamp(floor(extract(epoch FROM statement_timestamp() - make_interval(secs => %(seconds)s))
                              / %(resolution)s) * %(resolution)s) AS since
), rolled AS (
    SELECT s.bucket, sum(s.succeeded) AS succeeded, sum(s.retried + s.failed + s.quarantined + s.lapsed) AS failing
    FROM backwave_task_stat AS s, w
    WHERE s.resolution = %(resolution)s AND s.bucket >= w.since
    GROUP BY s.bucket
), tail AS MATERIALIZED (
    -- The watermark as a scalar subquery (an InitPlan): the planner then starts the primary key
    -- scan at it. Joined from the CTE instead, it walks the whole key and filters each row.
    SELECT a.state, a.finished_at
    FROM backwave_attempt AS a
    WHERE a.id > (SELECT watermark FROM w)
    ORDER BY a.id
    LIMIT %(tail)s
), live AS (
    SELECT to_timestamp(floor(extract(epoch FROM t.finished_at) / %(resolution)s) * %(resolution)s) AS bucket,
           count(*) FILTER (WHERE t.state = 'succeeded') AS succeeded,
           count(*) FILTER (WHERE t.state IN ('failed', 'quarantined', 'lapsed')) AS failing
    FROM tail AS t
    GROUP BY 1
)
SELECT b.bucket, sum(b.succeeded)::bigint, sum(b.failing)::bigint
FROM (SELECT * FROM rolled UNION ALL SELECT * FROM live) AS b, w
WHERE b.bucket >= w.since
GROUP BY b.bucket
ORDER BY b.bucket


-- name: admin_task_stats
-- Each task's rolled-up buckets over the last "seconds", summed; the histograms come as an array
-- of the buckets' own (the caller merges them: a few dozen small maps per task). "tasks" NULL:
-- every task; else only those.
SELECT s.task_path, sum(s.succeeded)::bigint, sum(s.retried)::bigint, sum(s.failed)::bigint,
       sum(s.quarantined)::bigint, sum(s.lapsed)::bigint, sum(s.cancelled)::bigint, sum(s.snoozed)::bigint,
       sum(s.reruns)::bigint, sum(s.timed)::bigint,
       sum(s.duration_sum), max(s.duration_max), array_agg(s.duration_histogram)
FROM backwave_task_stat AS s
WHERE s.resolution = %(resolution)s
  AND s.bucket >= to_timestamp(floor(extract(epoch FROM statement_timestamp() - make_interval(secs => %(seconds)s))
                               / %(resolution)s) * %(resolution)s)
  AND (%(tasks)s::text[] IS NULL OR s.task_path = ANY(%(tasks)s::text[]))
GROUP BY s.task_path
ORDER BY s.task_path


-- name: admin_recent_failures
-- The last "limit" attempts that did not succeed, newest first: a backward scan of the partial
-- index backwave_attempt_failing, however many successes came since. Only the end of each
-- traceback travels (the message is its last line).
SELECT a.id, a.job_id, a.number, a.state, a.error_class, right(a.traceback, 4000), a.finished_at,
       a.worker_id, j.task_path, j.queue, j.state
FROM backwave_attempt AS a
JOIN backwave_job AS j ON j.id = a.job_id
WHERE a.state IN ('failed', 'quarantined', 'lapsed')
ORDER BY a.id DESC
LIMIT %(limit)s


-- name: admin_running_jobs
-- What runs now, longest-running first, with whether its lease has lapsed (or is gone): the rows
-- of the partial running-jobs index, as many as jobs in flight, cut at "limit".
SELECT j.id, j.task_path, j.queue, j.worker_id, j.attempts, j.last_attempted_at,
       extract(epoch FROM statement_timestamp() - j.last_attempted_at)::float8,
       l.expires_at, (l.id IS NULL OR l.expires_at <= statement_timestamp())
FROM backwave_job AS j
LEFT JOIN backwave_lease AS l ON l.id = j.lease_id
WHERE j.state = 'running'
ORDER BY j.last_attempted_at, j.id
LIMIT %(limit)s


-- name: admin_queue_latency
-- Per queue, how long the oldest due ready job has waited (since its run_at). The claim index is
-- ordered by priority first, so the oldest is not its first entry: a loose index scan visits each
-- distinct priority of the queue once (one probe each), whose first entry is that priority's
-- oldest run_at; the oldest due job is the earliest of those that are due.
WITH RECURSIVE heads(queue, priority, run_at) AS (
    SELECT q.name, h.priority, h.run_at
    FROM unnest(%(names)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_at FROM backwave_job AS j
        WHERE j.state = 'ready' AND j.queue = q.name
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT 1
    ) AS h
    UNION ALL
    SELECT p.queue, n.priority, n.run_at
    FROM heads AS p
    CROSS JOIN LATERAL (
        SELECT j.priority, j.run_at FROM backwave_job AS j
        WHERE j.state = 'ready' AND j.queue = p.queue AND j.priority < p.priority
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT 1
    ) AS n
)
SELECT h.queue, extract(epoch FROM statement_timestamp() - min(h.run_at))::float8
FROM heads AS h
WHERE h.run_at <= statement_timestamp()
GROUP BY h.queue


-- name: admin_hint_sessions
-- The wake-up hint listeners connected to this database: each worker process keeps one session
-- named backwave-hints (backwave/store/hints.py). PostgreSQL hides most columns of other roles'
-- sessions from a role without pg_read_all_stats: the admin's role should be the workers' (or
-- be granted it) for this count to be whole.
SELECT count(*), min(a.backend_start), max(a.backend_start)
FROM pg_stat_activity AS a
WHERE a.datname = current_database() AND a.application_name = 'backwave-hints'


-- name: set_queue_admission
-- A worker's start-up write of a queue's admission limits from BACKWAVE["QUEUES"] (the settings
-- are their only source: a limit left out is cleared). Rows already as given are not written.
INSERT INTO backwave_queue (name, key_concurrency_limit, rate_limit, key_rate_limit, rate_period, paused, updated_at)
VALUES (%(name)s, %(key_concurrency_limit)s, %(rate_limit)s, %(key_rate_limit)s, %(rate_period)s, false, statement_timestamp())
ON CONFLICT (name) DO UPDATE
SET key_concurrency_limit = EXCLUDED.key_concurrency_limit,
    rate_limit = EXCLUDED.rate_limit,
    key_rate_limit = EXCLUDED.key_rate_limit,
    rate_period = EXCLUDED.rate_period,
    updated_at = EXCLUDED.updated_at
WHERE (backwave_queue.key_concurrency_limit, backwave_queue.rate_limit, backwave_queue.key_rate_limit, backwave_queue.rate_period)
      IS DISTINCT FROM (EXCLUDED.key_concurrency_limit, EXCLUDED.rate_limit, EXCLUDED.key_rate_limit, EXCLUDED.rate_period)


-- name: queue_has_admission
SELECT EXISTS (SELECT FROM backwave_queue
               WHERE name = %(name)s
                 AND (key_concurrency_limit IS NOT NULL OR rate_limit IS NOT NULL OR key_rate_limit IS NOT NULL))


-- name: metrics_without_jit
-- Sent first, in the same transaction, by the metrics view: the planner prices metrics_queues by
-- the capped counts it might read (LIMIT 10,001 per queue and priority), which on a large backlog
-- passes jit_above_cost, and compiling it then took 1.4 s (with a million jobs) of a statement
-- that runs in 40 ms. SET LOCAL: it ends with the transaction.
SELECT set_config('jit', 'off', true)


-- name: metrics_queues
-- Per queue, for the metrics view: paused or not, its depths by state (each counted up to
-- "limit" rows) and the age in seconds of its oldest due ready job (0 when none is due). One
-- statement whose cost grows with queues x priorities in use, never with the backlog.
--
-- The claim index orders a queue by priority before run_at, so neither "the oldest due job" nor
-- "the ready jobs due later" is a range of it. A loose index scan (levels) walks the distinct
-- (queue, priority) pairs of ready rows, one probe each (at most 201 priorities per queue); under
-- each pair run_at is in order, so the oldest row is its first entry and the due and the
-- scheduled rows are two index ranges, counted through a LATERAL whose outer LIMIT stops the
-- nested loop once "limit" rows are found. (A count over "queue = x AND run_at > now()" on the
-- whole index walks every ready row of the queue; one over "run_at <= now()" can even turn into
-- a sequential scan of the table, which the planner prefers when most rows are ready.) Running,
-- failed and quarantined rows are counted through their partial indexes, as the admin does. The
-- names are those queues, the failing ones (a loose scan of backwave_job_failed_queue), the
-- running ones, the Queue rows and the configured ones passed in.
WITH RECURSIVE levels(queue, priority) AS (
    (SELECT j.queue, j.priority FROM backwave_job AS j WHERE j.state = 'ready' ORDER BY j.queue, j.priority DESC LIMIT 1)
    UNION ALL
    SELECT following.queue, following.priority
    FROM levels AS l
    CROSS JOIN LATERAL (
        (SELECT j.queue, j.priority FROM backwave_job AS j
         WHERE j.state = 'ready' AND j.queue = l.queue AND j.priority < l.priority
         ORDER BY j.queue, j.priority DESC LIMIT 1)
        UNION ALL
        (SELECT j.queue, j.priority FROM backwave_job AS j
         WHERE j.state = 'ready' AND j.queue > l.queue
         ORDER BY j.queue, j.priority DESC LIMIT 1)
        LIMIT 1
    ) AS following
), failed_queues(name) AS (
    (SELECT j.queue FROM backwave_job AS j
     WHERE j.state IN ('failed', 'quarantined') ORDER BY j.queue LIMIT 1)
    UNION ALL
    SELECT (SELECT j.queue FROM backwave_job AS j
            WHERE j.state IN ('failed', 'quarantined') AND j.queue > f.name
            ORDER BY j.queue LIMIT 1)
    FROM failed_queues AS f WHERE f.name IS NOT NULL
), names(name) AS (
    SELECT queue FROM levels
    UNION SELECT name FROM failed_queues WHERE name IS NOT NULL
    UNION SELECT j.queue FROM backwave_job AS j WHERE j.state = 'running'
    UNION SELECT q.name FROM backwave_queue AS q
    UNION SELECT unnest(%(names)s::text[])
)
SELECT n.name, coalesce(q.paused, false),
       (SELECT count(*) FROM (
            SELECT FROM levels AS l
            CROSS JOIN LATERAL (SELECT FROM backwave_job AS j
                                WHERE j.state = 'ready' AND j.queue = l.queue AND j.priority = l.priority
                                  AND j.run_at <= statement_timestamp()
                                LIMIT %(limit)s) AS d
            WHERE l.queue = n.name LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (
            SELECT FROM levels AS l
            CROSS JOIN LATERAL (SELECT FROM backwave_job AS j
                                WHERE j.state = 'ready' AND j.queue = l.queue AND j.priority = l.priority
                                  AND j.run_at > statement_timestamp()
                                LIMIT %(limit)s) AS d
            WHERE l.queue = n.name LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'running' AND j.queue = n.name LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'failed' AND j.queue = n.name LIMIT %(limit)s) AS c),
       (SELECT count(*) FROM (SELECT FROM backwave_job AS j
         WHERE j.state = 'quarantined' AND j.queue = n.name LIMIT %(limit)s) AS c),
       (SELECT extract(epoch FROM greatest(statement_timestamp() - min(oldest.run_at), interval '0'))::float8
        FROM levels AS l
        CROSS JOIN LATERAL (SELECT j.run_at FROM backwave_job AS j
                            WHERE j.state = 'ready' AND j.queue = l.queue AND j.priority = l.priority
                            ORDER BY j.queue, j.priority DESC, j.run_at LIMIT 1) AS oldest
        WHERE l.queue = n.name)
FROM names AS n
LEFT JOIN backwave_queue AS q ON q.name = n.name
ORDER BY n.name


-- name: metrics_lapsed_leases
-- Leases past their expiry that maintenance has not released yet (their pumps died, hung or
-- lost the database), and how many jobs still run under them: a probe of the expiry index.
SELECT count(*), coalesce(sum((SELECT count(*) FROM backwave_job AS j WHERE j.state = 'running' AND j.lease_id = l.id)), 0)::bigint
FROM backwave_lease AS l
WHERE l.expires_at <= statement_timestamp()


-- name: job_table_changes
-- What the cleanup of the job table (backwave/store/vacuum.py) decides on: the row versions
-- updated outside HOT or deleted since the server's statistics began (each leaves a dead entry
-- in every index of the table: a claim's update leaves one at the front of the claim index),
-- the table's rows as the planner counts them, and how many times anyone vacuumed it.
-- Cumulative counters: the caller compares two readings. They lag their writers by up to a
-- second.
SELECT s.n_tup_upd - s.n_tup_hot_upd + s.n_tup_del, greatest(c.reltuples, 0)::float8,
       s.vacuum_count + s.autovacuum_count
FROM pg_stat_user_tables AS s
JOIN pg_class AS c ON c.oid = s.relid
WHERE s.relid = to_regclass('backwave_job')


-- name: vacuum_backwave_job
-- Removes the dead entries claims leave at the front of the claim index, which every later claim
-- otherwise walks (with autovacuum off, or behind: it waits for 20% of a table's rows by
-- default). INDEX_CLEANUP ON: left to AUTO, VACUUM skips the indexes when few pages hold dead
-- rows, and a queue's claimed rows sit on few pages. SKIP_LOCKED: a table another session
-- (autovacuum, another worker) is vacuuming is left to it. Not in a transaction block: VACUUM
-- refuses one.
VACUUM (SKIP_LOCKED, INDEX_CLEANUP ON) backwave_job
