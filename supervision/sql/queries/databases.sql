-- name: database_exists --
SELECT 1 FROM pg_database WHERE datname = %(name)s;

-- name: db_ping --
SELECT 1;

-- name: db_session_user --
-- Who this session authenticated as (SET ROLE does not change it): recorded with a pause.
SELECT session_user::text;
