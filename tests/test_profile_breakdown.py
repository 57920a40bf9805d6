"""bench/profile_breakdown.py: kernel time by category from a JAX trace, without TensorFlow."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import REPO, without_tensorflow_env

sys.path.insert(0, os.path.join(REPO, "bench"))

import profile_breakdown  # noqa: E402

# Real kernel and instruction names (the H200 profile, cuBLAS, cuDNN, XLA:CPU).
NAMES = {
    "input_compare_transpose_fusion": "transposes",
    "loop_transpose_fusion_3": "transposes",
    "copy.12": "transposes",
    "wrapped_copy": "transposes",
    "loop_convert_multiply_fusion": "other",
    "loop_select_fusion.2": "other",
    "MemcpyD2D": "other",
    "Memset": "other",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
    "execute_segment_k_off_kernel__5x_cublas": "matmul",
    "nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN": "matmul",
    "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8": "matmul",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float>": "matmul",
    "gemm_fusion_dot.3": "matmul",
    "dot.7": "matmul",
    "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_"
    "kernel0_0": "attention",
    "bert_flash_attention_forward": "attention",
    "bert_flash_attention_dkdv": "attention",
    "bert_flash_attention_dq": "attention",
    "mha_forward": "attention",
    "input_reduce_fusion": "reductions",
    "loop_reduce_fusion.1": "reductions",
    "triton_softmax_3": "reductions",
    "layer_norm_fusion": "reductions",
}


@pytest.mark.parametrize("name", sorted(NAMES))
def test_names_are_categorized(name):
    assert profile_breakdown.categorize(name) == NAMES[name]


def test_stats_decide_where_the_name_does_not():
    categorize = profile_breakdown.categorize
    assert categorize("fusion_123") == "other"
    assert categorize("fusion_123", {"hlo_op": "gemm_fusion_dot.12"}) == "matmul"
    assert categorize("fusion_123", {"hlo_category": "reduction"}) == "reductions"
    # A Triton kernel launched by a pallas_call keeps the call's name in the JAX op path.
    assert categorize("triton_kernel_0", {"tf_op": "jit(step)/pallas_call[name=mha_fwd]"}) \
        == "attention"
    # The compiled module says what an opaque fusion runs.
    hlo_ops = {"jit_step": {"ynn_fusion.1": "matmul"}, "jit_other": {"ynn_fusion.1": "other"}}
    assert categorize("ynn_fusion.1", {"hlo_op": "ynn_fusion.1", "hlo_module": "jit_step"},
                      hlo_ops) == "matmul"
    assert categorize("ynn_fusion.1", {"hlo_op": "ynn_fusion.1", "hlo_module": "jit_other"},
                      hlo_ops) == "other"


HLO = """\
HloModule jit_step, is_scheduled=true, entry_computation_layout={(bf16[4,8]{1,0})->bf16[4,8]{1,0}}

