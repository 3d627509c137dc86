"""``sut=MODULE:CLASS[@ARG]``: a system under test the user names (``gpu_impl.sut.open_named_sut``)."""
