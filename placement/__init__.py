"""shardport.placement (placeholder package: filled in by later issues)."""