%add_f32 (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%fused_reduce (p: f32[4,8]) -> f32[4] {
  %p = f32[4,8]{1,0} parameter(0)
  %zero = f32[] constant(0)
  ROOT %r = f32[4]{0} reduce(%p, %zero), dimensions={1}, to_apply=%add_f32
}

%fused_transpose_reduce (p.1: f32[4,8]) -> (f32[8,4], f32[4]) {
  %p.1 = f32[4,8]{1,0} parameter(0)
  %t = f32[8,4]{1,0} transpose(%p.1), dimensions={1,0}
  %zero.1 = f32[] constant(0)
  %r.1 = f32[4]{0} reduce(%p.1, %zero.1), dimensions={1}, to_apply=%add_f32
  ROOT %tuple.1 = (f32[8,4]{1,0}, f32[4]{0}) tuple(%t, %r.1)
}

%fused_gemm (p.2: bf16[4,8], p.3: bf16[8,8]) -> bf16[4,8] {
  %p.2 = bf16[4,8]{1,0} parameter(0)
  %p.3 = bf16[8,8]{1,0} parameter(1)
  %d = bf16[4,8]{1,0} dot(%p.2, %p.3), lhs_contracting_dims={1}, rhs_contracting_dims={0}
  ROOT %n = bf16[4,8]{1,0} negate(%d)
}

%body (s: (s32[], f32[4,8])) -> (s32[], f32[4,8]) {
  %s = (s32[], f32[4,8]{1,0}) parameter(0)
  %x = f32[4,8]{1,0} get-tuple-element(%s), index=1
  %i = s32[] get-tuple-element(%s), index=0
  %inner = f32[4] fusion(%x), kind=kInput, calls=%fused_reduce
  ROOT %next = (s32[], f32[4,8]{1,0}) tuple(%i, %x)
}

%cond (s.1: (s32[], f32[4,8])) -> pred[] {
  %s.1 = (s32[], f32[4,8]{1,0}) parameter(0)
  ROOT %c = pred[] constant(false)
}

ENTRY %main (x.1: bf16[4,8], /*index=1*/y.1: f32[]) -> bf16[4,8] {
  %x.1 = bf16[4,8]{1,0} parameter(0)
  %w = bf16[8,8]{1,0} constant({...})
  %gemm_fusion = bf16[4,8]{1,0} fusion(%x.1, %w), kind=kCustom, calls=%fused_gemm
  %cublas = (bf16[4,8]{1,0}, s8[1024]{0}) custom-call(%x.1, %w), custom_call_target="__cublas$gemm"
  %fmha = (bf16[4,8]{1,0}, u8[0]{0}) custom-call(%x.1, %x.1, %x.1), custom_call_target="__cudnn$fmhaSoftmax"
  %pallas = bf16[4,8]{1,0} custom-call(%x.1), custom_call_target="__gpu$xla.gpu.triton", backend_config={"name":"bert_flash_attention_forward"}
  %f = f32[4,8]{1,0} convert(%x.1)
  %input_fusion = f32[4] fusion(%f), kind=kInput, calls=%fused_reduce
  %both = (f32[8,4]{1,0}, f32[4]{0}) fusion(%f), kind=kInput, calls=%fused_transpose_reduce
  %init = (s32[], f32[4,8]{1,0}) tuple(%c0, %f)
  %loop = (s32[], f32[4,8]{1,0}) while(%init), condition=%cond, body=%body
  %branch = (s32[], f32[4,8]{1,0}) conditional(%c, %init, %init), true_computation=%cond, false_computation=%body
  ROOT %out = bf16[4,8]{1,0} add(%gemm_fusion, %x.1)
}
"""


def test_hlo_instructions_are_categorized_by_what_they_run():
    table = profile_breakdown.hlo_op_categories(HLO)["jit_step"]
    assert table["gemm_fusion"] == "matmul"            # a dot inside, with an epilogue
    assert table["cublas"] == "matmul"
    assert table["fmha"] == "attention"
    assert table["pallas"] == "attention"              # the pallas_call's kernel name
    assert table["input_fusion"] == "reductions"       # not "other" from the reducer's add
    assert table["both"] == "transposes"               # a transpose beside a reduce
    assert table["loop"] == "reductions"               # its body's fusion
    assert table["branch"] == "reductions"             # a branch's fusion
    assert table["f"] == "other" and table["out"] == "other"


def _gpu_trace_text():
    """An XSpace as CUPTI writes a GPU's: a stream line of kernels, with the lines an XProf
    post-processing derives ("XLA Ops") and CUPTI's overhead, which must not be counted."""
    kernels = [  # (kernel name, hlo_op, start us, duration us)
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN", "custom-call.1", 0, 500),
        ("input_compare_transpose_fusion", "input_compare_transpose_fusion", 500, 300),
        ("loop_convert_multiply_fusion", "loop_convert_multiply_fusion", 800, 100),
        ("fusion_7", "fusion.7", 900, 50),
        ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x64x64_4x1x1_"
         "kernel0_0", "custom-call.2", 1000, 200),
        ("input_reduce_fusion", "input_reduce_fusion", 1200, 100),
        ("MemcpyD2D", "", 1300, 20),
    ] * 2  # two steps
    kernels = [(n, op, start + 2000 * (i >= 7), d) for i, (n, op, start, d) in
               enumerate(kernels)]
    names = sorted({k[0] for k in kernels} | {"loop_convert_multiply_fusion.derived"})
    ids = {n: i + 1 for i, n in enumerate(names)}
    events = "".join(
        f'events {{ metadata_id: {ids[n]} offset_ps: {start * 1000000} '
        f'duration_ps: {d * 1000000} stats {{ metadata_id: 1000 str_value: "{op}" }} '
        f'stats {{ metadata_id: 1001 str_value: "jit_train_step" }} }}\n'
        for n, op, start, d in kernels)
    metadata = "".join(f'event_metadata {{ key: {i} value {{ id: {i} name: "{n}" }} }}\n'
                       for n, i in ids.items())
    derived = (f'events {{ metadata_id: {ids["loop_convert_multiply_fusion.derived"]} '
               f'offset_ps: 0 duration_ps: 4000000000 }}')
    return f"""
planes {{ id: 1 name: "/host:CPU" }}
planes {{
  id: 2 name: "/device:GPU:0"
  lines {{ id: 7 display_id: 7 name: "Stream #7(Kernel,MemcpyD2D)" timestamp_ns: 1000
{events}  }}
  lines {{ id: 100 name: "XLA Ops" timestamp_ns: 1000 {derived} }}
  lines {{ id: 101 name: "CUPTI overhead" timestamp_ns: 1000 {derived} }}
{metadata}
  stat_metadata {{ key: 1000 value {{ id: 1000 name: "hlo_op" }} }}
  stat_metadata {{ key: 1001 value {{ id: 1001 name: "hlo_module" }} }}
}}
"""


