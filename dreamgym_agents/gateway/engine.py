"""Continuous batching with a KV cache: the fast path of every in-process generation.

The reference path (:class:`~dreamgym_agents.gateway.local.Batcher`) hands each batch of waiting
requests to transformers' ``generate``: a request that arrives while a batch runs waits for the
whole batch to end, and every token pays ``generate``'s per-step bookkeeping, which for a small
model such as the embedded experience model costs far more than the model's own arithmetic
for that step (evidence: docs/history/results-2026-11-to-12.md).

:class:`ContinuousBatcher` keeps one running batch per model instead:

- requests join and leave between decoding steps: a new request is prefilled (its prompt run
  once through the model, its keys and values written to the cache) and decodes from the next
  step on; a finished one leaves at once and its caller has its answer;
- every row keeps its keys and values in a cache (one slot per row, rows contiguous, so a
  decoding step reads each layer's cache as one view), so a step computes one token a row;
- a prompt that begins like a recent one takes the cached keys and values of the common prefix
  and prefills only the rest (:class:`PrefixCache`): a GRPO group's first turn, an
  experience-model retry, the same state and action in several rollouts;
- each row keeps its own settings: greedy and sampled rows, temperatures, nucleus mass, seeds
  (a seeded row draws from its own generator, so its sample does not depend on the batch it
  shares), decoding constraints and banned sequences; masks are applied to the whole batch at
  once.

It runs the model's own modules (embeddings, norms, projections, MLPs, head, rotary
embedding), so LoRA adapters and live weights (a trainer's model) apply as they are; only the
attention over the cache is its own. Architectures it knows: the Llama family's decoder layer
(``qwen2``, ``llama``, ``mistral`` without sliding windows: the embedded models, SmolLM2);
another model (Gemma 3, say) takes the reference path (:func:`fast_path_refusal` says why).
Greedy answers equal the reference path's up to floating-point ties (tests hold them to it).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from dreamgym_agents.errors import ModelError

logger = logging.getLogger(__name__)

_INTERRUPTED = threading.Event()


def interrupt_local_generation() -> None:
    """Stop every local generation at its next token; each running or later request fails with
    a non-retryable :class:`~dreamgym_agents.errors.ModelError` until
    :func:`resume_local_generation`. ``dg-agents`` calls it on Ctrl-C, so the process does not
    wait for a long answer to finish before it exits (its worker threads are joined at exit)."""
    _INTERRUPTED.set()


def resume_local_generation() -> None:
    """Let local generations run again after :func:`interrupt_local_generation`."""
    _INTERRUPTED.clear()


def interrupted() -> bool:
    """Whether local generation is interrupted (:func:`interrupt_local_generation`)."""
    return _INTERRUPTED.is_set()


def check_interrupted() -> None:
    """Raise the interruption's :class:`~dreamgym_agents.errors.ModelError` if interrupted."""
    if _INTERRUPTED.is_set():
        raise ModelError("local generation interrupted", retryable=False)


def eos_ids(model: Any, tokenizer: Any | None) -> set[int]:
    """The token ids that end an answer: the model's generation config's and the tokenizer's."""
    ids: set[int] = set()
    for value in (getattr(model.generation_config, "eos_token_id", None),
                  getattr(tokenizer, "eos_token_id", None)):
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(int(v) for v in value)
    return ids


FAST_MODEL_TYPES = ("qwen2", "llama", "mistral")
"""``config.model_type`` values whose decoder layers the fast path runs."""

PREFIX_MIN_TOKENS = 16
"""Shortest common prefix worth taking from the prefix cache."""

PREFIX_CACHE_BYTES = 256 * 2**20
"""Most memory the prefix cache keeps (its oldest entries are dropped first)."""


