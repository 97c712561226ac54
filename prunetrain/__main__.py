"""`python -m prunetrain`: the command line."""
from prunetrain.cli import main

main()
