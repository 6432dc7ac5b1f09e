"""``ingero sink``: the reference consumer of fleet-push's NDJSON event socket."""
