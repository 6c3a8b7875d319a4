"""The torch backend's tests need PyTorch (an optional dependency, which CI installs): without it they are
not collected, so their modules can import torch at the top."""

import importlib.util

collect_ignore_glob = [] if importlib.util.find_spec("torch") else ["test_*.py"]
