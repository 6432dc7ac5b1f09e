"""Echo's dashboard: server-rendered pages over Echo's questions (``view``, pure) and the
routes that serve them on Echo's API app (``routes``); docs/echo.md, "Dashboard"."""
