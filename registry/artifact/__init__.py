"""What an artifact is: the manifest and its consistency check, references, checkpoint paths.

Also the digests and the one streaming hasher, and producer witnesses. Pure data and
parsing; no store I/O.
"""
