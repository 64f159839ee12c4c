"""What the fused Triton step compiles to on NVIDIA GPUs, measured without a GPU.

    python bench/gpu_sass.py                 # sm_75, sm_80, sm_90; fp32 and bf16; prints a table
    python bench/gpu_sass.py --json out.json # also save the numbers
    python bench/gpu_sass.py --search        # the same for the old binary-search kernel (for comparison)
    python bench/gpu_sass.py --variants      # sm_90 also for the other specializations (Adam, int64, ...)
    python bench/gpu_sass.py --lowbit4       # sm_90 also for the 4-bit formats' kernels
    python bench/gpu_sass.py --rules         # sm_90 also for the family's rule template

Triton compiles ahead of time for any target (``triton.compile`` with a ``GPUTarget``; its
bundled ``ptxas`` makes the cubin and ``cuobjdump`` disassembles it), so this runs on a CPU.
For each target it reports, for ``_adam8bit_kernel`` at blocksize 256 with the launch
configuration the backend uses on a GPU (2048-element tiles, 8 warps: 8 elements per thread)
and the variant it compiles for ``bench/gpu_bench.py``'s step (AdamW: lr 1e-3, weight decay
1e-2, eps 1e-8; 1e8 parameters, so int32 offsets; see ``step_specialization``):

* **registers** per thread and **spills** (bytes of local memory: should be 0);
* **SASS instructions per element**: the kernel's straight-line instruction count (there are
  no loops: Triton unrolls the per-thread elements and the ``static_range``) divided by the
  elements each thread owns, i.e. about how many instructions a warp issues per 32 elements.
  Counted on the main path: the slow paths of the IEEE division and square root (subroutines
  after the kernel body, called only for denormal or special operands) are left out; the
  few instructions that set up and skip those calls are counted;
* how many of them are **global loads** (``LDG``) per element: the table probes.

Why it matters: an H200 copies at ~4.2 TB/s; the step moves 16 bytes per fp32 parameter, so
at that speed each of the 132 SMs must finish about one element per cycle, while an SM issues
at most 4 warp instructions (128 thread instructions) per cycle. Instructions per element
above ~128 therefore cap the kernel below copy bandwidth whatever the memory does (integer,
FP32 and load units differ in throughput, so this is a guide, not a model).

Must run in a process where the Triton interpreter was never used (TRITON_INTERPRET unset).
"""

from __future__ import annotations

import argparse
import json
import inspect
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))

TARGETS = (75, 80, 90)
DTYPES = ("fp32", "bf16")
BLOCKSIZE = 256
#: gpu_bench.py's step: AdamW, 1e8 fp32 parameters, first step.
BENCH = dict(n=10**8, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=1e-2, step=1)
#: Other specializations of the step kernel (``--variants``): (label, changes to BENCH).
VARIANTS = (
    ("AdamW (bench)", {}),
    ("Adam, weight_decay=0", {"weight_decay": 0.0}),
    ("AdamW, n >= 2^31 (int64 offsets)", {"n": 2**31}),
    ("AdamW, eps=0 (reset by select)", {"eps": 0.0}),
)


