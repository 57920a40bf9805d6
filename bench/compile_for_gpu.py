r"""What XLA makes of a Keras side's step for an NVIDIA H100 or H200, compiled on a CPU.

    pip install "jax[cuda12]==$(python -c 'import jax; print(jax.__version__)')"   # once
    KERAS_BACKEND=jax python bench/compile_for_gpu.py --size=base \
        --sides="ours,ours@enable=position_one_hot+gelu_16_bits" --top=10

No GPU is needed: JAX's CUDA plugin compiles for a described device ("deviceless" ahead-of-
time compilation, `jax.experimental.topologies.get_topology_desc` with XLA's GPU target
config), and the compiled module's text says what the GPU would run. Each side (the sides
and options of bench_accelerator.py: ours, keras_hub, `ours@attention_dropout=0`,
`ours@enable=...`) is compiled in a process of its own, its step being what `model.fit`
jits (Keras' JAX `train_step`, pretraining) or the encoder's jitted forward (inference,
bench/accelerator_tasks.py), with the kernels' platform taken for a GPU
(`kernels.platform`, `flash_attention.on_gpu`), so the Pallas kernels lower to Triton.

Reported per side, from the compiled module (`summarize`):
  kernels       top-level instructions that launch work (fusions, custom calls, copies)
  custom calls  Pallas / Triton calls and cuDNN attention calls
  branches      runtime conditionals in the step (attention's choice between cuDNN with
                key lengths and with the mask, one a layer, where no probability is dropped)
  batch-minor   tensors whose physical minor dimension is the batch (BUILD_NOTES 8.10: the
                [S, H, B] layout XLA chose for the residual stream, and the transposes
                around every matrix product that came with it)
  GB moved      the bytes each kernel reads and writes (its operands and result, each once),
                summed by bench/profile_breakdown.py's categories; "non-matmul" is
                everything but matrix products, the memory-bound part of the step; a
                runtime branch (`conditional`, as our attention takes the cuDNN call
                with key lengths when the mask is right-padded) counts as the kernels
                of its costliest branch, not as a kernel itself

These are properties of the compiled program, not times. XLA does not autotune without a
GPU (its GEMM choices can differ from a real device's); the flag
`--xla_gpu_enable_triton_gemm=false`, set here, makes every GEMM cuBLAS's, as the H200
profiles showed for most of them. The bytes are an upper bound on what a kernel moves
(an operand read twice counts once; one that stays in L2 counts in full). A time from them
is an estimate that must be written as one.

Needs JAX's CUDA plugin for the installed JAX (about 5 GB with its CUDA libraries, in a
virtual environment of its own if need be); without it the tool says so in one line.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)

from profile_breakdown import (CATEGORIES, called_computations,  # noqa: E402
                               hlo_op_categories, split_instruction)

# XLA's GPU target configs (xla/stream_executor/device_description.proto), from NVIDIA's
# published figures for the SXM parts: 132 SMs, 228 KB of shared memory an SM (227 KB a
# block, opted in), 50 MB of L2, 1.98 GHz boost clock; HBM3 80 GB at 3.35 TB/s (H100),
# HBM3e 141 GB at 4.8 TB/s (H200). cuDNN 9.8 and CUDA 12.9 stand for the plugin's own.
_DEVICE = """gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132
  fpus_per_core: 128 block_dim_limit_x: 2147483647 block_dim_limit_y: 65535
  block_dim_limit_z: 65535 memory_bandwidth: {bandwidth} l2_cache_size: 52428800
  clock_rate_ghz: 1.98 device_memory_size: {memory} shared_memory_per_block_optin: 232448
  cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 8 }}
