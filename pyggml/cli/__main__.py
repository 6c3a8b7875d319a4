"""`python -m pyggml.cli`: the `pyggml` command."""

import sys

from pyggml.cli.main import main

sys.exit(main())
