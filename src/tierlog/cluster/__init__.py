"""The cluster layer: membership, leases, one leader per stream, replication, failover.

Decisions live in pure code (``state``, ``log_history``, ``members``); MetaStore and
network I/O sit at the edge (``membership``, the replication shell)."""
