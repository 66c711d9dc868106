"""Supervised fine-tuning of the experience model with TRL's SFTTrainer (paper Eq. 5).

Starts from any local transformers causal-LM checkpoint, or from scratch: a byte-level BPE
tokenizer trained on the environment's own text plus a small Qwen2 configuration (the embedded
default). The loss covers the completion only (reasoning, next state, reward, done, success); the
prompt is rendered and tokenized exactly as the in-process ``hf/`` provider does at inference.

The loss is a token-weighted cross-entropy: the tokens of an example's ``decision_spans``, its
reasoning's conclusion, outcome and which page comes next
(:func:`~dreamgym_agents.experience.data.decision_spans`), weigh ``decision_weight`` times the
others. Unweighted, a final answer's verdict is a handful of tokens among hundreds of copied page
lines, and a small model trained for minutes learns the page and not the verdict. The LM head is
applied to completion positions only, which on a CPU saves a sizeable share of the compute of a
small model with a large vocabulary. On a CPU with native bfloat16 (AVX512-BF16, AMX) the forward
and backward passes run under bfloat16 autocast, the weights, the optimizer and the loss staying in
float32: more steps in the same time on the embedded default's shape (evidence:
docs/history/results-2026-11-to-12.md).

A run trains its fixed number of steps on any machine (a slow one takes longer); a time budget
only stops it early, and the result then says it is partial (``SFTResult.partial``): callers
never use a partial model as a recipe's.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dreamgym_agents import launch, tracking
from dreamgym_agents.errors import ConfigError, MissingExtraError
from dreamgym_agents.gateway.local import configure_torch_threads

logger = logging.getLogger(__name__)


@dataclass
class ExperienceSFTConfig:
    """SFT settings.

    Attributes:
        output_dir: Where the trained checkpoint is saved (usable as ``hf/<output_dir>``).
        base_model: A local checkpoint directory to start from; None trains from scratch.
        vocab_size: Tokenizer size when training from scratch.
        hidden_size: Model width when training from scratch.
        num_layers: Transformer layers when training from scratch.
        max_length: Longest example in tokens (longer ones are dropped, and counted).
        epochs: Passes over the examples (unless ``max_steps`` is set).
        max_steps: Optimisation steps, whatever the data's size (None: ``epochs`` passes). With
            a fixed step count the run, its learning-rate schedule and so its weights do not
            depend on the machine's speed: the same data and seed train the same model.
        batch_size: Examples per optimisation step.
        learning_rate: Peak learning rate (from scratch wants ~1e-3, fine-tuning ~5e-5).
        decision_weight: Loss weight of the tokens in an example's ``decision_spans``
            (other completion tokens weigh 1); 1 is plain SFT.
        time_budget_s: Stop training after this many seconds (None: run every step). The
            schedule stays the steps' (it never depends on the machine's speed): a run the
            budget stops is partial (``SFTResult.partial``), not a shorter complete one.
        checkpoint_every: Save a resumable checkpoint (weights, optimizer, schedule) every
            this many steps in ``output_dir/trainer`` (0: none); a rerun with the same
            settings resumes from the newest one. A run the budget stops saves one too.
        seed: Seed of initialisation and data order.
        bf16: Run the passes under bfloat16 autocast (weights, optimizer and loss stay float32);
            None: on when the training device computes bfloat16 natively (:func:`native_bf16`;
            training runs on a visible CUDA device, :func:`training_device`).
    """

    output_dir: str
    base_model: str | None = None
    vocab_size: int = 3000
    hidden_size: int = 256
    num_layers: int = 4
    max_length: int = 1024
    epochs: float = 3.0
    max_steps: int | None = None
    batch_size: int = 8
    learning_rate: float = 1e-3
    decision_weight: float = 1.0
    time_budget_s: float | None = None
    checkpoint_every: int = 0
    seed: int = 0
    bf16: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.epochs <= 0 or self.batch_size < 1 or self.learning_rate <= 0:
            raise ConfigError("epochs, batch_size and learning_rate must be positive")
        if self.max_steps is not None and self.max_steps < 1:
            raise ConfigError(f"max_steps must be at least 1, got {self.max_steps}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0 (0: none), got "
                              f"{self.checkpoint_every}")
        if self.decision_weight <= 0:
            raise ConfigError(f"decision_weight must be positive (1 = plain SFT), got "
                              f"{self.decision_weight}")
        if self.base_model is not None and not Path(self.base_model).is_dir():
            raise ConfigError(f"base model not found: {self.base_model} (a local checkpoint dir)")


@dataclass
class SFTResult:
    """What training did."""

    path: str
    examples: int
    dropped_too_long: int
    steps: int
    first_loss: float
    last_loss: float
    seconds: float
    bf16: bool = False
    device: str = "cpu"
    """Where it trained (:func:`training_device`)."""
    planned_steps: int = 0
    """The steps the run was set to train (``steps`` falls short of them only when partial)."""
    resumed_from_step: int | None = None
    """The checkpoint's step the run resumed from (None: it started afresh)."""
    model: Any = field(default=None, repr=False, compare=False)
    """The trained model (in memory; also saved to ``path`` by the functions that save)."""

    @property
    def partial(self) -> bool:
        """True when a time budget stopped the run before its planned steps."""
        return self.steps < self.planned_steps


