"""``python -m supervision`` is the ``safetynet`` command."""

from supervision.cli import main

main(prog_name="safetynet")
