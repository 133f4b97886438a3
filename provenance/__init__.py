"""shardport.provenance (placeholder package: filled in by later issues)."""
