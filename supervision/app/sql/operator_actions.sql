-- name: operator_actions_insert --
-- One operator action (a CLI verb or a console form), in the transaction of the action.
INSERT INTO safetynet.operator_actions (actor, origin, client, verb, ids, reason, result)
VALUES (left(%(actor)s, 256), %(origin)s, left(%(client)s, 256), %(verb)s, %(ids)s,
        left(%(reason)s, 1024), %(result)s)
RETURNING id, at;

-- name: operator_actions_page --
-- `safetynet history` and the console: newest first, a keyset page (id < %(before)s),
-- at or after %(since)s (NULL: no bound).
SELECT id, at, actor, db_user, origin, client, verb, ids, reason, result
FROM safetynet.operator_actions
WHERE id < %(before)s
  AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
ORDER BY id DESC
LIMIT %(limit)s;
