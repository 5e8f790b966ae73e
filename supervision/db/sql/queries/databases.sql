-- name: database_exists --
SELECT 1 FROM pg_database WHERE datname = %(name)s;

-- name: db_ping --
SELECT 1;

-- name: notification_queue_usage --
-- The fraction (0-1) of the server's NOTIFY queue in use: one queue for the whole
-- cluster, filled when a LISTENing session stops consuming (then NOTIFY fails).
SELECT pg_notification_queue_usage();

-- name: db_session_user --
-- Who this session authenticated as (SET ROLE does not change it): recorded with a pause.
SELECT session_user::text;

-- name: db_now --
-- AsOf of a cycle: the database clock, never the host's.
SELECT now();