runtime_version {{ major: 12 minor: 9 }}
device_description_str: "{name}"
"""
TARGETS = {
    "h100": _DEVICE.format(bandwidth=3352320000000, memory=85520809984,
                           name="NVIDIA H100 80GB HBM3"),
    "h200": _DEVICE.format(bandwidth=4800000000000, memory=150754820096, name="NVIDIA H200"),
}
MODES = ("pretraining", "inference")
XLA_FLAGS = "--xla_gpu_enable_triton_gemm=false"

# --------------------------------------------------------------------------------------
# Reading a compiled module

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2,
          "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_ARRAY = re.compile(r"\b([a-z][a-z0-9]*)\[([0-9,]*)\](?:\{([0-9,]*))?")
_LINE_HEAD = re.compile(r"^\s*(?:ROOT\s+)?%([\w.\-]+)\s*=\s*")
# Instructions that launch nothing: views, tuples, parameters.
_NO_KERNEL = {"parameter", "get-tuple-element", "bitcast", "tuple", "constant",
              "after-all", "opt-barrier", "partition-id", "replica-id"}
_VIEWS = {"parameter", "get-tuple-element", "bitcast", "tuple"}


def array_bytes(shape: str) -> int:
    """Bytes of every array in an HLO shape ("bf16[2,3]{1,0}", a tuple of them, "f32[]")."""
    total = 0
    for dtype, dims, _ in _ARRAY.findall(shape):
        if dtype not in _BYTES:
            continue
        count = 1
        for d in filter(None, dims.split(",")):
            count *= int(d)
        total += count * _BYTES[dtype]
    return total


def parse_instruction(line: str) -> tuple[str, str, str, str] | None:
    """(name, result shape, opcode, the rest after the opcode's parenthesis) of an HLO
    instruction line, or None (profile_breakdown.split_instruction reads the right-hand
    side, tuple shapes of six or more with their "/*index=5*/" comments included)."""
    head = _LINE_HEAD.match(line)
    if not head:
        return None
    shape, opcode, rest = split_instruction(line[head.end():])
    return (head.group(1), shape, opcode, rest) if opcode else None


def computation_instructions(hlo_text: str, computation: str | None = None
                             ) -> list[tuple[str, str, str, list[str], str]]:
    """A computation's instructions, ENTRY's when `computation` is None: (name, result
    shape, opcode, operand names, the rest of the line: operands and attributes)."""
    if computation is None:
        header = re.search(r"^ENTRY ", hlo_text, re.M)
        missing = "no ENTRY computation in the module text"
    else:  # Headers start at the margin, instructions are indented.
        header = re.search(rf"^%?{re.escape(computation)} ", hlo_text, re.M)
        missing = f"no computation {computation!r} in the module text"
    if header is None:
        raise ValueError(missing)
    out = []
    for line in hlo_text[header.start():].splitlines()[1:]:
        if line.strip() == "}":
            break
        parsed = parse_instruction(line)
        if parsed:
            name, shape, opcode, rest = parsed
            # Operands: the names inside the call's parentheses (before its attributes).
            depth, end = 1, 0
            for end, c in enumerate(rest):
                depth += (c == "(") - (c == ")")
                if depth == 0:
                    break
            out.append((name, shape, opcode, re.findall(r"%([\w.\-]+)", rest[:end]), rest))
    return out


def entry_instructions(hlo_text: str) -> list[tuple[str, str, str, list[str]]]:
    """The ENTRY computation's instructions: (name, result shape, opcode, operand names)."""
    return [row[:4] for row in computation_instructions(hlo_text)]


def kernels_run(hlo_text: str, computation: str | None = None, instructions=None
                ) -> list[tuple[str, int, str]]:
    """(name, bytes read and written, attributes) of each kernel a computation launches
    (ENTRY's when None; `instructions`: its `computation_instructions` if already parsed),
    in order. A `conditional` launches nothing itself (its operands
    are views handed to the branch): it stands for the kernels of its branch, and as the
    branch taken depends on the data, the one that moves the most bytes (so the sum stays
    an upper bound)."""
    shapes, out = {}, []
    if instructions is None:
        instructions = computation_instructions(hlo_text, computation)
    for name, shape, opcode, operands, rest in instructions:
        shapes[name] = shape
        if opcode in _NO_KERNEL:
            continue
        if opcode == "conditional":
            branches = [kernels_run(hlo_text, b)
                        for b in called_computations(rest, opcode)]
            out += max(branches, key=lambda kernels: sum(k[1] for k in kernels), default=[])
            continue
        moved = array_bytes(shape) + sum(array_bytes(shapes.get(o, "")) for o in operands)
        out.append((name, moved, rest))
    return out


def batch_minor_tensors(hlo_text: str, batch: int, other_sizes) -> int:
    """How many instructions (fused ones included; not views, tuples or parameters) produce
    a tensor of rank 3 or more whose physical minor dimension is the batch: the layout's
    first minor-to-major index names a dimension of size `batch`, and some other dimension
    has one of `other_sizes` (the sequence length, say), so that [B, S, H] laid out
    [S, H, B] counts and a weight does not."""
    count = 0
    for line in hlo_text.splitlines():
        parsed = parse_instruction(line)
        if not parsed or parsed[2] in _VIEWS:
            continue
        for _, dims, layout in _ARRAY.findall(parsed[1]):
            sizes = [int(d) for d in dims.split(",") if d]
            if len(sizes) < 3 or not layout:
                continue
            minor = sizes[int(layout.split(",")[0])]
            if minor == batch and any(s in other_sizes for s in sizes):
                count += 1
    return count


def summarize(hlo_text: str, batch: int, other_sizes, top: int = 0) -> dict:
    """What one compiled module runs: kernel and custom-call counts, batch-minor tensors,
    and bytes moved by category (see the module docstring); `top` kernels by bytes, grouped
    by kind (the fusion's name without its number) and JAX op path."""
    categories = next(iter(hlo_op_categories(hlo_text).values()), {})
    moved, groups, targets = Counter(), Counter(), Counter()
    entry = computation_instructions(hlo_text)
    kernels = kernels_run(hlo_text, instructions=entry)
    for name, line_bytes, rest in kernels:
        category = categories.get(name, "other")
        moved[category] += line_bytes
        targets.update(re.findall(r'custom_call_target="([^"]+)"', rest))
        if top:
            kind = re.sub(r"[.\d]+$", "", name)
            groups[(kind, category)] += line_bytes
    result = {
        "kernels": len(kernels),
        "triton_calls": sum(v for k, v in targets.items() if "triton" in k),
        "cudnn_calls": sum(v for k, v in targets.items() if "cudnn" in k and "fmha" in k),
        # Each a choice the GPU's host side makes at run time (a predicate read back).
        "conditionals": sum(row[2] == "conditional" for row in entry),
        "batch_minor_tensors": batch_minor_tensors(hlo_text, batch, other_sizes),
        "bytes_moved": {c: moved[c] for c in CATEGORIES},
        "bytes_non_matmul": sum(v for c, v in moved.items() if c != "matmul"),
    }
    if top:
        result["top"] = [(kind, category, b) for (kind, category), b in groups.most_common(top)]
    return result


# --------------------------------------------------------------------------------------
# Compiling a side (child process)


def plugin_error() -> str | None:
    """None if JAX's CUDA plugin can be loaded here, else the one-line reason."""
    try:
        import jax_plugins.xla_cuda12  # noqa: F401
    except ImportError:
        try:
            import jax_plugins.xla_cuda13  # noqa: F401
        except ImportError:
            from importlib.metadata import PackageNotFoundError, version

            try:
                jax_version = version("jax")
            except PackageNotFoundError:
                return "JAX is not installed; pip install 'jax[cuda12]' (no GPU needed)"
            return (f"JAX's CUDA plugin is not installed; pip install "
                    f"'jax[cuda12]=={jax_version}' (no GPU needed)")
    return None


def _target_mesh(target: str):
    import jax
    from jax.experimental import topologies

    platform = "cuda"
    topology = topologies.get_topology_desc(platform=platform, target_config=TARGETS[target],
                                            topology="1x1x1")
    mesh = topologies.make_mesh(topology, (1,), ("batch",))
    return jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())


