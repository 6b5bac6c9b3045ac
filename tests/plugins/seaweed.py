"""Session-scoped seaweed server fixture (filled in by the storage work)."""
