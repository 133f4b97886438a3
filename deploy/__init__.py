"""shardport.deploy (placeholder package: filled in by later issues)."""
