"""The ``serrano`` command: entry point, options and report (``main``), sweeps (``sweep``)."""
