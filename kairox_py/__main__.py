"""`python -m kairox_py` is the `kairox` command."""
from .cli import main

main()
