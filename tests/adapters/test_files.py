"""The shipped adapters' files are whole and verified without loading a model: schema, and the tensor file's sha256
as recorded in adapter_config.json."""
import hashlib
import json

import pytest

from focusattn import adapters
from focusattn.hf.io import CONFIG, WEIGHTS, verify_adapter


@pytest.mark.parametrize("name", adapters.shipped())
def test_shipped_adapter_files_verify(name):
    folder = adapters.HERE / name
    meta = verify_adapter(name)
    assert meta == json.loads((folder / CONFIG).read_text())
    assert meta["weights_sha256"] == hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()
