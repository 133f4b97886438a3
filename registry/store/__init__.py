"""Where artifacts live: the object store, a local directory or ``s3://bucket/prefix``.

:mod:`.protocol` is what every caller (the loader included) talks to: :class:`~.protocol.Store`
(``Store(url)`` opens the backend), its :class:`~.protocol.ReadProfile`. The backends: :mod:`.local`
(with :mod:`.localfiles`, the checked opens of the store's own files, and :mod:`.localfs`) and
:mod:`.s3` (with :mod:`.s3reads`, bounded and retried GETs, and :mod:`.retry`); :mod:`.fsstore` the
listings both answer through a file system; :mod:`.keys` the key layout;
:mod:`.copies` streamed uploads. The C library calls they need: :mod:`.libc`.
"""
