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
    assert found["triton_calls"] == found["cudnn_calls"] == 0
    assert found["top"] == [("input_transpose_fusion", "transposes", 4096),
                            ("custom-call", "matmul", 3584)]


def test_a_module_without_an_entry_computation_is_refused():
    with pytest.raises(ValueError, match="no ENTRY"):
        compile_for_gpu.entry_instructions("HloModule empty\n")


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
