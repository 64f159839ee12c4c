"""Workbook 14 · the whole bill: unit tests of the learner's code (run: -m ex14)."""

import pytest
import torch
from torch import nn

from adam8lib import AdamW8bit, release_gradients
from adam8lib.memory_tracker import track_step

pytestmark = pytest.mark.ex14


def _model(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(16, 96), nn.Tanh(), nn.Linear(96, 64), nn.Tanh(), nn.Linear(64, 3))


def _data(n=4):
    gen = torch.Generator().manual_seed(5)
    return [(torch.randn(12, 16, generator=gen), torch.randint(0, 3, (12,), generator=gen)) for _ in range(n)]


def test_release_by_hand_equals_adam8lib_release_gradients_bit_for_bit(workbook):
    """One optimizer per parameter, stepped in its hook, trains exactly as the library's release with one
    optimizer over all (per-parameter steps: the same arithmetic), and leaves no gradient behind."""
    release_by_hand = workbook("14").release_by_hand
    mine, ref = _model(), _model()
    handles = release_by_hand(mine, lambda ps: AdamW8bit(ps, lr=1e-2, weight_decay=0.05))
    opt = AdamW8bit(ref.parameters(), lr=1e-2, weight_decay=0.05)
    with release_gradients(ref, opt):
        for x, y in _data():
            nn.functional.cross_entropy(mine(x), y).backward()
            nn.functional.cross_entropy(ref(x), y).backward()
            assert all(p.grad is None for p in mine.parameters())
    assert all(torch.equal(a, b) for a, b in zip(mine.parameters(), ref.parameters()))
    for h in handles:
        h.remove()
    x, y = _data(1)[0]
    nn.functional.cross_entropy(mine(x), y).backward()
    assert all(p.grad is not None for p in mine.parameters())  # the handles were the hooks: removed


def test_release_by_hand_holds_at_most_one_gradient_of_a_chain(workbook):
    """In a chain of layers each gradient is freed before the next parameter's is complete: a hook of
    our own, registered after the learner's, never sees an earlier parameter's gradient still there."""
    model = _model()
    workbook("14").release_by_hand(model, lambda ps: torch.optim.SGD(ps, lr=0.1))
    params = list(model.parameters())
    seen = []
    for p in params:
        p.register_post_accumulate_grad_hook(lambda q: seen.append(sum(r.grad is not None for r in params)))
    x, y = _data(1)[0]
    nn.functional.cross_entropy(model(x), y).backward()
    assert len(seen) == len(params) and max(seen) == 0


@pytest.mark.parametrize("release", [False, True])
def test_bill_row_reads_the_tracker(workbook, release):
    """The row's numbers are the tracker's, per parameter: with release no gradient is left when backward
    ends, and the peak names a gradient that was in flight."""
    bill_row = workbook("14").bill_row
    model = _model()
    opt = AdamW8bit(model.parameters(), lr=1e-3)
    handle = release_gradients(model, opt) if release else None
    x, y = _data(1)[0]
    nn.functional.cross_entropy(model(x), y).backward()
    if not release:
        opt.step()
        opt.zero_grad(set_to_none=True)
    tracker = track_step(model, opt, lambda: nn.functional.cross_entropy(model(x), y))
    if handle:
        handle.remove()
    row = bill_row(tracker)
    n = sum(p.numel() for p in model.parameters())
    assert row["weights"] == 4.0 and row["gradients"] == (0.0 if release else 4.0)
    state = sum(t.numel() * t.element_size() for st in opt.state.values() for t in st.values() if torch.is_tensor(t))
    assert row["state"] == state / n
    assert row["between"] == pytest.approx(row["weights"] + row["gradients"] + row["state"], rel=1e-12)
    assert row["peak"] >= row["between"]
    names = {name for name, _ in model.named_parameters()}
    assert row["largest_gradient"] in names
    if release:
        assert row["peak"] > row["between"]  # a gradient in flight on top of the bill
