"""CPython frames of another process, read from outside it (node side, no ptrace).

``reader.PyProcess`` finds the interpreter, its threads and their frames; ``linetable``
turns an instruction offset into the executing line; ``layout`` holds what differs
between versions.
"""
