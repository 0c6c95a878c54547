"""`python -m rkcompile`: the same command line as the `rkcompile` script."""
import sys

from .cli import main

sys.exit(main())
