"""Scaled dot-product softmax attention (Vaswani et al. 2017, Eq. 1).

softmax(q kᵀ / √D + b) v, with b the positional logit bias, the key-padding mask and
the causal mask folded into one additive mask (``additive_mask``). Three backends, chosen by
``attn.backend`` and all fed the same mask, so no bias is dropped by any of them:

  sdpa      torch.nn.functional.scaled_dot_product_attention (default; fused where torch can)
  math      the textbook formula written out: the reference the other variants are tested against
  xformers  xformers.ops.memory_efficient_attention; CUDA only (xformers has no CPU kernels). Probed at
            construction with a tiny real call: a wheel built for another torch/CUDA imports fine and
            fails only when called ("xFormers wasn't build with CUDA support"), so it is refused before
            training, in one line naming the installed versions and the fix.
  auto      the fastest of sdpa and (where its probe passes) xformers, timed forward + backward on the
            first real input of each shape and mask kind; ``backend_used`` names the choice (for a run tag).

Rows whose keys are all masked (e.g. a padded query under causal + left padding) give 0,
as torch's SDPA does, instead of NaN.

Notation: B batch, H heads, Tq / Tk query / key length, D head dim.
"""

from __future__ import annotations

import functools
import math
import timeit
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import AttentionVariant, Positioned
from harness.errors import ConfigError
from harness.ranges import DropoutRate, ranged
from positional.base import Shape, later_keys

# (q, k, v, mask, causal, dropout_p) -> (B, H, Tq, D); mask already holds causal when it is not None
Backend = Callable[[Tensor, Tensor, Tensor, "Tensor | None", bool, float], Tensor]


def masked_softmax(logits: Tensor) -> Tensor:
    """softmax over the last dim where −inf marks masked entries; all-masked rows give 0, not NaN.

    Subtracting the row max (finite rows only) keeps exp in range; gradients stay finite too.
    """
    row_max = logits.amax(-1, keepdim=True).detach().nan_to_num(0.0, 0.0, 0.0)  # an all-masked row's −inf: 0
    w = torch.exp(logits - row_max)
    total = w.sum(-1, keepdim=True)
    return w / torch.where(total > 0, total, torch.ones_like(total))


def sdpa_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float) -> Tensor:
    # eager only: under torch.compile (model.compile=true) the graph differentiates SDPA itself, and the hand
    # backward's branch on the mask's values would break it
    if (
        mask is not None
        and mask.requires_grad
        and p == 0.0
        and torch.is_grad_enabled()
        and q.device.type == "cpu"
        and not torch.compiler.is_compiling()
    ):
        return _LearnedMaskAttention.apply(q, k, v, mask)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal and mask is None
    )  # (B, H, Tq, D)


SLICE_LOGITS = 1 << 20  # logits per slice in _LearnedMaskAttention's backward (4 MB in fp32: stays in cache)


