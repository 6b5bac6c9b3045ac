"""Maintenance jobs over the remote tier, each a Spark application: export, scrub, gc."""
