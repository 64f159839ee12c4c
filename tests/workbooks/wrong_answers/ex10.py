"""Workbook 10 · mixed-precision fine-tuning: what learners plausibly write instead of the solution."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from adam8lib.course import checks
from tests.workbooks.wrong_answers import Right, Wrong

# ---------------------------------------------------------------------------------- 10.1
NORMS = tuple(t for t in (nn.LayerNorm, getattr(nn, "RMSNorm", None)) if t is not None)


def _is_norm(module):
    return isinstance(module, NORMS) or type(module).__name__.endswith("Norm")


def decay_with_biases(model):
    names = []
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            if not _is_norm(module):
                names.append(f"{module_name}.{name}" if module_name else name)
    return names


def no_decay_names(model):  # the list of what to exclude, returned instead of what decays
    names = []
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            if _is_norm(module) or name == "bias":
                names.append(f"{module_name}.{name}" if module_name else name)
    return names


def only_biases(model):  # "decay on the bias"
    return [n for n, _ in model.named_parameters() if n.endswith("bias")]


def hf_name_patterns(model):  # Hugging Face's old rule: names, not types
    return [n for n, _ in model.named_parameters()
            if not any(k in n for k in ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight"))]


def layernorm_isinstance_only(model):
    names = []
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            if not isinstance(module, nn.LayerNorm) and name != "bias":
                names.append(f"{module_name}.{name}" if module_name else name)
    return names


def bias_substring(model):  # 'bias' anywhere in the dotted name: a module called bias_proj loses its weight
    names = []
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if not _is_norm(module) and "bias" not in full:
                names.append(full)
    return names


def norm_anywhere_in_class(model):  # "Norm" anywhere in the class name (NormalizedGate is no norm layer)
    names = []
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            if "norm" not in type(module).__name__.lower() and name != "bias":
                names.append(f"{module_name}.{name}" if module_name else name)
    return names


def norm_substring(model):  # norm types, and to be safe any name containing "norm": drops "denormalizer" too
    names = []
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            full = f"{module_name}.{name}" if module_name else name
            if not _is_norm(module) and name != "bias" and "norm" not in full.lower():
                names.append(full)
    return names


def children_recursion(model, prefix=""):  # walks the children, forgets the model's own parameters
    names = []
    for child_name, child in model.named_children():
        full = f"{prefix}{child_name}"
        if _is_norm(child):
            continue
        names += [f"{full}.{n}" for n, _ in child.named_parameters(recurse=False) if n != "bias"]
        names += children_recursion(child, prefix=f"{full}.")
    return names


def leading_dot(model):  # f"{module_name}.{name}" also for the model itself (module_name == "")
    return [f"{m}.{n}" for m, mod in model.named_modules() for n, _ in mod.named_parameters(recurse=False)
            if not _is_norm(mod) and n != "bias"]


def recursing_parameters(model):  # named_parameters() without recurse=False inside the named_modules loop
    names = []
    for module_name, module in model.named_modules():
        if _is_norm(module):
            continue
        for name, _ in module.named_parameters():
            if not name.endswith("bias"):
                names.append(f"{module_name}.{name}" if module_name else name)
    return names


def by_ndim(model):  # nanoGPT's rule: decay 2-D and larger tensors
    return [n for n, p in model.named_parameters() if p.ndim >= 2]


def no_embeddings(model):  # "embeddings should not decay"
    names = []
    for module_name, module in model.named_modules():
        for name, _ in module.named_parameters(recurse=False):
            if not (_is_norm(module) or isinstance(module, nn.Embedding) or name == "bias"):
                names.append(f"{module_name}.{name}" if module_name else name)
    return names


def chapter_rule(model, forbidden=(nn.LayerNorm,)):  # the chapter's get_parameter_names, then "bias" not in name
    def names(module):
        out = []
        for child_name, child in module.named_children():
            out += [f"{child_name}.{n}" for n in names(child) if not isinstance(child, forbidden)]
        return out + list(module._parameters.keys())

    return [n for n in names(model) if "bias" not in n]


def listed_twice(model):  # a name appended once per module that reaches it
    from adam8lib.training import decay_parameter_names

    names = decay_parameter_names(model)
    return names + names[:1]


def as_a_set(model):
    from adam8lib.training import decay_parameter_names

    return set(decay_parameter_names(model))


def no_return(model):  # builds the list, forgets to return it
    from adam8lib.training import decay_parameter_names

    decay_parameter_names(model)


def the_parameters(model):
    names = set(no_decay_names(model))
    return [p for n, p in model.named_parameters() if n not in names]


def class_name_only(model):  # LayerNorm and RMSNorm end in "Norm" too: one test is enough
    owner = {f"{m}.{n}" if m else n: mod for m, mod in model.named_modules() for n, _ in mod.named_parameters(recurse=False)}
    return tuple(n for n, _ in model.named_parameters()
                 if n.rsplit(".", 1)[-1] != "bias" and not type(owner[n]).__name__.endswith("Norm"))


def excluded_set_difference(model):
    excluded = set()
    for module_name, module in model.named_modules():
        prefix = f"{module_name}." if module_name else ""
        if _is_norm(module):
            excluded |= {prefix + n for n, _ in module.named_parameters(recurse=False)}
    return sorted(n for n, _ in model.named_parameters() if n not in excluded and not n.endswith(".bias") and n != "bias")


# ---------------------------------------------------------------------------------- 10.2
def _forward(model, batch, dtype, device="cpu"):
    with torch.autocast(device, dtype=dtype):
        return model(**batch).loss


def step_no_autocast(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def step_autocast_cuda(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    with torch.autocast("cuda", dtype=dtype):
        loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def step_fixed_fp16(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    loss = _forward(model, batch, torch.float16)
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def step_half_model(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    model.to(dtype)
    loss = _forward(model, batch, dtype)
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def step_zero_after_backward(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    loss = _forward(model, batch, dtype)
    loss.backward()
    optimizer.zero_grad()
    optimizer.step()
    scheduler.step()
    return loss.item()


def step_before_backward(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    optimizer.zero_grad()
    loss = _forward(model, batch, dtype)
    optimizer.step()
    loss.backward()
    scheduler.step()
    return loss.item()


def step_no_zero_grad(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    loss = _forward(model, batch, dtype)
    loss.backward()
    optimizer.step()
    scheduler.step()
    return loss.item()


def step_scheduler_first(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    loss = _forward(model, batch, dtype)
    loss.backward()
    scheduler.step()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def step_no_scheduler(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    loss = _forward(model, batch, dtype)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def step_backward_in_autocast(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    with torch.autocast("cpu", dtype=dtype):
        loss = model(**batch).loss
        loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def step_summed_loss(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    with torch.autocast("cpu", dtype=dtype):
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    loss = nn.functional.cross_entropy(logits.float(), batch["labels"], reduction="sum")
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def step_no_optimizer(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    loss = _forward(model, batch, dtype)
    loss.backward()
    scheduler.step()
    optimizer.zero_grad()
    return loss.item()


def step_returns_tensor(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    loss = _forward(model, batch, dtype)
    loss.backward()
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    return loss


def step_zero_first(model, batch, optimizer, scheduler, dtype=torch.bfloat16):
    optimizer.zero_grad()
    device_type = next(model.parameters()).device.type
    with torch.autocast(device_type=device_type, dtype=dtype):
        out = model(**batch)
    out.loss.backward()
    optimizer.step()
    scheduler.step()
    return float(out.loss)


# ---------------------------------------------------------------------------------- 10.3
def _groups(model, decay_value, rest_value, decay_names=None):
    from adam8lib.training import decay_parameter_names

    decay = set(decay_parameter_names(model) if decay_names is None else decay_names)
    return [{"params": [p for n, p in model.named_parameters() if n in decay], "weight_decay": decay_value},
            {"params": [p for n, p in model.named_parameters() if n not in decay], "weight_decay": rest_value}]


def _from_args(args):
    return dict(lr=args.learning_rate, betas=(args.adam_beta1, args.adam_beta2), eps=args.adam_epsilon)


def trainer_own_adamw(model, args, train_dataset):
    from transformers import Trainer

    return Trainer(model=model, args=args, train_dataset=train_dataset)


def trainer_torch_adamw(model, args, train_dataset):
    from transformers import Trainer

    opt = torch.optim.AdamW(_groups(model, args.weight_decay, 0.0), **_from_args(args))
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, None))


def trainer_pair_swapped(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(_groups(model, args.weight_decay, 0.0), **_from_args(args))
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(None, opt))


def trainer_optimizer_alone(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(_groups(model, args.weight_decay, 0.0), **_from_args(args))
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=opt)


def trainer_own_scheduler(model, args, train_dataset):
    from transformers import Trainer, get_linear_schedule_with_warmup

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(_groups(model, args.weight_decay, 0.0), **_from_args(args))
    sched = get_linear_schedule_with_warmup(opt, 0, args.max_steps)
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, sched))


def trainer_decay_everything(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(model.parameters(), weight_decay=args.weight_decay, **_from_args(args))
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, None))


def trainer_groups_swapped(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(_groups(model, 0.0, args.weight_decay), **_from_args(args))
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, None))


def trainer_fixed_decay(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(_groups(model, 0.01, 0.0), **_from_args(args))
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, None))


def trainer_no_decay(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(model.parameters(), **_from_args(args))
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, None))


def trainer_decay_group_only(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(_groups(model, args.weight_decay, 0.0)[:1], **_from_args(args))
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, None))


def trainer_lesson_lr(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(_groups(model, args.weight_decay, 0.0), lr=5e-4)
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, None))


def trainer_default_betas(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import Adam8bit

    opt = Adam8bit(_groups(model, args.weight_decay, 0.0), lr=args.learning_rate, eps=args.adam_epsilon)
    return Trainer(model=model, args=args, train_dataset=train_dataset, optimizers=(opt, None))


def trainer_adamw8bit_with_keywords(model, args, train_dataset):
    from transformers import Trainer

    from adam8lib.optim import AdamW8bit

    decays = set(excluded_set_difference(model))
    decay, rest = [], []
    for n, p in model.named_parameters():
        (decay if n in decays else rest).append(p)
    optimizer = AdamW8bit([dict(params=decay, weight_decay=args.weight_decay), dict(params=rest, weight_decay=0.0)],
                          lr=args.learning_rate, betas=[args.adam_beta1, args.adam_beta2], eps=args.adam_epsilon)
    return Trainer(model, args, train_dataset=train_dataset, optimizers=[optimizer, None])


# ---------------------------------------------------------------------------------- 10.4
def make_epoch(*, train=True, acc_backward=True, clip="accelerator", sched="batch", zero="end", autocast="none",
               result="list", norm=None):
    def train_epoch(accelerator, model, optimizer, loader, scheduler, max_grad_norm=1.0):
        if train:
            model.train()
        losses = []
        for batch in loader:
            if zero == "start":
                optimizer.zero_grad()
            whole = accelerator.autocast() if autocast == "all" else contextlib.nullcontext()
            with whole:
                own = torch.autocast("cpu", dtype=torch.bfloat16) if autocast == "torch" else contextlib.nullcontext()
                with own, accelerator.autocast() if autocast == "forward" else contextlib.nullcontext():
                    loss = model(**batch).loss
                if zero == "before-backward":
                    optimizer.zero_grad()
                if clip == "before-backward":
                    accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
                accelerator.backward(loss) if acc_backward else loss.backward()
            if zero == "after-backward":
                optimizer.zero_grad()
            if clip == "accelerator":
                accelerator.clip_grad_norm_(model.parameters(), norm or max_grad_norm)
            elif clip == "torch":
                torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
            optimizer.step()
            if clip == "after-step":
                accelerator.clip_grad_norm_(model.parameters(), max_grad_norm)
            if sched == "batch":
                scheduler.step()
            if zero == "end":
                optimizer.zero_grad()
            losses.append(loss.detach() if result == "tensors" else loss.item())
        if sched == "epoch":
            scheduler.step()
        return sum(losses) / len(losses) if result == "mean" else losses

    return train_epoch


def epoch_train_inside(accelerator, model, optimizer, loader, scheduler, max_grad_norm=1.0):
    out = []
    for step, batch in enumerate(loader):
        model.train()
        with accelerator.autocast():
            output = model(**batch)
        accelerator.backward(output.loss)
        if accelerator.sync_gradients:  # accelerate's idiom (always true without gradient accumulation)
            accelerator.clip_grad_norm_(list(model.parameters()), max_norm=max_grad_norm)
        optimizer.step()
        scheduler.step()
        model.zero_grad(set_to_none=True)
        out.append(float(output.loss))
    return out


# ---------------------------------------------------------------------------------- 10.5
def make_amp(*, scale=True, unscale="before-clip", step="scaler", update="after-step", zero="end",
             dtype=torch.float16, backward_in_autocast=False, own_scaler=False, returns="loss", norm=None):
    def amp_step(model, batch, optimizer, scaler, max_norm):
        if own_scaler:
            scaler = torch.amp.GradScaler("cpu")
        ctx = torch.autocast("cpu", dtype=dtype)
        ctx.__enter__()
        loss = model(**batch).loss
        if not backward_in_autocast:
            ctx.__exit__(None, None, None)
        scaled = scaler.scale(loss) if scale else loss
        scaled.backward()
        if backward_in_autocast:
            ctx.__exit__(None, None, None)
        if zero == "after-backward":
            optimizer.zero_grad(set_to_none=True)
        if unscale == "before-clip":
            scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), norm or max_norm)
        if unscale == "after-clip":
            scaler.unscale_(optimizer)
        if update == "before-step":
            scaler.update()
        scaler.step(optimizer) if step == "scaler" else optimizer.step()
        if update == "after-step":
            scaler.update()
        if zero == "end":
            optimizer.zero_grad(set_to_none=True)
        return scaled.item() if returns == "scaled" else loss.item()

    return amp_step


def amp_zero_first(model, batch, optimizer, scaler, max_norm):
    optimizer.zero_grad()
    with torch.autocast(device_type=next(model.parameters()).device.type, dtype=torch.float16):
        out = model(**batch)
    scaler.scale(out.loss).backward()
    scaler.unscale_(optimizer)
    nn.utils.clip_grad_norm_(model.parameters(), max_norm=max_norm)
    scaler.step(optimizer)
    scaler.update()
    return float(out.loss.detach())


C = checks
WRONG = [
    # 10.1 · weight-decay parameter names
    Wrong("10.1", C.check_decay_parameter_names, bias_substring, "'bias' as a substring of the dotted name",
          "You tested for 'bias' anywhere in the dotted name", True),
    Wrong("10.1", C.check_decay_parameter_names, norm_anywhere_in_class, "'Norm' anywhere in the class name",
          "contains 'Norm' but does not END in it", True),
    Wrong("10.1", C.check_decay_parameter_names, decay_with_biases, "biases decay too",
          "biases never get weight decay", True),
    Wrong("10.1", C.check_decay_parameter_names, no_decay_names, "returned the names that must NOT decay",
          "the ones to EXCLUDE", True),
    Wrong("10.1", C.check_decay_parameter_names, only_biases, "decay on the biases only",
          "the ones to EXCLUDE", True),
    Wrong("10.1", C.check_decay_parameter_names, hf_name_patterns, "'LayerNorm.weight' name patterns miss 'ln'",
          "find norm layers by their type", True),
    Wrong("10.1", C.check_decay_parameter_names, layernorm_isinstance_only, "only nn.LayerNorm counts as a norm",
          "treat any module whose class name ends in 'Norm'", True),
    Wrong("10.1", C.check_decay_parameter_names, norm_substring, "'norm' in the name drops 'denormalizer'",
          "decide by the module's type, not by a substring", True),
    Wrong("10.1", C.check_decay_parameter_names, children_recursion, "the model's own parameters left out",
          "a parameter of the model itself", True),
    Wrong("10.1", C.check_decay_parameter_names, leading_dot, "'.temperature' for the model's own parameter",
          "no dot before its parameters", True),
    Wrong("10.1", C.check_decay_parameter_names, recursing_parameters, "named_parameters() recursing in the loop",
          "use module.named_parameters(recurse=False)", True),
    Wrong("10.1", C.check_decay_parameter_names, by_ndim, "p.ndim >= 2 instead of bias/norm",
          "not by the shape", True),
    Wrong("10.1", C.check_decay_parameter_names, no_embeddings, "embeddings left out",
          "embeddings decay too", True),
    Wrong("10.1", C.check_decay_parameter_names, the_parameters, "returns the parameters, not their names",
          "return the *names*", True),
    Wrong("10.1", C.check_decay_parameter_names, chapter_rule, "the chapter's rule: nn.LayerNorm children, 'bias' in name",
          "treat any module whose class name ends in 'Norm'", True),
    Wrong("10.1", C.check_decay_parameter_names, listed_twice, "a name listed twice",
          "more than once", True),
    Wrong("10.1", C.check_decay_parameter_names, as_a_set, "returns a set",
          "should return a list", True),
    Wrong("10.1", C.check_decay_parameter_names, no_return, "forgot to return the list",
          "forget to `return`", True),
    # 10.2 · mixed-precision training step
    Wrong("10.2", C.check_training_step, step_no_autocast, "no autocast",
          "your forward ran in fp32, without autocast", True),
    Wrong("10.2", C.check_training_step, step_autocast_cuda, "autocast on 'cuda' for a CPU model",
          "you asked for autocast on 'cuda', but the model is on the CPU", True),
    Wrong("10.2", C.check_training_step, step_fixed_fp16, "dtype fixed instead of the argument",
          "pass the `dtype` argument to torch.autocast instead of a fixed dtype", True),
    Wrong("10.2", C.check_training_step, step_half_model, "model cast to 16 bits",
          "do not call model.to(dtype)", True),
    Wrong("10.2", C.check_training_step, step_zero_after_backward, "zero_grad between backward and step",
          "zero_grad() ran between backward and optimizer.step()", True),
    Wrong("10.2", C.check_training_step, step_before_backward, "optimizer.step() before backward",
          "optimizer.step() ran before loss.backward()", True),
    Wrong("10.2", C.check_training_step, step_no_zero_grad, "zero_grad forgotten",
          "gradients add up across steps", True),
    Wrong("10.2", C.check_training_step, step_scheduler_first, "scheduler stepped before the optimizer",
          "scheduler.step() ran before optimizer.step()", True),
    Wrong("10.2", C.check_training_step, step_no_scheduler, "scheduler never stepped",
          "your step never calls scheduler.step()", True),
    Wrong("10.2", C.check_training_step, step_backward_in_autocast, "backward inside the autocast block",
          "loss.backward() ran inside the autocast block", True),
    Wrong("10.2", C.check_training_step, step_summed_loss, "loss summed over the batch, not averaged",
          "the SUM over the batch", True),
    Wrong("10.2", C.check_training_step, step_no_optimizer, "optimizer.step() forgotten",
          "never calls optimizer.step()", True),
    Wrong("10.2", C.check_training_step, step_returns_tensor, "returns the loss tensor",
          "a tensor keeps the whole graph of the step alive", True),
    # 10.3 · Trainer with 8-bit Adam
    Wrong("10.3", C.check_trainer_8bit, trainer_own_adamw, "no optimizer passed: Trainer builds AdamW",
          "the Trainer will build its own AdamW", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_torch_adamw, "torch's AdamW instead of Adam8bit",
          "trainer.optimizer is a AdamW", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_pair_swapped, "optimizers=(None, optimizer)",
          "you passed (None, optimizer)", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_optimizer_alone, "optimizers=optimizer, not a pair",
          "`optimizers` takes a pair, not the optimizer alone", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_own_scheduler, "a scheduler of their own in the pair",
          "pass None as the scheduler", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_decay_everything, "one group: biases and norms decay",
          "biases and norm weights too", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_groups_swapped, "decay groups swapped",
          "the two groups are swapped", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_fixed_decay, "weight decay 0.01 instead of args.weight_decay",
          "use args.weight_decay, not a number of your own", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_no_decay, "no weight decay anywhere",
          "no parameter gets weight decay", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_decay_group_only, "no-decay group left out",
          "the no-decay group is missing", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_lesson_lr, "the lesson's lr instead of args.learning_rate",
          "your optimizer's lr is not the one in args", True),
    Wrong("10.3", C.check_trainer_8bit, trainer_default_betas, "betas left at their default",
          "your optimizer's betas is not the one in args", True),
    # 10.4 · the accelerate loop
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(train=False), "model left in eval mode",
          "call model.train() first", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(acc_backward=False), "loss.backward() instead of accelerator's",
          "call accelerator.backward(loss), not loss.backward()", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(zero="after-backward"), "zero_grad between backward and step",
          "zero_grad() ran between backward and optimizer.step()", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(zero="none"), "zero_grad forgotten",
          "the gradients are never zeroed, so they add up across batches", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(clip="none"), "no clipping",
          "the gradients are not clipped", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(clip="before-backward"), "clipping before backward",
          "you clip before accelerator.backward(loss)", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(clip="after-step"), "clipping after the step",
          "you clip after optimizer.step()", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(clip="torch"), "torch's clip_grad_norm_ under accelerate",
          "not torch's", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(norm=1.0), "clip norm fixed at 1.0",
          "you clipped at a fixed norm", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(sched="epoch"), "scheduler stepped once per epoch",
          "scheduler.step() ran once per epoch", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(sched="none"), "scheduler never stepped",
          "the learning rate never moves", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(autocast="all"), "backward inside accelerator.autocast()",
          "accelerator.backward(loss) ran inside the autocast block", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(autocast="torch"), "its own torch.autocast(bf16) around the "
          "forward", "you opened an autocast block of your own", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(result="mean"), "returns the mean loss",
          "not their mean or sum", True),
    Wrong("10.4", C.check_accelerate_epoch, make_epoch(result="tensors"), "appends loss tensors",
          "a tensor keeps the graph alive", True),
    # 10.5 · fp16 step with a GradScaler
    Wrong("10.5", C.check_amp_step, make_amp(step="optimizer"), "optimizer.step() instead of scaler.step",
          "Calling optimizer.step() directly applies them", True),
    Wrong("10.5", C.check_amp_step, make_amp(update="none"), "scaler.update() forgotten",
          "call scaler.update() after scaler.step()", True),
    Wrong("10.5", C.check_amp_step, make_amp(update="before-step"), "scaler.update() before scaler.step()",
          "call scaler.update() AFTER scaler.step(optimizer)", True),
    Wrong("10.5", C.check_amp_step, make_amp(unscale="none"), "clipping the scaled gradients",
          "otherwise you clip the scaled gradients", True),
    Wrong("10.5", C.check_amp_step, make_amp(unscale="after-clip"), "unscale_ after clipping",
          "otherwise you clip the scaled gradients", True),
    Wrong("10.5", C.check_amp_step, make_amp(scale=False, unscale="none"), "backward on the unscaled loss",
          "backward the SCALED loss", True),
    Wrong("10.5", C.check_amp_step, make_amp(zero="none"), "zero_grad forgotten",
          "the gradients are never zeroed", True),
    Wrong("10.5", C.check_amp_step, make_amp(zero="after-backward"), "zero_grad between backward and scaler.step",
          "zero_grad() ran between backward and optimizer.step()", True),
    Wrong("10.5", C.check_amp_step, make_amp(dtype=torch.bfloat16), "bf16 autocast with a GradScaler",
          "your forward ran in bf16, not fp16", True),
    Wrong("10.5", C.check_amp_step, make_amp(backward_in_autocast=True), "backward inside the autocast block",
          "scaler.scale(loss).backward() ran inside the autocast block", True),
    Wrong("10.5", C.check_amp_step, make_amp(own_scaler=True), "a new GradScaler inside the step",
          "never used the scaler it was given", True),
    Wrong("10.5", C.check_amp_step, make_amp(returns="scaled"), "returns the scaled loss",
          "you returned the SCALED loss", True),
    Wrong("10.5", C.check_amp_step, make_amp(norm=1.0), "clip norm fixed at 1.0",
          "you clipped at a fixed norm", True),
]

RIGHT = [
    Right("10.1", C.check_decay_parameter_names, class_name_only,
          "one class-name test (LayerNorm and RMSNorm end in 'Norm'), a tuple"),
    Right("10.1", C.check_decay_parameter_names, excluded_set_difference,
          "the excluded set first, then a sorted difference"),
    Right("10.2", C.check_training_step, step_zero_first, "zero_grad at the start, float(out.loss)"),
    Right("10.3", C.check_trainer_8bit, trainer_adamw8bit_with_keywords,
          "AdamW8bit (decoupled decay, same rule), betas as a list, positional model and args"),
    Right("10.4", C.check_accelerate_epoch, epoch_train_inside,
          "model.train() in the loop, clip under `if accelerator.sync_gradients`, model.zero_grad(set_to_none=True)"),
    Right("10.4", C.check_accelerate_epoch, make_epoch(zero="start"), "zero_grad at the start of each batch"),
    Right("10.4", C.check_accelerate_epoch, make_epoch(autocast="forward"),
          "a redundant `with accelerator.autocast():` around the prepared model's forward (same dtype: no change)"),
    Right("10.5", C.check_amp_step, amp_zero_first, "zero_grad first, nn.utils alias, float(loss.detach())"),
]
