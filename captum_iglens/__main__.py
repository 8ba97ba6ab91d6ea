"""``python -m captum_iglens``: the ``iglens`` command."""

import sys

from captum_iglens.cli import main

sys.exit(main())
