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


-- name: release_lease
-- The DELETE runs first and takes the lease row before any job row: the "(SELECT count(*) FROM
-- gone) >= 0" gate is always true, but as an InitPlan it makes the DELETE finish before the
-- UPDATE scans a job. That keeps the locking order of expire_leases (lease, then jobs), so a
-- release racing an expiry of the same lease waits instead of deadlocking, and then finds the
-- jobs already handed back. Jobs are released even when the lease row is already gone.
WITH gone AS MATERIALIZED (
    DELETE FROM backwave_lease WHERE id = %(lease_id)s RETURNING id
), released AS (
    UPDATE backwave_job AS j
    SET state = 'ready',
        lease_id = NULL,
        run_at = now(),
        attempts = greatest(j.attempts - 1, 0),
        started_at = CASE WHEN j.attempts <= 1 THEN NULL ELSE j.started_at END
    WHERE j.lease_id = %(lease_id)s AND j.state = 'running'
      AND (SELECT count(*) FROM gone) >= 0
    RETURNING j.id
)
SELECT id FROM released ORDER BY id


-- name: claim_jobs_one_queue
-- One queue. "queue = %(queue)s" pins the leading column of the partial index
-- backwave_job_claim (queue, priority DESC, run_at, id) WHERE state = 'ready', so an ordered
-- index scan yields rows already in claim order; "run_at <= now()" is checked on index tuples.
-- The plan is Limit -> LockRows -> Index Scan: it stops after `limit` rows it could lock, and a
-- row another claimer holds is skipped and replaced by the next one, never waited for.
--
-- The lease CTE is an uncorrelated EXISTS, so it runs once as an InitPlan before any job row is
-- touched: claiming under a lease that lapsed or is gone claims nothing (otherwise its jobs
-- would run under a lease no maintenance run can ever expire). FOR KEY SHARE holds the lease row
-- until the claim commits, so expiry (FOR UPDATE SKIP LOCKED) cannot delete it in between.
--
-- The CTE fences the LIMIT: as a MATERIALIZED CTE the pick runs exactly once and locks at most
-- `limit` rows. Written inline as "UPDATE ... WHERE id IN (SELECT ... LIMIT ...)", the planner
-- may flatten or re-execute the sub-select, locking and updating more rows than asked for.
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
), picked AS MATERIALIZED (
    SELECT j.id
    FROM backwave_job AS j
    WHERE j.state = 'ready' AND j.queue = %(queue)s AND j.run_at <= now()
      AND EXISTS (SELECT FROM lease)
    ORDER BY j.priority DESC, j.run_at, j.id
    LIMIT %(limit)s
    FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE backwave_job AS j
    SET state = 'running',
        lease_id = %(lease_id)s,
        worker_id = %(worker_id)s,
        attempts = j.attempts + 1,
        last_attempted_at = now(),
        started_at = coalesce(j.started_at, now())
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.id, j.task_path, j.queue, j.priority, j.payload, j.attempts, j.max_attempts,
              j.backoff_base, j.backoff_max, j.backend, j.enqueued_at, j.started_at,
              j.last_attempted_at, j.run_at
)
SELECT c.id, c.task_path, c.queue, c.priority, c.payload, c.attempts, c.max_attempts,
       c.backoff_base, c.backoff_max, c.backend, c.enqueued_at, c.started_at,
       c.last_attempted_at,
       CASE WHEN c.attempts > 1  -- a first attempt has no history: skip the lookup
            THEN ARRAY(SELECT a.worker_id FROM backwave_attempt AS a
                       WHERE a.job_id = c.id ORDER BY a.number) END AS previous_worker_ids
FROM claimed AS c
ORDER BY c.priority DESC, c.run_at, c.id


