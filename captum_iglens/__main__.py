"""``python -m captum_iglens``: the ``iglens`` command."""

import sys

from captum_iglens.cli import main

if __name__ == "__main__":
    sys.exit(main())
