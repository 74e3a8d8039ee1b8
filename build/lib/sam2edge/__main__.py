import sys

from sam2edge.cli.main import main

sys.exit(main())
