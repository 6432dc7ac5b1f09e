"""The exit rule's cases, shared by fleet-push's classifier and Fleet's tick: both sides
must end an episode at the same interval."""

from __future__ import annotations

# Each interval's score, as a letter: "b" below the threshold, "h" at or above it but below
# threshold + hysteresis (the band), "u" at threshold + hysteresis or above.
# (exit_intervals, the intervals after the one the episode started at, the interval it ends
# at (recovered) or None)
EXIT_RULES = [
    (2, "u", None),  # one noisy interval above does not end it
    (2, "uu", 1),
    (2, "ubu", None),  # an interval below between them starts the count again
    (2, "uhu", None),  # so does one in the band: not below, not recovered either
    (2, "ubuu", 3),
    (2, "hhuu", 3),
    (1, "hu", 1),  # exit_intervals 1: the first interval above ends it
    (3, "uubuuu", 5),
]
