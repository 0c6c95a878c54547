"""`python -m rkcompile`: the same command line as the `rkcompile` script."""
from .cli import console_main

console_main()
