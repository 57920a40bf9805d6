r"""Where a profiled step's device time goes: kernel time by category, read from a JAX trace.

    from profile_breakdown import kernel_time_by_category, format_breakdown
    with jax.profiler.trace(folder):
        run(2)                                   # two steps
    found = kernel_time_by_category(glob(folder + "/**/*.xplane.pb")[0], steps=2)
    print(format_breakdown(found))
    # kernel 59.4 ms/step: matmul 26.2 (44%), attention 0.0 (0%), transposes 13.2 (22%), ...

The trace is read with JAX's own reader, `jax.profiler.ProfileData.from_file` (XLA's
XSpace protobuf: planes, lines, events with start, duration and stats); TensorFlow and
TensorBoard's profile plugin are not needed.

Which events are counted:

  GPU  The device planes "/device:GPU:<n>" (the first one that has kernels; one device is
       one step's work). CUPTI writes one line per CUDA stream there ("Stream #7",
       "Stream #7(Kernel,MemcpyD2D)"): each event is one kernel (or memcpy / memset) as the
       GPU ran it, named by the kernel, with the XLA instruction that launched it in its
       stats (`hlo_op`, `hlo_module`, and `tf_op`: the JAX op path). Those stream lines are
       read, and nothing else: "CUPTI overhead" and counter lines are not kernels, and the
       lines an XProf post-processing derives from them ("XLA Ops", "XLA Modules",
       "Steps") repeat the same time grouped differently, so reading them too would count
       it twice (an "XLA Ops" event also spans the gaps between its kernels). Only where a
       device plane has no stream line (a trace written after such post-processing) is its
       "XLA Ops" line read instead.
  CPU  A trace of XLA:CPU has no device plane. Then the host plane "/host:CPU" is read:
       each XLA thunk that ran is an event carrying an `hlo_op` stat (its instruction;
       "end: ..." markers are skipped). A thunk that contains others on its thread (a
       while loop's) is dropped and its children kept, so no time is counted twice.

The sum is kernel time: a kernel on two streams at once counts twice; `busy_ms_per_step`
(the union of the counted intervals) is the time the device had something running.

Categories, first match wins (`categorize`):

  attention   cuDNN fused attention (kernel names with fmha / sdpa / flash / cudnn) and the
              Pallas / Triton attention kernels, named after their pallas_call
              ("bert_flash_attention_forward", "..._dkdv", "..._dq"; JAX's "mha_forward")
  matmul      cuBLAS / cuBLASLt / CUTLASS / nvjet / xmma / gemm kernels, XLA dots,
              convolutions and gemm fusions ("gemm_fusion_dot.3", a cuBLAS split-K reduce)
  transposes  fusions and copies named "transpose" or "copy" (not memcpy): layout changes
  reductions  XLA "input_*" fusions (its reduction fusions), reduce / reduction, softmax,
              layer norm
  other       everything else: converts, elementwise "loop_*" fusions, memcpy / memset

An event is categorized by its kernel name, then by its `hlo_op` name, then (if the trace
has one, as XProf-processed traces do) its `hlo_category`, then by the JAX op path in
`tf_op` (attention only: a Triton kernel launched by a pallas_call keeps its name there).
Names of XLA fusions do not always say what is inside (XLA:CPU's "ynn_fusion" runs a dot);
pass the compiled module's text (`jitted.lower(...).compile().as_text()`, or the
"*after_optimizations.txt" files of XLA_FLAGS=--xla_dump_to, see `read_hlo_dump`) as
`hlo_text`, and an event whose name does not decide is categorized by the operations of the
instruction it ran (a dot inside makes a fusion a matmul, and so on, in the order above).
"""

from __future__ import annotations

import glob
import os
import re
from collections import defaultdict

CATEGORIES = ("matmul", "attention", "transposes", "reductions", "other")
# Most specific first: an event belongs to the first category whose rule matches.
_PRECEDENCE = ("attention", "matmul", "transposes", "reductions", "other")

_ATTENTION = re.compile(r"fmha|sdpa|flash|cudnn|mha_(fwd|bwd|forward|backward)|"
                        r"dot_product_attention|bert_flash_attention")
