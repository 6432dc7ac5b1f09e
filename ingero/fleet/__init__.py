"""ingero fleet: the central peer-relative threshold daemon."""
