"""The words of ``hint("NN.k")`` (:mod:`adam8lib.course.hints`): per graded exercise, the idea to revisit
and the nudges for the usual mistakes — ideas and questions, never the code.

* :data:`EXERCISES` — exercise id -> :class:`ExerciseHints`: its check (the name without ``check_``, as in
  :data:`adam8lib.course.grading.lessons.SECTIONS`, which gives the lesson section), a short title, ``idea``
  (level 1: one sentence on what the lesson section teaches) and ``nudges`` (level 3: keyed by the property
  that failed or the mistake the check's hint names — see :data:`adam8lib.course.hints.TOPICS` — with a
  ``"default"`` for any other mistake).
* :data:`GENERAL_NUDGES` — the level-3 nudge for a mistake that looks alike in every exercise (no return, a
  type, an error, an input changed in place, ...) when the exercise has none of its own.
* :data:`LESSONS` — workbook number -> lesson notebook.

A course test holds every text to containing no line of the solutions' code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["ExerciseHints", "EXERCISES", "EXERCISE_OF_CHECK", "GENERAL_NUDGES", "LESSONS"]


@dataclass(frozen=True)
class ExerciseHints:
    check: str
    title: str
    idea: str
    nudges: dict[str, str] = field(default_factory=dict)


LESSONS: dict[str, str] = {
    "01": "01_optimizer_memory.ipynb", "02": "02_ema.ipynb", "03": "03_adam_rule.ipynb",
    "04": "04_linear_quantization.ipynb", "05": "05_dynamic_map.ipynb", "06": "06_blockwise_quantization.ipynb",
    "07": "07_adam8bit_step.ipynb", "08": "08_triton_kernel.ipynb", "09": "09_memory_maths.ipynb",
    "10": "10_mixed_precision_finetune.ipynb", "11": "11_at_scale.ipynb", "12": "12_beyond_8_bits.ipynb",
    "13": "13_one_state_many_optimizers.ipynb", "14": "14_the_whole_bill.ipynb",
}

E = ExerciseHints

EXERCISES: dict[str, ExerciseHints] = {
    # ----------------------------------------------------------------------------------------------- 01
    "01.1": E("state_bytes_per_param", "Bytes of state per parameter",
              "Optimizer state is what the optimizer keeps between steps — Adam's two moments — not the weights "
              "or the gradients; an 8-bit state pays one byte per parameter plus one fp32 scale shared by a "
              "whole block.",
              {"default": "Count for one block of `blocksize` parameters first: how many bytes do the codes of both "
                          "states take, how many do their scales take? Then divide by the block's size.",
               "factor": "Your number is off by a clean factor: list the states (how many?), the bytes of one "
                         "entry of each, and how many parameters one scale serves, and multiply only those.",
               "refuse": "A kind the function does not know is a question it cannot answer: which exception says "
                         "'this value is not allowed', and where must it be raised so no number comes back?"}),
    "01.2": E("optimizer_state_bytes", "Optimizer state bytes of a model",
              "The exact bill is counted tensor by tensor: each tensor has its own blocks (the last one may be "
              "short), and tensors below the small-tensor threshold keep full-precision states.",
              {"default": "Work one small tensor and one large tensor by hand and compare with your function: which "
                          "of the two is wrong?",
               "last_block": "A tensor whose size is not a multiple of the block size still needs a scale for its "
                             "leftover elements: does your block count round up?",
               "count": "Check the boundary case the statement names: a tensor of exactly the threshold's size — is "
                        "it counted as small or as 8-bit in your code? And are blocks counted per tensor, not over "
                        "the sum of all tensors?",
               "factor": "Which tensors pay 8 bytes per parameter and which pay about 2? A factor off usually means "
                         "one of the two rules is applied to every tensor."}),
    "01.3": E("compute_optimizer_size", "Measuring a live optimizer",
              "A measurement walks the optimizer's actual state: every tensor in every per-parameter state dict, "
              "its elements times its element size — and a tensor shared by several states is memory only once.",
              {"default": "Print the keys and the types of one parameter's state dict: which entries are tensors, "
                          "which are plain numbers, and which tensor objects appear in more than one dict?",
               "count": "Two names can point at one tensor object: decide what identifies a tensor (its identity, "
                        "not its values) and count each identity once.",
               "factor": "Bytes, MiB: a MiB is 2**20 bytes, not 10**6 — and the element size depends on each "
                         "tensor's dtype (uint8 codes are one byte, not four).",
               "type": "The result is a pair: a number of megabytes and a number of elements, in that order."}),
    # ----------------------------------------------------------------------------------------------- 02
    "02.1": E("adam_moments", "Adam's two moving averages",
              "An exponential moving average keeps most of the old average and mixes in a small share of the new "
              "value; Adam keeps two — one of the gradient, one of its square — each with its own beta.",
              {"default": "Take beta = 0.9, an old average of 0 and a new value of 1: what should one update give? "
                          "Try your function on exactly that and compare.",
               "order": "Which of the two betas goes with the average of the gradient, and which with the "
                        "average of its square? Read them off the statement, not off the argument order.",
               "factor": "Does the old average get the large weight (beta) and the new value the small one "
                         "(1 - beta)? Swapping them gives an average that forgets almost everything at once.",
               "dtype": "Every operation on the inputs keeps their dtype unless you convert: where does a float64 "
                        "(a NumPy number, a Python double) or a new tensor of the default dtype slip in?",
               "shape": "Nothing in the rule needs a loop or a reshape: elementwise operations keep any shape, a "
                        "0-d tensor included."}),
    "02.2": E("bias_correct", "Bias correction",
              "Averages that start at zero are too small for the first steps by exactly the factor "
              "1 - beta**t; dividing by it undoes that, and the correction fades as t grows.",
              {"default": "With a constant gradient g, after t steps from zero the stored average is a known "
                          "fraction of g: the corrected value must be g itself. Test that with t = 1 and t = 5.",
               "first_step": "Which exponent does the first update use? Count steps from 1: after one update the "
                             "factor must be 1 - beta, not 1 - 1 = 0 and not 1 - beta**2.",
               "order": "Each moment has its own beta: which beta corrects the first moment, which the second?",
               "in_place": "The stored averages must stay uncorrected for the next step: build new tensors for "
                           "the corrected values instead of changing the ones you were given.",
               "denominator": "Bias correction only rescales: no square root belongs in this function."}),
    # ----------------------------------------------------------------------------------------------- 03
    "03.1": E("adam_step", "The Adam step",
              "Adam divides the bias-corrected first moment by the square root of the bias-corrected second "
              "moment (plus eps); its weight decay is L2 — a term added to the gradient before the moments "
              "see it.",
              {"default": "Compare one step of yours with torch.optim.Adam on a 3-element tensor, printing m, v "
                          "and p after the step: the first of the three that differs is where to look.",
               "decay": "In Adam, where does weight_decay enter — into what the moments average, or onto the "
                        "parameter directly? Only one of the two is Adam.",
               "first_step": "The first call has step = 1: what are the two correction factors then, and do you "
                             "use the updated moments or the old ones?",
               "denominator": "eps is added outside the square root, to the corrected second moment's root.",
               "in_place": "The caller keeps p, m and v: the function must change those very tensors (in-place "
                           "operations), not rebind local names to new ones.",
               "order": "Moments first, then the parameter: the update uses the moments after this step's "
                        "gradient went into them."}),
    "03.2": E("adamw_step", "The AdamW step",
              "AdamW decouples weight decay: it shrinks the parameter directly, in proportion to lr, before the "
              "Adam update, and the moments see only the plain gradient.",
              {"default": "Set the gradient to zero and weight_decay to 0.1: what should one AdamW step do to p? "
                          "Check your function against that before turning the gradient back on.",
               "decay": "Decoupled decay multiplies the parameter by a factor close to 1 that involves lr and "
                        "weight_decay; it never enters the gradient. Which of those does your code miss or add?",
               "order": "The decay acts on the parameter before the Adam update, not after it.",
               "first_step": "Same bias correction as Adam: step counts from 1.",
               "in_place": "p, m and v must be changed in place: the caller reads them after the call."}),
    # ----------------------------------------------------------------------------------------------- 04
    "04.1": E("absmax_quantize", "Absmax int8 quantization",
              "Absmax quantization scales a tensor so its largest magnitude lands on 127 and rounds every "
              "element to the nearest integer; the scale (the absmax) is kept to undo it.",
              {"default": "Try x = [-2.0, 1.0, 0.5]: what must the largest magnitude be, and which integer must "
                          "each element become? Compare with what your function returns.",
               "rounding": "Converting to an integer type cuts the fraction toward zero; the statement asks for "
                           "the nearest integer. Which operation rounds?",
               "sign": "The largest magnitude is the maximum of the absolute values: a tensor whose largest "
                       "entry is negative is the test.",
               "zero": "An all-zero tensor has absmax 0: what must the codes be then, and how do you avoid 0 / 0?",
               "dtype": "Two dtypes are asked for: the codes as int8, the absmax as a 0-d float32 tensor. Which of "
                        "yours differs?",
               "shape": "The absmax is one number: a 0-d tensor, not a tensor with a dimension of size 1, and the "
                        "codes keep the input's shape.",
               "type": "Return the pair (codes, absmax), both tensors — not Python numbers."}),
    "04.2": E("absmax_dequantize", "Absmax dequantization",
              "Dequantizing inverts the scaling: each integer code times the absmax over 127 gives back the "
              "value to within half a quantization step.",
              {"default": "Quantize a small tensor with 04.1 and dequantize it: is every element back within "
                          "absmax / 254 of the original?",
               "dtype": "The codes are int8: do the arithmetic in float32, or the result stays an integer.",
               "factor": "A constant factor off means the scale is inverted or 127 is used twice."}),
    # ----------------------------------------------------------------------------------------------- 05
    "05.1": E("dynamic_map", "The dynamic map from scratch",
              "The dynamic map spends its codes on seven decades, each with twice as many values as the one "
              "below it: the midpoints of evenly spaced points in [0.1, 1], scaled to the decade, mirrored for "
              "the sign, with 0 and 1 added.",
              {"default": "Build one decade by hand (i = 0) and compare its values with the same decade of "
                          "bitsandbytes' map: count, range, spacing.",
               "count": "Count entries per decade: n points give n - 1 midpoints; signed and unsigned maps use "
                        "different n. Does your total come to 256?",
               "rounding": "Bit-for-bit means the same arithmetic: every step in float32, in the same order, no "
                           "float64 in between.",
               "sign": "The signed map mirrors the positive decades only: 0 and 1 appear once, and -1 is not in "
                       "the map.",
               "shape": "A map of the wrong length is a wrong count: how many midpoints does each decade give, "
                        "which decades are mirrored, which values are added once? The total must be 256.",
               "order": "The map must come out sorted, from the most negative entry to 1.0."}),
    "05.2": E("nearest_code", "Nearest-code lookup",
              "Quantizing with a map means finding, for each value, the index of the closest map entry; in a "
              "sorted map that is one of the two neighbours around the value.",
              {"default": "Pick a value exactly halfway between two entries, one below the first entry and one "
                          "above the last: what index must each get? Test those three.",
               "rounding": "A tie goes to the lower index: compare the two distances with the right strictness.",
               "last_block": "Values beyond the ends of the map must clamp to the first or last index, never run "
                             "past it.",
               "dtype": "Indices into a 256-entry map fit in uint8, which is what the statement asks for.",
               "shape": "Work elementwise on the whole tensor so any shape comes back unchanged."}),
    "05.3": E("decode_code", "Decode a code",
              "A code of the dynamic map is a tree code: after the sign bit, the position of the leading 1 names "
              "the decade and the bits after it the fraction within that decade.",
              {"default": "Decode the two examples the task gives by hand, bit by bit, writing the index in "
                          "binary first; then compare each of the four fields your function returns.",
               "sign": "Negative entries mirror positive ones: which index maps to which positive entry?",
               "count": "The unsigned map has one more fraction bit, so its decade is found one position "
                        "differently: check an unsigned index separately.",
               "factor": "Within a decade the value is a midpoint: between two even points, not on one."}),
    # ----------------------------------------------------------------------------------------------- 06
    "06.1": E("quantize_blockwise", "Blockwise quantization",
              "Blockwise quantization gives every block of consecutive elements its own absmax, so one outlier "
              "costs precision only inside its own block.",
              {"default": "Take 600 elements with blocksize 256: how many blocks, how many elements in the last, "
                          "and which absmax scales element 550? Check those three in your result.",
               "last_block": "The last block may be short: it still counts as a block, with its own absmax "
                             "computed only from its real elements.",
               "block": "Element i belongs to block i // blocksize: do the scales line up with the elements "
                        "they divide?",
               "zero": "An all-zero block has absmax 0: what code must its elements get, and how do you avoid "
                       "dividing by zero there?",
               "axis": "Flatten in row-major order, reduce within each block, and give the codes the input's "
                       "shape back.",
               "dtype": "Codes are uint8, one absmax per block in float32."}),
    "06.2": E("dequantize_blockwise", "Blockwise dequantization",
              "Dequantizing looks each code up in the map and multiplies it by the absmax of the element's "
              "own block.",
              {"default": "Quantize 600 elements with 06.1 and dequantize them: which elements come back wrong — "
                          "the first block, the last, all?",
               "last_block": "The last block is short: the scale of each element follows from its position, not "
                             "from repeating every scale blocksize times.",
               "dtype": "A uint8 tensor used as an index is read as a mask by torch: convert the codes to an "
                        "integer index type first.",
               "shape": "The result has the codes' shape, in float32."}),
    # ----------------------------------------------------------------------------------------------- 07
    "07.1": E("adam8bit_step", "The 8-bit Adam step",
              "8-bit Adam dequantizes each block's states, runs the ordinary Adam(W) step in fp32, and "
              "requantizes with a fresh absmax per block — keeping the sign of every non-zero state and "
              "resetting the states of non-finite gradients.",
              {"default": "Run one block by hand, as the lesson does for SGD's one buffer: dequantize, update, "
                          "requantize — and compare m, v, p and the absmax after each stage with the library's "
                          "reference.",
               "first_step": "Bias correction needs this step's number, counting from 1.",
               "sign": "A small non-zero state must not round to zero or to the other sign when it is "
                       "requantized: what code does the smallest value of its own sign have?",
               "zero": "An element whose gradient is NaN or Inf: what happens to its states and to its "
                       "parameter this step? And an all-zero block of v?",
               "last_block": "The last block is short: its absmax comes from its own elements only.",
               "decay": "Decoupled decay: p shrinks by a factor involving lr and weight_decay before the "
                        "update, as in 03.2.",
               "in_place": "Everything is written back into the tensors you were given: parameter, codes and "
                           "scales.",
               "nonfinite": "NaN where there should be none: a square root of a negative second moment (is what v "
                            "averages never negative?), or a NaN/Inf gradient handled wrongly — its states reset to "
                            "zero, its parameter untouched this step, decay included.",
               "order": "Dequantize, update both moments, update p — decay first, then subtract the update — and "
                        "only then requantize.",
               "rounding": "Rounding happens where a value is stored: the codes once per step, a 16-bit parameter "
                           "once, when its new value is written back. Everything before that is computed in fp32."}),
    "07.2": E("adam8bit_optimizer", "The Adam8bit optimizer",
              "An optimizer is a loop over param groups and their parameters: hyperparameters come from each "
              "parameter's group, state lives in self.state[p] and is created on the first step, and small "
              "tensors keep fp32 states.",
              {"default": "Create your optimizer on two groups with different lr and step it once: does each "
                          "parameter use its own group's values, and does its state look like the statement's?",
               "first_step": "The step counter starts at 0 and is increased before the update, so the first "
                             "update is step 1.",
               "count": "Three counts to check: the threshold is inclusive (exactly min_8bit_size elements get "
                        "8-bit states, counted with numel); each parameter keeps its own step counter in its own "
                        "state; a parameter without a gradient is skipped and counts no step.",
               "last_block": "A size that is not a multiple of the block size needs one more absmax for its "
                             "short last block.",
               "state": "The state must be in self.state[p] with the names the statement gives, or "
                        "state_dict() cannot save it.",
               "axis": "The 8-bit step works on flat tensors: give it flat views of the parameter and of its "
                       "gradient."}),
    "07.3": E("stable_embedding", "The stable embedding",
              "The paper's stable embedding does three things: xavier-uniform initialisation, a LayerNorm on the "
              "looked-up vectors, and 32-bit optimizer states for the table even in an 8-bit optimizer.",
              {"default": "Check your module against the three items one by one: the initial weights' spread, the "
                          "normalisation in forward, and the override registered with bitsandbytes' manager.",
               "state": "The override is registered for the module's embedding parameter by name: which module "
                        "and which parameter name does the manager need?",
               "values": "Compare the spread of your initial weights with xavier-uniform's bound for this shape.",
               "axis": "Two things depend on the table's dimensions: xavier's bound uses both of them (rows and "
                       "columns), the LayerNorm normalises along the last one only."}),
    "07.4": E("trains_like_adam", "Training with your optimizer",
              "Training repeats one cycle: the loss of the current weights, its gradient by backward, one "
              "optimizer step; each step's gradient must come from that step's loss alone, and the curve records "
              "each loss before the step that follows it.",
              {"default": "Run your loop with torch.optim.SGD for three steps, at lr=0 and at lr=0.1, and compare "
                          "with the task's worked examples: which call is missing, doubled or in the wrong place?",
               "order": "Clear the gradients before backward, step after it; record the loss of this step "
                        "before the parameters change.",
               "count": "One loss per step, `steps` of them, as Python floats.",
               "factor": "The loss is the mean of the squared errors, not their sum.",
               "axis": "The loss compares each output with its own target: print the shape of the model's output "
                       "next to the shape of y."}),
    # ----------------------------------------------------------------------------------------------- 08
    "08.1": E("absmax_kernel", "A Triton absmax-per-block kernel",
              "A Triton program handles one block: it loads its offsets with a mask for the ragged tail, "
              "reduces them to one number, and stores it at its own program id.",
              {"default": "Which elements does program pid read? Write down its first and last offset, and what "
                          "the mask does in the last block.",
               "last_block": "Masked lanes must not win the max: what value should they load?",
               "block": "The offsets of program pid start at pid times the block size.",
               "sign": "The max is over magnitudes."}),
    "08.2": E("dequantize_kernel", "A Triton blockwise dequantization kernel",
              "Dequantizing in a kernel is a gather: each lane loads its code, loads the map entry at that code, "
              "and multiplies by its block's absmax.",
              {"default": "Check one program by hand: which absmax does it load, which map entries, and which "
                          "output lanes does it store (masked at n)?",
               "dtype": "A uint8 code must become a wider integer before it is an offset into the map.",
               "last_block": "Loads and stores of the last block are masked at n."}),
    "08.3": E("quantize_kernel", "A Triton nearest-code kernel (binary search)",
              "A binary search over the sorted map finds, in 8 halving steps, the last entry not above each "
              "value; the nearest code is that entry or the next one, whichever is strictly closer.",
              {"default": "Trace the search for one value by hand (8 steps from 128 down to 1) and compare with "
                          "the library's nearest code.",
               "rounding": "A tie keeps the lower index: the next entry wins only when it is strictly closer.",
               "zero": "An all-zero block has absmax 0: normalise by 1 there instead.",
               "last_block": "Masked lanes must not store codes past n."}),
    "08.4": E("ema_requantize_kernel", "A fused 8-bit EMA kernel",
              "The fused step keeps a block in registers: dequantize, update the moving average in fp32, take "
              "the new absmax over the valid lanes, and requantize — memory touched once.",
              {"default": "Check each stage of one block against dequantize → EMA → quantize done with the "
                          "library: which stage first differs?",
               "last_block": "Masked lanes read something: zero them before the max, or they can become the "
                             "new absmax.",
               "order": "The new absmax is taken after the EMA, from the updated values.",
               "in_place": "Codes and absmax are written back in place."}),
    # ----------------------------------------------------------------------------------------------- 09
    "09.1": E("state_megabytes", "The seed numbers",
              "The estimate counts bytes per parameter (8 for fp32 Adam, 2 for the codes plus the scales of each "
              "block) and converts bytes to MiB by dividing by 2**20.",
              {"default": "Work DistilBERT's codes alone by hand (the task gives them) and compare with yours; "
                          "then add the scales.",
               "factor": "MiB is 2**20 bytes; a factor like 1.05 or 0.95 is MB against MiB.",
               "last_block": "Blocks are counted rounding up.",
               "refuse": "An unknown kind must raise an error that names it, not fall back to a number."}),
    "09.2": E("training_memory", "A full training memory budget",
              "Training memory is weights + gradients + optimizer state (activations apart): weights and "
              "gradients at their own element size, the state by the per-tensor rule of 01.2.",
              {"default": "Run it on a tiny model you can count by hand (one Linear) and compare each entry.",
               "dtype": "A bf16 parameter takes 2 bytes, and so does its gradient: use each tensor's element size.",
               "keys": "Four entries, with the names the statement gives, all in bytes.",
               "count": "A tied weight (one tensor used twice) is one parameter: count each tensor once."}),
    "09.3": E("adamw_state_elements", "The seed's 131,566,188",
              "torch's AdamW keeps, per trained parameter, two moments shaped like it and a one-element step "
              "counter; frozen parameters get no state.",
              {"default": "Count for a model of two tensors by hand, then build AdamW on it, step once, and count "
                          "its state: which term do you miss?",
               "count": "One extra element per trained tensor — the step counter — and nothing for frozen ones.",
               "factor": "Two moments per parameter, not one and not three."}),
    "09.4": E("seed_adam8bit", "Adam8bit as the seed builds it",
              "The seed builds its own optimizer: two parameter groups (decay for everything outside LayerNorm "
              "that is not a bias, none for the rest), then bitsandbytes' Adam8bit with the arguments' "
              "hyperparameters.",
              {"default": "Print the names in each of your two groups: is every parameter in exactly one?",
               "decay": "Which group gets args.weight_decay, which 0.0 — and is args.weight_decay passed, not a "
                        "constant?",
               "count": "Build the second group from the names that are not in the first, so nothing is in "
                        "both or neither."}),
    # ----------------------------------------------------------------------------------------------- 10
    "10.1": E("decay_parameter_names", "Weight-decay parameter names",
              "Weight decay skips biases and every parameter of a normalisation layer, and the layer is known by "
              "its type, not by its attribute name.",
              {"default": "Print every module with its type and its own parameters: for each, decide by hand "
                          "whether it decays, and compare with your list.",
               "count": "Each parameter once: walk the modules with their own parameters only, and include "
                        "parameters that belong to the model itself.",
               "values": "A normalisation layer may be called anything, and a layer whose name contains 'norm' "
                         "may be a Linear: look at the class."}),
    "10.2": E("training_step", "Mixed-precision training step",
              "Mixed precision runs the forward under autocast (16-bit compute) while the weights and the "
              "optimizer stay fp32; backward, optimizer step and scheduler step follow, then the gradients are "
              "cleared.",
              {"default": "Write down the five calls of one step in order and check each against yours: which is "
                          "missing or misplaced?",
               "order": "The optimizer steps before the scheduler, and the gradients are cleared after the step.",
               "dtype": "Do not cast the model: only the forward runs under autocast with the given dtype.",
               "type": "Return the loss as a Python float."}),
    "10.3": E("trainer_8bit", "Trainer with 8-bit Adam",
              "Handing Trainer your own optimizer means passing it every hyperparameter yourself — groups with "
              "and without decay, lr, betas, eps — and letting Trainer build only the schedule.",
              {"default": "Print your optimizer's param groups after building the Trainer: lr, betas, eps and "
                          "weight_decay of each — do they come from args?",
               "decay": "Two groups: the decay names get args.weight_decay, the others 0.0.",
               "type": "`optimizers` takes a pair: the optimizer and the scheduler (None lets Trainer build it)."}),
    "10.4": E("accelerate_epoch", "The accelerate training loop",
              "With accelerate the loop stays yours, but backward and gradient clipping go through the "
              "accelerator, which handles scaling and synchronisation.",
              {"default": "List the calls of one batch in order and compare with yours: which one goes through "
                          "the accelerator?",
               "order": "Clip after backward and before the optimizer step; the scheduler steps after the "
                        "optimizer; gradients are cleared last.",
               "values": "Put the model in training mode first: it may come back from an evaluation."}),
    "10.5": E("amp_step", "An fp16 step with a GradScaler",
              "A GradScaler multiplies the loss before backward so small fp16 gradients survive, divides the "
              "gradients back before clipping and stepping, and skips the step (halving its scale) when a "
              "gradient overflowed.",
              {"default": "Write the order of the scaler's calls around backward and the optimizer step, then "
                          "compare it with yours call by call.",
               "order": "Unscale before clipping (clipping scaled gradients clips the wrong norm); the scaler "
                        "steps the optimizer, then updates itself.",
               "factor": "Return the loss itself, not the scaled loss."}),
    # ----------------------------------------------------------------------------------------------- 11
    "11.1": E("per_rank_bytes", "Per-rank memory",
              "DDP replicates everything, ZeRO-1 shards only the optimizer states, FSDP2 shards weights, "
              "gradients and states; a rank holds the shards it owns.",
              {"default": "Work one strategy by hand for 10 parameters on 4 ranks: how many parameters does "
                          "the largest rank own, and which of the three terms are sharded?",
               "last_block": "The largest shard rounds up, and its blocks round up again.",
               "keys": "Three entries, weights, gradients and states, all in bytes.",
               "factor": "States: 8 bytes per parameter for fp32 Adam, 2 plus the scales for 8-bit."}),
    "11.2": E("shard_range", "FSDP2 shards",
              "FSDP2 splits a parameter along its first dimension like torch.chunk: equal chunks of rows "
              "rounded up, so the last ranks may get fewer rows or none.",
              {"default": "Work shape (5, 3) on 4 ranks by hand: rows per rank, then each rank's flat range.",
               "last_block": "A rank past the last row gets an empty range, clipped to the end.",
               "type": "A tuple of two Python ints.",
               "factor": "Flat positions count elements: rows times the size of one row."}),
    "11.3": E("local_state_bytes", "8-bit states of a shard",
              "Under FSDP2 a shard's 8-bit states have their own local blocks, while the full parameter's size "
              "decides between 8-bit and fp32 states.",
              {"default": "Work one shard by hand: its number of elements from 11.2, then its blocks, then the "
                          "bytes.",
               "count": "Decide 8-bit or fp32 by the full parameter, not the shard.",
               "last_block": "Local blocks round up; an empty shard holds nothing."}),
    # ----------------------------------------------------------------------------------------------- 12
    "12.1": E("pack_nibbles", "Two codes per byte",
              "Two 4-bit codes share a byte: the first in the upper nibble, the second in the lower one, with "
              "an odd count padded by one zero code at the end.",
              {"default": "Pack [1, 2, 3] by hand, in binary: which bytes must come out? Then unpack them.",
               "order": "Which of a pair goes to the high nibble: the even-index code or the odd one?",
               "last_block": "An odd count gets one zero code of padding at the end; unpacking returns only the "
                             "first n codes.",
               "dtype": "Bit operations belong on integer tensors; the result is uint8."}),
    "12.2": E("zero_point_victims", "The zero-point victims",
              "A second moment coded to 0 makes the next update m / eps — thousands of learning rates — for "
              "every entry whose first moment is not coded to 0 as well.",
              {"default": "For one block, write down what the next update actually reads — both moments as "
                          "they come back from their codes. Which combination of the two blows the update up to "
                          "m / eps?",
               "values": "Which m does the update see: the fp32 one or the one decoded from its 4-bit code?",
               "last_block": "The last block may be short: pad and drop the padding again.",
               "zero": "Flag by the decoded values, after quantizing, not by the inputs."}),
    "12.3": E("rank1_scale", "Rank-1 normalization",
              "Rank-1 normalisation scales each entry by the smaller of its row's and its column's largest "
              "magnitude: r + c numbers instead of one per block.",
              {"default": "Work a 2 × 3 matrix by hand: the row maxima, the column maxima, and the smaller of the "
                          "two for each entry.",
               "axis": "A reduction along one axis gives one number per row or per column; keep the reduced "
                       "dimension so both broadcast back to the matrix's shape.",
               "sign": "Maxima of magnitudes."}),
    "12.4": E("stochastic_round", "Stochastic rounding to bf16",
              "Stochastic rounding rounds up with probability equal to the distance from the lower bf16 "
              "neighbour, as a fraction of the step, so the rounded value is right on average.",
              {"default": "Take a value a quarter of a bf16 step above a bf16 number: over many draws, how often "
                          "must it round up? Measure your function.",
               "values": "A number bf16 holds exactly must never move: what is its lower 16 bits' fraction?",
               "sign": "For negative numbers, the neighbour toward zero is the one above: work in magnitudes "
                       "(the bits), not in values.",
               "rounding": "Draw every random number from the generator you are given, once per element."}),
    # ----------------------------------------------------------------------------------------------- 13
    "13.1": E("lion8bit", "Lion8bit on the core",
              "Lion keeps one state and steps by the sign of an interpolation between that state and the "
              "gradient; the state itself is then updated with a second beta — the two betas play different "
              "parts.",
              {"default": "Step your rule by hand once on three numbers (one positive gradient, one negative, one "
                          "zero) and compare p and m with adam8lib.Lion8bit's.",
               "order": "Three updates: decay, the sign step, the state update. The sign is taken from the "
                        "interpolation with the old state, before the state changes; and the pair of betas comes "
                        "in a fixed order — the first for the step's direction, the second for the state.",
               "sign": "The update is the sign of an interpolation with beta1, not of the state or of the "
                       "gradient alone.",
               "in_place": "The rule updates its states in place but must not change the gradient in place; "
                           "compute the interpolation in a new tensor.",
               "refuse": "check(group) refuses exactly: an lr or weight_decay that is negative, NaN or not a "
                         "number, and a beta outside [0, 1) — naming the argument — and accepts everything else, "
                         "lr = 0 included. Which case does yours get wrong?",
               "none": "update must return the new parameter.",
               "decay": "Decoupled decay multiplies p by a factor involving lr and weight_decay."}),
    "13.2": E("state_bytes", "The bytes of one state",
              "A state's bytes are its codes plus its scales: one or half a byte per element, one fp32 scale "
              "per block (or, for 4-bit second moments of tensors with two or more dimensions, one per index of "
              "each axis), with small tensors in fp32.",
              {"default": "Work shape (4, 32, 64) by hand for each format and state: codes, then scales.",
               "last_block": "Blocks and half-bytes round up.",
               "axis": "Rank-1 scales apply to every tensor of two or more dimensions: one number per index "
                       "of EACH axis — for (4, 32, 64), 4 + 32 + 64 numbers, not the first axis plus the others "
                       "flattened.",
               "count": "Tensors below 4,096 elements are fp32 in every format.",
               "factor": "Count the bytes of each part: fp32 takes 4 per element, an 8-bit or FP8 code 1, a 4-bit "
                         "code half; each scale is fp32; and below 4,096 elements every format is fp32."}),
    "13.3": E("lion_flips", "The signs Lion loses",
              "Lion's update sees only the sign of the interpolation, so a stored state's rounding matters only "
              "where that sign flips.",
              {"default": "Compute the sign of the interpolation twice, with the fp32 m and with the m coded and "
                          "decoded by the format, and compare them.",
               "values": "The gradient stays fp32: only m goes through the format.",
               "zero": "A sign of exactly zero is a sign too: an interpolation that is 0 one way and not the "
                       "other is a flip.",
               "sign": "The sign that matters is the interpolation's, not the sign of m itself: a small m can flip "
                       "without changing the step, and an unchanged sign of m can still change it.",
               "order": "Which term of the interpolation gets beta1, the stored m or the new gradient? Read it "
                        "off lesson 13's rule, not off the order of the arguments.",
               "error": "Print the shape of each tensor the failing line combines: what the format decodes comes "
                        "back flat, so the stored m needs m's shape again before it meets g."}),
    # ----------------------------------------------------------------------------------------------- 14
    "14.1": E("release_by_hand", "Step and free, one parameter at a time",
              "Gradient release steps each parameter in a hook that runs as soon as its gradient is complete, "
              "then frees that gradient, so all gradients never exist at once.",
              {"default": "Check the three things: one optimizer per parameter that requires a gradient, a "
                          "post-accumulate-grad hook on each, and the list of handles returned.",
               "order": "Inside the hook, this parameter's optimizer steps first and its gradient is freed "
                        "after; with no freeing, every gradient stays alive to the end of backward.",
               "hook": "Test one hook alone: is it the kind that runs once the gradient is complete (a tensor "
                       "used twice gets one summed gradient)? Does it step this parameter's own optimizer (a "
                       "function made in a loop sees the loop's last values unless you bind them), free the "
                       "gradient after the step, return None? One per trainable tensor?",
               "count": "Each tensor once, and only those that require a gradient."}),
    "14.2": E("bill_row", "A row of the bill",
              "A row of the bill reads the tracker at the end of backward and at its peak, and divides every "
              "byte count by the number of parameters.",
              {"default": "Print the snapshot at the end of backward and the one where the bill is highest: which "
                          "of your entries comes from which moment? Every number of the peak belongs to ONE moment "
                          "(the parts do not peak together, least of all in a first step that makes its state), and "
                          "the largest gradient is the one alive then.",
               "factor": "Per parameter: divide by the tracker's number of parameters.",
               "keys": "The keys the statement names, each a Python float.",
               "rounding": "Bytes per parameter is a fraction: which division keeps the fraction, and which drops "
                           "it? Print one value with each.",
               "type": "The row is a dict of the statement's keys, and every number in it a Python float, even "
                       "one that comes out whole (not a tensor, not an int): print type() of each of your values."}),
}

del E

#: check name (without ``check_``) -> exercise id
EXERCISE_OF_CHECK: dict[str, str] = {hints.check: exercise for exercise, hints in EXERCISES.items()}

#: level-3 nudges for the mistakes that look alike in every exercise (no return, a type, an error, in place,
#: shape, dtype, NaN/Inf, keys, a refused argument), for an exercise without a nudge of its own for it
GENERAL_NUDGES: dict[str, str] = {
    "stub": "Replace the stub's raise line with your code, run that cell, then run the check cell again.",
    "none": "The function computes its result but never hands it back: every path must end in a return of "
            "the result.",
    "type": "Compare the type of what you return with what the statement asks for: a tensor, a tuple of "
            "tensors, a Python number — a tuple where a tensor is expected, or the other way round, is the "
            "usual slip.",
    "error": "Read the last line of the traceback: which line of yours raised, and what does torch say about "
             "the shapes or dtypes there? Try that line alone on the same input.",
    "in_place": "Work on new tensors (out-of-place operations, or a clone first) so the inputs come back as "
                "they were given.",
    "shape": "Print the shape of your result next to the input's: which dimension was added, dropped or "
             "swapped?",
    "dtype": "Print the dtype at each line: where does it change, and what does the statement ask for?",
    "nonfinite": "A NaN or Inf usually comes from 0 / 0 or x / 0: which input makes a denominator zero? And where "
                 "the input itself is NaN or Inf, what does the statement say must happen?",
    "keys": "Compare your keys with the statement's, letter by letter.",
    "refuse": "List the arguments the statement says must be refused and try each one.",
    "dtype_mix": "Two tensors in one operation have different dtypes: decide the dtype each result must have.",
    "values": "Test on the smallest input you can work by hand, and compare every intermediate value.",
    "check": "Read the check's first line again: it names the input and the property; reproduce that input "
             "alone.",
}
