"""Node measurements: /proc, nvidia-smi and the node DB, each behind a small typed interface."""
