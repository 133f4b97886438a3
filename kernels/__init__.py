"""shardport.kernels (placeholder package: filled in by later issues)."""
