import sys

from gskit.cli import main

sys.exit(main())
