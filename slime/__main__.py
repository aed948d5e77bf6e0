import sys

from slime.cli import main

sys.exit(main())
