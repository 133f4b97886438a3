"""Who may sign what: tag documents and their history verification, the trust policy.

Also manifest signatures, client trust state, and resolving a reference to a verified manifest.
"""
