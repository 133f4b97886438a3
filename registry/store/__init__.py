"""Where artifacts live: the object store, a local directory or ``s3://bucket/prefix``.

Its local-file and S3 read layers, retries, and the C library calls they need.
"""