def test_gpu_trace_sums_the_stream_kernels_per_step(tmp_path):
    import jax

    path = tmp_path / "gpu.xplane.pb"
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(
        _gpu_trace_text()))
    found = profile_breakdown.kernel_time_by_category(str(path), steps=2, hlo_text=None)
    assert found["plane"] == "/device:GPU:0" and found["source"] == "device kernels"
    assert found["lines"] == ["Stream #7(Kernel,MemcpyD2D)"]
    assert found["events"] == 14
    # Microseconds per step (two steps of the same kernels): by hand from the table above.
    assert found["ms_per_step"] == pytest.approx(
        dict(matmul=0.5, attention=0.2, transposes=0.3, reductions=0.1,
             other=0.1 + 0.05 + 0.02))
    assert found["total_ms_per_step"] == pytest.approx(1.27)
    assert found["busy_ms_per_step"] == pytest.approx(1.27)  # one stream: no overlap
    assert found["modules"] == {"jit_train_step": pytest.approx(1.27)}
    top = found["top_kernels"]
    assert top[0]["name"].startswith("nvjet") and top[0]["count"] == 2
    assert top[0]["ms_per_step"] == pytest.approx(0.5) and top[0]["category"] == "matmul"
    assert [k["ms_per_step"] for k in top] == sorted((k["ms_per_step"] for k in top),
                                                     reverse=True)
    line = profile_breakdown.format_breakdown(found)
    assert line.startswith("kernel 1.3 ms/step: matmul 0.5 (39%), attention 0.2 (16%), "
                           "transposes 0.3 (24%), reductions 0.1 (8%), other 0.2 (13%)")
    assert line.endswith("[/device:GPU:0]")
    # Given the compiled module, the opaque "fusion_7" is categorized by what it runs.
    module = ("HloModule jit_train_step\n\n%moved (p: f32[4,8]) -> f32[8,4] {\n"
              "  %p = f32[4,8]{1,0} parameter(0)\n"
              "  ROOT %t = f32[8,4]{1,0} transpose(%p), dimensions={1,0}\n}\n\n"
              "ENTRY %main (x: f32[4,8]) -> f32[8,4] {\n  %x = f32[4,8]{1,0} parameter(0)\n"
              "  ROOT %fusion.7 = f32[8,4]{1,0} fusion(%x), kind=kLoop, calls=%moved\n}\n")
    with_hlo = profile_breakdown.kernel_time_by_category(str(path), 2, hlo_text=[module, HLO])
    assert with_hlo["ms_per_step"] == pytest.approx(
        dict(found["ms_per_step"], transposes=0.35, other=0.12))


