"""Synthetic GPU workload: writes the node DB the way ``ingero trace`` would, for demos and tests."""
