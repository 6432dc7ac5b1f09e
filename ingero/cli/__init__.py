"""The ``ingero`` command line: one module per command over shared options and errors."""
