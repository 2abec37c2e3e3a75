"""`python -m embedx`: the same commands as the `embedx` script."""

import sys

from embedx.cli import main

sys.exit(main())