def _abstract(tree, sharding):
    import jax
    import numpy as np

    return jax.tree.map(lambda a: jax.ShapeDtypeStruct(np.shape(a), a.dtype,
                                                       sharding=sharding), tree)


def _take_the_platform_for_a_gpu():
    from bert_keras import flash_attention, kernels

    kernels.platform = lambda: "gpu"
    flash_attention.on_gpu = lambda: True


def compile_pretraining(side: str, size_name: str, target: str) -> str:
    """The compiled module text of the side's Keras train step (what fit jits)."""
    import jax
    import keras

    import bench_accelerator as ba

    name, options = ba.parse_side(side)
    _take_the_platform_for_a_gpu()
    keras.mixed_precision.set_global_policy("mixed_bfloat16")
    ba.set_kernel_switches(options)
    size = ba.SIZES[size_name]
    model, feed = (ba.build_ours if name == "ours" else ba.build_keras_hub)(size, options)
    data = feed(ba.synthetic_batches(size, count=1))
    model._symbolic_build(data_batch=jax.tree.map(lambda a: a[:2], data))
    state = model._get_jax_state(trainable_variables=True, non_trainable_variables=True,
                                 optimizer_variables=True, metrics_variables=True)
    sharding = _target_mesh(target)
    step = jax.jit(model.train_step, donate_argnums=0)
    return step.lower(_abstract(state, sharding), _abstract(data, sharding)).compile().as_text()


