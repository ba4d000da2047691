"""Result tables in huge pages behave as any tensor from torch.empty."""
import gc
import io

import torch

from attribution.engine.memory import HUGE_PAGE_MIN_BYTES, empty_table


def test_a_large_table_is_an_ordinary_writable_tensor_that_outlives_its_maker():
    rows = HUGE_PAGE_MIN_BYTES // (4 * 256) + 1
    table = empty_table((rows, 256))
    gc.collect()
    assert table.shape == (rows, 256) and table.dtype == torch.float32
    assert table.is_contiguous() and table.device.type == "cpu"
    table.copy_(torch.arange(rows * 256, dtype=torch.float32).view(rows, 256))
    buffer = io.BytesIO()
    torch.save(table, buffer)
    buffer.seek(0)
    torch.testing.assert_close(torch.load(buffer), table)
    assert table.numpy().flags.writeable and float(table[-1, -1]) == rows * 256 - 1


def test_a_small_table_is_plain_torch_memory():
    table = empty_table((3, 4), torch.float64)
    assert table.shape == (3, 4) and table.dtype == torch.float64
    assert table.untyped_storage().resizable()  # torch.empty's own



def test_the_gradient_leaf_is_the_layer_output_itself_unless_the_tail_shares_its_memory():
    from attribution.engine.runners.fx import _leaf

    z = torch.randn(4, 3)
    alone = _leaf(z, [torch.randn(4, 2), 7])
    assert alone.requires_grad and alone.is_leaf
    assert alone.untyped_storage().data_ptr() == z.untyped_storage().data_ptr()  # no copy
    shared = _leaf(z, [z.view(2, 6)])  # e.g. an in-place layer's input kept for a residual
    assert shared.requires_grad and shared.is_leaf and torch.equal(shared, z)
    assert shared.untyped_storage().data_ptr() != z.untyped_storage().data_ptr()
