-- name: database_exists --
SELECT 1 FROM pg_database WHERE datname = %(name)s;

-- name: db_ping --
SELECT 1;
