"""``python -m shardport.cli``: the ``registry`` console script."""

import sys

from shardport.cli import main

sys.exit(main())
