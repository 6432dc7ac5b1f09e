"""Echo: the central, durable cluster event store with HTTP+JSON, MCP and read-only SQL."""
