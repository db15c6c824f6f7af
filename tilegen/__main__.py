"""`python3 -m tilegen ...` is the `tilegen` command."""
import sys

from .cli import main

sys.exit(main())