def step_flags(n: int, tile: int, *, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
               step: int) -> dict:
    """The constexpr flags ``adam8bit_step_triton`` passes for these hyperparameters."""
    import math

    from adam8lib.kernels import triton as kt

    n_blocks = -(-n // BLOCKSIZE)
    return kt.step_specialization(n_blocks * BLOCKSIZE, tile, decay=1.0 - lr * weight_decay,
                                  neg_step_size=-lr / (1.0 - beta1**step),
                                  bias_correction2_sqrt=math.sqrt(1.0 - beta2**step), eps=eps)


def compile_step(arch: int, dtype: str, *, use_table: bool = True, tile: int | None = None,
                 num_warps: int | None = None, hyper: dict | None = None):
    """Compile ``_adam8bit_kernel`` for ``sm_<arch>`` with the backend's launch configuration
    (or ``tile``/``num_warps``) and its specialization for ``hyper`` (default :data:`BENCH`);
    returns (triton's compiled kernel, elements per thread)."""
    types = {"p_ptr": "*" + dtype, "g_ptr": "*" + dtype, "state1_ptr": "*u8", "state2_ptr": "*u8",
             "steps1_ptr": "*i32", "steps2_ptr": "*i32", "n": "i32", "n_blocks": "i32"}
    return _compile(arch, "_adam8bit_kernel", types, {"USE_TABLE": use_table}, hyper, tile=tile, num_warps=num_warps,
                    aligned=("n",))


def compile_step_many(arch: int, dtype: str, *, hyper: dict | None = None):
    """Compile ``_adam8bit_many_kernel`` (several tensors in one launch) for ``sm_<arch>`` as
    ``adam8bit_step_many_triton`` launches it for tensors of ``dtype``; returns (triton's
    compiled kernel, elements per thread)."""
    from adam8lib.kernels import triton as kt

    tl_dtype = {"fp32": kt.tl.float32, "bf16": kt.tl.bfloat16, "fp16": kt.tl.float16}[dtype]
    types = {"meta_ptr": "*i64", "programs_ptr": "*i64", "steps1_ptr": "*i32", "steps2_ptr": "*i32", "count": "i32"}
    return _compile(arch, "_adam8bit_many_kernel", types,
                    {"USE_TABLE": True, "P_DTYPE": tl_dtype, "G_DTYPE": tl_dtype}, hyper)


def compile_4bit_step(arch: int, dtype: str, *, rank1: bool = True, hyper: dict | None = None):
    """Compile ``_adam4bit_kernel`` (the 4-bit formats' step; blocks of 128, two codes per byte) for
    ``sm_<arch>`` as ``adam4bit_step_triton`` launches it: ``rank1`` the ``"4bit"`` format's pass 2
    for a matrix (v with rank-1 scales), else the blockwise step (``"4bit-naive"``, or a vector)."""
    types = {"p_ptr": "*" + dtype, "g_ptr": "*" + dtype, "state1_ptr": "*u8", "state2_ptr": "*u8",
             "n": "i32", "n_blocks": "i32", "n_cols": "i32", "d0": "i32", "d1": "i32", "d2": "i32"}
    return _compile(arch, "_adam4bit_kernel", types, {"RANK1": rank1}, hyper, aligned=("n",), blocksize=128)


def compile_rank1_max(arch: int, dtype: str, *, hyper: dict | None = None):
    """Compile ``_rank1_max_kernel`` (pass 1 of the ``"4bit"`` step of a matrix: the new v's row and
    column maxima) for ``sm_<arch>`` with the tile ``rank1_tile`` picks for a large matrix."""
    from adam8lib.kernels import triton as kt
    from adam8lib.kernels import triton_4bit

    tile_r, tile_c = triton_4bit.rank1_tile(8192, 8192, kt.TILE_ELEMENTS)
    types = {"g_ptr": "*" + dtype, "state1_ptr": "*u8", "state2_ptr": "*u8", "maxima_ptr": "*i32",
             "n_rows": "i32", "n_cols": "i32", "d0": "i32", "d1": "i32", "d2": "i32"}
    return _compile(arch, "_rank1_max_kernel", types, {"TILE_R": tile_r, "TILE_C": tile_c}, hyper, blocksize=128)


def compile_rule_step(arch: int, dtype: str, rule: str):
    """Compile the family's Triton template (``triton_rules._rule_kernel``) for ``sm_<arch>`` for ``rule``
    (``"lion"``, ``"ademamix"``, ``"rmsprop"``, ``"adagrad"``) on 8-bit map states, as
    ``rule_step_triton`` launches it."""
    from adam8lib.kernels.rule_args import RULES

    types = {"p_ptr": "*" + dtype, "g_ptr": "*" + dtype, "n": "i32", "n_blocks": "i32",
             **{f"c{k}_ptr": "*u8" for k in range(3)}, **{f"t{k}_ptr": "*i32" for k in range(3)}}
    states = 3 if rule == "ademamix" else 1
    return _compile(arch, "_rule_kernel", types, {"RULE": RULES[rule], "STATES": states, "USE_TABLE": True,
                                                  "FP8": False, "INT64": False}, None, aligned=("n",))


def _compile(arch: int, kernel: str, types: dict, constexprs: dict, hyper: dict | None, *, tile: int | None = None,
             num_warps: int | None = None, aligned: tuple = (), blocksize: int = BLOCKSIZE):
    """Compile ``adam8lib.kernels.triton.<kernel>`` (or ``triton_4bit``'s) for ``sm_<arch>``: arguments typed by
    ``types`` (else ``*fp32`` for a ``*_ptr``, ``fp32`` for a scalar), the launch's BLOCKSIZE,
    ROWS and step flags for ``hyper`` plus ``constexprs`` (those the kernel takes); every pointer
    and the ``aligned`` arguments are declared divisible by 16, as Triton specializes them at a
    real launch."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise RuntimeError("unset TRITON_INTERPRET: the interpreter cannot compile for a GPU")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from adam8lib.kernels import triton as kt
    from adam8lib.kernels import triton_4bit, triton_rules

    rows, num_warps = kt.launch_config(blocksize, tile=tile or kt.TILE_ELEMENTS, num_warps=num_warps)
    home = triton_4bit if "4bit" in kernel or "rank1" in kernel else triton_rules if "rule" in kernel else kt
    fn = getattr(home, kernel)  # (the module that holds the kernel)
    constexprs = {"BLOCKSIZE": blocksize, "ROWS": rows, **step_flags(tile=rows * blocksize, **(hyper or BENCH)),
                  **constexprs}
    constexprs = {name: value for name, value in constexprs.items() if name in fn.arg_names}
    for param in fn.params:  # constexprs with a default (e.g. FP8=False) compile as that default, as a launch does
        if param.is_constexpr and param.name not in constexprs and param.default is not inspect.Parameter.empty:
            constexprs[param.name] = param.default
    names = list(fn.arg_names)
    signature = {name: "constexpr" if name in constexprs else
                 types.get(name, "*fp32" if name.endswith("_ptr") else "fp32") for name in names}
    divisible = {(names.index(name),): [["tt.divisibility", 16]]
                 for name in names if name.endswith("_ptr") or name in aligned}
    source = ASTSource(fn=fn, signature=signature, constexprs=constexprs, attrs=divisible)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32),
                          options={"num_warps": num_warps, "enable_fp_fusion": False}), rows * blocksize // (32 * num_warps)


def _cuobjdump() -> str:
    from triton import knobs

    return knobs.nvidia.cuobjdump.path


def analyse(kernel, per_thread: int) -> dict:
    """Registers, spills and SASS instruction counts of a compiled kernel."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernel.cubin"
        path.write_bytes(kernel.asm["cubin"])
        sass = subprocess.check_output([_cuobjdump(), "-sass", str(path)], text=True)
        usage = subprocess.check_output([_cuobjdump(), "-res-usage", str(path)], text=True)
    # instruction lines look like "        /*0040*/                   LDG.E.128 R4, desc[UR4][R2.64] ;"
    found = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);", sass)
    ops = [(int(addr, 16), op, rest) for addr, op, rest in found if not op.startswith("NOP")]
    # the division/sqrt slow paths (denormal or special operands) are subroutines placed after
    # the kernel body and reached by CALL; the main path is everything before the first of them
    targets = [int(t, 16) for _, op, rest in ops if op.startswith("CALL") for t in re.findall(r"0x([0-9a-f]+)", rest)]
    end = min(targets) if targets else float("inf")
    main = [op for addr, op, _ in ops if addr < end]
    while main and main[-1] == "BRA":  # the "BRA self" padding after EXIT
        main.pop()
    regs = int(re.search(r"REG:(\d+)", usage).group(1))
    stack = re.search(r"STACK:(\d+)", usage)
    local = re.search(r"LOCAL:(\d+)", usage)
    return {
        "registers": regs,
        "spill_bytes": (int(stack.group(1)) if stack else 0) + (int(local.group(1)) if local else 0),
        "instructions": len(main),
        "instructions_with_slow_paths": len(ops),
        "per_thread_elements": per_thread,
        "instructions_per_element": len(main) / per_thread,
        "global_loads_per_element": sum(op.startswith("LDG") for op in main) / per_thread,
    }


