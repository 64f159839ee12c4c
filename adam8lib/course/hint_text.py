"""The words of ``hint("NN.k")`` (:mod:`adam8lib.course.hints`): per graded exercise, the idea to revisit
and the nudges for the usual mistakes — ideas and questions, never the code.

* :data:`EXERCISES` — exercise id -> :class:`ExerciseHints`: its check (the name without ``check_``, as in
  :data:`adam8lib.course.grading.lessons.SECTIONS`, which gives the lesson section), a short title, ``idea``
  (level 1: one sentence on what the lesson section teaches) and ``nudges`` (level 3: keyed by the property
  that failed or the mistake the check's hint names — see :data:`adam8lib.course.hints.TOPICS` — with a
  ``"default"`` for any other mistake).
* :data:`FOCUS` — per exercise, the mistakes its checks name: a pattern of the check's words, the part of the
  lesson it belongs to (level 1) and a nudge (level 3); merged into :data:`EXERCISES` (``parts``, ``mistakes``,
  ``nudges``).
* :data:`GENERAL_NUDGES` — the level-3 nudge for a mistake that looks alike in every exercise (no return, a
  type, an error, an input changed in place, ...) when the exercise has none of its own.
* :data:`RULES` / :data:`GENERIC_OPENINGS` — the openings of a check's hint that restates the rule and names no
  mistake; :data:`LOCATE` — level 3 then: how to find the mistake on the failing case.
* :data:`LESSONS` — workbook number -> lesson notebook.

A course test holds every text to containing no line of the solutions' code.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

__all__ = ["ExerciseHints", "EXERCISES", "EXERCISE_OF_CHECK", "FOCUS", "GENERAL_NUDGES", "GENERIC_OPENINGS", "LESSONS",
           "LOCATE", "NUDGE_PARTS", "RULES"]


@dataclass(frozen=True)
class ExerciseHints:
    check: str
    title: str
    idea: str
    nudges: dict[str, str] = field(default_factory=dict)
    #: level 1, when a failure is recorded: mistake key -> which part of the section (which concept) the failing
    #: property belongs to, "your X — the lesson's part on Y"
    parts: dict[str, str] = field(default_factory=dict)
    #: (mistake key, pattern): the exercise's own mistakes, found by the pattern in the check's hint (the part before
    #: a restated rule), first match wins — see :func:`adam8lib.course.hints.aim`
    mistakes: tuple[tuple[str, str], ...] = ()


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
               "error": "Print the shape of each tensor the failing line combines, and of what you hand the format and "
                        "what it gives back: the format codes a flat tensor and decodes a flat one — m goes in "
                        "flattened, and the stored m needs m's shape again before it meets g."}),
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

#: per exercise, the mistakes its checks name, each ``(key, pattern, part, nudge)``: ``pattern`` finds the mistake
#: in the check's hint, before any topic of its words ("" — reached through a topic key of
#: :data:`adam8lib.course.hints.TOPICS` only); ``part`` says, at level 1, which part of the lesson section the
#: failing property belongs to; ``nudge`` is the level-3 nudge ("" — the exercise's ``nudges`` has one). Patterns
#: are tried in order, the first match wins. Keys shared across exercises: ``result_order`` (the items of a returned
#: tuple in the wrong order), ``absmax`` (a scale forgotten or miscounted), ``states`` (how many states).
FOCUS: dict[str, list[tuple[str, str, str, str]]] = {
    "01.1": [
        ("refuse", r"KeyError|raise ValueError", "an unknown kind — the statement's error for a kind it does not know",
         ""),
        ("units", r"\bbits\b|32 bytes",
         "the size of one entry — bytes, not bits, for an fp32 number and for a uint8 code",
         "How many bytes does one fp32 number take, and one uint8 code? Write both down before you multiply."),
        ("blocksize", r"blocksize argument",
         "the block size in your count — how the scales' cost per parameter depends on it",
         "Call your function with two different block sizes: should the answer change, and by how much?"),
        ("states", r"(?-i:\bONE\b)|parameter and its gradient",
         "which tensors are optimizer state — the lesson's part on what Adam keeps between steps (not p, not its "
         "gradient)",
         "List by name what Adam keeps between two steps: how many states, and are the parameter or its gradient "
         "among them? Then give each its bytes."),
        ("absmax", r"absmax",
         "the scales in your count — the lesson's part on one fp32 absmax per block, for each of the two states",
         "Draw one block of `blocksize` parameters: how many absmax numbers do its two states store, how many bytes "
         "is each, and how many parameters share them?"),
        ("count", "", "your count of states and scales — the lesson's part on what Adam keeps between steps", ""),
        ("factor", "", "a whole-number factor in your count — the lesson's list of states, entries and scales", ""),
    ],
    "01.2": [
        ("absmax", r"forgot the absmax|one absmax per block",
         "the scales of each 8-bit tensor — one fp32 absmax per block for m, one for v",
         "For one 8-bit tensor of 4,096 elements: how many blocks, how many absmax per block (one per state?), and "
         "how many bytes is that?"),
        ("count", r"small-tensor rule|own blocks|over all tensors", "", ""),
        ("kind", r"ignored kind",
         "the optimizer kind — AdamW pays the same per parameter for every tensor, whatever its size",
         "Call your function with kind='adamw' on one large tensor: which rule applies there, and does your code "
         "look at kind before it looks at the size?"),
        ("elements", r"first dimension",
         "the number of elements of a tensor — the product of its whole shape",
         "How many elements does a (768, 768) tensor have? Compare with the number your code takes from that shape."),
        ("last_block", "", "your block count — the lesson's part on the last, short block of a tensor", ""),
        ("factor", "", "a whole-number factor — which tensors pay fp32 states and which pay 8-bit ones", ""),
    ],
    "01.3": [
        ("result_order", r"returned \(elements",
         "the order of the pair you return — megabytes first, then elements",
         "Which of the two numbers does the statement put first? Print your pair next to that sentence."),
        ("sizes", r"4 bytes|element_size",
         "each tensor's element size — a uint8 code is one byte, an fp32 number four",
         "What is the element size of a uint8 code, and of an fp32 number? Multiply each tensor's elements by its "
         "own size."),
        ("every_tensor", r"left out some",
         "every tensor of each state dict — the moments, the scales, the maps and the step counters",
         "Print every key of one state dict with type() and shape: which of those tensors does your loop skip?"),
        ("elements", r"tensors, not elements",
         "the element count — the sum of the tensors' elements, not the number of tensors",
         "Does your count add tensors or their elements? Work it for a state of two tensors of 3 elements each."),
        ("factor", r"10\*\*6|MiB", "your unit — MiB is 2**20 bytes, and each tensor's element size is its own", ""),
        ("count", r"once per state|SAME", "what is counted once — a tensor shared by several states is memory only "
         "once", ""),
    ],
    "02.1": [
        ("factor", r"gave beta2? to the new",
         "which weight the old average gets — the lesson's update of an EMA, old value kept, new one mixed in", ""),
        ("square", r"averaged (g,|\|g\||m \* m)|squared \(1",
         "what the second moment averages — the square of the gradient, nothing else squared",
         "What does v average: the gradient, its magnitude, or its square — and does anything besides g get squared? "
         "Work one element with g = 2 and beta2 = 0.5 by hand."),
        ("order", r"used beta[12] for",
         "which beta goes with which moment — the lesson's two averages, each with its own beta", ""),
        ("result_order", r"returned \(v",
         "the order of the two moments you return",
         "Which moment comes first in the pair the statement asks for? Print yours next to that sentence."),
        ("dtype", "", "your result's dtype — every operation keeps the inputs' dtype unless something converts it",
         ""),
    ],
    "02.2": [
        ("both", r"uncorrected|corrected m only|corrected v with",
         "which moment gets which correction — each moment divided by its own factor, with its own beta",
         "Correct the two moments separately: which beta belongs to m's factor, which to v's? Check both outputs "
         "at step 1, where the correction is largest."),
        ("first_step", r"divided by beta\*\*step|1 - beta \* step",
         "the correction factor at a given step — the lesson's 1 - beta**t and why the first steps need it", ""),
        ("result_order", r"returned \(v_hat", "the order of the two corrected moments you return",
         "Which corrected moment comes first in the pair the statement asks for?"),
        ("order", "", "which beta corrects which moment", ""),
    ],
    "03.1": [
        ("corrected", r"bias-corrected m and v in place",
         "the stored moments — kept uncorrected for the next step; the corrected ones are new values",
         "After your step, print m: is it the running average the next step needs, or its corrected value? Which of "
         "the two should stay in the caller's tensor?"),
        ("in_place", r"did not change|rebinds|made new tensors|makes a new tensor",
         "how the step hands its result back — the caller's p, m and v changed in place", ""),
        ("betas", r"used beta1 for v|used beta2 for m",
         "which beta each moment uses — the first moment's beta1, the second moment's beta2",
         "Which beta goes with the average of the squared gradient? Read both off the statement and check each "
         "moment after one step."),
        ("first_step", "", "the first step — bias correction counted from step 1", ""),
        ("decay", "", "your weight decay — Adam's L2 term, added to the gradient before the moments", ""),
        ("denominator", "", "the denominator — eps added to the root of the corrected second moment", ""),
    ],
    "03.2": [
        ("corrected", r"bias-corrected m and v in place",
         "the stored moments — kept uncorrected for the next step; the corrected ones are new values",
         "After your step, print m: is it the running average the next step needs, or its corrected value? Which of "
         "the two should stay in the caller's tensor?"),
        ("in_place", r"did not change|rebinds|made new tensors|makes a new tensor",
         "how the step hands its result back — the caller's p, m and v changed in place", ""),
        ("denominator", r"eps inside",
         "the denominator — where eps sits relative to the square root",
         "Where does eps go: under the square root or after it? Compare the two by hand for a second moment of 0 "
         "and of 1e-4."),
        ("sign", "", "the direction of the step — against the gradient",
         "Take one positive gradient: should p go up or down after the step? Does yours?"),
        ("factor", "", "the size of the step — lr times the corrected ratio, nothing more",
         "Your step is off by a constant factor or a slowly varying one: count how often lr enters, and what else "
         "multiplies or divides the update. Is eps added, or multiplied in?"),
        ("zeroed", r"all zeros",
         "the state the step leaves behind — m after the update, as the next step reads it",
         "Print m after your step: is it the new average, or was it reset, or never written?"),
        ("decay", "", "your decoupled decay — the parameter shrunk directly, before the Adam update", ""),
    ],
    "04.1": [
        ("sign", r"max\(x\)|quantized \|x\|", "the sign of the values — absmax is the largest magnitude, codes keep "
         "the sign", ""),
        ("scale127", r"\b128\b",
         "the scale — why the largest magnitude lands on 127, the largest int8 value",
         "What is the largest value int8 holds? Quantize x = [1.0] by hand: which code must it get, and which does "
         "yours give?"),
        ("result_order", r"returned \(absmax", "the order of the pair you return — codes first, then the absmax",
         "Which comes first in the pair the statement asks for: the codes or the absmax?"),
        ("rounding", "", "rounding — to the nearest integer, not toward zero", ""),
        ("zero", "", "an all-zero tensor — its absmax is 0", ""),
        ("dtype", "", "your result's dtypes — int8 codes, a float32 absmax", ""),
    ],
    "04.2": [
        ("scale", r"divided by 128|multiplied by 127|divided by absmax|did not multiply by absmax",
         "undoing the scale — the same 127 and the same absmax as quantizing, the other way round",
         "Quantizing divided by the absmax and multiplied by 127: which operation undoes each? Dequantize the code "
         "127 of a tensor whose absmax is 2 by hand — it must give 2."),
        ("rounding", r"floor division|rounded the result",
         "the result's fractions — dequantized values are not whole numbers",
         "Dequantized values are fractions: which of your operations drops them — a division, a rounding?"),
        ("offset", r"shifted by a constant|offset",
         "the code-to-value rule — code 0 is the value 0",
         "Dequantize code 0 by hand: which value must come out? Compare with yours."),
        ("sign", "", "the sign of the values — a negative code gives a negative value",
         "Dequantize one negative code by hand: must the value be negative? Does anything in your code take a "
         "magnitude?"),
        ("dtype", "", "your result's dtype — the arithmetic in float32", ""),
        ("factor", "", "a constant factor — the scale inverted, or 127 used twice", ""),
    ],
    "05.1": [
        ("decades", r"10x too",
         "the powers of ten — which decade ends at 1 and how far down the lowest one starts",
         "Which decade ends at 1, and what is the smallest value of the lowest one? Print the first and last entry "
         "of each of your decades."),
        ("order", r"did not sort", "the order of the map — sorted, for the nearest-code search", ""),
        ("midpoints", r"midpoints of linspace",
         "the values inside a decade — midpoints between evenly spaced points",
         "Between two points a and b, which midpoint does the lesson take — the arithmetic or the geometric one? "
         "Work one by hand in the top decade."),
        ("count", "", "the number of entries — midpoints per decade, signed and unsigned", ""),
        ("rounding", "", "bit-for-bit values — the same float32 arithmetic as bitsandbytes", ""),
        ("sign", "", "the signed map — the mirror of the positive decades", ""),
    ],
    "05.2": [
        ("last_block", r"clamp", "values beyond the ends of the map — the first and last index", ""),
        ("neighbours", r"searchsorted's index|entry before it",
         "the two neighbours around a value in a sorted map — which one is nearer",
         "For a value between two map entries, which two indices are candidates? Compute both distances by hand "
         "for one value and pick the nearer."),
        ("search", r"linear formula",
         "why the dynamic map needs a search — its entries are not evenly spaced",
         "Print the first ten map entries: are they evenly spaced? Which index does your formula give for 0.001, "
         "and which entry is really nearest?"),
        ("scaled", r"divided x by its absmax",
         "what nearest_code receives — values already scaled to [-1, 1]",
         "What range are the values in when nearest_code gets them? Does your function change them before the "
         "lookup?"),
        ("rounding", "", "a tie between two entries — it goes to the lower index", ""),
    ],
    "05.3": [
        ("factor", r"grid point", "the value inside a decade — a midpoint between two grid points", ""),
        ("decades", r"10x too",
         "the powers of ten — which decade covers [0.1, 1]",
         "Which decade covers [0.1, 1]? Decode one index of that decade by hand and check its power of ten."),
        ("sign", r"negative (entries|codes)|for the negative", "the negative codes — the mirror of the positive ones",
         ""),
        ("one", r"1\.0 is",
         "the entry 1.0 — above the seven decades, with no fraction",
         "Which index holds 1.0, and what sign, decade and fraction does the statement give it?"),
        ("fields", r"returned only",
         "what a decode returns — the four fields, in order",
         "How many fields does a decoded code have, and in which order? Return all of them."),
        ("leading_one", r"bit_length|whole tree code",
         "the tree code — the position of its leading 1 (the decade) and the bits after it (the fraction)",
         "Write one tree code in binary, say 0b1011: at which position is its leading 1, counting from 0, and "
         "which bits come after it? Compare both with what your code computes."),
        ("count", "", "the unsigned map — one more fraction bit", ""),
    ],
    "06.1": [
        ("sign", r"max\(x\)|treats the sign", "the sign of the values — absmax is the largest magnitude of a block",
         "Take a block whose largest entry in magnitude is negative: what is its absmax, and what does yours give?"),
        ("map", r"rounded linearly",
         "the codes — the index of the nearest entry of the dynamic map, not a linear rounding",
         "What is a code here: a rounded number, or the index of a map entry? Quantize one value by hand with the "
         "map and compare."),
        ("axis", r"right sign everywhere but the wrong size",
         "the order of the elements — flattened in row-major order before the blocks are cut", ""),
        ("last_block", "", "the last, short block — its own absmax from its real elements", ""),
        ("block", "", "which block an element belongs to — its index divided by the block size", ""),
        ("zero", "", "an all-zero block — its absmax is 0", ""),
    ],
    "06.2": [
        ("block", r"i // blocksize|% number_of_blocks",
         "which absmax scales an element — the one of its own block, element i in block i // blocksize",
         "Which block does element i belong to? Write the scale index of elements 0, 255, 256 and 600 for blocksize "
         "256, and compare with the scale your code gives each."),
        ("map", r"multiplied the codes|linear dequantization|NEIGHBOURING map entry",
         "the codes — indices into the map, looked up before any scaling",
         "What is a code: a value, or the index of a map entry? Decode code 255 and code 0 by hand with the map."),
        ("scale", r"forgot the scale|divided by absmax",
         "the scale — the map's normalised value times its block's absmax",
         "The map gives values in [-1, 1]: what turns one back into the size of the original? Work one element by "
         "hand."),
        ("last_block", "", "the last, short block — each element's scale follows from its position", ""),
    ],
    "07.1": [
        ("in_place", r"rebinds|did not change|IN PLACE|nothing changed",
         "how the step hands its result back — everything written into the tensors you were given", ""),
        ("direction", r"ADDED the update", "the direction of the step — against the gradient",
         "Take one positive gradient: should p go up or down after the step? Does yours?"),
        ("maps", r"qmap[12]|signed map",
         "the two maps — the signed one for m, the unsigned one for v",
         "Which of the two maps has negative entries, and which moment can be negative? Check which map each of "
         "yours is coded with."),
        # upper case only: the check's rule restated ("requantize with a fresh absmax per block") names no mistake
        ("absmax", r"(?-i:OLD absmax|FRESH absmax)",
         "requantizing — a fresh absmax per block from the updated states",
         "After the update, which absmax must the codes be divided by: the one the states came with, or one taken "
         "from the new values?"),
        ("order", r"requantized \(8-bit\)|from the requantized", "", ""),
        ("factor", r"up to a constant factor",
         "the size of one quantity — the step size, or a stored scale, off by a constant",
         "One quantity is off by a constant factor everywhere: the check names which. Count how often lr (or the "
         "scale) enters that quantity in your code."),
        ("denominator", r"under the square root|divided sqrt",
         "the denominator — the corrected second moment's root, then eps",
         "Write the denominator for one element by hand: which correction goes under the square root, and where is "
         "eps added?"),
        ("m_path", r"^p, m, absmax of m are wrong while v, absmax of v are right",
         "m's path — dequantizing m with its own map (the signed one) and its absmax, its EMA, requantizing it",
         "Only m (and p, which uses it) is wrong; v is right. Follow m alone through one block of your step: which map "
         "do you decode its codes with — the one with negative entries? —, which absmax, which beta, and which map "
         "and absmax when you code it again? Print each stage beside the library's reference."),
        ("v_path", r"^p, v, absmax of v are wrong while m, absmax of m are right",
         "v's path — dequantizing v with its own map (the unsigned one) and its absmax, its EMA of g * g, requantizing it",
         "Only v (and p, which uses it) is wrong; m is right. Follow v alone through one block of your step: which map "
         "do you decode its codes with, which absmax, what does its EMA average, and which map when you code it "
         "again? Print each stage beside the library's reference."),
        ("first_step", "", "the step number — bias correction counted from 1", ""),
        ("zero", "", "special elements — a non-finite gradient, an all-zero block", ""),
        ("last_block", "", "the last, short block — its absmax from its own elements", ""),
        ("decay", "", "your decoupled decay — before the update", ""),
        ("nonfinite", "", "NaN where there should be none — the rule for non-finite gradients", ""),
        ("rounding", "", "where rounding happens — once, when a value is stored", ""),
    ],
    "07.2": [
        ("checkpoint", r"loads a checkpoint|attributes set during|that is what state_dict\(\) saves",
         "what a checkpoint keeps — only the param groups and self.state, so everything step() reads must live there",
         "Save state_dict() after two steps, load it into a NEW optimizer over the same parameters and step it once: "
         "which of your attributes is missing there? What step() reads must come back with the checkpoint."),
        ("lazy_state", r"state on its first step|not in __init__",
         "where the state is made — in step(), on a parameter's first step, so a parameter without a gradient has none",
         "Build the optimizer over two parameters, give only one a gradient, step once and print len(opt.state): "
         "does the other parameter have a state? Where does your code make states?"),
        ("decay", r"decay|param.?groups?\b|self\.defaults|hyper-?parameters|group\[",
         "the hyperparameters of each group — lr, betas, eps and decoupled weight decay read from its own group",
         "Create the optimizer on two groups with different lr and weight_decay: does each parameter move by its "
         "own group's values, decay included?"),
        ("count", r"small tensor|min_8bit_size", "", ""),
        ("first_step", "", "the step counter — one per parameter, increased before the update", ""),
        ("last_block", "", "the number of scales — one more for a short last block", ""),
        ("state", "", "where the state lives — self.state[p], with the statement's names", ""),
        ("axis", "", "flat views — the 8-bit step works on flat tensors", ""),
    ],
    "07.3": [
        ("trainable", r"froze|detached",
         "what trains — the table and the LayerNorm's scale and shift, all trainable",
         "List the module's parameters with requires_grad, then take one backward through forward: which ones get "
         "a gradient?"),
        ("axis", r"BOTH dimensions", "", ""),
        ("config", r"its config|which key",
         "the override's config — the key and value the manager reads for the bits of a parameter's states",
         "Your override is registered for the right module and parameter, yet the table's state is still 8-bit: the "
         "manager ignores a config key it does not know. Compare your config's key, letter by letter, with the one "
         "the lesson's cell passes (and its value)."),
        ("state", r"register|override|32-bit states",
         "the 32-bit override — registered with bitsandbytes' manager for the table's weight", ""),
        ("values", r"current parameters", "", ""),
        ("init", r"\binit\b|initiali[sz]|xavier|N\(0, 1\)",
         "the initial weights — xavier-uniform's bound for this table",
         "Print the largest |w| of your initial table and compare it with xavier-uniform's bound for these two "
         "dimensions: inside it, and reaching close to it?"),
        ("norm", r"normalis|LayerNorm|self\.norm",
         "the normalisation — a LayerNorm over each looked-up vector, with its learned scale and shift",
         "Feed one index through your forward: is the output the looked-up vector normalised over its last "
         "dimension, then scaled and shifted by the LayerNorm's own parameters?"),
    ],
    "07.4": [
        ("lr", r"\blr\b|learning rate",
         "the optimizer you build — with train's lr, not its default",
         "Which learning rate does your optimizer use? Print its param group's lr next to train's argument."),
        ("order", r"zero_grad|add up|between backward", "", ""),
        ("factor", r"summed the squared", "", ""),
        ("once", r"optimizer ONCE", "the optimizer — built once, before the loop, so its state carries over",
         "How many optimizers does your loop build? What happens to m, v and the step count when a new one is made?"),
        ("count", r"take `steps` steps|\bsteps=", "", ""),
        ("floats", r"loss tensor|Python float",
         "what the curve records — one Python number per step",
         "Print type() of one entry of your curve: is it a number, or a tensor that keeps its graph alive?"),
        ("batch", r"mini-batch|batches of",
         "what one step trains on — the whole batch, every step",
         "How many points does your model see in one step? The task gives 256: print the batch size inside your "
         "loop."),
        ("axis", "", "the loss's shapes — each output against its own target", ""),
    ],
    "08.1": [
        ("last_block", "", "the ragged tail — what masked lanes load", ""),
        ("sign", r"MAGNITUDE|max of x itself",
         "the reduction — the largest magnitude of the block, abs before max",
         "Take a block whose most negative entry is largest in magnitude: which number must the program store, and "
         "does yours take the magnitudes before or after the max?"),
        ("store", r"stored into absmax\[0\]|nothing was written|tl\.store",
         "where a program stores its result — at its own program id",
         "Which entry of absmax does program pid write, and does every program write one?"),
        ("pid", r"program_id\(1\)|1-D",
         "the program id — the grid's one axis",
         "How many axes has your launch grid? Which program id does each program read?"),
        ("block", "", "the offsets of a program — pid times the block size", ""),
    ],
    "08.2": [
        ("last_block", r"mask", "the ragged tail — loads and stores masked at n", ""),
        ("map", r"multiplied the codes|codes themselves", "the map lookup — each code an index into the map",
         "What is a code: a value, or an index? Which map entry does code 0 give?"),
        ("block", r"absmax\[0\]|pid \* BLOCK|one entry per BLOCK|absmax_ptr \+ offs|forgot the scale",
         "which absmax and which offsets a program uses — its own block's, from pid times the block size",
         "For program pid: which element does its first lane handle, and which single absmax does it multiply by? "
         "Work pid = 2 by hand."),
        ("dtype", "", "the code as an offset — a wider integer first", ""),
    ],
    "08.3": [
        ("last_block", r"mask", "the ragged tail — masked lanes store nothing past n", ""),
        ("edge", r"inside the map", "the upper neighbour — kept inside the map",
         "For x = 1 (an element equal to its block's absmax), which index does the search end at, and does 'the next "
         "one' exist?"),
        ("rounding", r"neighbour|lo \+ 1", "the nearest code — the search's entry or the next one, whichever is "
         "strictly closer", ""),
        ("search", r"halvings",
         "the binary search — 8 halvings to reach all 256 entries",
         "How many halvings does it take to reach every one of 256 entries? Trace the search for the value 1.0 by "
         "hand."),
        ("block", r"absmax\[0\]|multiplied x by absmax|DIVIDING",
         "the normalisation — each block divided by its own absmax",
         "Which absmax does program pid divide by, and does its division bring the block into [-1, 1]?"),
        ("zero", "", "an all-zero block — normalised by 1", ""),
    ],
    "08.4": [
        ("last_block", r"masked lanes|mask the", "the masked lanes — zeroed before the max, never stored", ""),
        ("sign", r"MAGNITUDE|tl\.max\(m\)",
         "the new absmax — the largest magnitude of the updated state",
         "Take a block whose updated state is most negative somewhere: which absmax must come out, and does yours "
         "take magnitudes first?"),
        ("ema", r"swapped beta|beta multiplies",
         "the moving average — beta on the old state, 1 - beta on the new value",
         "Which term gets beta: the old state or the new gradient? Work one element with beta = 0.9 by hand."),
        ("order", r"OLD absmax|old absmax|AFTER the update|swapped beta|OLD state", "", ""),
        ("store", r"did not store|never stored",
         "what the kernel writes back — the codes and the new absmax",
         "List what the fused kernel must write back for one block: the codes and what else?"),
        ("dequant", r"dequantize first|without \* absmax",
         "dequantizing — the map's value times the block's absmax, before the EMA",
         "What does the EMA update: the map's normalised value, or the state itself? Dequantize one element by "
         "hand."),
        ("rounding", "", "a tie between two codes — the lower index",
         "On an exact tie between two map entries, which index must win? Take a value exactly halfway and compare "
         "with 08.3's rule."),
        ("block", r"absmax entries", "where the new absmax is stored — one per block, at the program id",
         "How many absmax entries must the kernel write for 4 blocks, and at which addresses?"),
        ("zero", "", "an all-zero block — its absmax is 0",
         "An all-zero block has absmax 0: what does your kernel divide by there, and what code must a 0.0 get?"),
        ("count", "", "the masked lanes — zeroed before the max", ""),
    ],
    "09.1": [
        ("refuse", r"unknown kind|silent fallback", "an unknown kind — the error the statement asks for", ""),
        ("kind", r"kind='adamw'|adamw:|AdamW",
         "the two kinds — AdamW's fp32 states against 8-bit codes and scales",
         "Work kind='adamw' by hand for 1,000 parameters: how many states, how many bytes each, any scales?"),
        ("factor", r"2\*\*30|GiB|kind='adamw'", "the unit and the kind — MiB, and AdamW's 8 bytes per parameter", ""),
        ("absmax", r"forgot the absmax|one absmax per block",
         "the scales — one fp32 absmax per block for each of the two states",
         "For one block of blocksize parameters: how many absmax numbers, how many bytes each, for both states?"),
        ("states", r"\bONE state\b",
         "the states — Adam keeps two, m and v",
         "How many states does Adam keep, and how many bytes does each take per parameter in 8 bits and in fp32?"),
        ("inputs", r"right on \d+ of \d+ inputs",
         "the inputs your answer gets wrong — the kind, the block size, an empty model",
         "The check names the inputs you get wrong: work exactly those by hand, with the lesson's per-parameter "
         "rule, and see which argument your code does not use."),
        ("last_block", "", "the block count — rounded up", ""),
        ("rounding", "", "the unit conversion — a true division",
         "Bytes over 2**20 is rarely a whole number: which of your divisions keeps the fraction, and which drops it?"),
    ],
    "09.2": [
        ("small", r"small-tensor rule|min_8bit_size|every tensor 8-bit",
         "the small-tensor rule — fewer than min_8bit_size elements keep fp32 states",
         "Take one tensor of exactly min_8bit_size elements and one just below: which gets 8-bit states? Compare "
         "with yours."),
        ("dtype", r"whatever the dtype|always fp32|element size",
         "element sizes — each tensor's own, weights and gradients alike", ""),
        ("gradients", r"gradients",
         "the gradients — one per trained parameter, at the parameter's own element size, in the total",
         "List the four entries of the budget and say which tensors each counts: where are the gradients, and are "
         "they in the total?"),
        ("absmax", r"absmax", "the scales of each 8-bit tensor — two fp32 absmax per block",
         "For one 8-bit tensor: how many blocks, and how many bytes of absmax per block?"),
        ("factor", r"fp32 states|BYTES as ints|MiB", "the units — bytes, with fp32 states at 8 per parameter",
         "Which unit does the budget use, and how many bytes per parameter do fp32 Adam states take, whatever the "
         "weights' dtype?"),
        ("count", "", "each tensor once — a tied weight is one parameter", ""),
        ("block", "", "the blocks — counted per tensor",
         "Blocks belong to one tensor each: count them tensor by tensor, and compare with your count over the whole "
         "model."),
        ("state", r"buffers|state_dict", "what is trained — parameters, not buffers",
         "Which tensors does your loop visit: parameters only, or buffers too? Print their names."),
    ],
    "09.3": [
        ("elements", r"counted bytes|not bytes|bytes, not|bytes instead|len\(|not len",
         "elements, not bytes — every element of each tensor",
         "Does your count add elements or bytes, and does it count every element of a matrix? Work a (3, 4) tensor "
         "by hand."),
        ("first_step", r"step counter", "the step counter — one one-element tensor per trained parameter tensor",
         "How many step counters does AdamW keep: one per element, one per tensor, or one in all? Build it on two "
         "tensors and count."),
        ("state", r"moment tensors", "the moments — two tensors shaped like each parameter",
         "Print the keys of one parameter's AdamW state after a step: how many moment tensors are there?"),
        ("count", "", "what is counted — trained parameters, their moments and their step counter", ""),
    ],
    "09.4": [
        ("decay", r"LayerNorm|bias|no group|decay group", "", ""),
        ("hyper", r"TrainingArguments|args\.(adam|learning)",
         "the hyperparameters — every one taken from the arguments",
         "Print lr, betas and eps of your optimizer next to the arguments' values: which one is still the library's "
         "default?"),
        ("optimizer", r"you built|bitsandbytes' optimizer|bnb\.optim",
         "which optimizer the seed builds — bitsandbytes' 8-bit Adam, fed the two groups",
         "Which class does the seed build, from which library? Print type() of yours."),
    ],
    "10.1": [
        ("names", r"substring|dotted name|'norm' in its name|Norm' but|class name|by (its|their) type|isinstance",
         "how a parameter is recognised — by its own name (bias) and by its module's type (a norm layer), not by a "
         "substring",
         "For each parameter the check names, find its module and that module's class: is it a bias, is the class a "
         "norm layer? Decide by those two, not by the words in the dotted name."),
        ("inverted", r"(?-i:EXCLUDE|GET weight decay)",
         "which list you return — the names that get weight decay",
         "Which names does the statement ask for: those that decay, or those that do not?"),
        ("count", r"recurses|once per ancestor|twice", "", ""),
        ("own", r"model itself|'\.temperature'|first from named_modules",
         "parameters of the model itself — the module with the empty name",
         "Does your walk over the modules reach the model's own parameters? Print the first name named_modules gives."),
        ("decay", r"biases never|embeddings decay", "which parameters decay — everything but biases and norm layers",
         "Go through the parameters one by one: which are biases, which belong to norm layers? Everything else "
         "decays, embeddings included."),
        ("axis", r"dimensions", "the rule — by name and module type, not by the number of dimensions",
         "Is a 1-D parameter always a bias or a norm parameter? Find one in the check's model that is neither."),
        ("count", "", "each parameter once — modules walked with their own parameters", ""),
    ],
    "10.2": [
        ("autocast", r"autocast|fp32|model\.to|\.half",
         "autocast — the forward in 16 bits on the model's own device, weights kept fp32, backward outside",
         "Where does your `with` block start and end, which device type does it name, and is the model itself "
         "cast anywhere?"),
        ("calls", r"never calls|forgotten|add up",
         "the five calls of one step — each present, once",
         "Write the five calls of one step and tick each in your code: which is missing?"),
        ("order", r"zero_grad|before loss\.backward|scheduler\.step\(\) ran before|AFTER optimizer", "", ""),
        ("loss", r"SUM over|times the reference",
         "the loss — the model's own, a mean over the batch",
         "Is your loss the mean over the batch or the sum? Compare with the model's own loss on one batch."),
        ("type", r"loss\.item|a float", "", ""),
    ],
    "10.3": [
        ("pair", r"pass your optimizer|optimizers=|scheduler \(optimizers|the pair",
         "what Trainer receives — the pair (your optimizer, None for its scheduler)",
         "What does Trainer's `optimizers` argument hold, in which order, and which half lets Trainer build the "
         "schedule?"),
        ("order", r"swapped", "the two groups — which gets the decay",
         "Which group gets args.weight_decay: the names from the decay list, or the others?"),
        ("optimizer", r"build adam8lib", "which optimizer — adam8lib's Adam8bit over the two decay groups",
         "Which optimizer class does the task ask you to build, from which library? Print type() of yours."),
        ("decay", r"weight_decay|weight decay", "the two groups — decay names with args.weight_decay, the rest with "
         "0.0", ""),
        ("hyper", r"not the one in args|args\.",
         "the hyperparameters — every one from args, since Trainer does not pass them on",
         "Print each hyperparameter of your optimizer next to args': which one is a library default?"),
    ],
    "10.4": [
        ("clip", r"fixed norm|max_grad_norm argument",
         "clipping — at the max_grad_norm you are given",
         "Which norm does your clipping use: the argument, or a number of your own?"),
        ("calls", r"never zeroed|add up", "the calls of one batch — gradients cleared every step",
         "Which call clears the gradients, and does your loop make it once per batch?"),
        ("order", r"clip (before|after)|you clip|no clipping|not clipped|zero_grad\(\) ran between", "", ""),
        ("accelerator", r"accelerator\.backward|torch's|autocast block of your own|autocast block",
         "what goes through the accelerator — backward and clipping, with its own autocast",
         "List each call of one batch and ask for each: does the accelerator have its own version of it? Use that "
         "one."),
        ("scheduler", r"scheduler|learning rate never",
         "the scheduler — one step per batch, after the optimizer",
         "How many times per batch does your schedule advance, and where?"),
        ("train_mode", r"model\.train",
         "the model's mode — training, with dropout on",
         "Which mode is the model in when your loop starts? Print model.training."),
        ("floats", r"loss\.item|a float", "what you record — one Python number per batch",
         "Print type() of one recorded loss."),
    ],
    "10.5": [
        ("order", r"zero_grad\(\) ran between", "", ""),
        ("dtype", r"bf16|float16", "the 16-bit format — fp16, the one whose overflow needs the scaler",
         "Which 16-bit dtype overflows and needs a scaler? Which one does your autocast use?"),
        ("order", r"AFTER scaler\.step|after scaler\.step|unscale before clipping", "", ""),
        ("scaler", r"scaler|SCALED loss",
         "the scaler's calls — scale before backward, unscale before clipping, step and update through it",
         "Write the scaler's four calls around backward and the step, in order, and tick each in your code: which "
         "one is missing or replaced?"),
        ("order", r"zero_grad|between backward", "", ""),
        ("autocast", r"autocast block", "autocast — the forward only, backward outside",
         "Where does your `with` block end: before backward or after it?"),
        ("calls", r"never zeroed|fixed norm|add up", "the calls of one step — each with its argument, every step",
         "Tick each call of one step against the statement: is each there, with the argument it is given?"),
        ("factor", "", "what you return — the loss itself", ""),
    ],
    "11.1": [
        ("strategy", r"ZeRO-1 shards only|under DDP|not divided by the world size|FSDP2 shards",
         "what each strategy shards — DDP nothing, ZeRO-1 the states, FSDP2 everything",
         "Make a table: DDP, ZeRO-1, FSDP2 against weights, gradients, states — mark which are divided by the world "
         "size, then compare with your code."),
        ("last_block", r"rounded the number of blocks down", "", ""),
        ("absmax", r"absmax", "the scales — two fp32 absmax per block of the rank's own elements",
         "For the rank's own k parameters: how many blocks, and how many absmax per block (one per state)?"),
        ("states", r"two \(m and v\)|keeps two", "the states — two of them, m and v",
         "How many states does Adam keep, and how many bytes per parameter each?"),
        ("last_block", r"ceil|whole number", "", ""),
        ("rounding", "", "the block count — rounded up", ""),
    ],
    "11.2": [
        ("integers", r"Python ints",
         "the type of a position — a Python int, computed with integers",
         "Print type() of your start and stop: are they ints, or floats from a true division?"),
        ("last_block", r"clip|past the end|exclusive", "", ""),
        ("rows", r"rows|dim 0|row length|prod\(shape",
         "how FSDP2 splits — whole rows of the first dimension, like torch.chunk",
         "Work shape (5, 3) on 4 ranks with torch.chunk by hand: rows per rank, the last ranks' rows, then each "
         "rank's flat start and stop."),
    ],
    "11.3": [
        ("count", r"FULL parameter's size|8-bit or fp32 by", "", ""),
        ("small", r"smaller than min_8bit_size", "the small parameters — fp32 states, no blocks",
         "Take a parameter smaller than min_8bit_size: which states does it keep, and does it have blocks?"),
        ("states", r"keeps two", "the states — two of them, m and v, a byte each in 8 bits",
         "How many states does Adam keep, and how many bytes per element does each take in 8 bits?"),
        ("block", r"blocks|ceil\(local", "the local blocks — counted from the shard's own first element",
         "Work one shard by hand: its size from 11.2, then ceil of that over the block size — where do your blocks "
         "start?"),
        ("absmax", r"absmax", "the scales — two fp32 absmax per local block",
         "How many bytes of absmax does one local block cost, for both states?"),
        ("states", r"two fp32 states", "the fp32 branch — two states at 4 bytes each",
         "How many bytes per element does fp32 Adam keep?"),
        ("axis", r"its own shard|shard_range", "this rank's shard — its own size, maybe smaller or empty",
         "Is every rank's shard the size of rank 0's? Work the last rank by hand."),
    ],
    "12.1": [
        ("last_block", r"padded at the front|AFTER the last", "", ""),
        ("order", r"nibbles are swapped|interleav", "", ""),
        ("nibbles", r"nibble|shift",
         "the nibbles — the first code in the upper 4 bits, the second in the lower 4",
         "Pack one pair by hand in binary, then unpack it: which code ends in the upper 4 bits, and what takes only "
         "the lower 4?"),
        ("factor", "", "two codes per byte — n / 2 bytes",
         "How many bytes must n codes of 4 bits take? Count yours."),
    ],
    "12.2": [
        ("size", r"depends on the size", "the test — in the decoded values, independent of their size",
         "Scale both moments by 1e-3: should the flags change? Does your test use a fixed tolerance?"),
        ("count", "", "when a v is coded 0 — after quantizing, not before",
         "A v is coded 0 whenever its scaled value is nearer 0 than any other entry, not only when it is exactly 0: "
         "quantize a tiny non-zero v and decode it."),
        ("rounding", r"rounded down|NEAREST",
         "the codes — the nearest map entry, so a small value decodes to 0 only below half the smallest entry",
         "Which code does a value get: the map entry below it or the nearest one? Take a v whose scaled value is just "
         "above half the smallest positive entry."),
        ("block", r"absmax", "the scales — each block's own absmax",
         "Each block has its own absmax: a block's v is divided by ITS absmax before it meets the map. Which absmax "
         "does your code use, and does it divide at all?"),
        ("decoded", r"DECODED|decoded|no victim",
         "which moments the update reads — both as decoded from their codes",
         "For one entry, write what the update reads: the decoded m and the decoded v. Which pair makes it m / eps?"),
        ("sign", r"v's map|signed map", "the maps — m signed, v unsigned",
         "Which map has negative entries? Which moment needs them?"),
    ],
    "12.3": [
        ("combine", r"SMALLEST|LARGER of the two|alone is one scale", "", ""),
        ("sign", r"\|x\||magnitudes", "the maxima — of magnitudes", ""),
        ("combine", r"product|combine|one absmax for the whole|smaller of",
         "the scale of an entry — the smaller of its row's and its column's maximum",
         "For entry (i, j) of a 2 × 3 matrix: which two numbers are compared, and which is kept? Build the full "
         "matrix of them by hand."),
        ("axis", "", "the reductions — one per row, one per column, broadcast back", ""),
    ],
    "12.4": [
        ("negative", r"negative x is mishandled",
         "a negative x — its neighbours toward and away from zero, and the signed gap between them",
         "Round 1.3 and -1.3 many times each with the same generator: does each go away from zero about as often? "
         "Follow one negative value through your arithmetic: where does a difference change sign, or lose it?"),
        ("noise", r"random (integers|numbers)|span",
         "the random numbers — exactly one bf16 step of the lower 16 bits",
         "How many different values must your random numbers take to cover one bf16 step, no more, no less? Print "
         "their smallest and largest."),
        ("odds", r"odds|half of the time",
         "the odds — round up with the distance from the lower neighbour",
         "A value a quarter step above a bf16 number: how often must it round up? Measure yours over many draws."),
        ("generator", r"generator|global RNG",
         "the randomness — every number drawn from the generator you are given",
         "Draw every random number from the generator you are given, once per element: which call of yours uses "
         "torch's global one?"),
        ("rounding", "", "stochastic rounding — neither to the nearest nor toward zero, but up with the right odds",
         "Stochastic rounding is neither nearest nor truncation: for a value a quarter step above a bf16 number, how "
         "often must it go up? Measure yours over many draws."),
    ],
    "13.1": [
        ("betas", r"betas are swapped|two betas",
         "the pair of betas — the first for the step's direction, the second for the state's own update",
         "Which name does your code give the first entry of the pair, and which the second? Step once by hand with "
         "betas (0.9, 0.99): the interpolation for the sign must weigh m by 0.9, the state's update by 0.99."),
        ("defaults", r"default arguments",
         "Lion's hyperparameters — its own default lr, betas and decay, not Adam's",
         "Print your class's default arguments next to Lion's in the lesson: which one is Adam's?"),
        ("state_beta", r"updated with beta1",
         "the state update — the lesson's second beta, the one for the momentum",
         "Which of the two betas does the state's own update use, and which only the step's direction? Step once by "
         "hand with betas (0.9, 0.99) and compare m."),
        ("state_in_place", r"never changes|handed",
         "the state — updated inside the very tensor the optimizer handed you",
         "The optimizer keeps only what your rule writes into the tensor it handed you: does your rule write into "
         "it, or bind a new tensor to the name?"),
        ("order", r"you update m before", "", ""),
        ("map", r"stored_as|never negative",
         "how the state is stored — the signed map, for a momentum with both signs",
         "Can Lion's momentum be negative? Which of the two maps holds negative numbers?"),
        ("sign", r"(?-i:SIGN)", "the step's direction — the sign of the interpolation with beta1", ""),
        ("in_place", "", "what may be written in place — the states yes, the gradient never", ""),
        ("first_step", "", "the first step — the direction from the interpolation, with the momentum still 0",
         "On the first step m is 0: what is the interpolation then, and which direction must p move? Does yours "
         "move at all?"),
        ("order", "", "the order of the three updates — decay, the sign step, then the state", ""),
        ("refuse", "", "what check(group) refuses — the statement's list of invalid arguments", ""),
        ("decay", "", "decoupled decay — p multiplied by a factor with lr and weight_decay", ""),
    ],
    "13.2": [
        ("rank1_where", r"you counted rank-1 scales|rank-1 scales are the 4-bit format's",
         "which states get rank-1 scales — a 4-bit 'v' of two or more dimensions only; 8-bit and FP8 keep one "
         "absmax per block of 256",
         "Which format and which state does your code give rank-1 scales? They belong to the 4-bit format's 'v' "
         "alone: work (768, 3072) 'v' in 8-bit by hand — how many blocks of 256, and one fp32 scale each."),
        ("fp8", r"'fp8' codes take one byte|FP8 \(e4m3\) code is",
         "an FP8 code — one byte, laid out like the 8-bit format, one absmax per block of 256",
         "An FP8 (e4m3) code is 8 bits: one byte, like an 8-bit code — not half a byte, not two. Which bytes per "
         "code and which blocks does your code give 'fp8'? Count them exactly as for '8bit'."),
        ("count", r"FEWER than|n < min", "", ""),
        ("axis", r"rank-1 scales|per row", "", ""),
        ("absmax", r"forgot the scales|fp32 number|4 bytes per block", "the scales — one fp32 number per block",
         "How many scales does a state of n elements have, and how many bytes is each?"),
        ("last_block", r"two per byte", "", ""),
        ("factor", r"FP8|one byte", "", ""),
    ],
    "13.3": [
        ("map", r"'v' moment|never negative",
         "how m is stored — with the format's signed coding",
         "Is m ever negative? Which of the format's two moment codings keeps a sign?"),
        ("sign", r"(?-i:SIGN)|sign of the interpolation|only the sign", "the sign that matters — the interpolation's, "
         "not m's", ""),
        ("inverted", r"inverted", "the mask — True where the update changes",
         "Which entries must your mask mark: those where the sign stays, or those where it flips?"),
        ("values", r"quantized the gradient", "", ""),
        ("beta", r"hard-coded|does not change with beta1",
         "the interpolation — with the beta1 you are given",
         "Call your function with two different beta1: should the mask change? Does yours?"),
        ("small", r"uncoded|whatever its size|under 4,?096",
         "what goes through the format — m of every size: this question codes small tensors too",
         "Run your function on an m of 1,024 elements and on the same values repeated past 4,096: does your code "
         "treat the two sizes differently? The optimizer's small-tensor rule is not part of this question."),
        ("zero", "", "a zero sign — a flip too", ""),
    ],
    "14.1": [
        ("order", r"zeroing the gradient|keeps its memory", "freeing a gradient — dropped, not zeroed", ""),
        ("free", r"^free the gradient",
         "freeing each gradient — set to None right after that parameter's step, in the hook that runs once the "
         "gradient is complete",
         "After one backward, print p.grad of every parameter: with gradient release each must be None. Does your "
         "hook drop the gradient once its step has used it — and does it run after autograd has written p.grad, or "
         "before (then what it frees is written again)?"),
        ("count", r"requires_grad|frozen", "each trainable tensor once — frozen ones get no hook", ""),
        ("hook", "", "the hook — the kind that runs once the gradient is complete", ""),
    ],
    "14.2": [
        ("bill_only", r"activations and transient|weights \+ gradients \+ state only",
         "what the bill holds — weights, gradients and state, not activations or transient buffers",
         "Print the snapshot at the end of backward category by category: which are the bill's three, and which "
         "categories does your number add up?"),
        ("count", r"own maximum", "the peak — one moment, not each part's own maximum",
         "Do the three parts peak at the same moment? Add them at one moment and compare with the sum of their "
         "maxima."),
        ("rounding", r"floor|//", "bytes per parameter — a fraction", ""),
        ("moment", r"peak|moment|at_end_of|backward ends|when forward ends|after the step|before backward",
         "which moment each number is read at — the end of backward or the bill's own peak",
         "For each entry of your row, name the moment it is read at: the end of backward or the bill's peak? "
         "Print both snapshots and find each of your numbers in one of them."),
        ("largest", r"first item|\(name, bytes\)",
         "the largest gradient — its name only",
         "What does the row's largest-gradient entry hold: a name or a pair? Print the snapshot's entry next to "
         "yours."),
        ("factor", r"number of parameters|num_params|first item", "", ""),
        ("parts", r"'state' part|missing from the sum",
         "the three parts — weights, gradients and state, each from its own category",
         "Name the tracker's category behind each part of your row, and check that a sum has all three."),
    ],
}

for _exercise, _entries in FOCUS.items():
    _item = EXERCISES[_exercise]
    _nudges, _parts, _mistakes = dict(_item.nudges), dict(_item.parts), list(_item.mistakes)
    for _key, _pattern, _part, _nudge in _entries:
        if _nudge:
            _nudges[_key] = _nudge
        if _part:
            _parts[_key] = _part
        if _pattern:
            _mistakes.append((_key, _pattern))
    EXERCISES[_exercise] = replace(_item, nudges=_nudges, parts=_parts, mistakes=tuple(_mistakes))
del _exercise, _entries, _item, _nudges, _parts, _mistakes, _key, _pattern, _part, _nudge

#: level 1's parts for the keys of the exercises' own ``nudges`` that :data:`FOCUS` does not describe
NUDGE_PARTS: dict[str, dict[str, str]] = {
    "01.2": {"count": "what each tensor is counted as — the small-tensor threshold (inclusive) and blocks counted per "
                      "tensor"},
    "02.2": {"denominator": "what bias correction does — it only rescales, with no square root"},
    "03.1": {"order": "the order of the step — the moments updated first, then the parameter from the new moments"},
    "03.2": {"order": "the order of the step — the decay before the Adam update",
             "first_step": "the first step — bias correction counted from step 1, as in Adam"},
    "07.1": {"sign": "requantizing small states — the sign of every non-zero state kept",
             "order": "the order of one 8-bit step — dequantize, update the moments, update p, then requantize"},
    "07.2": {"count": "the counts — the inclusive size threshold, one step counter per parameter, skipped parameters"},
    "07.3": {"values": "the initial weights and the forward — the module's current parameters, xavier-uniform's spread",
             "axis": "the table's two dimensions — both in xavier's bound, the last one for the LayerNorm"},
    "07.4": {"order": "the order of one training step — clear, loss, backward, step, with the loss recorded before it "
                      "changes",
             "count": "the curve's length — one loss per step, `steps` of them, from one optimizer",
             "factor": "the loss — the mean of the squared errors"},
    "08.4": {"order": "the order inside the fused kernel — the new absmax taken after the EMA"},
    "09.3": {"factor": "the moments — two per trained parameter"},
    "09.4": {"decay": "the two parameter groups — decay for everything but biases and LayerNorm parameters, with "
                      "args.weight_decay",
             "count": "the two groups — every parameter in exactly one"},
    "10.1": {"values": "how a norm layer is recognised — by its class, not by its name"},
    "10.2": {"order": "the order of the five calls of one step — backward, optimizer step, scheduler step, then "
                      "clearing the gradients"},
    "10.4": {"order": "the order of one batch — backward, clipping, optimizer step, scheduler step, clearing",
             "values": "the model's mode — training"},
    "10.5": {"order": "the scaler's order — scale, backward, unscale, clip, step through the scaler, update"},
    "11.1": {"last_block": "the largest shard — rounded up, and its blocks rounded up again",
             "factor": "the bytes per parameter of the states — 8 for fp32 Adam, 2 plus the scales for 8-bit"},
    "11.2": {"last_block": "the ranks at the end — chunks clipped to the parameter, an empty range past the last row",
             "factor": "flat positions — rows times the elements of one row"},
    "11.3": {"count": "8-bit or fp32 — decided by the full parameter, not the shard",
             "last_block": "local blocks — rounded up, none for an empty shard"},
    "12.1": {"order": "which code of a pair goes where — the even-index one in the high nibble",
             "last_block": "an odd count — one zero code of padding at the end, dropped again when unpacking"},
    "12.2": {"values": "which m the update sees — the one decoded from its code",
             "last_block": "the last, short block — padded, and the padding dropped again",
             "zero": "when a v is coded 0 — flagged by the decoded values, after quantizing"},
    "12.4": {"values": "a number bf16 holds exactly — it never moves",
             "sign": "negative numbers — the neighbour toward zero, found in the bits"},
    "13.2": {"last_block": "rounding up — blocks and half-bytes",
             "axis": "rank-1 scales — one per index of each axis of a tensor with two or more dimensions",
             "count": "the small-tensor rule — fewer than 4,096 elements keep fp32 states in every format",
             "factor": "the bytes of each part — codes by format, fp32 scales, fp32 below 4,096 elements"},
    "13.3": {"values": "what goes through the format — only m, the gradient stays fp32",
             "error": "the shapes the format works in — m handed over flat, the decoded m given m's shape again",
             "order": "the interpolation — which term gets beta1"},
    "14.2": {"factor": "per parameter — every byte count divided by the tracker's number of parameters"},
}

for _exercise, _parts in NUDGE_PARTS.items():
    _item = EXERCISES[_exercise]
    EXERCISES[_exercise] = replace(_item, parts={**_parts, **_item.parts})
del _exercise, _parts, _item

#: check name (without ``check_``) -> exercise id
EXERCISE_OF_CHECK: dict[str, str] = {hints.check: exercise for exercise, hints in EXERCISES.items()}

#: per exercise, the openings of its check's hints that only restate the rule — the check's fallback when it cannot
#: tell which mistake was made (a sentence of the check's property finder before "The rule:" is no restatement). Such
#: a hint names no mistake: levels 1 and 3 then say what the check saw and how to find the mistake, rather than
#: guess one from the rule's words. ``tests/course/test_hints.py`` holds every "The rule: ..." of the course's wrong
#: answers to an opening listed here.
RULES: dict[str, tuple[str, ...]] = {
    "01.1": ("AdamW: two fp32 states; 8-bit Adam: two uint8 codes",),
    "01.2": ("per tensor: n >= min_8bit_size -> 2 bytes/param",),
    "01.3": ("sum numel() * element_size() over every tensor",),
    "02.1": ("m = beta1 * m + (1 - beta1) * g", "v = beta2 * v + (1 - beta2) * g * g"),
    "02.2": ("m_hat = m / (1 - beta1**step), v_hat",),
    "03.1": ("Adam: g = g + weight_decay * p; m, v = EMAs",),
    "03.2": ("AdamW: p *= 1 - lr * weight_decay first",),
    "04.1": ("q = round(x * 127 / absmax)",),
    "04.2": ("x ≈ q * absmax / 127",),
    "06.1": ("absmax[b] = max |x| over block b", "code = nearest map entry to x / absmax"),
    "06.2": ("x[i] = code[codes[i]] * absmax[i // blocksize]",),
    "07.1": ("dequantize m and v (qmap[state] * absmax of the block)",),
    "09.1": ("adamw: 8 bytes/param; adam8bit:",),
    "09.2": ("weights and gradients: numel * element_size of each parameter",),
    "09.3": ("per trainable parameter tensor: exp_avg and exp_avg_sq",),
    "11.1": ("fp32 weights and gradients (4 bytes each); states",),
    "11.2": ("rank r holds rows [r*c, (r+1)*c)",),
    "11.3": ("8-bit when the FULL parameter has",),
    "13.2": ("codes: n bytes in 8-bit and FP8",),
    "13.3": ("none of the usual mistakes",),
}
#: openings of a hint that names no mistake, in any exercise
GENERIC_OPENINGS: tuple[str, ...] = ("The rule:", "none of the usual mistakes")

#: level 3 after a hint that names no mistake (:data:`RULES`): how to find the mistake on the one failing case
LOCATE: dict[str, str] = {
    "07.1": "Run that step by hand on the block where it differs (or with adam8lib's reference step) and print m, v, "
            "the two bias corrections, the denominator, the update and the new p beside yours, stage by stage: the "
            "first value that differs is your mistake. When only a few elements differ, look at what is special "
            "there — a tiny v, where eps and the corrections matter most, or a block's largest entry.",
    "13.2": "Split your number into its parts — the bytes of the codes, the number of scales, the bytes of one "
            "scale — and work each by hand for that shape, state and format, the way the lesson's table does: "
            "which part is not what the format keeps?",
    "13.3": "On that case, compute the two signs yourself — with the fp32 m and with m coded and decoded by the "
            "format the statement names — and print them beside your mask at the first index that differs: which "
            "of your tensors is not what the rule takes there?",
}

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
    "unnamed": "Work that one input by hand with the lesson's rule and print each intermediate value beside the one "
               "your code computes: the first value that differs is where your mistake is.",
}
