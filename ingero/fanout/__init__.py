"""Many nodes from one host: an ingero command on every node over SSH (ClusterShell), the
node DBs' rows gathered, what only shows across nodes, and the nodes' timeline."""