_MATMUL = re.compile(r"gemm|cublas|cutlass|nvjet|xmma|matmul|convolution|"
                     r"(^|[^a-z])dot([^a-z]|$)")
_TRANSPOSE = re.compile(r"transpose|copy")
_REDUCTION = re.compile(r"^input_|reduce|reduction|softmax|layer_?norm")
_MEMORY = re.compile(r"memcpy|memset")


def categorize_name(name: str | None) -> str | None:
    """The category a kernel or instruction name says, or None if it says nothing.

    Args:
      name: a CUDA kernel name ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_TNN"), an XLA
        instruction or fusion name ("input_reduce_fusion.3"), or a CUPTI activity name
        ("MemcpyD2D").
    """
    if not name:
        return None
    lowered = name.lower()
    if _MEMORY.search(lowered):
        return "other"
    if _ATTENTION.search(lowered):
        # cuDNN also runs convolutions and (where XLA is told to) GEMM fusions.
        if "cudnn" in lowered and re.search(r"conv|gemm|matmul", lowered) and not re.search(
                r"fmha|sdpa|flash", lowered):
            return "matmul"
        return "attention"
    for category, rule in (("matmul", _MATMUL), ("transposes", _TRANSPOSE),
                           ("reductions", _REDUCTION)):
        if rule.search(lowered):
            return category
    return None


def categorize(name: str, stats: dict | None = None, hlo_ops: dict | None = None) -> str:
    """The category of one kernel / op event (see the module docstring).

    Args:
      name: the event's name (kernel or thunk).
      stats: the event's stats ({"hlo_op": ..., "hlo_module": ..., "tf_op": ...}).
      hlo_ops: {hlo_module: {instruction name: category}} from `hlo_op_categories`.
    """
    stats = stats or {}
    found = categorize_name(name)
    if found:
        return found
    op = stats.get("hlo_op")
    if hlo_ops and op:
        module = stats.get("hlo_module")
        tables = [hlo_ops[module]] if module in hlo_ops else list(hlo_ops.values())
        for table in tables:
            if op in table:
                return table[op]
    for key in ("hlo_op", "hlo_category"):
        found = categorize_name(stats.get(key))
        if found:
            return found
    tf_op = str(stats.get("tf_op") or "").lower()
    if tf_op and _ATTENTION.search(tf_op):
        return "attention"
    return "other"


# --------------------------------------------------------------------------------------
# The compiled HLO: what each instruction runs


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|called_computations|"
                     r"branch_computations|true_computation|false_computation)"
                     r"=\{?([^}]*?)\}?(?=,\s*[a-z_]+=|$)")
_TARGET = re.compile(r'custom_call_target="([^"]*)"')


