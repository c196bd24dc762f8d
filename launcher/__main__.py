"""`python -m launcher` is `mgpu-launch`."""

import sys

from .cli import main

sys.exit(main())