def compile_inference(side: str, size_name: str, target: str) -> str:
    """The compiled module text of the encoder's jitted forward, the function the bench
    times (bench/accelerator_tasks.py): on the padded batch or, with `real_tokens=M`, on the
    first batch's real tokens."""
    import accelerator_tasks as tasks
    import bench_accelerator as ba

    name, options = ba.parse_side(side, "inference")
    _take_the_platform_for_a_gpu()
    ba.set_kernel_switches(options)
    size = tasks.SIZES["inference"][size_name]
    model, feed = tasks.keras_inference_model(name, size)
    inputs = feed(tasks.synthetic_examples(size, count=1))
    sharding = _target_mesh(target)
    if options.get("real_tokens"):
        from bert_keras.layers import padding_free

        forward, values = tasks.real_tokens_forward_and_weights(model)
        capacity = padding_free.row_capacity(inputs["input_mask"], int(options["real_tokens"]))
        lowered = forward.lower(_abstract(values, sharding), _abstract(inputs, sharding),
                                capacity)
    else:
        forward, weights = tasks.forward_and_weights(model)
        lowered = forward.lower(*_abstract(weights, sharding), _abstract(inputs, sharding))
    return lowered.compile().as_text()


def child(args) -> None:
    compile_side = compile_pretraining if args.mode == "pretraining" else compile_inference
    text = compile_side(args.side, args.size, args.target)
    with open(args.module_out, "w", encoding="utf-8") as f:
        f.write(text)


# --------------------------------------------------------------------------------------
# The parent


def _batch_and_sizes(mode: str, size_name: str):
    import bench_accelerator as ba

    size = ba.sizes_of(mode)[size_name]
    return size["batch"], {size["seq"]}


def run_side(side: str, args, out_dir: str) -> dict:
    """Compiles one side in a child process; its summary (or an error)."""
    name = re.sub(r"[^\w]+", "_", side).strip("_")
    module = os.path.join(out_dir, f"{name}_{args.size}.hlo.txt")
    env = dict(os.environ, KERAS_BACKEND="jax", JAX_PLATFORMS="cpu",
               JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1", CUDA_VISIBLE_DEVICES="-1",
               TF_CPP_MIN_LOG_LEVEL="2")
    env["XLA_FLAGS"] = " ".join([env.get("XLA_FLAGS", ""), XLA_FLAGS]).strip()
    command = [sys.executable, os.path.abspath(__file__), "--child", f"--mode={args.mode}",
               f"--side={side}", f"--size={args.size}", f"--target={args.target}",
               f"--module_out={module}"]
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode != 0 or not os.path.exists(module):
        tail = (done.stderr or done.stdout).strip().splitlines()[-8:]
        return dict(side=side, error=f"exit {done.returncode}", log="\n".join(tail))
    with open(module, encoding="utf-8") as f:
        text = f.read()
    batch, other = _batch_and_sizes(args.mode, args.size)
    result = dict(side=side, **summarize(text, batch, other, args.top))
    if args.hlo_dir:
        os.makedirs(args.hlo_dir, exist_ok=True)
        with gzip.open(os.path.join(args.hlo_dir, os.path.basename(module) + ".gz"), "wt") as f:
            f.write(text)
    os.remove(module)
    return result


