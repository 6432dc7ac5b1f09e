"""Errors a person sees: each becomes one line on stderr and a fixed exit code."""

from __future__ import annotations

# Exit codes follow sysexits(3) where one fits, so scripts and systemd can tell causes apart.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATAERR = 65
EXIT_UNAVAILABLE = 69
EXIT_SOFTWARE = 70
EXIT_CANTCREAT = 73
EXIT_CONFIG = 78


class IngeroError(Exception):
    """Base for errors reported to the user as a single line."""

    exit_code = EXIT_FAILURE


class ConfigError(IngeroError):
    """A configuration file or value is invalid; the message names the key and the file."""

    exit_code = EXIT_CONFIG


class UsageError(IngeroError):
    exit_code = EXIT_USAGE


class UnavailableError(IngeroError):
    """A service or resource the command needs cannot be reached."""

    exit_code = EXIT_UNAVAILABLE


class CantCreateError(IngeroError):
    """A file or directory the command must write cannot be created (sysexits EX_CANTCREAT)."""

    exit_code = EXIT_CANTCREAT