def fast_path_refusal(model: Any) -> str | None:
    """Why ``model`` cannot take the fast path (None: it can)."""
    base = _base_model(model)
    config = getattr(base, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in FAST_MODEL_TYPES:
        return f"model type {kind!r} is not one of {', '.join(FAST_MODEL_TYPES)}"
    if getattr(config, "use_sliding_window", False) or any(
            t != "full_attention" for t in getattr(config, "layer_types", None) or []):
        return "sliding-window attention"
    body = getattr(base, "model", None)
    layers = getattr(body, "layers", None)
    if layers is None or getattr(base, "lm_head", None) is None or \
            getattr(body, "rotary_emb", None) is None:
        return "not a decoder of the Llama family's layout"
    attn = layers[0].self_attn
    if any(getattr(attn, name, None) is not None for name in ("q_norm", "k_norm")):
        return "per-head query/key norms"
    return None


def _base_model(model: Any) -> Any:
    """The transformers model under a PEFT wrapper (its layers keep their adapters)."""
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


@dataclass
class EngineStats:
    """Where an engine's time went (seconds of its worker thread, tokens, rows)."""

    prefill_s: float = 0.0
    decode_s: float = 0.0
    select_s: float = 0.0
    """Choosing each token: masks, constraints, sampling, traces."""
    constraint_s: float = 0.0
    """Of ``select_s``: the decoding constraints' own work (``Constraint.allowed``)."""
    prompt_tokens: int = 0
    prefix_tokens: int = 0
    """Prompt tokens taken from the prefix cache instead of prefilled."""
    new_tokens: int = 0
    decode_steps: int = 0
    rows: int = 0
    batches: int = 0

    def snapshot(self) -> dict[str, float]:
        return {k: round(v, 6) if isinstance(v, float) else v for k, v in vars(self).items()}


class PrefixCache:
    """Recent prompts' keys and values, by their tokens: a new prompt takes those of its longest
    common prefix with any of them (at least :data:`PREFIX_MIN_TOKENS`)."""

    def __init__(self, max_bytes: int = PREFIX_CACHE_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: list[_Prefix] = []
        self._bytes = 0

    def clear(self) -> None:
        self._entries.clear()
        self._bytes = 0

    def find(self, ids: Any) -> tuple[int, Any]:
        """``(length, entry)`` of the longest cached prefix of ``ids`` (a numpy array): the
        entry's ``keys``/``values`` cover at least ``length`` positions; ``(0, None)`` when
        none reaches :data:`PREFIX_MIN_TOKENS`."""
        import numpy as np

        best, found = 0, None
        for entry in self._entries:
            cached = entry.ids
            n = min(len(cached), len(ids))
            if n <= best:
                continue
            diff = np.flatnonzero(cached[:n] != ids[:n])
            common = int(diff[0]) if len(diff) else n
            if common > best:
                best, found = common, entry
        if found is None or best < PREFIX_MIN_TOKENS:
            return 0, None
        self._entries.remove(found)
        self._entries.append(found)  # most recently used last
        return best, found

    def add(self, ids: Any, keys: Any, values: Any, replaces: _Prefix | None = None) -> None:
        """Keep ``keys``/``values`` (layers × kv heads × positions × dims) of the prompt ``ids``
        (a numpy array); ``replaces``: an entry that is a prefix of it, dropped."""
        if replaces is not None and replaces in self._entries:
            self._entries.remove(replaces)
            self._bytes -= replaces.size
        size = keys.element_size() * (keys.numel() + values.numel())
        if size > self.max_bytes:
            return
        self._entries.append(_Prefix(ids, keys, values, size))
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._bytes -= self._entries.pop(0).size

    def __len__(self) -> int:
        return len(self._entries)


@dataclass(eq=False)
class _Prefix:
    """One cached prompt: its tokens and every layer's keys and values."""

    ids: Any
    keys: Any
    values: Any
    size: int


@dataclass
class _Row:
    """One request in the running batch."""

    request: Any
    length: int
    """Positions in the cache (prompt and the tokens fed back so far)."""
    new: list[int] = field(default_factory=list)
    generator: Any = None


class DecoderCache:
    """The running batch's keys and values: per layer ``(slots, kv heads, positions, dims)``,
    rows in slots ``0..n-1``; grown (copied) when more rows or positions are needed."""

    def __init__(self, layers: int, kv_heads: int, head_dim: int, dtype: Any, device: Any,
                 max_positions: int) -> None:
        self.layers, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.dtype, self.device = dtype, device
        self.max_positions = max_positions
        self.slots = 0
        self.positions = 0
        self.keys: list[Any] = []
        self.values: list[Any] = []

    def reserve(self, slots: int, positions: int) -> None:
        import torch

        positions = min(self.max_positions, positions)
        if slots <= self.slots and positions <= self.positions:
            return
        new_slots = max(slots, self.slots, 4)
        new_positions = max(positions, self.positions)
        if new_slots > self.slots:
            new_slots = max(new_slots, min(2 * self.slots, 1 << 30))
        if new_positions > self.positions:
            new_positions = min(self.max_positions,
                                max(new_positions, 2 * self.positions, 256))
        shape = (new_slots, self.kv_heads, new_positions, self.head_dim)
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                for _ in range(self.layers)]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device)
                  for _ in range(self.layers)]
        for old, new in ((self.keys, keys), (self.values, values)):
            for o, n in zip(old, new, strict=False):
                n[: self.slots, :, : self.positions] = o
        self.keys, self.values = keys, values
        self.slots, self.positions = new_slots, new_positions

    def move(self, src: int, dst: int, length: int) -> None:
        for layer in range(self.layers):
            self.keys[layer][dst, :, :length] = self.keys[layer][src, :, :length]
            self.values[layer][dst, :, :length] = self.values[layer][src, :, :length]


