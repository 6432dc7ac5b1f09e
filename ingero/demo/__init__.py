"""``ingero demo``: a real Fleet and real fleet-push agents on synthetic workloads, on one host."""