-- name: claim_jobs_many_queues
-- Several queues. "queue = ANY(...)" cannot use the index for ordering: the index is sorted by
-- queue first, so the planner would fetch every due ready row of those queues and sort them all
-- (a Sort under the LockRows), paying for the whole backlog on every claim. Instead each queue
-- gets its own ordered index scan through LATERAL (the single-queue plan, limited to `limit`),
-- and the outer ORDER BY merges at most queues * limit rows and keeps the best `limit`.
--
-- The lock is taken inside each LATERAL, where the scan is ordered, so a row another claimer
-- holds is skipped and replaced by that queue's next row; locking only after the merge would
-- make concurrent claimers pick the same candidates and come back short. The cost: up to
-- (queues - 1) * limit rows are locked but not claimed, until this statement commits;
-- concurrent claimers skip them for that instant and they stay ready. The caller passes each
-- queue once (a queue listed twice would see its own locked rows again).
--
-- The lease CTE, the CTE fence and FOR NO KEY UPDATE are as in claim_jobs_one_queue.
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), picked AS MATERIALIZED (
    SELECT c.id
    FROM unnest(%(queues)s::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.run_at
        FROM backwave_job AS j
        WHERE j.state = 'ready' AND j.queue = q.name AND j.run_at <= now()
        ORDER BY j.priority DESC, j.run_at, j.id
        LIMIT %(limit)s
        FOR NO KEY UPDATE SKIP LOCKED
    ) AS c
    WHERE EXISTS (SELECT FROM lease)
    ORDER BY c.priority DESC, c.run_at, c.id
    LIMIT %(limit)s
), claimed AS (
    UPDATE backwave_job AS j
    SET state = 'running',
        lease_id = %(lease_id)s,
        worker_id = %(worker_id)s,
        attempts = j.attempts + 1,
        last_attempted_at = now(),
        started_at = coalesce(j.started_at, now())
    FROM picked
    WHERE j.id = picked.id
    RETURNING j.id, j.task_path, j.queue, j.priority, j.payload, j.attempts, j.max_attempts,
              j.backoff_base, j.backoff_max, j.backend, j.enqueued_at, j.started_at,
              j.last_attempted_at, j.run_at
)
SELECT c.id, c.task_path, c.queue, c.priority, c.payload, c.attempts, c.max_attempts,
       c.backoff_base, c.backoff_max, c.backend, c.enqueued_at, c.started_at,
       c.last_attempted_at,
       CASE WHEN c.attempts > 1  -- a first attempt has no history: skip the lookup
            THEN ARRAY(SELECT a.worker_id FROM backwave_attempt AS a
                       WHERE a.job_id = c.id ORDER BY a.number) END AS previous_worker_ids
FROM claimed AS c
ORDER BY c.priority DESC, c.run_at, c.id


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
-- retry_delay seconds after now() by the database clock. Attempt rows are inserted from the
-- UPDATE's RETURNING, so only applied outcomes are logged; the unique (job_id, number)
-- constraint would turn a double apply into an error rather than a second row.
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
), outcome AS (
    -- The batch travels as one JSON array: encoding it is one C call in the worker, where
    -- eight Python-built arrays cost more CPU than the statement itself. The return value
    -- comes boxed as {"v": value} so that a task returning None stores JSON null, a value,
    -- while the other kinds (box absent) store SQL NULL.
    SELECT b.job_id, b.attempt, b.kind, b.retry_delay, b.boxed -> 'v' AS return_value,
           b.error_class, b.traceback, b.duration
    FROM jsonb_to_recordset(%(outcomes)s::jsonb)
         AS b(job_id bigint, attempt int, kind text, retry_delay float8, boxed jsonb,
              error_class text, traceback text, duration float8)
), applied AS (
    UPDATE backwave_job AS j
    SET state = CASE o.kind WHEN 'succeeded' THEN 'succeeded'
                            WHEN 'retry' THEN 'ready'
                            WHEN 'failed' THEN 'failed'
                            WHEN 'quarantined' THEN 'quarantined' END,
        run_at = CASE WHEN o.kind = 'retry'
                      THEN now() + make_interval(secs => greatest(coalesce(o.retry_delay, 0), 0))
                      ELSE j.run_at END,
        finished_at = CASE WHEN o.kind = 'retry' THEN NULL ELSE now() END,
        return_value = o.return_value,
        lease_id = NULL
    FROM outcome AS o
    WHERE j.id = o.job_id
      AND j.lease_id = %(lease_id)s
      AND j.state = 'running'
      AND j.attempts = o.attempt
      AND EXISTS (SELECT FROM lease)
    RETURNING j.id, j.worker_id, j.last_attempted_at, o.attempt, o.kind, o.return_value,
              o.error_class, o.traceback, o.duration
)
INSERT INTO backwave_attempt (job_id, number, state, worker_id, started_at, finished_at,
                              error_class, traceback, return_value)
