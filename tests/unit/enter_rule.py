"""The enter rule's cases, shared by fleet-push's classifier and Fleet's tick: both sides
must start an episode at the same interval."""

from __future__ import annotations

# (enter_intervals, enter_window, scores against a threshold of 0.7, the interval the
# episode starts at or None)
ENTER_WINDOW = [
    (2, 2, [0.5, 0.9, 0.5, 0.9, 0.5], None),  # in a row: every interval above restarts it
    (2, 2, [0.5, 0.9, 0.5, 0.5], 3),
    (2, 3, [0.5, 0.9, 0.5], 2),  # one noisy interval above between two below
    (2, 3, [0.5, 0.9, 0.9, 0.5], None),  # the first below has left the window
    (2, 3, [0.9, 0.5, 0.5], 2),
    (2, 3, [0.9, 0.9, 0.5], None),  # intervals above never start it
    (3, 5, [0.5, 0.9, 0.5, 0.9, 0.5], 4),
    (3, 2, [0.5, 0.9, 0.5, 0.5, 0.5], 4),  # a window shorter than the count: in a row
]
