"""`python -m rkcompile`: the same command line as the `rkcompile` script."""
from rkcompile.cli import console_main

console_main()
