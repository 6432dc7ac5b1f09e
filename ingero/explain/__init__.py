"""``ingero explain``: why this node may be slow, read from its node DB."""

from ingero.explain.analysis import Finding, Report, WindowData, explain

__all__ = ["Finding", "Report", "WindowData", "explain"]
