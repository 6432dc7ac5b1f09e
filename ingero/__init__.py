"""ingero: GPU-cluster straggler detection and GPU observability."""

# The one place the version is written; pyproject.toml reads it from here. A literal rather
# than importlib.metadata, whose package scan costs tens of ms on every CLI and Slurm hook start.
__version__ = "0.1.0"

__all__ = ["__version__"]
