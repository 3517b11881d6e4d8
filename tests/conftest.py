import os

import pytest
import torch

# Keep CI deterministic and light on 2 cores.
torch.manual_seed(0)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