class DecoderRunner:
    """The model's forward for prefill and decoding steps over :class:`DecoderCache`.

    Where every projection of a layer is a plain ``nn.Linear`` (no adapter), the runner
    computes with fused copies of the weights (queries, keys and values in one matrix; the
    MLP's gate and up in another), made again whenever a parameter changes (its version
    counter: an optimiser's step updates weights in place); the query and key rows are
    reordered so that rotary embedding is one complex product, which leaves attention scores
    unchanged since queries and keys share the order. Otherwise (LoRA adapters) it calls the
    layers' modules, so the adapters apply.
    """

    def __init__(self, model: Any) -> None:
        import torch

        base = _base_model(model)
        self.model = model
        self.base = base
        config = base.config
        self.body = base.model
        self.head = base.lm_head
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(getattr(config, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None)
                            or config.hidden_size // config.num_attention_heads)
        self.groups = self.heads // self.kv_heads
        self.scaling = self.head_dim ** -0.5
        self.context = int(getattr(config, "max_position_embeddings", 0) or 1 << 20)
        self.vocab = int(config.vocab_size)
        self.eps = float(getattr(config, "rms_norm_eps", 1e-6))
        self.plain = all(type(m) is torch.nn.Linear for layer in self.body.layers
                         for m in (layer.self_attn.q_proj, layer.self_attn.k_proj,
                                   layer.self_attn.v_proj, layer.self_attn.o_proj,
                                   layer.mlp.gate_proj, layer.mlp.up_proj,
                                   layer.mlp.down_proj))
        half = self.head_dim // 2
        # each head's dimensions as (j, j + half) pairs: rotary is then a complex product
        self._pairs = torch.stack([torch.arange(half), torch.arange(half) + half], 1).flatten()
        self._versions: tuple[int, ...] = ()
        self._fused: list[tuple[Any, ...]] = []
        self._cis: Any = None

    @property
    def device(self) -> Any:
        return self.head.weight.device

    @property
    def dtype(self) -> Any:
        return self.head.weight.dtype

    def new_cache(self) -> DecoderCache:
        return DecoderCache(len(self.body.layers), self.kv_heads, self.head_dim, self.dtype,
                            self.device, self.context)

    def refresh(self) -> bool:
        """Make the fused weights and the rotary table again if a parameter changed since;
        whether anything did (cached keys and values are then stale)."""
        versions = tuple(p._version for p in self.model.parameters()) + \
            tuple(id(p) for p in self.head.parameters())
        if versions == self._versions:
            return False
        self._versions = versions
        self._rotary_table()
        if self.plain:
            self._fuse()
        return True

    def _rotary_table(self) -> None:
        import torch

        rotary = self.body.rotary_emb
        if "dynamic" in str(getattr(rotary, "rope_type", "default")):
            self._cis = None  # its frequencies depend on the sequence: asked at each step
            return
        positions = torch.arange(self.context, device=self.device).unsqueeze(0)
        probe = torch.zeros(1, 1, self.head_dim, dtype=self.dtype, device=self.device)
        cos, sin = rotary(probe, positions)
        half = self.head_dim // 2
        self._cis = torch.complex(cos[0, :, :half].float(), sin[0, :, :half].float())

    def _fuse(self) -> None:
        import torch

        d, pairs = self.head_dim, self._pairs.to(self.device)

        def paired(t: Any, heads: int) -> Any:  # rows of each head in (j, j + half) order
            shape = t.shape
            return t.reshape(heads, d, *shape[1:])[:, pairs].reshape(shape)

        fused = []
        for layer in self.body.layers:
            attn, mlp = layer.self_attn, layer.mlp
            weights = [paired(attn.q_proj.weight, self.heads),
                       paired(attn.k_proj.weight, self.kv_heads), attn.v_proj.weight]
            biases = [attn.q_proj.bias, attn.k_proj.bias, attn.v_proj.bias]
            qkv_b = None
            if any(b is not None for b in biases):
                zeros = [torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
                         for w in weights]
                parts = [b if b is not None else z for b, z in zip(biases, zeros, strict=True)]
                qkv_b = torch.cat([paired(parts[0], self.heads),
                                   paired(parts[1], self.kv_heads), parts[2]]).detach()
            up_b = None
            if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
                up_b = torch.cat([
                    b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype,
                                                        device=w.device)
                    for b, w in ((mlp.gate_proj.bias, mlp.gate_proj.weight),
                                 (mlp.up_proj.bias, mlp.up_proj.weight))]).detach()
            fused.append((
                layer.input_layernorm.weight.detach(),
                torch.cat(weights).detach(), qkv_b,
                attn.o_proj.weight.detach(),
                None if attn.o_proj.bias is None else attn.o_proj.bias.detach(),
                layer.post_attention_layernorm.weight.detach(),
                torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]).detach(), up_b,
                mlp.down_proj.weight.detach(),
                None if mlp.down_proj.bias is None else mlp.down_proj.bias.detach(),
                _activation(getattr(mlp, "act_fn", None)),
            ))
        self._fused = fused

    def _rotations(self, positions: Any, h: Any) -> Any:
        """The rotary factors of ``positions`` ``(b, t)``: complex ``(b, t, 1, half)``."""
        import torch

        if self._cis is not None:
            return self._cis[positions].unsqueeze(2)
        cos, sin = self.body.rotary_emb(h, positions)
        half = self.head_dim // 2
        return torch.complex(cos[..., :half].float(), sin[..., :half].float()).unsqueeze(2)

    def _project(self, index: int, layer: Any, h: Any, cis: Any) -> tuple[Any, Any, Any]:
        """Norm and projections of one layer, queries and keys rotated: ``(b, t, heads, d)``,
        ``(b, t, kv, d)`` and ``(b, t, kv, d)`` (queries and keys in paired order)."""
        import torch
        import torch.nn.functional as F

        b, t, hidden = h.shape
        d, half = self.head_dim, self.head_dim // 2
        if self.plain:
            ln1, w, bias = self._fused[index][:3]
            qkv = F.linear(F.rms_norm(h, (hidden,), ln1, self.eps), w, bias)
        else:
            attn = layer.self_attn
            x = layer.input_layernorm(h)
            pairs = self._pairs.to(h.device)
            q = attn.q_proj(x).view(b, t, self.heads, d)[..., pairs]
            k = attn.k_proj(x).view(b, t, self.kv_heads, d)[..., pairs]
            qkv = torch.cat([q.reshape(b, t, -1), k.reshape(b, t, -1), attn.v_proj(x)], -1)
        nq, nk = self.heads * d, self.kv_heads * d
        pairs = qkv[..., :nq + nk]
        if pairs.dtype != torch.float32:  # each cast is a dispatch: only where one is needed
            pairs = pairs.float()
        rotated = torch.view_as_real(torch.view_as_complex(
            pairs.reshape(b, t, self.heads + self.kv_heads, half, 2)) * cis)
        rotated = rotated.view(b, t, self.heads + self.kv_heads, d)
        if rotated.dtype != h.dtype:
            rotated = rotated.to(h.dtype)
        q, k = rotated[:, :, :self.heads], rotated[:, :, self.heads:]
        v = qkv[..., nq + nk:].view(b, t, self.kv_heads, d)
        return q, k, v

    def _rest(self, index: int, layer: Any, h: Any, out: Any) -> Any:
        """Output projection, residual, MLP, residual."""
        import torch.nn.functional as F

        if not self.plain:
            h = h + layer.self_attn.o_proj(out)
            return h + layer.mlp(layer.post_attention_layernorm(h))
        _, _, _, wo, bo, ln2, wgu, bgu, wd, bd, act = self._fused[index]
        h = h + F.linear(out, wo, bo)
        gate, up = F.linear(F.rms_norm(h, (h.shape[-1],), ln2, self.eps), wgu, bgu).chunk(2, -1)
        return h + F.linear(act(gate) * up, wd, bd)

    def _attend(self, q: Any, keys: Any, values: Any, mask: Any) -> Any:
        """Attention of ``q`` ``(b, t, heads, d)`` over ``keys``/``values`` ``(b, kv, s, d)``
        where ``mask`` ``(b, 1, t, s)`` is true; ``(b, t, heads * d)`` out."""
        import torch

        b, t, _, d = q.shape
        s = keys.shape[2]
        q = q.transpose(1, 2).reshape(b, self.kv_heads, self.groups * t, d)
        scores = torch.matmul(q, keys.transpose(2, 3)).view(b, self.kv_heads, self.groups, t, s)
        scores = scores.mul_(self.scaling).masked_fill_(~mask.unsqueeze(1), float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.matmul(probs.view(b, self.kv_heads, self.groups * t, s), values)
        return out.view(b, self.heads, t, d).transpose(1, 2).reshape(b, t, self.heads * d)

    def _final(self, h: Any) -> Any:
        return self.head(self.body.norm(h)).float()

    def prefill(self, cache: DecoderCache, slot: int, ids: list[int], start: int) -> Any:
        """Run ``ids[start:]`` at positions ``start..`` into ``slot`` (positions before
        ``start`` already cached); the last position's logits ``(vocab,)``."""
        import torch

        if not self._versions:
            self.refresh()
        device = self.device
        tokens = torch.tensor([ids[start:]], dtype=torch.long, device=device)
        n, total = tokens.shape[1], len(ids)
        positions = torch.arange(start, total, device=device).unsqueeze(0)
        h = self.body.embed_tokens(tokens)
        cis = self._rotations(positions, h)
        # query i (position start + i) sees keys 0 .. start + i
        mask = (torch.arange(total, device=device).unsqueeze(0)
                <= positions.view(n, 1)).view(1, 1, n, total)
        for index, layer in enumerate(self.body.layers):
            q, k, v = self._project(index, layer, h, cis)
            cache.keys[index][slot, :, start:total] = k[0].transpose(0, 1)
            cache.values[index][slot, :, start:total] = v[0].transpose(0, 1)
            out = self._attend(q, cache.keys[index][slot:slot + 1, :, :total],
                               cache.values[index][slot:slot + 1, :, :total], mask)
            h = self._rest(index, layer, h, out)
        return self._final(h[:, -1:])[0, -1]

    def decode(self, cache: DecoderCache, tokens: list[int], lengths: list[int]) -> Any:
        """One step of the rows in slots ``0..len(tokens)-1``: each row's token at its own
        position (``lengths``: positions cached before it); logits ``(rows, vocab)``."""
        import torch

        if not self._versions:
            self.refresh()
        device = self.device
        b = len(tokens)
        ids = torch.tensor(tokens, dtype=torch.long, device=device).view(b, 1)
        pos = torch.tensor(lengths, dtype=torch.long, device=device)
        span = max(lengths) + 1
        h = self.body.embed_tokens(ids)
        cis = self._rotations(pos.view(b, 1), h)
        mask = (torch.arange(span, device=device).unsqueeze(0) <= pos.unsqueeze(1)) \
            .view(b, 1, 1, span)
        rows = torch.arange(b, device=device)
        kv, groups, d = self.kv_heads, self.groups, self.head_dim
        # the mask as an additive bias, one row per (row, kv head): one fused multiply-add a
        # layer (baddbmm) instead of a product, a scaling and a fill
        bias = torch.zeros((b, span), dtype=h.dtype, device=device).masked_fill_(
            ~mask.view(b, span), float("-inf"))
        bias = bias.repeat_interleave(kv, 0).unsqueeze(1)
        for index, layer in enumerate(self.body.layers):
            q, k, v = self._project(index, layer, h, cis)
            keys, values = cache.keys[index], cache.values[index]
            keys[rows, :, pos] = k[:, 0]
            values[rows, :, pos] = v[:, 0]
            # one query a row: (b·kv, groups, d) against the row's (b·kv, span, d)
            seen_k = keys[:b, :, :span].reshape(b * kv, span, d)
            seen_v = values[:b, :, :span].reshape(b * kv, span, d)
            scores = torch.baddbmm(bias, q.reshape(b * kv, groups, d), seen_k.transpose(1, 2),
                                   alpha=self.scaling)
            out = torch.bmm(torch.softmax(scores, dim=-1), seen_v).view(b, 1, self.heads * d)
            h = self._rest(index, layer, h, out)
        return self._final(h)[:, 0]

    def prompt_cache(self, cache: DecoderCache, slot: int, length: int) -> tuple[Any, Any]:
        """Copies of one slot's first ``length`` positions, every layer: ``(layers, kv, t, d)``."""
        import torch

        keys = torch.stack([k[slot, :, :length] for k in cache.keys]).clone()
        values = torch.stack([v[slot, :, :length] for v in cache.values]).clone()
        return keys, values

    def load_prefix(self, cache: DecoderCache, slot: int, keys: Any, values: Any,
                    length: int) -> None:
        for index in range(len(cache.keys)):
            cache.keys[index][slot, :, :length] = keys[index, :, :length]
            cache.values[index][slot, :, :length] = values[index, :, :length]


def _activation(act: Any) -> Any:
    """The MLP's activation as a plain function (SiLU, the family's, through torch's own)."""
    import torch.nn.functional as F

    if act is None or type(act).__name__ in ("SiLU", "SiLUActivation"):
        return F.silu
    return act


class ContinuousBatcher:
    """One model's generations in a running batch (see the module docstring); the same
    ``submit`` as :class:`~dreamgym_agents.gateway.local.Batcher`.

    Args:
        model: A causal LM the fast path runs (:func:`fast_path_refusal` is None).
        pad_id: Unused (rows are never padded); kept for the reference path's signature.
        max_batch: Most rows decoding at once; more requests wait for a row to end.
        eos: Token ids that end an answer (the model's own when None).
        prefix_cache: Reuse the keys and values of recent prompts' common prefixes.
    """

    IDLE_EXIT_S = 30.0

    def __init__(self, model: Any, pad_id: int, max_batch: int, *,
                 eos: set[int] | None = None, prefix_cache: bool = True) -> None:
        del pad_id
        self.model = model
        self.max_batch = max(1, max_batch)
        self.runner = DecoderRunner(model)
        self._eos = set(eos) if eos is not None else eos_ids(model, None)
        self.prefix = PrefixCache() if prefix_cache else None
        self.stats = EngineStats()
        self._queue: list[Any] = []
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None

    @property
    def batches(self) -> int:
        """Requests admitted into a running batch at once, counted as batches (a request that
        joined a running batch adds none): figures comparable with the reference path's."""
        return self.stats.batches

    @property
    def rows(self) -> int:
        return self.stats.rows

    def submit(self, request: Any) -> list[int]:
        """Queue ``request``; block until its new token ids (cut at its own limit) are in."""
        return self.enqueue(request).result()

    def enqueue(self, request: Any) -> Any:
        """Queue ``request``; the (``concurrent.futures``) future of its new token ids."""
        with self._cond:
            self._queue.append(request)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._loop, name="hf-decode",
                                                daemon=True)
                self._worker.start()
            self._cond.notify()
        return request.future

    # -- the worker ----------------------------------------------------------------------------

    def _take(self, free: int, wait: bool) -> list[Any] | None:
        with self._cond:
            if wait and not self._queue and not self._cond.wait_for(
                    lambda: self._queue, timeout=self.IDLE_EXIT_S):
                self._worker = None  # idle: the next submit starts a new worker
                return None
            taken, self._queue = self._queue[:free], self._queue[free:]
            return taken

    def _loop(self) -> None:
        import torch

        rows: list[_Row] = []
        logits: Any = None
        cache = None
        while True:
            joining = self._take(self.max_batch - len(rows), wait=not rows)
            if joining is None:
                return
            try:
                check_interrupted()
                with torch.no_grad():
                    if cache is None:
                        cache = self.runner.new_cache()
                    if joining:
                        logits = self._admit(cache, rows, joining, logits)
                    if not rows:
                        continue
                    chosen = self._select(rows, logits)
                    rows, keep = self._finish(cache, rows, chosen)
                    if rows:
                        started = time.perf_counter()
                        logits = self.runner.decode(cache, [chosen[i] for i in keep],
                                                    [r.length for r in rows])
                        for r in rows:
                            r.length += 1
                        self.stats.decode_s += time.perf_counter() - started
                        self.stats.decode_steps += 1
                    else:
                        logits = None
            except Exception as exc:  # handed to every caller of the running batch
                for request in [r.request for r in rows] + list(joining or []):
                    if not request.future.done():
                        request.future.set_exception(exc)
                rows, logits, cache = [], None, None

    def _admit(self, cache: DecoderCache, rows: list[_Row], joining: list[Any],
               logits: Any) -> Any:
        """Prefill the ``joining`` requests into the slots after ``rows`` (appended to it);
        the logits of every row, the new ones last."""
        import numpy as np
        import torch

        started = time.perf_counter()
        need = max(len(r.request.ids) + r.request.max_tokens for r in rows + [
            _Row(q, 0) for q in joining])
        cache.reserve(len(rows) + len(joining), need)
        if self.runner.refresh() and self.prefix is not None:
            self.prefix.clear()  # cached keys and values are the old weights'
        fresh = []
        for request in joining:
            slot, ids = len(rows), list(request.ids)
            start, entry, array = 0, None, None
            if self.prefix is not None and len(ids) > PREFIX_MIN_TOKENS:
                array = np.asarray(ids, dtype=np.int64)
                found, entry = self.prefix.find(array)
                start = min(found, len(ids) - 1)  # the last prompt token gives the logits
                if start:
                    self.runner.load_prefix(cache, slot, entry.keys, entry.values, start)
            fresh.append(self.runner.prefill(cache, slot, ids, start))
            if array is not None and (entry is None or start < len(ids) - 1
                                      or len(entry.ids) < len(ids)):
                keys, values = self.runner.prompt_cache(cache, slot, len(ids))
                # an entry the new prompt extends is kept no more
                extends = entry is not None and start == len(entry.ids)
                self.prefix.add(array, keys, values, replaces=entry if extends else None)
            row = _Row(request, len(ids))
            if request.temperature > 0 and request.seed is not None:
                row.generator = torch.Generator(device=self.runner.device)
                row.generator.manual_seed(int(request.seed))
            rows.append(row)
            self.stats.prompt_tokens += len(ids)
            self.stats.prefix_tokens += start
        self.stats.rows += len(joining)
        self.stats.batches += 1
        self.stats.prefill_s += time.perf_counter() - started
        stacked = torch.stack(fresh)
        return stacked if logits is None else torch.cat([logits, stacked])

    def _select(self, rows: list[_Row], logits: Any) -> list[int]:
        """Each row's next token: its banned sequences and constraint masked, then greedy, or
        sampled at its temperature (and nucleus mass); traced rows record what they drew from."""
        import torch

        started = time.perf_counter()
        n, vocab = logits.shape
        keep: Any = None  # (rows, vocab) True where a token may come next; made when needed
        traced_allowed: dict[int, list[int] | None] = {}
        for i, r in enumerate(rows):
            request = r.request
            if not request.banned and request.constraint is None:
                continue
            for seq in request.banned:
                head = seq[:-1]
                if len(r.new) >= len(head) and r.new[len(r.new) - len(head):] == head:
                    if keep is None:
                        keep = torch.ones((n, vocab), dtype=torch.bool, device=logits.device)
                    keep[i, seq[-1]] = False
            if request.constraint is None:
                continue
            t0 = time.perf_counter()
            allowed = request.constraint.allowed(r.new)
            self.stats.constraint_s += time.perf_counter() - t0
            if request.trace:
                traced_allowed[i] = list(allowed) if allowed else None
            if allowed:  # None: unrestricted ([] never happens: see the grammar)
                if keep is None:
                    keep = torch.ones((n, vocab), dtype=torch.bool, device=logits.device)
                only = torch.zeros(vocab, dtype=torch.bool, device=logits.device)
                only[torch.as_tensor(allowed, dtype=torch.long, device=logits.device)] = True
                keep[i] &= only
        if keep is not None:
            logits = logits.masked_fill(~keep, float("-inf"))
        temps = [r.request.temperature for r in rows]
        chosen = logits.argmax(-1)
        sampled = [i for i, t in enumerate(temps) if t > 0]
        scored = logits
        if sampled:
            scored = logits.clone()
            index = torch.tensor(sampled, dtype=torch.long, device=logits.device)
            temp = torch.tensor([temps[i] for i in sampled], dtype=logits.dtype,
                                device=logits.device).unsqueeze(1)
            part = logits[index] / temp
            for j, i in enumerate(sampled):
                top_p = rows[i].request.top_p
                if top_p is not None and top_p < 1.0:
                    part[j] = _top_p(part[j], top_p)
            scored[index] = part
            probs = torch.softmax(part, dim=-1)
            shared = [j for j, i in enumerate(sampled) if rows[i].generator is None]
            if shared:
                picks = torch.multinomial(probs[shared], 1).squeeze(1)
                for j, pick in zip(shared, picks.tolist(), strict=True):
                    chosen[sampled[j]] = pick
            for j, i in enumerate(sampled):
                if rows[i].generator is not None:
                    chosen[i] = torch.multinomial(probs[j], 1, generator=rows[i].generator)[0]
        tokens = chosen.tolist()
        traced = [i for i, r in enumerate(rows) if r.request.trace]
        if traced:
            index = torch.tensor(traced, dtype=torch.long, device=logits.device)
            picked = torch.tensor([tokens[i] for i in traced], dtype=torch.long,
                                  device=logits.device)
            logps = torch.log_softmax(scored[index], dim=-1).gather(1, picked.unsqueeze(1))
            for i, lp in zip(traced, logps.squeeze(1).tolist(), strict=True):
                rows[i].request.logps.append(float(lp))
                if rows[i].request.constraint is not None:
                    rows[i].request.allowed.append(traced_allowed.get(i))
                else:
                    rows[i].request.allowed.append(None)
        self.stats.select_s += time.perf_counter() - started
        return tokens

    def _finish(self, cache: DecoderCache, rows: list[_Row],
                chosen: list[int]) -> tuple[list[_Row], list[int]]:
        """Append each row's token; answer and drop the rows that ended (the last slot moved
        into each freed one). Returns the rows left and, for each, its index in ``chosen``."""
        for r, token in zip(rows, chosen, strict=True):
            r.new.append(token)
            self.stats.new_tokens += 1
        order = list(range(len(rows)))
        i = 0
        while i < len(rows):
            r = rows[i]
            if r.new[-1] in self._eos or len(r.new) >= r.request.max_tokens:
                r.request.future.set_result(list(r.new))
                last = len(rows) - 1
                if i != last:
                    cache.move(last, i, rows[last].length)
                    rows[i], order[i] = rows[last], order[last]
                rows.pop()
                order.pop()
                continue
            i += 1
        return rows, order


def _top_p(logits: Any, top_p: float) -> Any:
    """transformers' ``TopPLogitsWarper`` on one row: the smallest set of tokens whose
    probabilities reach ``top_p`` is kept (at least one), the rest set to -inf."""
    import torch

    sorted_logits, order = torch.sort(logits, descending=False)
    cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[-1:] = False
    return logits.masked_fill(remove.scatter(0, order, remove), float("-inf"))
