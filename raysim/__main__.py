"""``python -m raysim``: the ``raysim`` command where its console script is not installed (a
checkout on ``PYTHONPATH``, a machine without pip)."""

from raysim.cli import console_main

console_main()
