import sys

from edge_runtime.cli.main import main

sys.exit(main())
