"""With SmolLM2's tokenizer the short contexts are under the 128-token window and the long ones above it."""
import pytest

from focusattn.eval.tasks import read_docs

pytestmark = pytest.mark.realmodel


def test_short_and_long_straddle_the_window():
    from transformers import AutoTokenizer

    from focusattn.hf.loading import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path("smollm2-135m"))
    for name in ("focus_cloze_short", "focus_nextsent_short", "focus_cloze_long", "focus_nextsent_long"):
        n = [len(tok(d["context"]).input_ids) for d in read_docs(name)]
        if name.endswith("short"):
            assert max(n) < 128, (name, max(n))
        else:
            assert min(n) > 128, (name, min(n))
    n = [len(tok(d["context"]).input_ids) for d in read_docs("focus_passkey")]
    assert min(n) > 300