class _LearnedMaskAttention(torch.autograd.Function):
    """softmax(q kᵀ/√D + m) v (Vaswani et al. 2017, Eq. 1) whose float mask m is learned (T5, KERPLE, FIRE):
    torch's fused CPU kernel forward, the whole backward by hand.

    Given a mask that requires grad, torch's CPU SDPA leaves its fused kernel for the unfused math path (bmm,
    safe-softmax, isneginf/all/where in the profile), although the fused kernel takes a float mask at no extra cost. So
    the forward runs the fused kernel on the mask as a constant, and the backward forms the softmax backward for q,
    k, v and m together:

        P = softmax(q kᵀ/√D + m),  ∂P = ∂O vᵀ,  ∂S = P ∘ (∂P − rowsum(∂P ∘ P))  (softmax's own backward),
        ∂v = Pᵀ ∂O,  ∂q = ∂S k/√D,  ∂k = ∂Sᵀ q/√D,  ∂m = ∂S summed over what m is broadcast over.

    It walks the batch (and, for long sequences, the heads) in slices of about ``SLICE_LOGITS`` logits, so
    each slice's P and ∂S stay in cache, in two work buffers reused by every slice (a fresh 4 MB tensor per
    slice cost more in page faults than the softmax). ∂S is formed in place by softmax's own backward kernel
    and the first slice copied into ∂m rather than added to zeros: one pass to memory fewer per op. Its cost
    against the fused backward of the same attention without a mask is the bench's T5 / softmax target
    (python -m harness.bench; results/bench/).
    """

    @staticmethod
    def forward(ctx, q, k, v, mask):
        ctx.save_for_backward(q, k, v, mask)
        # the mask detached: one that requires grad sends SDPA to the math path, even here under no_grad
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.detach())  # (B, H, Tq, D)

    @staticmethod
    def backward(ctx, d_out):
        q, k, v, mask = ctx.saved_tensors
        (B, H, t_q, D), t_k = q.shape, k.shape[-2]
        m = mask.reshape((1,) * (4 - mask.dim()) + mask.shape)  # broadcastable to (B, H, Tq, Tk)
        d_m = torch.empty(m.shape, dtype=torch.promote_types(m.dtype, torch.float32), device=m.device)
        d_q, d_k, d_v = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))  # contiguous
        q, k, v, d_out = (t.contiguous() for t in (q, k, v, d_out))  # (B, H, T, D) slices for bmm
        q_s, k_s = q / math.sqrt(D), k / math.sqrt(D)
        empty_rows = bool(m.amax(-1).isneginf().any())  # every key masked: SDPA gives 0, so does its gradient
        heads = max(1, min(H, SLICE_LOGITS // (t_q * t_k)))
        work = q.new_empty(2, heads, t_q, t_k)  # reused by every slice: a fresh 4 MB tensor costs page faults
        for b in range(B):
            for hs in (slice(h, h + heads) for h in range(0, H, heads)):
                n = min(heads, H - hs.start)
                weights, d_logits = work[0, :n], work[1, :n]  # (n, Tq, Tk): d_logits holds the logits, then ∂P, then ∂S
                torch.baddbmm(_entry(m, b, hs), q_s[b, hs], k[b, hs].mT, out=d_logits)  # the logits, for now
                torch.softmax(d_logits, -1, out=weights)
                if empty_rows:
                    weights.nan_to_num_(0.0)
                torch.bmm(weights.mT, d_out[b, hs], out=d_v[b, hs])
                torch.bmm(d_out[b, hs], v[b, hs].mT, out=d_logits)
                # ∂S = P ∘ (∂P − rowsum(∂P ∘ P)) in one pass, in place (the kernel reads a row of ∂P and P
                # before it writes that row; the gradients are tested against the fp64 formula)
                torch.ops.aten._softmax_backward_data.out(d_logits, weights, -1, weights.dtype, grad_input=d_logits)
                torch.bmm(d_logits, k_s[b, hs], out=d_q[b, hs])
                torch.bmm(d_logits.mT, q_s[b, hs], out=d_k[b, hs])
                first = (b == 0 or m.shape[0] > 1) and (hs.start == 0 or m.shape[1] > 1)  # slot not yet written
                slot = _entry(d_m, b, hs)
                (slot.copy_ if first else slot.add_)(d_logits.sum_to_size(slot.shape))
        return d_q, d_k, d_v, d_m.view(mask.shape).to(mask.dtype)


def _entry(t: Tensor, b: int, heads: slice) -> Tensor:
    """t[b, heads] of a tensor broadcastable to (B, H, ...): its one batch or head entry where it has one."""
    return t[b if t.shape[0] > 1 else 0, heads if t.shape[1] > 1 else slice(None)]


def math_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float) -> Tensor:
    """softmax(q kᵀ/√D + mask) v, Vaswani et al. 2017 Eq. 1, with the full (Tq, Tk) logits."""
    return F.dropout(_softmax_weights(q, k, mask, causal), p) @ v  # (B, H, Tq, D)


def _softmax_weights(q: Tensor, k: Tensor, mask: Tensor | None, causal: bool) -> Tensor:
    """softmax(q kᵀ/√D + mask) of Vaswani et al. 2017 Eq. 1, the (B, H, Tq, Tk) weights themselves (no dropout);
    ``mask`` as the backends take it (it holds the causal mask when it is not None)."""
    logits = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, H, Tq, Tk)
    if mask is not None:
        logits = logits + mask
    elif causal:
        logits = logits.masked_fill(later_keys(q.shape[-2], k.shape[-2], q.device), float("-inf"))
    return masked_softmax(logits)