def measure(targets=TARGETS, dtypes=DTYPES, use_table: bool = True, variants=VARIANTS[:1]) -> list[dict]:
    rows = []
    for label, change in variants:
        hyper = {**BENCH, **change}
        for arch in targets:
            for dtype in dtypes:
                kernel, per_thread = compile_step(arch, dtype, use_table=use_table, hyper=hyper)
                rows.append({"arch": f"sm_{arch}", "dtype": dtype, "use_table": use_table, "variant": label,
                             "flags": step_flags(tile=kernel_tile(), **hyper), **analyse(kernel, per_thread)})
    return rows


def kernel_tile() -> int:
    from adam8lib.kernels import triton as kt

    rows, _ = kt.launch_config(BLOCKSIZE, tile=kt.TILE_ELEMENTS)
    return rows * BLOCKSIZE


def render(rows: list[dict]) -> str:
    lines = ["| target | dtype | nearest code | step variant | registers | spills (bytes) "
             "| SASS instr. / element (main path) | incl. slow-path subroutines | LDG / element |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['arch']} | {r['dtype']} | {r.get('nearest') or ('table, 1 probe' if r['use_table'] else 'binary search')} | "
                     f"{r['variant']} | "
                     f"{r['registers']} | {r['spill_bytes']} | {r['instructions_per_element']:.0f} | "
                     f"{r['instructions_with_slow_paths'] / r['per_thread_elements']:.0f} | "
                     f"{r['global_loads_per_element']:.1f} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the numbers here")
    parser.add_argument("--search", action="store_true", help="also compile the binary-search variant")
    parser.add_argument("--variants", action="store_true",
                        help="also compile the step's other specializations (sm_90, table path)")
    parser.add_argument("--lowbit4", action="store_true",
                        help="also compile the 4-bit formats' kernels (sm_90: blockwise step, rank-1 pass 1 and 2)")
    parser.add_argument("--rules", action="store_true",
                        help="also compile the family's rule template (sm_90: Lion, AdEMAMix, RMSprop, Adagrad; 8-bit)")
    parser.add_argument("--targets", type=int, nargs="+", default=list(TARGETS))
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES))
    args = parser.parse_args(argv)
    rows = measure(args.targets, args.dtypes, use_table=True)
    if args.search:
        rows += measure(args.targets, args.dtypes, use_table=False)
    if args.variants:
        rows += measure([90], args.dtypes, use_table=True, variants=VARIANTS[1:])
        for dtype in args.dtypes:
            kernel, per_thread = compile_step_many(90, dtype)
            rows.append({"arch": "sm_90", "dtype": dtype, "use_table": True,
                         "variant": "AdamW, many tensors in one launch", **analyse(kernel, per_thread)})
    if args.lowbit4:
        for dtype in args.dtypes:
            for label, compile_ in (("4-bit step, blockwise v (4bit-naive, vectors)",
                                     lambda: compile_4bit_step(90, dtype, rank1=False)),
                                    ("4-bit step, rank-1 v: pass 1 (row/column maxima)", lambda: compile_rank1_max(90, dtype)),
                                    ("4-bit step, rank-1 v: pass 2", lambda: compile_4bit_step(90, dtype, rank1=True))):
                kernel, per_thread = compile_()
                rows.append({"arch": "sm_90", "dtype": dtype, "use_table": False, "nearest": "16 compares", "variant": label,
                             **analyse(kernel, per_thread)})
    if args.rules:
        for dtype in args.dtypes:
            for rule in ("lion", "ademamix", "rmsprop", "adagrad"):
                kernel, per_thread = compile_rule_step(90, dtype, rule)
                rows.append({"arch": "sm_90", "dtype": dtype, "use_table": True, "variant": f"{rule} (rule template)",
                             **analyse(kernel, per_thread)})
    print(render(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
