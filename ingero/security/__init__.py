"""Who may come in, and how it is checked: the gate of every Fleet and Echo listener (access), bearer tokens, rate limits, the audit log and TLS."""
