"""A dependent enqueued after= a job that already exists is settled at the enqueue's commit.

The enqueue reads its ancestors without locking them: a lock would stay until the caller's
transaction ends (a long atomic() in a view or a script), and an ancestor that is running is a
row the engine writes (its outcome, its progress, its lease's expiry). Read without a lock, an
ancestor may end between the enqueue's read and its commit, where the outcome write that ended
it could not see the new dependent: the dependent would wait for ever.

The constraint trigger below, deferred to the commit, closes that gap. At the commit, for each
new waiting dependent one of whose ancestors this transaction did not insert, it takes those
ancestors' rows (in id order, with a new row version: has_dependents set) for the moment the
commit lasts, which waits at most for an outcome write in flight, then reads them as they are:

  * an ancestor that ended meanwhile is counted as the outcome write would have counted it (a
    success, or a failure under on_failure "run": one less to wait for; "cancel": the dependent
    is cancelled, with its 'cancelled' transition for the observers that watch it, and its own
    dependents settled in turn; "hold": held);
  * an outcome write that comes after the commit sees the dependent; one whose snapshot is older
    finds the ancestor's row held or changed since, passes it over (busy) and writes it again
    with a snapshot that sees the dependent (see "taken" in outcome_applied, queries.sql).

A workflow enqueued whole (every ancestor a row of this transaction) costs one probe per waiting
job: the engine cannot have seen those ancestors. The observers watched are those the enqueuing
statement names (backwave.observed, a transaction-local setting).
"""

from django.db import migrations

