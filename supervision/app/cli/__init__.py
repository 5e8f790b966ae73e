"""The ``safetynet`` command line (SPEC §7), one module per group of verbs.

Exit codes: 0 success; 1 infrastructure failure or a child beyond its restart intensity;
2 usage errors, a violated SLO (``status``) or an unknown id (``requeue``); 78 bad
configuration. No verb ends in a traceback: expected failures print one clear line each.
What comes from data (ids, ``last_error``, a plan's reasons) is printed through
:mod:`supervision.app.terminal`: no control sequence or rich markup of theirs takes effect.

    group.py     the group, the shared options (--job, -c, --reason/--actor), exit codes
    daemon.py    check-config, run, run-once
    schema.py    migrate, check-schema
    reading.py   status, audit, plan
    acting.py    requeue, release, dead-letters, replay, pause, resume, accept-missing
    demo.py      dev
    (the console's verbs, console and history: supervision/app/console/commands.py)
"""

from __future__ import annotations

from supervision.app.cli import acting, daemon, demo, reading, schema
from supervision.app.cli.group import main
from supervision.app.console.commands import console, history

main.add_command(console)
main.add_command(history)

__all__ = ["acting", "daemon", "demo", "main", "reading", "schema"]
