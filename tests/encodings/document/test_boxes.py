"""Box inputs of the document-layout encodings (``relpos.encodings.document.boxes``): every
bad box tensor is refused with an error naming the input, and the example boxes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import relpos
from relpos.encodings.document.boxes import example_boxes

H, D = 4, 8


@pytest.mark.parametrize("name", ["layoutlmv2", "docpolarbert"])
def test_bad_boxes_name_the_input(name):
    enc = relpos.create(name, num_heads=H, head_dim=D)
    q = torch.randn(2, H, 5, D)
    good = example_boxes(2, 5, torch.Generator().manual_seed(0))

    def call(boxes, **kw):
        return relpos.scores(q, q, enc, inputs={"boxes": boxes, **kw})

    with pytest.raises(TypeError, match=r"inputs\['boxes'\]"):
        call(good.float())
    with pytest.raises(ValueError, match=r"inputs\['boxes'\]"):
        call(good[..., :3])
    with pytest.raises(ValueError, match=r"inputs\['boxes'\]"):
        call(good[:, :4])
    with pytest.raises(ValueError, match=r"inputs\['boxes'\]"):
        call(torch.cat([good, good[:1]]))  # batch 3 for a batch of 2
    swapped = good.clone()
    swapped[0, 1] = torch.tensor([50, 10, 40, 20])
    with pytest.raises(ValueError, match="x0 <= x1"):
        call(swapped)
    with pytest.raises(ValueError, match="query_boxes"):
        call(good, query_boxes=good[:, :2])
    with pytest.raises(ValueError, match="boxes"):
        relpos.scores(q, q, enc)
    call(good[:1])  # one set of boxes for the whole batch


def test_example_boxes_do_not_depend_on_the_length():
    short = example_boxes(3, 5, torch.Generator().manual_seed(0))
    long = example_boxes(3, 9, torch.Generator().manual_seed(0))
    assert torch.equal(long[:, :5], short)
    assert short[:, 0].eq(0).all()
    assert (short[..., 2] >= short[..., 0]).all() and (short[..., 3] >= short[..., 1]).all()
    assert F.relu(short.float()).equal(short.float())  # non-negative page coordinates


@pytest.mark.parametrize("name", ["layoutlmv2", "docpolarbert"])
def test_non_tensor_and_nan_boxes_name_the_input(name):
    enc = relpos.create(name, num_heads=H, head_dim=D)
    q = torch.randn(1, H, 3, D)
    good = example_boxes(1, 3, torch.Generator().manual_seed(0))
    with pytest.raises(TypeError, match=r"inputs\['boxes'\] must be a torch.Tensor"):
        relpos.scores(q, q, enc, inputs={"boxes": good.tolist()})
    nan = good.double()
    nan[0, 1, 2] = float("nan")
    with pytest.raises(TypeError, match=r"inputs\['boxes'\] must be an integer tensor"):
        relpos.scores(q, q, enc, inputs={"boxes": nan})
    with pytest.raises(TypeError, match=r"inputs\['query_boxes'\]"):
        relpos.scores(q, q, enc, inputs={"boxes": good, "query_boxes": nan})
    with pytest.raises(TypeError, match=r"inputs\['boxes'\]"):
        relpos.scores(q, q, enc, inputs={"boxes": good.bool()})


def test_check_boxes_refuses_non_tensors_by_name():
    from relpos.encodings.document.boxes import BOX_FORM, check_boxes

    with pytest.raises(TypeError, match="my_boxes must be a torch.Tensor"):
        check_boxes([[0, 0, 1, 1]], "my_boxes", BOX_FORM, 1, 1)
    out = check_boxes(torch.tensor([[[0, 0, 1, 1]]]), "my_boxes", BOX_FORM, 3, 1)
    assert out.shape == (3, 1, 4)
