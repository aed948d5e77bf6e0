"""The engine's own forward pass for Llama-family decoders, over a slot KV pool.

Hugging Face's forward with a `DynamicCache` keeps a running batch left-padded: every row's cache
is as long as the longest row, a request joining the batch re-pads and copies the whole cache,
and a finished row leaving it copies the whole cache again. Here each running row owns one *slot*
of a pool (`KVPool`: per layer, the keys and values of every slot), its tokens start at position
0 of the slot, and its length is its own:

* joining the batch writes only the new rows' KV into free slots (no copy of the others);
* leaving it moves only the rows that fill the holes (rows `0..n-1` stay the running batch);
* a decode step writes one position per row and attends over that row's own length (the C
  kernel) or over positions `0..longest` with a length mask (torch), GQA without repeating
  keys: the query heads of one KV head are grouped.

Keys are kept in blocks of 16 positions, each block transposed (`[slots, kv_heads, capacity / 16,
head_dim, 16]`): a query's scores over 16 consecutive positions are then contiguous multiply-adds
with no horizontal sums, and a row's keys are read as one contiguous run (measured 20% faster
than a plain transposed `[head_dim, capacity]` layout at 70 positions, cold caches).

Weights are the HF module's own parameters, read at every call, so an in-place weight update of
the module is seen by the next step (bf16 on a CPU without bf16 instructions multiplies fp32
copies of them, `WideWeights`, rebuilt when a weight changes). Covered: `llama`, `qwen2`,
`qwen3` (q/k norms), `mistral` without a sliding window, SiLU MLPs, static RoPE types; anything
else runs on the HF forward (`native_unsupported` says why). Numerics follow the HF modules: RMSNorm in fp32, RoPE tables
from the model's own rotary module, softmax in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import overload

import torch
import torch.nn.functional as F

from slime.engine import kernels

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
_STATIC_ROPE = ("default", "linear", "llama3", "yarn")
# tokens of new rows run through the model at once in a prefill; larger batches go in chunks so
# activations (tokens x intermediate size) stay small
PREFILL_CHUNK_TOKENS = 8192
# pool positions reserved past the longest prompt when rows are added; more as they decode
INITIAL_DECODE_ROOM = 64


def native_unsupported(model) -> str | None:
    """Why the native forward cannot run `model` (None: it can)."""
    cfg = model.config
    mt = getattr(cfg, "model_type", None)
    if mt not in SUPPORTED_MODEL_TYPES:
        return f"model_type {mt!r} (native forward covers {', '.join(SUPPORTED_MODEL_TYPES)})"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r}"
    if getattr(cfg, "pretraining_tp", 1) not in (None, 1):
        return "pretraining_tp > 1"
    window = getattr(cfg, "sliding_window", None)
    if window and (mt == "mistral" or getattr(cfg, "use_sliding_window", False)):
        return f"sliding_window {window}"
    layer_types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in layer_types):
        return "layers other than full attention"
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    rope_type = rope.get("rope_type", rope.get("type", "default")) if isinstance(rope, dict) else "default"
    if rope_type not in _STATIC_ROPE:
        return f"rope_type {rope_type!r}"
    inner = getattr(model, "model", None)
    if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
        return "no model.layers / model.rotary_emb"
    return None


def has_bf16_matmul() -> bool:
    """Whether this CPU has bf16 multiply instructions (AVX512-BF16 or AMX)."""
    try:
        return bool(torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())
    except AttributeError:  # pragma: no cover - older torch
        return False


def kv_dtype_for(dtype: torch.dtype) -> torch.dtype:
    """KV cache dtype. bf16/fp16 KV is kept in fp32 on CPUs without bf16 instructions: there the
    attention matmuls over the cache run several times faster in fp32, and the values are the
    same (the keys and values come out of the projections in the model dtype and widen exactly);
    attention then accumulates in fp32 as SDPA's CPU kernel does internally."""
    if dtype == torch.float32 or has_bf16_matmul():
        return dtype
    return torch.float32


