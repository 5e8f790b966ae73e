"""``python -m supervision.app`` is the ``safetynet`` command."""

from supervision.app.cli import main

main(prog_name="safetynet")
