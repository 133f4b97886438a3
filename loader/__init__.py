"""shardport.loader (placeholder package: filled in by later issues)."""
