"""The stream-protocol commands a Connection handles, one module per area."""
