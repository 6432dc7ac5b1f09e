"""Reading the journal for a person: ingero events from ``journalctl -o json``, grouped."""
