"""What every ingero process runs on: configuration loading, errors and exit codes, the clock, atomic files, systemd and journald, SIGHUP handling, build info."""