def format_results(results: list[dict], args) -> str:
    lines = [f"{args.mode}, size {args.size}, compiled for {args.target} on this CPU "
             f"(XLA_FLAGS={XLA_FLAGS}; GB each kernel reads and writes)",
             "| side | kernels | Triton calls | cuDNN attention | runtime branches | "
             "batch-minor tensors | "
             + " | ".join(f"GB {c}" for c in CATEGORIES) + " | GB non-matmul |",
             "| --- " * (7 + len(CATEGORIES)) + "|"]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['side']} | error: {r['error']} |")
            continue
        lines.append(f"| {r['side']} | {r['kernels']} | {r['triton_calls']} | "
                     f"{r['cudnn_calls']} | {r['conditionals']} | {r['batch_minor_tensors']} | "
                     + " | ".join(f"{r['bytes_moved'][c] / 1e9:.2f}" for c in CATEGORIES)
                     + f" | {r['bytes_non_matmul'] / 1e9:.2f} |")
    for r in results:
        if r.get("top"):
            lines.append(f"\n{r['side']}: kernels moving the most bytes (kind, category, GB)")
            lines += [f"  {b / 1e9:7.2f}  {kind} ({category})" for kind, category, b in r["top"]]
        if "log" in r:
            lines.append(f"\n{r['side']}:\n{r['log']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="pretraining")
    parser.add_argument("--size", default="base",
                        help="a size of bench_accelerator.py (pretraining) or "
                             "accelerator_tasks.py (inference)")
    parser.add_argument("--sides", default="ours",
                        help="comma-separated sides with options (bench_accelerator.py's; "
                             "';' separates a side's options)")
    parser.add_argument("--target", choices=sorted(TARGETS), default="h200")
    parser.add_argument("--top", type=int, default=0,
                        help="list each side's N kernel kinds moving the most bytes")
    parser.add_argument("--hlo_dir", default="", help="keep each compiled module here, gzipped")
    parser.add_argument("--out", default="", help="write the results as JSON here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--side", help=argparse.SUPPRESS)
    parser.add_argument("--module_out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args)
        return 0

    import tempfile

    import bench_accelerator as ba

    if args.size not in ba.sizes_of(args.mode):
        parser.exit(2, f"error: --size: {args.size!r} is not a {args.mode} size; expected one "
                       f"of {sorted(ba.sizes_of(args.mode))}\n")
    sides = [s for s in args.sides.split(",") if s]
    for side in sides:
        name = ba.parse_side(side, args.mode)[0]  # a bad option: one line, exit 1
        if name not in ("ours", "keras_hub"):
            parser.exit(2, f"error: --sides: {side!r}: only the Keras sides (ours, keras_hub) "
                           f"compile with XLA\n")
    reason = plugin_error()
    if reason:
        parser.exit(2, f"error: {reason}\n")
    results = []
    with tempfile.TemporaryDirectory(prefix="compile_for_gpu_") as out_dir:
        for side in sides:
            print(f"compiling {side} ({args.mode}, {args.size}, {args.target}) ...", flush=True)
            results.append(run_side(side, args, out_dir))
    print(format_results(results, args))
    if args.out:
        with open(args.out + ".tmp", "w", encoding="utf-8") as f:
            json.dump(dict(mode=args.mode, size=args.size, target=args.target,
                           xla_flags=XLA_FLAGS, results=results), f, indent=1)
        os.replace(args.out + ".tmp", args.out)
    return 1 if any("error" in r for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