def _xformers_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, p: float) -> Tensor:
    """memory_efficient_attention (xFormers, after Rabe & Staats 2021) on (B, T, H, D) layout."""
    import xformers.ops as xops

    if not q.is_cuda:
        raise ConfigError(
            "backend=xformers needs CUDA tensors (xformers has no CPU kernels); use backend=sdpa or train on a GPU"
        )
    bias = xops.LowerTriangularMask() if causal and mask is None else None
    if mask is not None:  # a dense bias: xformers wants it materialised with a 16-aligned last dim
        B, H, t_q, t_k = q.shape[0], q.shape[1], q.shape[-2], k.shape[-2]
        bias = q.new_empty(B, H, t_q, -(-t_k // 16) * 16)[..., :t_k]  # (B, H, Tq, Tk), aligned rows
        bias.copy_(mask.expand(B, H, t_q, t_k))
    out = xops.memory_efficient_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_bias=bias, p=p
    )  # (B, Tq, H, D)
    return out.transpose(1, 2)  # (B, H, Tq, D)


BACKENDS: dict[str, Backend] = {"sdpa": sdpa_attention, "math": math_attention, "xformers": _xformers_attention}
PROBE_DEVICE = "cuda"  # where the xformers probe runs (a test points it at a fake)


@functools.cache
def xformers_problem() -> str | None:
    """Why xformers cannot run here, or None: a CUDA device, an importable xformers, and a tiny real
    memory_efficient_attention call that returns (once per process)."""
    if not torch.cuda.is_available():
        return "there is no CUDA device and xformers has no CPU kernels"
    try:
        import xformers.ops as xops
    except ImportError as e:
        return f"cannot import xformers ({e})"
    try:
        q = torch.randn(1, 8, 1, 8, device=PROBE_DEVICE, dtype=torch.float16)  # (B, T, H, D)
        xops.memory_efficient_attention(q, q, q)
        if q.is_cuda:
            torch.cuda.synchronize()
    except Exception as e:  # any failure of the call itself is the answer: the build does not fit
        lines = str(e).strip().splitlines()
        return f"a test call failed ({type(e).__name__}: {lines[0] if lines else ''})"
    return None


def _require_xformers() -> None:
    """Refuse attn.backend=xformers at construction, in one line, when it cannot run here."""
    problem = xformers_problem()
    if problem:
        try:  # the versions installed here, for the message
            import xformers

            xf = f"xformers {getattr(xformers, '__version__', '?')}"
        except ImportError:
            xf = "xformers not installed"
        raise ConfigError(
            f"backend=xformers cannot run here: {problem} [{xf}, torch {torch.__version__}, "
            f"CUDA {torch.version.cuda or 'none'}]; install "
            "an xformers build for this torch and CUDA (python -m xformers.info shows what one was "
            "built for) or use backend=sdpa"
        )


def pick_fastest(candidates: dict[str, Backend], trial: Callable[[Backend], None], repeats: int = 3) -> str:
    """The candidate whose ``trial`` (forward + backward on the real input, synchronised) is fastest, best of
    ``repeats`` after one untimed call; a candidate that raises is skipped (sdpa never does)."""
    seconds: dict[str, float] = {}
    for name, backend in candidates.items():
        try:
            trial(backend)
            seconds[name] = min(timeit.repeat(functools.partial(trial, backend), number=1, repeat=repeats))
        except Exception:
            continue
    if not seconds:
        raise ConfigError(f"backend=auto: none of {', '.join(candidates)} ran here; use backend=sdpa")
    return min(seconds, key=seconds.__getitem__)  # the first of the fastest


def _trial(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool, backend: Backend) -> None:
    """One forward + backward of a backend on detached copies of the layer's input."""
    with torch.enable_grad():
        q2, k2, v2 = (t.detach().requires_grad_() for t in (q, k, v))
        backend(q2, k2, v2, None if mask is None else mask.detach(), causal, 0.0).sum().backward()
    if q.is_cuda:
        torch.cuda.synchronize()  # the trial's kernels are done before its time is read


# (device, dtype, shape of q, mask kind) -> the backend auto picked, shared by every layer and instance
_AUTO_CHOICE: dict[tuple, str] = {}


class Softmax(AttentionVariant):
    accepts_bias = frozenset({"relative", "positional", "content"})  # any bias: the full logit matrix exists
    wide_rotary_refusal = None  # q̃ kᵀ/√(width of q) at any width; v keeps the head dim
    document_mask_refusal = None  # additive_mask folds document_ids in, for every backend
    dense_mask = True  # every backend takes the bias, padding and causal mask as one additive mask

    @ranged
    def __init__(self, shape: Shape, dropout: DropoutRate = 0.0, backend: str = "sdpa"):
        super().__init__(shape)
        if backend not in (*BACKENDS, "auto"):
            raise ConfigError(f"backend={backend!r} is unknown; use one of {', '.join(BACKENDS)}, auto")
        if backend == "xformers":
            _require_xformers()
        self.dropout, self.backend = dropout, backend
        # auto: sdpa, plus xformers where its probe passes; with one candidate the choice is made now
        self.candidates = ["sdpa", *([] if xformers_problem() else ["xformers"])] if backend == "auto" else [backend]
        self.backend_used: str | None = self.candidates[0] if len(self.candidates) == 1 else None

    def attend(self, p: Positioned, v: Tensor) -> Tensor:
        drop = self.dropout if self.training else 0.0
        backend = BACKENDS[self._choose(p.q, p.k, v, p.mask, p.ctx.causal)]
        return backend(p.q, p.k, v, p.mask, p.ctx.causal, drop)  # (B, H, T, D)

    def _choose(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, causal: bool) -> str:
        if len(self.candidates) == 1:
            return self.candidates[0]
        key = (q.device.type, q.dtype, tuple(q.shape), mask is None, causal)
        if key not in _AUTO_CHOICE:
            _AUTO_CHOICE[key] = pick_fastest(
                {n: BACKENDS[n] for n in self.candidates}, functools.partial(_trial, q, k, v, mask, causal)
            )
        self.backend_used = _AUTO_CHOICE[key]
        return self.backend_used

    def weights(self, p: Positioned) -> Tensor:
        """softmax(q kᵀ/√D + b), with the mask and rotation exactly as ``forward`` places them."""
        return _softmax_weights(p.q, p.k, p.mask, p.ctx.causal)  # (B, H, Tq, Tk)