class WeightCopies:
    """Copies derived from a model's weights (`_derive`), each rebuilt when its weight changes: an
    in-place update (a weight sync) bumps the tensor's version counter, a replaced `.data` changes
    its storage, and both are checked at every call."""

    def __init__(self):
        # id(weight) -> (weight, its (version, storage) when copied, the copy); holding the
        # weight keeps its id from being reused by another tensor
        self._copies: dict[int, tuple[torch.Tensor, tuple[int, int], torch.Tensor]] = {}

    def _derive(self, t: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @overload
    def get(self, t: torch.Tensor) -> torch.Tensor: ...
    @overload
    def get(self, t: None) -> None: ...
    def get(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None:
            return None
        key = (t._version, t.data_ptr())
        hit = self._copies.get(id(t))
        if hit is None or hit[1] != key:
            hit = self._copies[id(t)] = (t, key, self._derive(t))
        return hit[2]


class WideWeights(WeightCopies):
    """fp32 copies of a bf16/fp16 model's linear weights, for CPUs without bf16 instructions.

    There a bf16 `F.linear` was measured 3-4x slower than fp32 on the same shapes (torch emulates
    the bf16 multiply). The projection is computed as `F.linear(x.float(), W.float())` rounded back
    to the model dtype: the inputs widen exactly and both accumulate in fp32, so outputs agree with
    the bf16 kernel up to accumulation order (1 in 10^4 elements differed by one bf16 ulp in a
    test here). The cost is the fp32 copy's memory (twice the bf16 weights)."""

    def _derive(self, t: torch.Tensor) -> torch.Tensor:
        # column-major, as column_major_linears stores the model's own weights
        return t.t().float().contiguous().t() if t.dim() == 2 else t.float()


class PackedWeights(WeightCopies):
    """bf16 linear weights reordered once into oneDNN's blocked layout, for CPUs with bf16 units.

    A plain bf16 `F.linear` hands oneDNN the weight in torch's layout, which it reorders at every
    call: at the decode step's small batches that made a bf16 projection slower than the fp32 one
    (measured 2026-12-06, AMD EPYC with avx512_bf16, 2 threads, a [1536 x 512] weight: 8 rows 74 us
    bf16 against 38 us fp32; prepacked 34 us; 32 rows 131 / 157 / 73 us). The packed copy (the same
    values: a reorder, not a rounding) is rebuilt after every weight sync, as `WideWeights`' copies
    are. It costs a second copy of the bf16 weights' memory."""

    available = torch.backends.mkldnn.is_available()
    BATCH_HINT = 8  # oneDNN's packing depends on an expected batch; 8 served every batch size measured

    def _derive(self, t: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._reorder_linear_weight(t.contiguous(), self.BATCH_HINT)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """`F.linear(x, weight, bias)` for 2-D bf16 `x` on the packed copy of `weight`."""
        if not self.available:
            return F.linear(x, weight, bias)
        return torch.ops.mkldnn._linear_pointwise(x, self.get(weight), bias, "none", [], "")


BLOCK = 16  # key positions per block


class KVPool:
    """Keys `[slots, kv_heads, capacity / BLOCK, head_dim, BLOCK]` and values `[slots, kv_heads,
    capacity, head_dim]` of every layer, grown on demand (capacity a multiple of BLOCK)."""

    def __init__(self, num_layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype, zero_fill: bool = True):
        self.num_layers, self.kv_heads, self.head_dim, self.dtype = num_layers, kv_heads, head_dim, dtype
        self.zero_fill = zero_fill
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.slots = 0
        self.capacity = 0

    def ensure(self, slots: int, capacity: int, used_slots: int, used_len: int, limit: int = 0) -> None:
        """Room for `slots` rows of `capacity` positions; the first `used_slots` rows' first
        `used_len` positions are kept. Grows geometrically (but not past `limit`, the most any
        row can need), so a growing batch reallocates rarely; growing the positions drops slots
        past `slots` (rows that left the batch), so the pool follows the rows really running,
        not the batch's widest moment."""
        if slots <= self.slots and capacity <= self.capacity:
            return
        if capacity > self.capacity:
            new_slots = max(slots, used_slots)
            room = max(64, capacity // 2) if self.capacity else 0
            new_cap = -(-max(capacity, min(capacity + room, limit)) // BLOCK) * BLOCK
        else:
            new_slots = max(slots, min(2 * self.slots, slots + 64))
            new_cap = self.capacity
        kv, d = self.kv_heads, self.head_dim
        # The torch decode attention multiplies masked-out positions too (as 0 x value), so its
        # pool starts as zeros (reused allocator memory may hold NaN bit patterns). The C kernel
        # never reads past a row's length: their pool is left uninitialised, and pages are only touched
        # where rows really write (zeroing a pool sized for the longest request was ~3% of a rollout).
        new = torch.zeros if self.zero_fill else torch.empty
        keys = [new((new_slots, kv, new_cap // BLOCK, d, BLOCK), dtype=self.dtype) for _ in range(self.num_layers)]
        values = [new((new_slots, kv, new_cap, d), dtype=self.dtype) for _ in range(self.num_layers)]
        if used_slots and used_len:
            for old, fresh in zip(
                self.positions(used_len, used_slots), self._views(keys, values, used_len, used_slots), strict=True
            ):
                fresh.copy_(old)
        self.keys, self.values, self.slots, self.capacity = keys, values, new_slots, new_cap

    @staticmethod
    def _views(keys, values, n: int, slots: int | None) -> list[torch.Tensor]:
        blocks = -(-n // BLOCK)
        return [k[:slots, :, :blocks] for k in keys] + [v[:slots, :, :n] for v in values]

    def positions(self, n: int, slots: int | None = None) -> list[torch.Tensor]:
        """Views of (at least) the first `n` positions of every key and value tensor (dim 0:
        slots; keys in whole blocks)."""
        return self._views(self.keys, self.values, n, slots)

    def key_rows(self, layer: int, slots: slice | torch.Tensor, n: int) -> torch.Tensor:
        """Keys of positions 0..n-1 of `slots` as [rows, kv_heads, n, head_dim] (a copy)."""
        k = self.keys[layer][:, :, : -(-n // BLOCK)]
        k = k[slots] if isinstance(slots, slice) else k.index_select(0, slots)
        rows, kv, blocks, d, _ = k.shape
        return k.transpose(-1, -2).reshape(rows, kv, blocks * BLOCK, d)[:, :, :n]

    def write(self, layer: int, slot: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Put `keys`/`values` [kv_heads, m, head_dim] at positions 0..m-1 of `slot` (the rest
        of the last key block is overwritten with zeros)."""
        kv, m, d = keys.shape
        blocks = -(-m // BLOCK)
        padded = keys.new_zeros((kv, blocks * BLOCK, d))
        padded[:, :m] = keys
        self.keys[layer][slot, :, :blocks] = padded.view(kv, blocks, BLOCK, d).transpose(-1, -2)
        self.values[layer][slot, :, :m] = values

    def read(self, layer: int, slot: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of positions 0..n-1 of `slot`: keys and values [kv_heads, n, head_dim]."""
        return self.key_rows(layer, slice(slot, slot + 1), n)[0], self.values[layer][slot, :, :n].clone()


@dataclass
class SlotBatch:
    """A running batch: row i lives in slot i; `lens[i]` positions of it are cached."""

    pool: KVPool
    lens: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    max_len: int = 0  # max(lens), kept as a Python int so a step needs no tensor read-back
    need: int = 0  # the most positions any row may reach (prompt + max_new_tokens + 1)

    @property
    def rows(self) -> int:
        return int(self.lens.shape[0])


class NativeForward:
    def __init__(
        self, model, dtype: torch.dtype, context_length: int, use_kernels: bool = True, widen: bool | None = None
    ):
        """`widen`: multiply a bf16/fp16 model's projections in fp32 (`WideWeights`); by default
        where the CPU has no bf16 instructions."""
        self.model = model
        cfg = model.config
        self.inner = model.model
        self.layers = list(self.inner.layers)
        self.num_heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.num_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads)
        self.group = self.num_heads // self.kv_heads
        self.scaling = self.head_dim**-0.5
        self.eps = float(getattr(cfg, "rms_norm_eps", 1e-6))
        self.dtype = dtype
        if widen is None:
            widen = not has_bf16_matmul()
        self.wide = WideWeights() if widen and dtype != torch.float32 else None
        # a bf16 model on a CPU with bf16 units: the projections multiply in bf16 (the fast
        # instructions), everything between them (residual stream, norms, RoPE, attention, the KV
        # cache) stays in fp32 on the C kernels. The bf16 step as torch operations was measured
        # no faster than fp32 at 32 rows: its elementwise steps and dtype copies ate the gain.
        self.mixed = dtype == torch.bfloat16 and not widen and use_kernels and kernels.load() is not None
        self.act_dtype = torch.float32 if self.mixed else dtype  # the activations' dtype
        self.kv_dtype = torch.float32 if self.mixed else kv_dtype_for(dtype)
        self.norm_weights = WideWeights() if self.mixed else None  # fp32 copies for the C norm kernel
        self.packed = PackedWeights() if self.mixed else None
        self.qk_norm = hasattr(self.layers[0].self_attn, "q_norm")
        # fp32 decode steps run on the C kernels where they build (slime.engine.kernels); a
        # bf16 model whose KV pool is fp32 and whose activations are bf16 uses their attention only
        # (the rest of its step rounds to bf16 where the HF modules do, as torch operations)
        self.kernels = self.attention_kernel = None
        if use_kernels and self.kv_dtype == torch.float32:
            self.attention_kernel = kernels.load()
            self.kernels = self.attention_kernel if self.act_dtype == torch.float32 else None
        # RoPE cos/sin for every position, from the model's own rotary module (its scaling rules)
        positions = torch.arange(context_length + 1, dtype=torch.long).unsqueeze(0)
        with torch.inference_mode():
            cos, sin = self.inner.rotary_emb(torch.zeros(1, dtype=self.act_dtype), positions)
        self.cos, self.sin = cos[0].to(self.act_dtype), sin[0].to(self.act_dtype)  # [P, head_dim]

    # ------------------------------------------------------------------ batch interface
    def new_batch(self) -> SlotBatch:
        return SlotBatch(
            pool=KVPool(
                len(self.layers), self.kv_heads, self.head_dim, self.kv_dtype, zero_fill=self.attention_kernel is None
            )
        )

    @torch.inference_mode()
    def add_rows(
        self, batch: SlotBatch, prompts: list[list[int]], max_new: int, full_logits: bool, hits: dict, share: bool
    ):
        """Prefill `prompts` into the next free slots (rows `batch.rows..`). Identical prompts
        (`share`) are prefilled once and the KV copied to the others; a prompt with a prefix-cache
        hit `hits[j] = (m, entry)` starts from the entry's first `m` positions. Returns (last
        logits [n, V] fp32, per-row prompt logits or None, per-row reused prompt tokens)."""
        base, n_new = batch.rows, len(prompts)
        # positions for the prompts and the first INITIAL_DECODE_ROOM new tokens; decode grows
        # the pool as rows get longer (most rows of a rollout stop long before max_new_tokens)
        longest = max(len(p) for p in prompts)
        batch.need = max(batch.need, longest + max(max_new, 0) + 1)
        capacity = max(longest + min(max(max_new, 0), INITIAL_DECODE_ROOM) + 1, batch.max_len + 1)
        batch.pool.ensure(base + n_new, capacity, base, batch.max_len, batch.need)
        first: dict[tuple[int, ...], int] = {}
        source = list(range(n_new))  # row whose prefill row j reuses (itself when computed)
        if share:
            for j, p in enumerate(prompts):
                source[j] = first.setdefault(tuple(p), j)
        computed = [j for j in range(n_new) if source[j] == j]
        starts = []
        for j in computed:
            m, entry = hits.get(j, (0, None))
            if entry is not None:
                for layer, (k, v) in enumerate(zip(entry.keys, entry.values, strict=True)):
                    batch.pool.write(layer, base + j, k[:, :m], v[:, :m])
            starts.append(m)
        last_c, full_c = self.extend(
            batch,
            [base + j for j in computed],
            [prompts[j][m:] for j, m in zip(computed, starts, strict=True)],
            starts,
            full_logits,
        )
        pos = {j: i for i, j in enumerate(computed)}
        dups = [j for j in range(n_new) if source[j] != j]
        if dups:  # one copy per tensor for all of them
            dst = torch.tensor([base + j for j in dups], dtype=torch.long)
            src = torch.tensor([base + source[j] for j in dups], dtype=torch.long)
            for view in batch.pool.positions(max(len(prompts[j]) for j in dups)):
                view.index_copy_(0, dst, view.index_select(0, src))
        order = torch.tensor([pos[source[j]] for j in range(n_new)], dtype=torch.long)
        last = last_c.index_select(0, order)
        full = None if full_c is None else [full_c[pos[source[j]]] for j in range(n_new)]
        cached = [len(prompts[j]) if source[j] != j else starts[pos[j]] for j in range(n_new)]
        new_lens = torch.tensor([len(p) for p in prompts], dtype=torch.long)
        batch.lens = torch.cat([batch.lens, new_lens])
        batch.max_len = max(batch.max_len, int(new_lens.max()))
        return last, full, cached

    @torch.inference_mode()
    def row_kv(self, batch: SlotBatch, row: int, n: int):
        """The KV of row `row`'s first `n` positions (per layer [kv_heads, n, head_dim])."""
        if n > int(batch.lens[row]):
            return None
        kv = [batch.pool.read(layer, row, n) for layer in range(len(self.layers))]
        return [k for k, _ in kv], [v for _, v in kv]

    @torch.inference_mode()
    def select_rows(self, batch: SlotBatch, keep: list[int]) -> None:
        """Rows `keep[i]` become rows i. Only rows that change slot are copied."""
        moves = [(dst, src) for dst, src in enumerate(keep) if dst != src]
        if moves:
            dst = torch.tensor([m[0] for m in moves], dtype=torch.long)
            src = torch.tensor([m[1] for m in moves], dtype=torch.long)
            for view in batch.pool.positions(batch.max_len):
                view.index_copy_(0, dst, view.index_select(0, src))
        idx = torch.tensor(keep, dtype=torch.long)
        batch.lens = batch.lens.index_select(0, idx)
        batch.max_len = int(batch.lens.max()) if keep else 0

    # ------------------------------------------------------------------ compute
    def _rms(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * xf.to(x.dtype)

    def _add_norm(self, x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor):
        """The residual add and the RMSNorm after it: (x + delta, RMSNorm(x + delta) * weight).
        The C kernel does both in one pass and updates x in place."""
        if self.kernels is not None:
            if self.norm_weights is not None:
                weight = self.norm_weights.get(weight)
            return x, self.kernels.add_rms_norm(x, delta, weight, self.eps)
        if delta is not None:
            x = x + delta
        return x, self._rms(x, weight)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _linear(self, x: torch.Tensor, module) -> torch.Tensor:
        bias = getattr(module, "bias", None)
        if self.packed is not None:  # bf16 in, bf16 multiply, fp32 out (a bf16 value widens exactly)
            return self.packed.linear(x.to(torch.bfloat16), module.weight, bias).float()
        if self.wide is None:
            return F.linear(x, module.weight, bias)
        return F.linear(x.float(), self.wide.get(module.weight), self.wide.get(bias)).to(x.dtype)

    def _mlp(self, layer, h: torch.Tensor) -> torch.Tensor:
        mlp = layer.mlp
        gate = self._linear(h, mlp.gate_proj)
        up = self._linear(h, mlp.up_proj)
        if self.kernels is not None:
            gate = self.kernels.silu_mul(gate, up)
        else:
            gate = F.silu(gate).mul_(up)
        return self._linear(gate, mlp.down_proj)

    def _qkv(self, layer, h: torch.Tensor, rows: int):
        """q [rows, heads, D], k and v [rows, kv_heads, D] (after Qwen3's q/k norms)."""
        attn, d = layer.self_attn, self.head_dim
        q = self._linear(h, attn.q_proj).view(rows, self.num_heads, d)
        k = self._linear(h, attn.k_proj).view(rows, self.kv_heads, d)
        v = self._linear(h, attn.v_proj).view(rows, self.kv_heads, d)
        if self.qk_norm:
            q = self._rms(q, attn.q_norm.weight)
            k = self._rms(k, attn.k_norm.weight)
        return q, k, v

    def _layers(self, x: torch.Tensor, attend) -> torch.Tensor:
        """The decoder stack over hidden states x [T, H]. `attend(i, layer, h)` maps layer i's
        normed input to its attention output [T, heads * D] (and stores the KV). Returns the
        final-norm output [T, H]."""
        x, h = self._add_norm(x, None, self.layers[0].input_layernorm.weight)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            delta = self._linear(attend(i, layer, h), attn.o_proj)
            x, h = self._add_norm(x, delta, layer.post_attention_layernorm.weight)
            after = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.inner.norm
            x, h = self._add_norm(x, self._mlp(layer, h), after.weight)
        return h

    def _embed(self, ids: torch.Tensor) -> torch.Tensor:
        return self.inner.embed_tokens(ids).to(self.act_dtype)

    def _head(self, h: torch.Tensor) -> torch.Tensor:
        return self._linear(h, self.model.lm_head).float()

    @torch.inference_mode()
    def decode(self, batch: SlotBatch, tokens: torch.Tensor) -> torch.Tensor:
        """Feed one token per row ([B] long); returns the next logits [B, V] fp32."""
        pool = batch.pool
        if batch.max_len + 1 > pool.capacity:
            pool.ensure(batch.rows, batch.max_len + 1, batch.rows, batch.max_len, batch.need)
        if batch.max_len >= self.cos.shape[0]:
            raise IndexError(f"position {batch.max_len} is past the context length {self.cos.shape[0] - 1}")
        attend = self._decode_attend_kernels if self.kernels is not None else self._decode_attend_torch(batch)
        h = self._layers(self._embed(tokens), lambda i, layer, h: attend(batch, i, layer, h))
        batch.lens = batch.lens + 1
        batch.max_len += 1
        return self._head(h)

    def _decode_attend_kernels(self, batch: SlotBatch, i: int, layer, h: torch.Tensor) -> torch.Tensor:
        """RoPE + KV store in one pass, then attention over each row's own length (C kernels)."""
        b = batch.rows
        q, k, v = self._qkv(layer, h, b)
        q = q.contiguous()  # (a no-op but after q/k norms)
        keys, values = batch.pool.keys[i], batch.pool.values[i]
        kernels = self.kernels
        assert kernels is not None, "this path is taken only when the C kernels loaded"
        kernels.rope_store(q, k.contiguous(), v.contiguous(), self.cos, self.sin, batch.lens, keys, values)
        return kernels.decode_attention(q, keys, values, batch.lens, self.scaling).view(b, -1)

    def _decode_attend_torch(self, batch: SlotBatch):
        """The decode step's attention as torch operations (bf16, or no C compiler): RoPE and the
        KV store, then (unless the C attention kernel is there) attention over positions
        0..longest with a per-row length mask, GQA by grouping the query heads of each KV head."""
        b, kv, g, d = batch.rows, self.kv_heads, self.group, self.head_dim
        lens = batch.lens
        width = batch.max_len + 1
        blocks = -(-width // BLOCK)
        rows = torch.arange(b)
        cos = self.cos.index_select(0, lens).unsqueeze(1)  # [B, 1, D]
        sin = self.sin.index_select(0, lens).unsqueeze(1)
        if self.attention_kernel is None:
            # position j of row i is visible when j <= lens[i] (the new token sits at lens[i])
            mask = torch.zeros((b, 1, 1, width), dtype=self.kv_dtype)
            mask.masked_fill_(
                (torch.arange(width).unsqueeze(0) > lens.unsqueeze(1)).view(b, 1, 1, width), float("-inf")
            )

        def attend(batch: SlotBatch, i: int, layer, h: torch.Tensor) -> torch.Tensor:
            q, k, v = self._qkv(layer, h, b)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            keys, values = batch.pool.keys[i], batch.pool.values[i]
            keys[rows, :, lens // BLOCK, :, lens % BLOCK] = k.to(self.kv_dtype)
            values[rows, :, lens] = v.to(self.kv_dtype)
            if self.attention_kernel is not None:
                out = self.attention_kernel.decode_attention(
                    q.to(self.kv_dtype).contiguous(), keys, values, lens, self.scaling
                )
                return out.view(b, self.num_heads * d).to(h.dtype)
            qg = (q * self.scaling).to(self.kv_dtype).view(b, kv, 1, g, d)
            # [B, kv, 1, g, D] @ [B, kv, blocks, D, BLOCK] -> [B, kv, blocks, g, BLOCK], no copy of keys
            scores = torch.matmul(qg, keys[:b, :, :blocks])
            scores = scores.transpose(2, 3).reshape(b, kv, g, blocks * BLOCK)[..., :width]
            scores += mask
            probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(self.kv_dtype)
            return torch.matmul(probs, values[:b, :, :width]).view(b, self.num_heads * d).to(h.dtype)

        return attend

    @torch.inference_mode()
    def extend(
        self, batch: SlotBatch, slots: list[int], tokens: list[list[int]], starts: list[int], full_logits: bool
    ) -> tuple[torch.Tensor, list[torch.Tensor] | None]:
        """Run `tokens[j]` through the model on top of `starts[j]` cached positions of slot
        `slots[j]`; their KV lands in the pool. Returns the last position's logits [n, V] fp32
        and, with `full_logits`, each row's logits for all of its tokens ([len(tokens[j]), V])."""
        last: list[torch.Tensor] = []
        full: list[torch.Tensor] | None = [] if full_logits else None
        i = 0
        while i < len(tokens):  # chunks of about PREFILL_CHUNK_TOKENS tokens
            j, longest = i, 0
            while j < len(tokens) and (j == i or (j - i + 1) * max(longest, len(tokens[j])) <= PREFILL_CHUNK_TOKENS):
                longest = max(longest, len(tokens[j]))
                j += 1
            lo, fu = self._extend(batch, slots[i:j], tokens[i:j], starts[i:j], full_logits)
            last.append(lo)
            if full is not None:
                full.extend(fu)
            i = j
        return torch.cat(last, dim=0), full

    def _extend(self, batch, slots, tokens, starts, full_logits):
        """One chunk of `extend`. Token-wise work (projections, MLP, norms, RoPE) runs on the
        packed real tokens only; attention runs on rows right-padded to the longest."""
        pool = batch.pool
        b = len(tokens)
        n = max(len(t) for t in tokens)
        lengths = torch.tensor([len(t) for t in tokens], dtype=torch.long)
        start = torch.tensor(starts, dtype=torch.long)
        offsets = torch.arange(n).unsqueeze(0)
        real = offsets < lengths.unsqueeze(1)  # [b, n]: cells of the padded grid that hold a token
        positions = start.unsqueeze(1) + offsets  # [b, n]
        width = int((start + lengths).max())
        if width > pool.capacity or width > self.cos.shape[0]:
            raise RuntimeError(f"extend needs {width} positions, the pool has {pool.capacity}")
        pos = positions[real]  # [T], the packed tokens in row order
        cos, sin = self.cos[pos].unsqueeze(1), self.sin[pos].unsqueeze(1)  # [T, 1, D]
        slot_idx = torch.tensor(slots, dtype=torch.long)
        slot_of = slot_idx.unsqueeze(1).expand(b, n)[real]
        contiguous = slots == list(range(slots[0], slots[0] + b))
        # query t of row r (absolute position start+t) sees keys 0..start+t; padded queries
        # (t >= length) see key 0 only, so their softmax is defined (their output is unused)
        cols = torch.arange(width).view(1, 1, width)
        visible = cols <= positions.unsqueeze(2)
        visible &= real.unsqueeze(2) | (cols == 0)
        visible = visible.unsqueeze(1)  # [b, 1, n, width]
        # positions past a row's end are masked, but still multiplied (as 0 x value): make
        # them finite, whatever an uninitialised pool held there
        past_end = (cols.view(1, width) >= (start + lengths).unsqueeze(1)).view(b, 1, width, 1)
        heads, d = self.num_heads, self.head_dim
        t = int(pos.shape[0])

        def attend(i: int, layer, h: torch.Tensor) -> torch.Tensor:
            q, k, v = self._qkv(layer, h, t)
            q, k = self._rope(q, cos, sin), self._rope(k, cos, sin)
            keys, values = pool.keys[i], pool.values[i]
            keys[slot_of, :, pos // BLOCK, :, pos % BLOCK] = k.to(self.kv_dtype)
            values[slot_of, :, pos] = v.to(self.kv_dtype)
            rows = slice(slots[0], slots[0] + b) if contiguous else slot_idx
            ks = pool.key_rows(i, rows, width)  # [b, kv, width, D], a copy
            vs = values[rows, :, :width] if contiguous else values[:, :, :width].index_select(0, slot_idx)
            ks.masked_fill_(past_end, 0.0)
            vs.masked_fill_(past_end, 0.0)
            q_pad = q.new_zeros((b, n, heads, d), dtype=self.kv_dtype)
            q_pad[real] = q.to(self.kv_dtype)
            out = F.scaled_dot_product_attention(
                q_pad.transpose(1, 2), ks, vs, attn_mask=visible, scale=self.scaling, enable_gqa=self.group > 1
            )
            return out.transpose(1, 2)[real].reshape(t, heads * d).to(h.dtype)

        ids = torch.tensor([tok for row in tokens for tok in row], dtype=torch.long)
        h = self._layers(self._embed(ids), attend)  # [T, H]
        last = self._head(h[lengths.cumsum(0) - 1])
        full = list(self._head(h).split(lengths.tolist())) if full_logits else None
        return last, full