def split_instruction(rest: str) -> tuple[str, str, str]:
    """(result shape, opcode, what follows the opcode's parenthesis: operands and
    attributes) of an instruction's right-hand side ("f32[2]{0} dot(%a, %b), ..."); the
    opcode is "" if there is none. A tuple shape is read to its closing parenthesis (it may
    nest, and hold "/*index=5*/" comments)."""
    i, depth = 0, 0
    # Skip the result type: a token, or a parenthesised tuple of them.
    while i < len(rest):
        c = rest[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == " " and depth == 0:
            break
        i += 1
    match = re.match(r"\s*([a-z][\w\-]*)\((.*)$", rest[i:])
    return (rest[:i], match.group(1), match.group(2)) if match else (rest[:i], "", "")


def _opcode(rest: str) -> str:
    """The opcode of an instruction's right-hand side ("f32[2]{0} dot(%a, %b), ...")."""
    return split_instruction(rest)[1]


def called_computations(rest: str, opcode: str) -> list[str]:
    """The computations an instruction calls (a fusion's, a loop's body and condition, a
    conditional's branches), not a reduce's reducer."""
    called = []
    for found in _CALLED.finditer(rest):
        key = found.group(0).split("=")[0]
        if key != "to_apply" or opcode != "reduce":
            called += [c.strip().lstrip("%") for c in found.group(1).split(",") if c.strip()]
    return called


def _instruction_category(opcode: str, rest: str) -> str | None:
    if opcode == "custom-call":
        target = _TARGET.search(rest)
        by_target = categorize_name(target.group(1) if target else "")
        if by_target in ("attention", "matmul"):  # cuDNN attention, cuBLAS
            return by_target
        # A Pallas / Triton call names its kernel in its backend config.
        if _ATTENTION.search(rest.lower()):
            return "attention"
        return None if by_target == "other" else by_target
    if opcode in ("dot", "convolution", "ragged-dot"):
        return "matmul"
    if opcode in ("transpose", "copy"):
        return "transposes"
    if opcode in ("reduce", "reduce-window", "all-reduce", "reduce-scatter"):
        return "reductions"
    return None


def hlo_op_categories(hlo_text) -> dict:
    """{module name: {instruction name: category}} from compiled HLO module text(s).

    An instruction's category is the most specific (attention, matmul, transposes,
    reductions) of the operations it runs, looking into the computations it calls (a
    fusion's fused computation, a loop's body; not a reduce's reducer); "other" if none.

    Args:
      hlo_text: one module's text (`Compiled.as_text()`) or a list of them.
    """
    texts = [hlo_text] if isinstance(hlo_text, str) else list(hlo_text)
    out = {}
    for text in texts:
        module, computations, current = None, {}, None
        for line in text.splitlines():
            if line.startswith("HloModule "):
                module = line.split()[1].rstrip(",")
                continue
            if current is None:
                # A computation's header starts at the margin and ends with "{" (its
                # parameter list may hold "/*index=5*/" comments); instructions are indented.
                match = _COMPUTATION.match(line)
                if match and not line[:1].isspace() and line.rstrip().endswith("{"):
                    current = computations.setdefault(match.group(1), [])
                continue
            if line.strip() == "}":
                current = None
                continue
            match = _INSTRUCTION.match(line)
            if not match:
                continue
            name, rest = match.groups()
            opcode = _opcode(rest)
            current.append((name, _instruction_category(opcode, rest),
                            called_computations(rest, opcode)))

        memo = {}

        def computation_category(name, seen=()):
            if name in memo:
                return memo[name]
            found = set()
            for _, own, called in computations.get(name, ()):
                found.add(own)
                found.update(computation_category(c, seen + (name,)) for c in called
                             if c not in seen)
            memo[name] = next((c for c in _PRECEDENCE if c in found), "other")
            return memo[name]

        table = {}
        for instructions in computations.values():
            for name, own, called in instructions:
                found = {own} | {computation_category(c) for c in called}
                table[name] = next((c for c in _PRECEDENCE if c in found), "other")
        out.setdefault(module, {}).update(table)
    return out


def read_hlo_dump(dump_dir: str) -> list[str]:
    """The optimized modules XLA dumped (XLA_FLAGS="--xla_dump_to=DIR
    --xla_dump_hlo_as_text"): the text of every "*after_optimizations.txt" in `dump_dir`."""
    texts = []
    for path in sorted(glob.glob(os.path.join(dump_dir, "*after_optimizations.txt"))):
        with open(path, encoding="utf-8") as f:
            texts.append(f.read())
    return texts


# --------------------------------------------------------------------------------------
# The trace


def _device_events(profile):
    """(plane name, line names, [(name, start_ns, duration_ns, stats)]) of the first GPU
    plane with kernel events, or None."""
    planes = sorted((p for p in profile.planes if p.name.startswith("/device:GPU:")),
                    key=lambda p: int(re.sub(r"\D", "", p.name) or 0))
    for plane in planes:
        lines = list(plane.lines)
        chosen = [line for line in lines if line.name.startswith("Stream #")]
        if not chosen:
            chosen = [line for line in lines if line.name == "XLA Ops"]
        events = [(e.name, e.start_ns, e.duration_ns, dict(e.stats))
                  for line in chosen for e in line.events if e.duration_ns > 0]
        if events:
            return plane.name, [line.name for line in chosen], events
    return None


def _host_op_events(profile):
    """(plane name, line names, events) of XLA:CPU's thunks on the host plane (leaves
    only: a thunk containing others on its line is replaced by them)."""
    events, names = [], []
    for plane in profile.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            ops = sorted(((e.name, e.start_ns, e.duration_ns, dict(e.stats))
                          for e in line.events
                          if not e.name.startswith("end: ")
                          and any(k == "hlo_op" for k, _ in e.stats)),
                         key=lambda e: (e[1], -e[2]))
            if not ops:
                continue
            names.append(line.name)
            for i, event in enumerate(ops):
                end = event[1] + event[2]
                if i + 1 < len(ops) and ops[i + 1][1] < end:
                    continue  # a container: its children are counted instead
                events.append(event)
        return plane.name, names, events
    return "/host:CPU", names, events


def _union_ns(intervals):
    total, last_end = 0.0, None
    for start, end in sorted(intervals):
        if last_end is None or start > last_end:
            total += end - start
            last_end = end
        elif end > last_end:
            total += end - last_end
            last_end = end
    return total


def kernel_time_by_category(xplane_path: str, steps: int, hlo_text=None) -> dict:
    """Device kernel time per step of a JAX trace, by category (see the module docstring).

    Args:
      xplane_path: a ".xplane.pb" written by `jax.profiler.trace`.
      steps: Python int, how many steps the trace holds; times are divided by it.
      hlo_text: optional compiled HLO module text(s) of the traced program, to categorize
        events whose names do not say what they run.

    Returns:
      {"plane": "/device:GPU:0" (or "/host:CPU"), "source": "device kernels" or
       "host XLA ops (no GPU plane)", "lines": [line names read], "steps": steps,
       "events": number of events counted,
       "ms_per_step": {category: ms} for every one of CATEGORIES,
       "total_ms_per_step": their sum, "busy_ms_per_step": the union of the intervals,
       "modules": {hlo_module: ms per step},
       "top_kernels": up to 10 [{"name", "category", "count" (in the trace),
                      "ms_per_step"}], longest first}

    Raises:
      ValueError: steps < 1, or a trace with neither a GPU plane nor XLA:CPU op events.
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1; got {steps}")
    import jax

    profile = jax.profiler.ProfileData.from_file(xplane_path)
    found = _device_events(profile)
    source = "device kernels"
    if found is None:
        found = _host_op_events(profile)
        source = "host XLA ops (no GPU plane)"
    plane, lines, events = found
    if not events:
        raise ValueError(f"{xplane_path}: no GPU kernels and no XLA:CPU op events in the "
                         f"trace (planes: {[p.name for p in profile.planes]})")
    hlo_ops = hlo_op_categories(hlo_text) if hlo_text else None
    per_category = dict.fromkeys(CATEGORIES, 0.0)
    per_kernel = defaultdict(lambda: [0, 0.0, None])
    per_module = defaultdict(float)
    for name, start, duration, stats in events:
        category = categorize(name, stats, hlo_ops)
        per_category[category] += duration
        kernel = per_kernel[name]
        kernel[0] += 1
        kernel[1] += duration
        kernel[2] = category
        per_module[str(stats.get("hlo_module", "?"))] += duration
    ms = 1e-6 / steps
    top = sorted(per_kernel.items(), key=lambda item: -item[1][1])[:10]
    return {
        "plane": plane, "source": source, "lines": lines, "steps": steps,
        "events": len(events),
        "ms_per_step": {c: per_category[c] * ms for c in CATEGORIES},
        "total_ms_per_step": sum(per_category.values()) * ms,
        "busy_ms_per_step": _union_ns((s, s + d) for _, s, d, _ in events) * ms,
        "modules": {m: t * ms for m, t in sorted(per_module.items(), key=lambda i: -i[1])},
        "top_kernels": [{"name": n, "category": c, "count": k, "ms_per_step": t * ms}
                        for n, (k, t, c) in top],
    }


def format_breakdown(found: dict) -> str:
    """One line: "kernel 59.4 ms/step: matmul 26.2 (44%), attention 0.0 (0%), ...
    [/device:GPU:0]" from `kernel_time_by_category`'s result."""
    total = found["total_ms_per_step"]
    digits = 1 if total >= 1 else 3  # a tiny CPU step takes well under a millisecond
    parts = ", ".join(f"{c} {found['ms_per_step'][c]:.{digits}f} "
                      f"({found['ms_per_step'][c] / total if total else 0:.0%})"
                      for c in CATEGORIES)
    where = found["plane"] if found["source"] == "device kernels" else found["source"]
    return f"kernel {total:.{digits}f} ms/step: {parts} [{where}]"
