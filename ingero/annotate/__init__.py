"""``ingero annotate``: marks from the job itself (steps, phases, labels) on a local socket.

``ingero.annotate.client`` and ``ingero.annotate.codec`` use only the standard library, so a
training job imports them without ingero's heavy dependencies; the server lives in
``ingero.annotate.server``.
"""
