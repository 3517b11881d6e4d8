"""The pieces of the retrofit objective: distillation KL and repeated-half windows."""
import numpy as np
import torch

from focusattn.train.retrofit import distill_kl, repeat_halves


def test_distill_kl_is_zero_at_the_teacher_and_positive_elsewhere():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(2, 7, 11, generator=g)
    assert distill_kl(t, t).abs() < 1e-6
    s = torch.randn(2, 7, 11, generator=g, requires_grad=True)
    kl = distill_kl(s, t)
    assert kl > 0
    kl.backward()
    assert s.grad[:, -1].abs().max() == 0  # the last position predicts nothing scored
    ref = torch.nn.functional.kl_div(torch.log_softmax(s[:, :-1], -1).reshape(-1, 11),
                                     torch.log_softmax(t[:, :-1], -1).reshape(-1, 11), log_target=True,
                                     reduction="batchmean")
    torch.testing.assert_close(kl, ref)


def test_repeat_halves_is_a_function_of_the_sample_number():
    x = np.arange(40).reshape(4, 10)
    assert repeat_halves(x, range(4), 0.0, 0) is x
    all_ = repeat_halves(x, range(4), 1.0, 0)
    assert (all_[:, 5:] == all_[:, :5]).all() and (x == np.arange(40).reshape(4, 10)).all()  # input untouched
    some = repeat_halves(x, range(100, 104), 0.5, 3)
    again = np.concatenate([repeat_halves(x[i:i + 1], [100 + i], 0.5, 3) for i in range(4)])
    assert (some == again).all()  # per sample, whatever the batch split (ranks, accumulation)
    rows = repeat_halves(np.zeros((1000, 4), dtype=int) + np.arange(4), range(1000), 0.25, 0)
    assert 0.2 < (rows[:, 2] == 0).mean() < 0.3
