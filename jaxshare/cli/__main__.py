"""``python -m jaxshare.cli``."""

import sys

from jaxshare.cli._main import main

sys.exit(main())