SELECT a.id, a.attempt,
       CASE a.kind WHEN 'succeeded' THEN 'succeeded'
                   WHEN 'quarantined' THEN 'quarantined'
                   ELSE 'failed' END,
       a.worker_id,
       a.last_attempted_at,
       coalesce(a.last_attempted_at, now()) + make_interval(secs => greatest(a.duration, 0)),
       a.error_class, a.traceback, a.return_value
FROM applied AS a
RETURNING job_id


-- name: release_jobs_many
-- Fenced like write_outcomes_many (this lease, live, job still running), minus the attempt
-- number: a release gives back whatever attempt is running. The attempt is refunded (the job
-- did not run to an outcome), and started_at is cleared when that was the first attempt.
WITH lease AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE id = %(lease_id)s AND expires_at > now()
    FOR KEY SHARE
)
UPDATE backwave_job AS j
SET state = 'ready',
    lease_id = NULL,
    run_at = now(),
    attempts = greatest(j.attempts - 1, 0),
    started_at = CASE WHEN j.attempts <= 1 THEN NULL ELSE j.started_at END
WHERE j.id = ANY(%(job_ids)s::bigint[])
  AND j.lease_id = %(lease_id)s
  AND j.state = 'running'
  AND EXISTS (SELECT FROM lease)
RETURNING j.id


-- name: expire_leases
-- Maintenance: any number of nodes may run this at once. FOR UPDATE SKIP LOCKED gives each run
-- a disjoint set of lapsed leases (and skips a lease a claim or write holds FOR KEY SHARE right
-- now; the next run takes it), so each lease is expired and its jobs released exactly once.
-- The lapsed attempt still counts (the job may be what killed its worker): the job is ready
-- again while attempts < max_attempts, failed otherwise, and either way gets a 'lapsed' attempt.
--
-- "j.state = 'running'" is the re-check that never resurrects a finished job: a job finished
-- before this statement's snapshot is not running; one changed since (an outcome committed a
-- moment ago, an operator's cancel in flight) has a newer row version, which this UPDATE waits
-- for if need be, and READ COMMITTED re-evaluates the WHERE clause on that version (finished,
-- lease_id NULL), so the job is skipped.
WITH lapsed AS MATERIALIZED (
    SELECT id FROM backwave_lease
    WHERE expires_at < now()
    ORDER BY expires_at
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
), gone AS MATERIALIZED (
    DELETE FROM backwave_lease AS l
    USING lapsed
    WHERE l.id = lapsed.id
    RETURNING l.id, l.worker_id, l.expires_at
), released AS (
    UPDATE backwave_job AS j
    SET state = CASE WHEN j.attempts < j.max_attempts THEN 'ready' ELSE 'failed' END,
        run_at = CASE WHEN j.attempts < j.max_attempts THEN now() ELSE j.run_at END,
        finished_at = CASE WHEN j.attempts < j.max_attempts THEN NULL ELSE now() END,
        lease_id = NULL
    FROM gone
    WHERE j.lease_id = gone.id AND j.state = 'running'
    RETURNING j.id, j.attempts, j.max_attempts, j.worker_id, j.last_attempted_at,
              gone.worker_id AS lease_worker_id, gone.expires_at AS lease_expired_at
), logged AS (
    INSERT INTO backwave_attempt (job_id, number, state, worker_id, started_at, finished_at,
                                  error_class, traceback)
    SELECT r.id, r.attempts, 'lapsed', r.worker_id, r.last_attempted_at, now(),
           'backwave.results.LeaseLapsed',
           'backwave.results.LeaseLapsed: the lease of worker ' || r.lease_worker_id
               || ' expired at ' || r.lease_expired_at::text
               || ' (database clock) without being renewed, so this attempt''s outcome was never'
               || ' written; the worker died, hung or lost its database connection. Attempt '
               || r.attempts::text || ' of ' || r.max_attempts::text || ': '
               || CASE WHEN r.attempts < r.max_attempts THEN 'the job is ready to run again.'
                       ELSE 'no attempts left, the job failed.' END
    FROM released AS r
)
SELECT count(*) FROM released
