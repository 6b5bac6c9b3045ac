"""Message store tests (v2 records, scanner, store, compaction, v1 reading, migration)."""
