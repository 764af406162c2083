"""The NVTX range a row's checked call runs in: what `ncu --nvtx-include` (tools/bench/ncu_rows.sh) matches."""

from attnbench.run.runner import nvtx_range


def test_a_knob_backend_gets_a_range_ncu_can_match_literally():
    assert nvtx_range("triton") == "attnbench:triton"
    assert nvtx_range("flashinfer-fa3") == "attnbench:flashinfer-fa3"
    name = nvtx_range("triton[gdn_stream=128,gdn_stream_bv=32]")
    assert name == "attnbench:triton_gdn_stream_128_gdn_stream_bv_32_"
    assert nvtx_range("cute-decode:vpl1-u4") == "attnbench:cute-decode_vpl1-u4"  # `:` only after the prefix