def _imports() -> tuple[Any, Any, Any]:
    try:
        import datasets
        import transformers
        import trl
    except ImportError as exc:
        raise MissingExtraError(exc.name or "trl", "train") from None
    return datasets, transformers, trl


def train_experience_model(
    examples: list[dict[str, Any]], cfg: ExperienceSFTConfig, *, corpus: list[str] | None = None,
    on_step: Callable[..., None] | None = None,
) -> SFTResult:
    """Train on ``examples`` (``{"messages", "completion"}``) and save to ``cfg.output_dir``.

    Args:
        examples: From :func:`dreamgym_agents.experience.data.build_examples`.
        cfg: Settings.
        corpus: Texts the from-scratch tokenizer learns its merges from (defaults to the examples).
        on_step: Called after each optimisation step (a progress bar).
    """
    _imports()
    start = time.perf_counter()
    out = Path(cfg.output_dir)
    tokenizer, model = starting_model(
        cfg, out, lambda: corpus or [e["messages"][-1]["content"] + "\n" + e["completion"]
                                     for e in examples])
    rows, dropped = [], 0
    for e in examples:
        row = tokenize_example(tokenizer, e, cfg.decision_weight)
        if len(row["input_ids"]) > cfg.max_length:
            dropped += 1
            continue
        rows.append(row)
    if not rows:
        raise ConfigError(f"no example fits in max_length={cfg.max_length} tokens")
    logger.info("SFT on %d examples (%d longer than %d tokens dropped)", len(rows), dropped,
                cfg.max_length)
    steps = cfg.max_steps or math.ceil(len(rows) / cfg.batch_size * cfg.epochs)
    result = fit_weighted(model, tokenizer, rows, cfg, out=out, start=start, on_step=on_step,
                          optimizers=cosine_schedule(model, cfg.learning_rate, steps))
    result.dropped_too_long = dropped
    if launch.is_main():
        result.model.save_pretrained(str(out))
        tokenizer.save_pretrained(str(out))
    return result


def starting_model(cfg: Any, out: Path, texts: Callable[[], list[str]]) -> tuple[Any, Any]:
    """(tokenizer, model) a run in ``out`` starts from: an interrupted run's (its tokenizer and
    initial weights are saved there), ``cfg.base_model``, or a new tiny model whose tokenizer
    learns its merges from ``texts()`` (``cfg``'s ``vocab_size``, ``hidden_size``,
    ``num_layers``, ``max_length``, ``seed``). Under a launcher the main process makes it and
    the others load it after."""
    from dreamgym_agents.gateway.local import load_causal_lm, make_tiny_checkpoint

    with launch.main_first(training_device()):
        if cfg.base_model is None and resumable_checkpoint(out, cfg) is not None:
            source = str(out)
        elif cfg.base_model is None:
            if launch.is_main():
                make_tiny_checkpoint(out, texts(), vocab_size=cfg.vocab_size,
                                     hidden_size=cfg.hidden_size, num_layers=cfg.num_layers,
                                     max_positions=cfg.max_length, seed=cfg.seed)
            source = str(out)
        else:
            source = cfg.base_model
        return load_causal_lm(source)