def test_a_trace_without_ops_is_one_clear_error(tmp_path):
    import jax

    path = tmp_path / "empty.xplane.pb"
    path.write_bytes(jax.profiler.ProfileData.text_proto_to_serialized_xspace(
        'planes { id: 1 name: "/host:CPU" }'))
    with pytest.raises(ValueError, match="no GPU kernels and no XLA:CPU op events"):
        profile_breakdown.kernel_time_by_category(str(path), steps=2)
    with pytest.raises(ValueError, match="steps must be >= 1"):
        profile_breakdown.kernel_time_by_category(str(path), steps=0)


# Run in a fresh process in which TensorFlow cannot be imported (as on the GPU machine).
CPU_TRACE = textwrap.dedent("""
    import glob, json, sys, time
    import jax, jax.numpy as jnp
    import profile_breakdown

    @jax.jit
    def step(a, b, x):
        product = a @ b                                  # a dot
        moved = jnp.transpose(x, (0, 2, 1, 3))           # [B, S, N, D] -> [B, N, S, D]
        largest = jnp.max(product, axis=1)               # a reduction
        scaled = jnp.tanh(product) * 3.0 + 1.0           # elementwise
        return product, moved, largest, scaled

    a, b = jnp.ones((192, 96)), jnp.ones((96, 320))
    x = jnp.ones((6, 40, 5, 24))
    jax.block_until_ready(step(a, b, x))                 # compiled before the trace
    with jax.profiler.trace(sys.argv[1]):
        start = time.perf_counter()
        for _ in range(2):
            jax.block_until_ready(step(a, b, x))
        wall = time.perf_counter() - start
    path = glob.glob(sys.argv[1] + "/**/*.xplane.pb", recursive=True)[0]
    text = step.lower(a, b, x).compile().as_text()
    found = profile_breakdown.kernel_time_by_category(path, steps=2, hlo_text=text)
    names_only = profile_breakdown.kernel_time_by_category(path, steps=2)
    print("RESULT " + json.dumps(dict(found=found, names_only=names_only, wall=wall,
                                      line=profile_breakdown.format_breakdown(found),
                                      tensorflow="tensorflow" in sys.modules)))
""")


def test_cpu_trace_of_a_jitted_function(tmp_path):
    script = tmp_path / "trace.py"
    script.write_text(CPU_TRACE)
    env = without_tensorflow_env("jax", tmp_path)
    env["PYTHONPATH"] += os.pathsep + os.path.join(REPO, "bench")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "trace")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.split("RESULT ", 1)[1])
    assert not result["tensorflow"]
    found = result["found"]
    assert found["plane"] == "/host:CPU" and found["source"].startswith("host XLA ops")
    per_step = found["ms_per_step"]
    for category in ("matmul", "transposes", "reductions", "other"):
        assert per_step[category] > 0, (category, found)
    assert per_step["attention"] == 0
    # Each op ran twice (two steps), and nothing ran that the function does not hold.
    assert {k["count"] for k in found["top_kernels"]} == {2}
    assert set(found["modules"]) == {"jit_step"}
    # Kernel time is inside the two calls' wall time (the ops ran one after another).
    assert 0 < found["total_ms_per_step"] * 2 <= result["wall"] * 1000
    assert found["busy_ms_per_step"] <= found["total_ms_per_step"] + 1e-9
    # Without the module's text, names still find the transpose (XLA:CPU's copy).
    assert result["names_only"]["ms_per_step"]["transposes"] == per_step["transposes"]
    assert result["names_only"]["total_ms_per_step"] == pytest.approx(
        found["total_ms_per_step"])
    shown = result["line"].split()
    assert shown[0] == "kernel" and shown[2:4] == ["ms/step:", "matmul"]
    assert float(shown[1]) == pytest.approx(found["total_ms_per_step"], abs=0.05)
    assert "[host XLA ops (no GPU plane)]" in result["line"]


def test_read_hlo_dump_reads_the_optimized_modules_only(tmp_path):
    for name, text in (("module_0004.jit_step.cpu_after_optimizations.txt", "optimized"),
                       ("module_0004.jit_step.cpu_after_optimizations-buffer-assignment.txt",
                        "buffers"),
                       ("module_0004.jit_step.before_optimizations.txt", "before"),
                       ("module_0002.jit_add.sm_9.0_gpu_after_optimizations.txt", "gpu")):
        (tmp_path / name).write_text(text)
    assert profile_breakdown.read_hlo_dump(str(tmp_path)) == ["gpu", "optimized"]
