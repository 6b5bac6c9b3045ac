"""Local → remote as whole sealed segments (Pulsar's tiered storage): the offloader."""
