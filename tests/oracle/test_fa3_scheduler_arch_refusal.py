"""Class 4: architectures other than sm90 are refused, never answered with sm90's numbers.

FA3 (hopper/ at 0251105a) has other rules on sm8x that the model does not implement: its tiles come from
tile_size_fwd_sm8x (tile_size.h:116-137, used by flash_api.cpp:453-455 and 654-656), the call's semaphore rule
differs (flash_api.cpp:990-992), PackGQA is forced (flash_api.cpp:429) and fp8 is refused (717-720). The sm90
kernel does not run elsewhere (static_switch.h:138-150 maps every arch >= 90 to the sm90 instance).
"""

import pytest
import torch

from gpu_impl.kernels import load
from refmodel import call_inputs, get_scheduler_metadata, precompute_inputs, resolve_schedule
from refmodel.errors import OutsideModel
from refmodel.validation import MODELLED_ARCH


@pytest.mark.parametrize("arch", [80, 86, 89, 100, 120])
def test_other_architectures_are_refused_on_both_sides(arch):
    for inputs in (precompute_inputs(4, 1, 4096, 32, 8, 128, arch=arch), call_inputs(4, 1, 4096, 32, 8, 128, arch=arch)):
        with pytest.raises(OutsideModel, match="arch") as err:
            resolve_schedule(inputs)
        assert err.value.field == "arch" and "sm8x" in str(err.value)
    with pytest.raises(OutsideModel):
        get_scheduler_metadata(4, 1, 4096, 32, 8, 128, torch.full((4,), 100, dtype=torch.int32), arch=arch)


def test_the_emulated_kernel_on_another_architecture_refuses_the_precompute_and_the_call():
    kernel = load("emulated", arch=86)
    with pytest.raises(OutsideModel):
        kernel.get_scheduler_metadata(1, 1, 64, 8, 1, 64, torch.tensor([10], dtype=torch.int32))
    q, kv = torch.zeros(1, 1, 8, 64), torch.zeros(1, 64, 1, 64)
    with pytest.raises(OutsideModel):
        kernel.flash_attn_with_kvcache(q, kv, kv, cache_seqlens=torch.tensor([10], dtype=torch.int32))


def test_sm90_is_the_one_modelled_architecture():
    # negative control: arch 90 resolves
    assert MODELLED_ARCH == 90
    assert resolve_schedule(call_inputs(4, 1, 4096, 32, 8, 128, arch=90)).needs_semaphore