def fit_weighted(model: Any, tokenizer: Any, rows: list[dict[str, list]], cfg: Any, *,
                 out: Path, start: float | None = None,
                 on_step: Callable[..., None] | None = None,
                 optimizers: tuple[Any, Any] = (None, None)) -> SFTResult:
    """Train ``model`` on tokenized ``rows`` (``input_ids``, ``labels``, ``token_weights``) with
    the token-weighted loss; return what training did (``result.model`` is the trained model,
    not yet saved).

    ``cfg`` has the fields of :class:`ExperienceSFTConfig` that say how to train, as the
    policy's SFT config does: ``epochs``, ``max_steps``, ``batch_size``, ``learning_rate``,
    ``time_budget_s``, ``checkpoint_every``, ``seed``, ``max_length``, ``bf16``, ``extra``.
    ``on_step`` is called after each optimisation step (a progress bar); ``optimizers`` is
    (optimizer, scheduler), TRL's AdamW and cosine schedule when (None, None). With
    ``checkpoint_every``, a newer resumable checkpoint in ``out/trainer`` is resumed from.
    """
    datasets, transformers, trl = _imports()
    start = time.perf_counter() if start is None else start
    device = training_device()
    train_set = datasets.Dataset.from_list(rows)
    steps = cfg.max_steps or math.ceil(len(rows) / cfg.batch_size * cfg.epochs)
    every = int(getattr(cfg, "checkpoint_every", 0) or 0)
    resume = resumable_checkpoint(out, cfg)
    if (resume is not None and _checkpoint_step(resume) >= steps
            and (resume / "model.safetensors").exists()):
        # killed after the last checkpoint, before the model was saved (or trained on another
        # machine into this folder): the checkpoint is the model; the Trainer would take one
        # step more
        return finished_run(resume, model, rows, out=out, steps=steps, start=start, device=device,
                            bf16=native_bf16(device) if cfg.bf16 is None else cfg.bf16)
    # Batches of similar lengths: examples differ in length several times over, and random
    # batches would spend most of their compute on padding.
    # TRL recomputes activations in the backward pass by default: a third more forward work
    # for memory, which a CPU has to spare for these models (``extra`` can turn it back on)
    options: dict[str, Any] = {"train_sampling_strategy": "group_by_length",
                               "gradient_checkpointing": device != "cpu", **cfg.extra}
    args = trl.SFTConfig(
        output_dir=str(out / "trainer"),
        per_device_train_batch_size=cfg.batch_size,
        num_train_epochs=cfg.epochs,
        max_steps=cfg.max_steps or -1,
        learning_rate=cfg.learning_rate,
        lr_scheduler_type="cosine",
        warmup_steps=max(1, steps // 20),
        weight_decay=0.01,
        # at most every 10 steps: a time budget may stop training long before the planned
        # steps (a first-use build on a slow machine logged once, so first loss = last loss)
        logging_steps=max(1, min(steps // 25, 10)),
        save_strategy="steps" if every else "no",
        save_steps=every or 500,
        save_total_limit=1,
        report_to=[],
        use_cpu=device == "cpu",
        bf16=False,
        seed=cfg.seed,
        max_length=cfg.max_length,
        dataloader_num_workers=0,
        disable_tqdm=on_step is not None,  # the caller shows its own progress
        # The rows are tokenized here (labels and token weights included): TRL must neither
        # re-tokenize them nor drop the weights column.
        dataset_kwargs={"skip_prepare_dataset": True},
        remove_unused_columns=False,
        **options,
    )
    losses: list[float] = []

    class _Budget(transformers.TrainerCallback):
        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "loss" in logs:
                losses.append(float(logs["loss"]))

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if on_step is not None and state.global_step:
                on_step(state.global_step)  # a resumed run's bar starts where it stopped

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            if on_step is not None:
                on_step(1)
            over = bool(cfg.time_budget_s) and time.perf_counter() - start > cfg.time_budget_s
            if launch.any_process(over, device):  # every process stops at the same step
                logger.warning("SFT time budget of %.0f s reached at step %d/%d: the model is "
                               "partial", cfg.time_budget_s, state.global_step, state.max_steps)
                control.should_training_stop = True
                control.should_save = bool(every)  # a rerun resumes from here

    bf16 = native_bf16(device) if cfg.bf16 is None else cfg.bf16
    logger.info("SFT passes on %s in %s", device, "bfloat16 autocast" if bf16 else "float32")
    trainer = _weighted_trainer_class(trl, bf16=bf16, device=device)(
        model=model, args=args, train_dataset=train_set, processing_class=tokenizer,
        data_collator=_WeightedCollator(tokenizer.pad_token_id),
        callbacks=[_Budget(), *tracking.trainer_callbacks(f"sft-{out.name}")],
        optimizers=optimizers)
    if on_step is not None:  # the caller shows progress (and the losses): no printed log dicts
        trainer.remove_callback(transformers.trainer_callback.PrinterCallback)
    if resume is not None:
        logger.info("SFT resumes from %s", resume)
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    launch.check_weights_agree(trainer.model, device)
    return SFTResult(
        path=str(out), examples=len(rows), dropped_too_long=0,
        steps=int(result.global_step), first_loss=losses[0] if losses else float("nan"),
        last_loss=losses[-1] if losses else float("nan"),
        seconds=time.perf_counter() - start, bf16=bf16, device=device, planned_steps=steps,
        resumed_from_step=_checkpoint_step(resume) if resume else None,
        model=trainer.model,
    )


def finished_run(checkpoint: Path, model: Any, rows: list[dict[str, list]], *, out: Path,
                 steps: int, start: float, device: str, bf16: bool) -> SFTResult:
    """The result of a run whose ``checkpoint`` holds all its ``steps``: ``model`` with the
    checkpoint's weights, and the losses of the checkpoint's log."""
    from safetensors.torch import load_file

    state = json.loads((checkpoint / "trainer_state.json").read_text())
    losses = [float(e["loss"]) for e in state.get("log_history", []) if "loss" in e]
    missing, unexpected = model.load_state_dict(
        load_file(str(checkpoint / "model.safetensors")), strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied: not saved
    if missing or unexpected:
        raise ConfigError(f"{checkpoint} holds weights of another model "
                          f"({(missing or unexpected)[0]}, …): remove it to train afresh")
    done = _checkpoint_step(checkpoint)
    logger.info("SFT already finished: %s holds step %d of %d", checkpoint, done, steps)
    return SFTResult(
        path=str(out), examples=len(rows), dropped_too_long=0, steps=done,
        first_loss=losses[0] if losses else float("nan"),
        last_loss=losses[-1] if losses else float("nan"),
        seconds=time.perf_counter() - start, bf16=bf16, device=device, planned_steps=steps,
        resumed_from_step=done, model=model)


def resumable_checkpoint(out: Path, cfg: Any) -> Path | None:
    """The newest resumable checkpoint of an interrupted run in ``out/trainer`` (None: none,
    or ``cfg`` does not checkpoint)."""
    if not getattr(cfg, "checkpoint_every", 0):
        return None
    found = sorted((out / "trainer").glob("checkpoint-*"), key=_checkpoint_step)
    found = [p for p in found if (p / "trainer_state.json").exists()]
    return found[-1] if found else None


def _checkpoint_step(path: Path) -> int:
    tail = path.name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else -1


def tokenize_example(tokenizer: Any, example: dict[str, Any],
                     decision_weight: float = 1.0) -> dict[str, list]:
    """``input_ids``, ``labels`` (-100 on the prompt) and ``token_weights`` of one example.

    The prompt is tokenized on its own, as the in-process provider does before generating, and
    the completion (plus the end-of-text token) after it, so training sees exactly the token
    boundary that inference continues from. A completion token overlapping a decision span
    weighs ``decision_weight``; other completion tokens weigh 1 (0 in an example whose
    ``"loss"`` is ``"decisions"``); prompt tokens 0.
    """
    from dreamgym_agents.gateway.local import format_prompt

    prompt, templated = format_prompt(tokenizer, example["messages"])
    prompt_ids = tokenizer(prompt, add_special_tokens=not templated)["input_ids"]
    encoded = tokenizer(example["completion"], add_special_tokens=False,
                        return_offsets_mapping=True)
    spans = [tuple(s) for s in example.get("decision_spans") or []]
    # "loss": "decisions" (a judge example): only the decision spans are trained
    other = 0.0 if example.get("loss") == "decisions" else 1.0
    weights = [decision_weight if any(a < end and b > start for start, end in spans) else other
               for a, b in encoded["offset_mapping"]]
    completion_ids = [*encoded["input_ids"], tokenizer.eos_token_id]
    weights.append(other)
    return {"input_ids": prompt_ids + completion_ids,
            "labels": [-100] * len(prompt_ids) + completion_ids,
            "token_weights": [0.0] * len(prompt_ids) + weights}


class _WeightedCollator:
    """TRL's language-modeling collator (right padding, prebuilt labels) plus the padded
    ``token_weights``."""

    def __init__(self, pad_token_id: int) -> None:
        from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

        self.base = DataCollatorForLanguageModeling(pad_token_id=pad_token_id)

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        weights = [torch.tensor(e["token_weights"], dtype=torch.float32) for e in examples]
        batch = self.base([{"input_ids": e["input_ids"], "labels": e["labels"]}
                           for e in examples])
        width = batch["input_ids"].shape[1]
        batch["token_weights"] = torch.stack(
            [torch.nn.functional.pad(w, (0, width - len(w))) for w in weights])
        return batch


def cpu_has_native_bf16() -> bool:
    """True when the CPU computes bfloat16 in hardware (AVX512-BF16 or AMX); elsewhere bfloat16
    autocast is emulated and slower than float32."""
    import torch

    cpu = getattr(torch, "cpu", None)
    checks = [getattr(cpu, name, None) for name in ("_is_avx512_bf16_supported",
                                                     "_is_amx_tile_supported")]
    return any(bool(check()) for check in checks if callable(check))


def training_device() -> str:
    """Where training runs: ``cuda`` when a CUDA device is visible (``CUDA_VISIBLE_DEVICES=``
    hides it), else ``cpu``. The same data and seed train the same model on one kind of
    device; a GPU's arithmetic differs from a CPU's in the last bits."""
    import torch

    if torch.cuda.is_available():
        return "cuda"
    configure_torch_threads()
    return "cpu"


def native_bf16(device: str) -> bool:
    """True when ``device`` computes bfloat16 in hardware (the default of ``bf16``)."""
    import torch

    if device == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return cpu_has_native_bf16()


def body_and_head(model: Any) -> tuple[Any, Any]:
    """The transformer body (hidden states out) and the LM head of a causal LM, through a PEFT
    wrapper (whose ``base_model_prefix`` names the whole causal LM, not its body) and a
    DistributedDataParallel one."""
    model = getattr(model, "module", model) if _data_parallel(model) else model
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, base.base_model_prefix), base.get_output_embeddings()


def _data_parallel(model: Any) -> bool:
    import torch

    return isinstance(model, torch.nn.parallel.DistributedDataParallel)


def last_hidden(model: Any, input_ids: Any, attention_mask: Any) -> Any:
    """The body's last hidden states of a causal LM (what its LM head reads). Under a launcher
    the model is wrapped in DistributedDataParallel, whose own forward must run for the
    gradients to be averaged across processes: the whole model then runs, keeping one position
    of logits; alone, the body runs and the LM head is left for the positions that need it."""
    if _data_parallel(model):
        out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                    output_hidden_states=True, logits_to_keep=1)
        return out.hidden_states[-1]
    backbone, _ = body_and_head(model)
    return backbone(input_ids=input_ids, attention_mask=attention_mask,
                    use_cache=False).last_hidden_state


def _weighted_trainer_class(trl: Any, *, bf16: bool = False, device: str = "cpu") -> type:
    """SFTTrainer with the token-weighted, completion-only loss (see the module docstring),
    its passes under bfloat16 autocast on ``device`` when ``bf16``."""
    import torch

    class WeightedSFTTrainer(trl.SFTTrainer):
        def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                         num_items_in_batch: Any = None) -> Any:
            weights = inputs.pop("token_weights")[:, 1:]
            labels = inputs.pop("labels")[:, 1:]
            _, head = body_and_head(model)
            mask = labels != -100
            # The trainer's own mixed precision wraps model.forward, which this loss bypasses
            # (the LM head runs on completion positions only): autocast here instead.
            with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
                hidden = last_hidden(model, inputs["input_ids"],
                                     inputs.get("attention_mask"))[:, :-1]
                logits = head(hidden[mask])
            nll = torch.nn.functional.cross_entropy(logits.float(), labels[mask],
                                                    reduction="none")
            w = weights[mask]
            loss = (nll * w).sum() / w.sum().clamp(min=1e-6)
            return (loss, {"logits": logits}) if return_outputs else loss

    return WeightedSFTTrainer


WARMUP_SHARE = 0.05
"""Share of a run's steps spent warming up."""


def cosine_schedule(model: Any, learning_rate: float, steps: int) -> tuple[Any, Any]:
    """AdamW (weight decay 0.01 on matrices only) with a linear warmup over the first
    ``WARMUP_SHARE`` of ``steps`` and a cosine to 0 at the last step. The schedule depends on the
    step alone, never on the clock: the same data and seed train the same model on any machine,
    and a slow machine does not build a different, weaker model."""
    import torch

    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    rest = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                                   {"params": rest, "weight_decay": 0.0}], lr=learning_rate)

    def factor(step: int) -> float:
        progress = min(1.0, (step + 1) / max(1, steps))
        if progress < WARMUP_SHARE:
            return progress / WARMUP_SHARE
        return 0.5 * (1.0 + math.cos(math.pi * (progress - WARMUP_SHARE) / (1 - WARMUP_SHARE)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
