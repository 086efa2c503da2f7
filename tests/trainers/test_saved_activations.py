"""trainers/measure.py's SavedActivations: each saved storage is named by the module that saved it, and a
submodule output that was freed never names a tensor allocated later (a storage id is reused once its storage
is gone: CI once saw a dense layer's SwiGLU tensor taken for its attention output)."""

from __future__ import annotations

import gc

import pytest

torch = pytest.importorskip("torch")

from trainers import measure  # noqa: E402


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, 8, bias=False)

    def forward(self, x):
        y = self.proj(x)
        fresh = torch.tanh(x) * 2  # made here, after the Linear's output is gone or not
        return (y * y) + torch.sigmoid(fresh)  # y*y saves the child's output; sigmoid saves its own result


def test_each_saved_storage_is_named_by_its_saving_module_and_role():
    block = Block()
    saved = measure.SavedActivations(exclude=measure.param_storage_keys([block]))
    x = torch.randn(4, 8, requires_grad=True)
    with saved.recording(block):
        block(x).sum().backward()
    owners = set(saved.by_module())
    assert "model:proj" in owners  # the Linear's output, saved by the block's y*y
    assert "proj:in" in owners  # the Linear saves its input for the weight gradient
    assert "model" in owners  # sigmoid's result, made by the block itself


def test_a_freed_child_output_never_names_a_later_storage_at_its_id():
    frame = measure._Frame("layer0", {})
    gone = torch.ones(16)
    key = measure._storage_id(gone)
    frame.add_child_output("self_attention", measure._storages(gone))
    assert frame.owner(key, gone.untyped_storage()) == "layer0:self_attention"
    del gone
    gc.collect()
    later = torch.zeros(16)  # whatever id it gets: asked about the dead one's id, it is the frame's own
    assert frame.owner(key, later.untyped_storage()) == "layer0"
    frame.add_child_output("mlp", {key: later.untyped_storage()})  # the id reused: the live storage wins
    assert frame.owner(key, later.untyped_storage()) == "layer0:mlp"


def test_an_input_is_named_only_while_it_is_the_same_storage():
    kept = torch.ones(4)
    gone = torch.ones(4)
    frame = measure._Frame("layer1.mlp", {**measure._storages(kept), **measure._storages(gone)})
    gone_key = measure._storage_id(gone)
    assert frame.owner(measure._storage_id(kept), kept.untyped_storage()) == "layer1.mlp:in"
    del gone
    gc.collect()
    assert frame.owner(gone_key, torch.zeros(4).untyped_storage()) == "layer1.mlp"
