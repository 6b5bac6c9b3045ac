"""Session-scoped etcd server fixture (filled in by the storage work)."""
