"""Slurm integration: job files written by the prolog, and the opt-in drain controller."""
