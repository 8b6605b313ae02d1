-- Fill the task table with :rows finished tasks spread over the last 30 days (1 in 33 FAILED),
-- and :live READY tasks, in SQL (psql -v rows=5000000 -v live=1000 -f scripts/fill_history.sql).
-- Ids are UUIDv7 made from each task's enqueue time, as new_task_id() makes them.
\set ON_ERROR_STOP on
INSERT INTO django_sqltasks_taskrecord (
    id, task_path, backend_name, queue_name, priority, status, args, kwargs, return_value,
    errors, worker_ids, attempts, rescues, snoozes, owner, enqueued_at, run_after, available_at,
    started_at, last_attempted_at, finished_at, cancel_requested, dedupe_key, subject_type,
    subject_id, limit_key, progress, trace_parent, workflow_id
)
SELECT
    (lpad(to_hex((extract(epoch FROM t.at) * 1000)::bigint), 12, '0') || '7'
        || substr(md5(g::text), 1, 3) || '8' || substr(md5(g::text), 4, 15))::uuid,
    'example.tasks.send_receipt', 'default', (ARRAY['default', 'emails', 'reports'])[1 + g % 3],
    0, CASE WHEN g % 33 = 0 THEN 'FAILED' ELSE 'SUCCESSFUL' END,
    jsonb_build_array('user' || g || '@example.com', g), '{}'::jsonb,
    CASE WHEN g % 33 = 0 THEN 'null'::jsonb ELSE '{"sent": true}'::jsonb END,
    CASE WHEN g % 33 = 0 THEN '[{"exception_class_path": "smtplib.SMTPException", "traceback": "Traceback (most recent call last): ..."}]'::jsonb ELSE '[]'::jsonb END,
    '["worker-1"]'::jsonb, 1, 0, 0, NULL, t.at, NULL, t.at, t.at, t.at,
    t.at + interval '40 milliseconds', false, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM generate_series(1, :rows) AS g,
    LATERAL (SELECT now() - interval '30 days' * (1 - g::float8 / :rows) AS at) AS t;

INSERT INTO django_sqltasks_taskrecord (
    id, task_path, backend_name, queue_name, priority, status, args, kwargs, errors,
    worker_ids, attempts, rescues, snoozes, enqueued_at, available_at, cancel_requested
)
SELECT gen_random_uuid(), 'example.tasks.send_receipt', 'default',
    (ARRAY['default', 'emails', 'reports'])[1 + g % 3], 0, 'READY', '[1]', '{}', '[]', '[]',
    0, 0, 0, now(), now() + interval '1 day', false
FROM generate_series(1, :live) AS g;
