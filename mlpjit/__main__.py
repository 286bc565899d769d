"""`python -m mlpjit ...`: the same as the `mlpjit` console script."""

import sys

from mlpjit.cli import main

if __name__ == "__main__":
    sys.exit(main())
