"""bench/compile_for_gpu.py: what it reads from a compiled module, checked on a module
written by hand with its bytes counted by hand, and its one-line errors.

Compiling for a GPU needs JAX's CUDA plugin, which the test environment does not install
(about 5 GB); BUILD_NOTES.md 8.10 has the tool's runs at BERT-base and the command."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "bench"))
import compile_for_gpu  # noqa: E402

# A step of XLA:GPU's shape: an elementwise fusion, a cuBLAS call through a bitcast, a convert
# into a batch-minor layout and a transposing fusion. Batch 4, sequence 8, hidden 16.
MODULE = """HloModule jit_step, entry_computation_layout={(bf16[4,8,16]{2,1,0}, bf16[16,16]{1,0})->(f32[8,16,4]{2,1,0}, bf16[32,16]{1,0})}

%fused_add (p0: bf16[4,8,16], p1: bf16[4,8,16]) -> bf16[4,8,16] {
  %p0 = bf16[4,8,16]{2,1,0} parameter(0)
  %p1 = bf16[4,8,16]{2,1,0} parameter(1)
  ROOT %add.1 = bf16[4,8,16]{2,1,0} add(%p0, %p1)
}

%fused_transpose (p0.1: f32[4,8,16]) -> f32[8,16,4] {
  %p0.1 = f32[4,8,16]{0,2,1} parameter(0)
  ROOT %transpose.1 = f32[8,16,4]{2,1,0} transpose(%p0.1), dimensions={1,2,0}
}

ENTRY %main (x: bf16[4,8,16], w: bf16[16,16]) -> (f32[8,16,4], bf16[32,16]) {
  %x = bf16[4,8,16]{2,1,0} parameter(0)
  %w = bf16[16,16]{1,0} parameter(1)
  %loop_add_fusion = bf16[4,8,16]{2,1,0} fusion(%x, %x), kind=kLoop, calls=%fused_add
  %bitcast.1 = bf16[32,16]{1,0} bitcast(%loop_add_fusion)
  %custom-call.1 = (bf16[32,16]{1,0}, s8[1024]{0}) custom-call(%bitcast.1, %w), custom_call_target="__cublas$lt$matmul", backend_config={"alpha_real":1}
  %get-tuple-element.1 = bf16[32,16]{1,0} get-tuple-element(%custom-call.1), index=0
  %convert.2 = f32[4,8,16]{0,2,1} convert(%loop_add_fusion)
  %input_transpose_fusion = f32[8,16,4]{2,1,0} fusion(%convert.2), kind=kInput, calls=%fused_transpose
  ROOT %tuple = (f32[8,16,4]{2,1,0}, bf16[32,16]{1,0}) tuple(%input_transpose_fusion, %get-tuple-element.1)
}
"""


def test_array_bytes_of_arrays_tuples_and_scalars():
    assert compile_for_gpu.array_bytes("bf16[4,8,16]{2,1,0}") == 1024
    assert compile_for_gpu.array_bytes("(bf16[32,16]{1,0}, s8[1024]{0})") == 1024 + 1024
    assert compile_for_gpu.array_bytes("f32[]") == 4
    assert compile_for_gpu.array_bytes("(s32[4]{0}, pred[3])") == 16 + 3


def test_summary_of_a_module_counted_by_hand():
    found = compile_for_gpu.summarize(MODULE, batch=4, other_sizes={8}, top=2)
    # Launches: the add fusion, the cuBLAS call, the convert, the transposing fusion (the
    # parameters, bitcast, get-tuple-element and tuple launch nothing).
    assert found["kernels"] == 4
    # Each kernel's result plus its operands, once each:
    #   loop_add_fusion   1024 out + 1024 + 1024 in                 = 3072   other
    #   custom-call.1     1024 + 1024 out + 1024 (bitcast) + 512 (w) = 3584   matmul
    #   convert.2         2048 out + 1024 in                        = 3072   other
    #   input_transpose   2048 out + 2048 in                        = 4096   transposes
    assert found["bytes_moved"] == {"matmul": 3584, "attention": 0, "transposes": 4096,
                                    "reductions": 0, "other": 6144}
    assert found["bytes_non_matmul"] == 10240
    # Batch-minor: the convert's {0,2,1} layout, the transposing fusion's [8,16,4] result
    # and the transpose inside it. Not the views of them (the fused parameter p0.1, the
    # tuple), the weight [16,16] (rank 2) nor a [4,8,16]{2,1,0} tensor (minor dimension 16).
    assert found["batch_minor_tensors"] == 3
    assert found["triton_calls"] == found["cudnn_calls"] == found["conditionals"] == 0
    assert found["top"] == [("input_transpose_fusion", "transposes", 4096),
                            ("custom-call", "matmul", 3584)]


# Attention behind a runtime branch, as Keras/JAX compile it: a predicate kernel, then a
# conditional whose branches each launch their own kernels. Batch 2, sequence 4, width 8.
CONDITIONAL = """HloModule jit_forward

