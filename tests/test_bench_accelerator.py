"""bench/bench_accelerator.py on a CPU at its tiny size: every side runs and is reported."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, without_tensorflow_env

sys.path.insert(0, os.path.join(REPO, "bench"))
SESSION = os.path.join(REPO, "bench", "accelerator_session.sh")

import bench_accelerator  # noqa: E402


def test_flop_count_is_the_issues():
    # Issue 41: BERT-base S128 at 5,000 examples/s is "about 35%" of an H100's 989 TFLOP/s
    # bf16 dense peak, i.e. about 69 GFLOP per example (training = 3 x forward).
    per_example = bench_accelerator.flops_per_sequence(bench_accelerator.SIZES["base"])
    assert 5000 * per_example / 989e12 == pytest.approx(0.35, abs=0.01)
    # Large: twice the layers at (1024/768)^2 = 1.78x the width's matrix work, 3.56x the
    # encoder's FLOPs; the MLM head (1.33x) and the attention scores (2.7x) bring it lower.
    ratio = (bench_accelerator.flops_per_sequence(bench_accelerator.SIZES["large"])
             / per_example)
    assert 3.3 < ratio < 3.56
    # base512, by hand: 3 x [12 x (8SH^2 + 4SHI + 4S^2H) + 2PH^2 + 2PHV + 2H^2 + 4H] at
    # S = 512, P = 80 (the attention scores' 4S^2H term grows fourfold per token).
    s, h, i, p, v = 512, 768, 3072, 80, 30522
    by_hand = 3 * (12 * (8 * s * h * h + 4 * s * h * i + 4 * s * s * h)
                   + 2 * p * h * h + 2 * p * h * v + 2 * h * h + 4 * h)
    assert bench_accelerator.flops_per_sequence(bench_accelerator.SIZES["base512"]) == by_hand


def test_unknown_sides_and_options_are_one_line_errors():
    with pytest.raises(SystemExit, match="unknown side 'mxnet'"):
        bench_accelerator.parse_side("mxnet")
    with pytest.raises(SystemExit, match="options \\['heads'\\] not understood"):
        bench_accelerator.parse_side("ours@heads=3")
    assert bench_accelerator.parse_side("ours@attention_dropout=0,disable=a+b") == (
        "ours", {"attention_dropout": "0", "disable": "a+b"})
    assert bench_accelerator.parse_side("ours@enable=gelu_16_bits", "inference") == (
        "ours", {"enable": "gelu_16_bits"})
    assert bench_accelerator.parse_side("ours@real_tokens=1024;enable=gelu_16_bits",
                                        "inference") == (
        "ours", {"real_tokens": "1024", "enable": "gelu_16_bits"})
    for mode in ("pretraining", "finetune"):
        with pytest.raises(SystemExit, match="options \\['real_tokens'\\] not understood"):
            bench_accelerator.parse_side("ours@real_tokens=1024", mode)
    for bad in ("0", "-8", "many"):
        with pytest.raises(SystemExit, match=f"real_tokens must be a positive integer "
                                             f"\\(the row multiple\\), got '{bad}'"):
            bench_accelerator.parse_side(f"ours@real_tokens={bad}", "inference")


def test_kernel_switches_become_the_environment_and_refuse_unknown_names(monkeypatch):
    from bert_keras import kernels

    # Set (empty) through monkeypatch, so the values the function writes are undone after.
    monkeypatch.setenv(kernels.DISABLE_ENV, "")
    monkeypatch.setenv(kernels.ENABLE_ENV, "")
    bench_accelerator.set_kernel_switches({"disable": "cudnn_attention+flash_attention",
                                           "enable": "gelu_16_bits+position_one_hot"})
    assert kernels.disabled_kernels() == {"cudnn_attention", "flash_attention"}
    assert kernels.enabled_kernels() == {"gelu_16_bits", "position_one_hot"}
    with pytest.raises(ValueError, match="BERT_KERAS_ENABLE_KERNELS"):
        bench_accelerator.set_kernel_switches({"enable": "argmax"})


def test_step_time_never_reports_a_negative_rate():
    # Differential: (2n-step call - n-step call) / n per round, median over rounds.
    assert bench_accelerator.step_time([0.010, 0.012, 0.011], [0.02, 0.03, 0.02], True) == (
        0.011, "differential")
    # A fixed cost that varied more than the steps cost: the per-call figure, said so.
    assert bench_accelerator.step_time([-0.004, 0.001, -0.002], [0.02, 0.03, 0.025], True) == (
        0.025, "per_call (differential not above noise)")
    assert bench_accelerator.step_time([0.02, 0.03], [0.02, 0.03], False) == (0.025,
                                                                               "per_call")


# Every side (torch.compile included) at tiny size on the CPU: 2-3 min. Not in CI (time):
# test_accelerator_tasks' every-side run is; make test-all runs it, and it is the dry run
# before a device call (`SIZE=tiny LARGE=tiny bash bench/accelerator_session.sh`).
@pytest.mark.integration
@pytest.mark.slow
def test_tiny_run_reports_every_side(tmp_path):
    out = tmp_path / "out"
    command = [sys.executable, os.path.join(REPO, "bench", "bench_accelerator.py"),
               "--sizes=tiny", "--sides=ours,keras_hub,torch,ours@attention_dropout=0",
               "--steps=2", "--rounds=2", "--warmup_steps=1", f"--out={out}"]
    # As on the GPU machine, which has no TensorFlow.
    done = subprocess.run(command, capture_output=True, text=True, timeout=900,
                          env=without_tensorflow_env("jax", tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    rows = {r["side"]: r for r in results["results"]}
    assert set(rows) == {"ours", "keras_hub", "torch", "ours@attention_dropout=0"}
    for side, row in rows.items():
        assert "error" not in row, (side, row)
        assert row["examples_per_second"] > 0 and len(row["step_seconds_per_round"]) == 2
        assert row["step_timing"] in (
            {"differential", "per_call (differential not above noise)"}
            if side.startswith(("ours", "keras_hub")) else {"per_call"}), (side, row)
        # examples/s and model FLOP/s are the same measurement in two units.
        assert row["model_tflops"] == pytest.approx(
            row["examples_per_second"] * row["flops_per_example"] / 1e12)
        assert row["utilisation"] == pytest.approx(row["model_tflops"] / results["peak_tflops"])
    assert rows["ours"]["backend"] == "jax" and rows["torch"]["backend"].startswith("torch")
    # On a CPU the compiled step holds no fused-attention call, and nothing fell back.
    for side in ("ours", "keras_hub", "ours@attention_dropout=0"):
        found = rows[side]["fused_attention"]
        assert found["fused"] is False and found["fallback_logs"] == 0, (side, found)
    assert "fused_attention" not in rows["torch"]
    table = (out / "results.md").read_text()
    assert "| tiny | keras_hub |" in table and "# tiny: ours = " in table


def test_fused_attention_is_read_from_the_compiled_train_step(tmp_path):
    """What `fused_attention_in_dump` counts in an XLA dump: lines of the optimized train
    step (hand-written in the format XLA dumps), not the unoptimized module or others."""
    def module(name, lines):
        (tmp_path / name).write_text("HloModule jit_train_step\n" + "\n".join(lines) + "\n")

    cudnn = ('  %custom-call.4 = (bf16[8,128,12,64]{3,2,1,0}, f32[8,12,128]{2,1,0}) '
             'custom-call(%a, %b, %c), custom_call_target="__cudnn$fmhaSoftmax"')
    pallas = ('  %custom-call.9 = bf16[8,128,12,64]{3,2,1,0} custom-call(%s, %q), '
              'custom_call_target="__gpu$xla.gpu.triton", backend_config={"name":'
              '"bert_flash_attention_forward","ir":"..."}')
    other_triton = pallas.replace("bert_flash_attention_forward", "layer_norm")
    module("module_0012.jit_train_step.sm_9.0_gpu_after_optimizations.txt",
           [cudnn, cudnn, pallas, other_triton])
    module("module_0012.jit_train_step.before_optimizations.txt", [cudnn] * 5)
    module("module_0013.jit_train_step.sm_9.0_gpu_after_optimizations.txt", [pallas])
    found = bench_accelerator.fused_attention_in_dump(str(tmp_path))
    assert found["module"].startswith("module_0012")  # the largest optimized step
    assert found["cudnn_fused_attention_calls"] == 2 and found["pallas_attention_calls"] == 1
    assert found["custom_call_targets"] == ["__cudnn$fmhaSoftmax", "__gpu$xla.gpu.triton"]
    assert found["fused"]
    assert "cuDNN x2, Pallas x1" == bench_accelerator.describe_fused(found)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "no optimized train_step module" in bench_accelerator.fused_attention_in_dump(
        str(empty))["error"]


def test_the_step_time_leaves_out_a_calls_fixed_cost():
    # A fake side: each call costs 40 ms once plus 10 ms a step (a Keras fit call's shape).
    calls = []

    def run(steps):
        calls.append(steps)
        return 0.040 + 0.010 * steps

    step, per_call = bench_accelerator.time_rounds(run, 5, 3, differential=True)
    assert calls == [5, 10] * 3
    assert step == pytest.approx([0.010] * 3)
    assert per_call == pytest.approx([0.014] * 3)  # (40 + 100) ms / 10 steps
    step, _ = bench_accelerator.time_rounds(run, 5, 2, differential=False)
    assert step == pytest.approx([0.014] * 2)


@pytest.mark.parametrize("argv, expected", [
    (["3", "60"], "unknown PART '3'; expected 1, 2 or attention"),
    (["1", "8m"], "DEADLINE_S must be a positive number of seconds, got '8m'"),
    (["2", "0"], "DEADLINE_S must be a positive number of seconds, got '0'"),
])
def test_session_script_refuses_a_bad_part_or_deadline_in_one_line(tmp_path, argv, expected):
    # Before, an unknown part ran nothing and still printed "# part 3 done": a device call
    # spent on no measurement.
    done = subprocess.run(["bash", SESSION, *argv], capture_output=True, text=True,
                          cwd=REPO, env=dict(os.environ, OUT=str(tmp_path / "out")),
                          timeout=60)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: bench/accelerator_session.sh: {expected}"
    assert not (tmp_path / "out").exists()


# The session script's attention part at tiny size, where Keras is installed and TensorFlow
# cannot be imported (as on the GPU machine): about 45 s on 2 cores. Its check for Keras
# once ran before KERAS_BACKEND=jax was set, so Keras' default TensorFlow backend failed
# to import and the script tried to install the Python 3.12 wheels of .whl/ here.
@pytest.mark.integration
def test_session_script_runs_where_keras_is_installed_and_tensorflow_is_not(tmp_path):
    # The script runs `python3`: this interpreter (a link would lose its virtualenv).
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    (bin_dir / "python3").chmod(0o755)
    env = without_tensorflow_env("jax", tmp_path, SIZE="tiny", LARGE="tiny",
                                 OUT=str(tmp_path / "out"))
    env["PATH"] = os.pathsep.join([str(bin_dir), env["PATH"]])
    env.pop("KERAS_BACKEND")  # the script sets it, as the GPU machine's shell does not
    done = subprocess.run(["bash", SESSION, "attention", "240"], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "# part attention done" in done.stdout
    assert "pip" not in done.stderr
    rows = json.loads((tmp_path / "out" / "attention_tiny.json").read_text())["rows"]
    paths = {(r["path"], r["rate"]) for r in rows}
    # On a CPU: the explicit softmax, XLA's fused attention and the interpreted Pallas
    # kernel with its tile variants at both rates (cuDNN needs a GPU).
    assert {("explicit", 0.0), ("xla_fused", 0.0), ("flash", 0.0), ("flash", 0.1)} <= paths
    for r in rows:
        assert "error" not in r, r
        # bfloat16 operands against the float32 reference: METHOD's 1e-3 to 1e-2.
        assert r["max_relative_error"] is None or r["max_relative_error"] < 1e-2, r
