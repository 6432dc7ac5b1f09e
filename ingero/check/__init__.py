"""``ingero check``: can this node run ``ingero trace``, and what is missing."""