SETTLE_NEW_DEPENDENTS = r"""
CREATE FUNCTION backwave_settle_new_dependent() RETURNS trigger
LANGUAGE plpgsql
-- Its lookups are primary-key and index probes whatever the statistics said when the session
-- first planned them (cached for the session: planned on a table of a page, a sequential scan
-- per dependent); the caller's own value comes back when the function returns.
SET enable_seqscan = off
AS $settle$
DECLARE
    own xid := pg_current_xact_id()::xid;
    observed jsonb := coalesce(nullif(current_setting('backwave.observed', true), ''), '[]')::jsonb;
    todo bigint[] := ARRAY[NEW.id];
    dependent_id bigint;
    dependent record;
    effect record;
BEGIN
    -- A row this transaction inserted has its xid and the transaction's now() as enqueued_at
    -- (one it only updated keeps an older enqueued_at).
    IF NOT EXISTS (
        SELECT FROM backwave_dependency AS d
        JOIN backwave_job AS a ON a.id = d.ancestor_id
        WHERE d.job_id = NEW.id AND NOT (a.xmin = own AND a.enqueued_at = now())
    ) THEN
        RETURN NULL;
    END IF;
    WHILE cardinality(todo) > 0 LOOP
        dependent_id := todo[1];
        todo := todo[2:];
        PERFORM 1 FROM backwave_job AS a
        WHERE a.id IN (SELECT d.ancestor_id FROM backwave_dependency AS d WHERE d.job_id = dependent_id)
          AND NOT (a.xmin = own AND a.enqueued_at = now())
        ORDER BY a.id
        FOR NO KEY UPDATE;
        UPDATE backwave_job AS a SET has_dependents = true
        WHERE a.id IN (SELECT d.ancestor_id FROM backwave_dependency AS d WHERE d.job_id = dependent_id)
          AND a.xmin <> own;
        SELECT j.state, j.waiting_on, j.attempts, j.task_path, j.queue INTO dependent
        FROM backwave_job AS j WHERE j.id = dependent_id;
        CONTINUE WHEN dependent.state IS DISTINCT FROM 'waiting';
        SELECT count(*) FILTER (WHERE NOT (a.state = 'succeeded'
                                           OR (a.state IN ('failed', 'cancelled', 'quarantined') AND d.on_failure = 'run')))
                   AS waiting_on,
               min(a.id) FILTER (WHERE a.state IN ('failed', 'cancelled', 'quarantined') AND d.on_failure = 'cancel')
                   AS doomed_by,
               min(a.id) FILTER (WHERE a.state IN ('failed', 'cancelled', 'quarantined') AND d.on_failure = 'hold')
                   AS held_by
        INTO effect
        FROM backwave_dependency AS d
        JOIN backwave_job AS a ON a.id = d.ancestor_id
        WHERE d.job_id = dependent_id;
        IF effect.doomed_by IS NOT NULL THEN
            -- As settle_dependents cancels a dependent (its reason, finished_at, its transition).
            UPDATE backwave_job AS j
            SET state = 'cancelled', finished_at = now(),
                reason = 'Cancelled: ancestor #' || a.id::text
                         || CASE a.state WHEN 'failed' THEN ' failed.' ELSE ' was ' || a.state || '.' END
            FROM backwave_job AS a
            WHERE j.id = dependent_id AND a.id = effect.doomed_by;
            INSERT INTO backwave_transition (job_id, attempt, kind, task_path, queue, occurred_at, state,
                                             deliveries, next_attempt_at, delivered_to, failed_observer, last_error, observers)
            SELECT dependent_id, dependent.attempts, 'cancelled', dependent.task_path, dependent.queue, now(), 'pending', 0,
                   now(), ARRAY[]::varchar[], '', '', coalesce(o.names, ARRAY[]::varchar[])
            FROM (
                SELECT array_agg(DISTINCT w.observer ORDER BY w.observer) FILTER (WHERE w.observer IS NOT NULL) AS names,
                       count(*) AS watchers
                FROM jsonb_to_recordset(observed) AS w(kind text, task_path text, queue text, observer text)
                WHERE w.kind = 'cancelled' AND (w.task_path IS NULL OR w.task_path = dependent.task_path)
                  AND (w.queue IS NULL OR w.queue = dependent.queue)
            ) AS o
            WHERE o.watchers > 0;
            -- Its own dependents see it cancelled (all of this transaction: settled here, once).
            todo := todo || ARRAY(SELECT d.job_id FROM backwave_dependency AS d WHERE d.ancestor_id = dependent_id);
        ELSIF effect.held_by IS NOT NULL THEN
            UPDATE backwave_job AS j
            SET state = 'held', waiting_on = effect.waiting_on,
                reason = 'Held: ancestor #' || a.id::text
                         || CASE a.state WHEN 'failed' THEN ' failed' ELSE ' was ' || a.state END
                         || '. Retry it to re-arm this job, retry this job to run it now, or cancel it.'
            FROM backwave_job AS a
            WHERE j.id = dependent_id AND a.id = effect.held_by;
        ELSIF effect.waiting_on = 0 THEN
            UPDATE backwave_job AS j
            SET state = 'ready', waiting_on = 0, run_at = greatest(j.run_at, now())
            WHERE j.id = dependent_id;
            PERFORM pg_notify('backwave_hint', dependent.queue);
        ELSIF effect.waiting_on <> dependent.waiting_on THEN
            UPDATE backwave_job SET waiting_on = effect.waiting_on WHERE id = dependent_id;
        END IF;
    END LOOP;
    RETURN NULL;
END
$settle$;

CREATE CONSTRAINT TRIGGER backwave_settle_new_dependent
AFTER INSERT ON backwave_job
DEFERRABLE INITIALLY DEFERRED
FOR EACH ROW WHEN (NEW.state = 'waiting')
EXECUTE FUNCTION backwave_settle_new_dependent();
"""

DROP = """
DROP TRIGGER IF EXISTS backwave_settle_new_dependent ON backwave_job;
DROP FUNCTION IF EXISTS backwave_settle_new_dependent();
"""


class Migration(migrations.Migration):
    dependencies = [("backwave", "0021_pump_queues")]

    operations = [migrations.RunSQL(SETTLE_NEW_DEPENDENTS, DROP)]
