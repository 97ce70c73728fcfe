"""A short fine-tune at the new length under a scaling: position interpolation's protocol (Chen et al. 2023, §3.1
"Fine-tuning"): AdamW with β = (0.9, 0.95), no weight decay, learning rate 2·10⁻⁵ after a linear warm-up of 20
steps, next-token loss on windows of the target length from the training text — the paper ran 1,000 steps at batch
64 on 7B–65B models; posbench's default is a few hundred at batch 1, the user's to raise. bf16 autocast (fp32
weights and optimizer) on a GPU, fp32 on a CPU. The caller keeps the pretrained weights and puts them back after."""

from __future__ import annotations

import torch

WARMUP = 20


def finetune(
    model,
    ids: torch.Tensor,
    length: int,
    steps: int,
    lr: float = 2e-5,
    batch: int = 1,
    seed: int = 0,
    bf16: bool | None = None,
) -> list[float]:
    """Train ``model`` in place for ``steps`` AdamW steps on random windows of ``length`` + 1 tokens of ``ids``
    (1-D, on the model's device); returns each step's loss (nats/token). ``bf16``: autocast the forward to bfloat16
    (fp32 weights, gradients and optimizer); None: on a GPU only."""
    device = next(model.parameters()).device
    bf16 = device.type == "cuda" if bf16 is None else bf16
    g = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: min(1.0, (k + 1) / WARMUP))
    model.train()
    losses = []
    try:
        for _ in range(steps):
            starts = torch.randint(0, len(ids) - length, (batch,), generator=g)
            window = torch.stack([ids[s : s + length + 1] for s in starts.tolist()]).to(device)  # (B, L + 1)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
                logits = model(input_ids=window[:, :-1]).logits  # (B, L, V)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
            loss.backward()
            optimizer.step()
            warmup.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(loss.item())
    finally:
        model.eval()
    return losses
