"""`python -m giul_asgi` is the `giul-asgi` command."""

import sys

from .cli import main

sys.exit(main())
