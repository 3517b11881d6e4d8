"""The synthetic long-range tasks: determinism, answer masks, the distance guarantee, settings parsing."""
import pytest
import torch

from focusattn._errors import InputError
from focusattn.gpt.tasks import IGNORE, NEEDLE, QUESTION, MQARData, PasskeyData, parse_task
from focusattn.gpt.tokenizer import BOS, decode, encode

TEXT = encode("To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer. " * 30)


def _recall_distances(x, y, kv_len):
    """For each answer target, the distance from its input position to the latest earlier input position holding
    the same value token in the key-value section."""
    out = []
    for b in range(len(x)):
        for i in (y[b] != IGNORE).nonzero().flatten().tolist():
            src = [j for j in range(1, kv_len + 1) if x[b, j] == y[b, i] and x[b, j - 1] == x[b, i]]
            out.append(i - src[-1])
    return out


def test_mqar_layout_answers_and_distance():
    d = MQARData(pairs=4, keys=16, values=16)
    x, y = d.batch(0, 3, 8, 32)
    assert x.shape == y.shape == (8, 32) and (x[:, 0] == BOS).all()
    assert torch.equal(x, d.batch(0, 3, 8, 32)[0]) and not torch.equal(x, d.batch(0, 4, 8, 32)[0])
    assert ((y != IGNORE).sum(1) == 4).all()  # one answer per pair
    dist = _recall_distances(x, y, 8)  # every answer is the value that followed its key
    assert len(dist) == 32 and min(dist) >= d.min_distance(32) == 17
    # the bound is reached (last pair queried first): it is the task's true minimum distance
    assert min(_recall_distances(*d.val_windows(64, 32), 8)) == d.min_distance(64) == 49
    # validation is a stream of its own
    assert not torch.equal(d.val_windows(32, 8)[0], x)
    ans = y[y != IGNORE]
    assert ((ans >= 128) & (ans < 144)).all()


def test_passkey_answer_is_the_hidden_number_and_far_away():
    d = PasskeyData(TEXT[:1000], TEXT[1000:], digits=5, min_gap=16)
    x, y = d.batch(1, 0, 6, 128)
    dists = []
    for b in range(6):
        text = decode(x[b, 1:].tolist() + [int(y[b, -1])])
        key = decode(y[b][y[b] != IGNORE].tolist())
        assert len(key) == 5 and key.isdigit() and text.endswith("The pass key is " + key)
        assert NEEDLE.format(key) in text
        needle_digit0 = text.index(NEEDLE.format(key)) + len(" The pass key is ") + 1  # input position (BOS = 0)
        dists.append((128 - 5) - needle_digit0)
    assert min(dists) >= d.min_distance(128)
    x2, _ = d.val_windows(128, 2)
    assert torch.equal(x2, d.val_windows(128, 2)[0])


def test_passkey_distance_bound_is_tight():
    # min_gap = the filler left after the needle: at the deepest depth the bound is reached exactly.
    d = PasskeyData(TEXT[:1000], TEXT[1000:], digits=3, min_gap=0)
    nl, ql = len(encode(NEEDLE.format("000"))), len(encode(QUESTION.format("000")))
    t = nl + ql
    x, y = d.batch(0, 0, 1, t)  # filler length 0: needle right before the question
    text = decode(x[0, 1:].tolist())
    assert text.startswith(" The pass key is ")
    assert (t - 3) - (len(" The pass key is ") + 1) == d.min_distance(t)


def test_parse_task_and_errors():
    assert parse_task("shakespeare") is None
    assert parse_task("mqar:pairs=3,keys=20").pairs == 3
    with pytest.raises(InputError, match="allowed"):
        parse_task("mqar:width=3")
    with pytest.raises(InputError, match="name=integer"):
        parse_task("mqar:pairs")
    with pytest.raises(InputError, match="too short"):
        MQARData(pairs=8).batch(0, 0, 1, 16)
