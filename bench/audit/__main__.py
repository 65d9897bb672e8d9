import sys

from bench.audit.cli import main

sys.exit(main())
