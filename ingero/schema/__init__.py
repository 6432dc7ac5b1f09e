"""The one event schema every part writes and reads (journald fields, MESSAGE_IDs, NDJSON, OTLP logs) and the straggler-episode fold over it."""
