"""Session-scoped Spark (local[2]) fixture (filled in by the Spark work)."""