%fused_scale (p0.2: bf16[2,4,8]) -> bf16[2,4,8] {
  %p0.2 = bf16[2,4,8]{2,1,0} parameter(0)
  ROOT %multiply.1 = bf16[2,4,8]{2,1,0} multiply(%p0.2, %p0.2)
}

%fused_any (p0.3: s32[2,4]) -> pred[] {
  %p0.3 = s32[2,4]{1,0} parameter(0)
  ROOT %compare.1 = pred[] compare(%p0.3, %p0.3), direction=EQ
}

%region_lengths (arg_tuple.1: (s32[2,4], bf16[2,4,8])) -> (bf16[2,4,8]) {
  %arg_tuple.1 = (s32[2,4]{1,0}, bf16[2,4,8]{2,1,0}) parameter(0)
  %get-tuple-element.1 = bf16[2,4,8]{2,1,0} get-tuple-element(%arg_tuple.1), index=1
  %fmha.1 = (bf16[2,4,8]{2,1,0}, u8[0]{0}) custom-call(%get-tuple-element.1), custom_call_target="__cudnn$fmhaSoftmax"
  %get-tuple-element.2 = bf16[2,4,8]{2,1,0} get-tuple-element(%fmha.1), index=0
  ROOT %tuple.1 = (bf16[2,4,8]{2,1,0}) tuple(%get-tuple-element.2)
}

%region_mask (arg_tuple.2: (s32[2,4], bf16[2,4,8])) -> (bf16[2,4,8]) {
  %arg_tuple.2 = (s32[2,4]{1,0}, bf16[2,4,8]{2,1,0}) parameter(0)
  %get-tuple-element.3 = s32[2,4]{1,0} get-tuple-element(%arg_tuple.2), index=0
  %get-tuple-element.4 = bf16[2,4,8]{2,1,0} get-tuple-element(%arg_tuple.2), index=1
  %convert.3 = f32[2,4,4]{2,1,0} convert(%get-tuple-element.3)
  %fmha.2 = (bf16[2,4,8]{2,1,0}, u8[0]{0}) custom-call(%get-tuple-element.4, %convert.3), custom_call_target="__cudnn$fmhaScaleBiasSoftmax"
  %get-tuple-element.5 = bf16[2,4,8]{2,1,0} get-tuple-element(%fmha.2), index=0
  ROOT %tuple.2 = (bf16[2,4,8]{2,1,0}) tuple(%get-tuple-element.5)
}

