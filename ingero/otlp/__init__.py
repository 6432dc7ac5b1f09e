"""OTLP encoding and decoding of ingero's health pushes (metrics) and events (logs)."""
