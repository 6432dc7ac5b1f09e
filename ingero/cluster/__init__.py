"""Commands across nodes: fan-out over SSH (ClusterShell), merged node DBs, timeline export."""