ENTRY %main (mask: s32[2,4], x: bf16[2,4,8]) -> (bf16[2,4,8]) {
  %mask = s32[2,4]{1,0} parameter(0)
  %x = bf16[2,4,8]{2,1,0} parameter(1)
  %loop_scale_fusion = bf16[2,4,8]{2,1,0} fusion(%x), kind=kLoop, calls=%fused_scale
  %input_any_fusion = pred[] fusion(%mask), kind=kInput, calls=%fused_any
  %cond.1 = (s32[2,4]{1,0}, bf16[2,4,8]{2,1,0}) tuple(%mask, %loop_scale_fusion)
  ROOT %cond.2 = (bf16[2,4,8]{2,1,0}) conditional(%input_any_fusion, %cond.1, %cond.1), true_computation=%region_lengths, false_computation=%region_mask
}
"""


def test_a_conditional_counts_as_its_costliest_branch():
    found = compile_for_gpu.summarize(CONDITIONAL, batch=2, other_sizes={4})
    # Launched: the scale fusion (128 out + 128 in), the predicate (1 out + 32 in), then one
    # branch, not the conditional (whose operands are views handed to the branch):
    #   region_lengths: fmha.1 128 + 0 out + 128 in                       = 256
    #   region_mask:    convert.3 128 out + 32 in; fmha.2 128 out + 128 + 128 in = 544
    # so the mask branch, the costlier, with its 2 kernels and its one cuDNN call.
    assert found["kernels"] == 4
    assert found["cudnn_calls"] == found["conditionals"] == 1
    assert found["bytes_non_matmul"] == 256 + 33 + 544
    called = compile_for_gpu.called_computations  # profile_breakdown's, shared
    assert called("x), true_computation=%region_lengths, false_computation=%region_mask",
                  "conditional") == ["region_lengths", "region_mask"]
    assert called("i), branch_computations={%b0, %b1, %b2}", "conditional") == [
        "b0", "b1", "b2"]


def test_a_tuple_of_six_or_more_with_index_comments_is_read():
    """XLA writes "/*index=5*/" into every tuple shape of six or more: such an instruction
    (a multi-output fusion, a conditional returning attention's residuals) is still a
    kernel with its bytes."""
    line = ("  %fusion.7 = (bf16[2]{0}, bf16[2]{0}, bf16[2]{0}, bf16[2]{0}, bf16[2]{0}, "
            "/*index=5*/f32[4]{0}) fusion(%x, %y), kind=kLoop, calls=%fused_seven")
    name, shape, opcode, rest = compile_for_gpu.parse_instruction(line)
    assert (name, opcode) == ("fusion.7", "fusion") and rest.startswith("%x, %y)")
    assert compile_for_gpu.array_bytes(shape) == 5 * 4 + 16
    module = ("HloModule m\n\nENTRY %main (x: f32[4], y: f32[4]) -> f32[4] {\n"
              "  %x = f32[4]{0} parameter(0)\n  %y = f32[4]{0} parameter(1)\n"
              + line + "\n  ROOT %g = f32[4]{0} get-tuple-element(%fusion.7), index=5\n}\n")
    found = compile_for_gpu.summarize(module, batch=2, other_sizes=set())
    assert found["kernels"] == 1 and found["bytes_non_matmul"] == 36 + 16 + 16
    assert compile_for_gpu.parse_instruction("  ROOT %t = (f32[], (s32[], f32[])) tuple(%a, "
                                             "%b)")[1:3] == ("(f32[], (s32[], f32[]))", "tuple")


def test_a_module_without_an_entry_computation_is_refused():
    with pytest.raises(ValueError, match="no ENTRY"):
        compile_for_gpu.entry_instructions("HloModule empty\n")
    with pytest.raises(ValueError, match="no computation 'region_9'"):
        compile_for_gpu.kernels_run(CONDITIONAL, "region_9")


@pytest.mark.parametrize("argv,expected", [
    (["--size=huge"], "error: --size: 'huge' is not a pretraining size"),
    (["--sides=torch"], "error: --sides: 'torch': only the Keras sides"),
    (["--sides=ours@real_tokens=64"], "not understood"),
])
def test_bad_flags_get_one_line(argv, expected, capsys):
    with pytest.raises(SystemExit) as raised:
        compile_for_gpu.main(argv)
    assert raised.value.code not in (0, None)
    err = capsys.readouterr().err.strip() or str(raised.value.code)
    assert expected in err and len(err.splitlines()) == 1


def test_without_the_cuda_plugin_it_says_so_in_one_line(monkeypatch, capsys):
    # An entry of None in sys.modules makes the import fail, as an absent package does.
    monkeypatch.setitem(sys.modules, "jax_plugins.xla_cuda12", None)
    monkeypatch.setitem(sys.modules, "jax_plugins.xla_cuda13", None)
    with pytest.raises(SystemExit) as raised:
        compile_for_gpu.main(["--size=tiny", "--sides=ours"])
    assert raised.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: JAX's CUDA plugin is not installed; pip install")
    assert len(err.splitlines()) == 1
