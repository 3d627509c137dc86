"""refmodel.metadata_layout: the metadata codec over plain ints is, slot for slot, FA3's int32 tensor.

The reference here is the tensor encoder as refmodel.metadata wrote it (an int32 ``torch.full`` of UNWRITTEN, each
vector assigned from a tensor of its values: the int32 slot wraps a value to a C++ int); the list codec must give
the same values for upstream's and the vLLM fork's layouts, and decoding the list must give what decoding the
tensor gives. spec.invariants reads metadata through this codec, so importing it loads no torch.
"""

import dataclasses
import itertools
import subprocess
import sys

import pytest
import torch

from refmodel.fa3_builds import UPSTREAM, VLLM_FORK
from refmodel.fa3_scheduler import call_inputs, precompute_inputs, resolve_schedule
from refmodel.metadata import decode_for_schedule, encode_metadata
from refmodel.metadata_layout import (UNWRITTEN, MetadataLayout, decode_values_for_schedule,
                                      encode_metadata_values)
from refmodel.prepare import prepare_scheduler


def _tensor_reference(schedule, result, wrap=True):
    """The int32 tensor as refmodel.metadata built it before the list codec (``wrap=False``: a codec that keeps
    values past int32 unwrapped, the negative control)."""
    layout = MetadataLayout.for_schedule(schedule)
    out = torch.full((layout.size,), UNWRITTEN, dtype=torch.int32 if wrap else torch.int64)
    b = layout.batch_size
    for offset, values in ((layout.splits_offset, result.num_splits), (layout.m_blocks_offset, result.num_m_blocks),
                           (layout.seqlen_q_offset, result.prepare_seqlen_q),
                           (layout.batch_idx_offset, result.batch_idx), (layout.nheads_in_l2_offset, result.nheads_in_l2)):
        if offset is not None:
            out[offset:offset + b] = torch.tensor(values)
    if layout.has_semaphore:
        out[layout.semaphore_offset] = 0
    return out


def _cases():
    for build, b, q, causal, page in itertools.product((UPSTREAM, VLLM_FORK), (1, 3, 5, 8), (1, 7),
                                                       (True, False), (None, 16)):
        pin = precompute_inputs(b, q, 8192, 32, 8, 128, varlen_q=True, page_size=page, causal=causal, build=build)
        lens = [8192 - 1000 * i for i in range(b)]
        P = resolve_schedule(pin)
        R = prepare_scheduler(P, lens, seqlens_q=[q] * b)
        yield P, R, [resolve_schedule(call_inputs(bc, q, 8192, 32, 8, 128, varlen_q=True, page_size=page,
                                                  causal=causal, build=build)) for bc in (b, max(1, b - 1))]


def test_the_list_codec_is_the_int32_tensor_slot_for_slot_and_decodes_the_same():
    n = 0
    for P, R, calls in _cases():
        ref = _tensor_reference(P, R)
        values = encode_metadata_values(P, R)
        assert values == ref.tolist() == encode_metadata(P, R).tolist()
        for C in calls:
            if len(values) >= C.num_vectors * C.b4:
                assert decode_values_for_schedule(values, C) == decode_for_schedule(ref, C)
                n += 1
    assert n > 50


def test_a_value_past_int32_wraps_as_the_int32_slot_does_and_the_control_without_the_wrap_differs():
    P, R, _ = next(_cases())
    big = dataclasses.replace(R, num_m_blocks=[2 ** 31 + 5] + list(R.num_m_blocks[1:]))
    assert encode_metadata_values(P, big) == _tensor_reference(P, big).tolist()
    # negative control: slots that keep the value unwrapped are another tensor, and the comparison sees it
    assert encode_metadata_values(P, big) != _tensor_reference(P, big, wrap=False).tolist()


@pytest.mark.parametrize("module, loads_torch", [("spec.invariants", False), ("refmodel.metadata_layout", False),
                                                 ("refmodel.kv_blocks", False),
                                                 ("refmodel.metadata", True)])  # the last: the control
def test_the_invariants_read_metadata_without_loading_torch(module, loads_torch):
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == str(loads_torch)
