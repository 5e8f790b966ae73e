"""``safetynet console``: the operator console in the browser (issue #27).

A process of its own (the daemon's metrics port stays read-only and small): Starlette on
hypercorn's Trio worker, server-rendered Jinja2 pages (autoescaped), plain HTML forms and no
script at all. Read-only unless ``console.allow_actions``; every action goes through
:mod:`supervision.app.actions`, the code the CLI verbs call, and leaves a row in the
operator trail. See docs/console.md.
"""
