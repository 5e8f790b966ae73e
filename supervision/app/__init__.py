"""The composition root: the process tree, the daemon's wiring, the CLI and its verbs.

The only code that imports both the runtime (``supervision``) and the actors (``actors``);
``tests/unit/house/test_layers.py`` keeps it that way.
"""
