"""What ``posbench hf-eval`` measures on a causal LM, each as its paper defines it; the model is anything whose
``forward(input_ids=(1, T))`` returns ``.logits`` (1, T, V) — a transformers model, or a hand-made one in the tests.

- ``token_losses``: the negative log-likelihood of every label with sliding windows of L tokens advancing S (YaRN's
  eval/perplexity.py; Press et al. 2022, App. B): each window scores the labels the previous one did not reach, so
  label j is scored once, with the context its first window gives it. Perplexity at L is exp(mean).
- ``key_tokens``: LongPPL's key tokens (Fang et al. 2025, "What is wrong with perplexity for long-context language
  modeling?", §3.2, Eq. 3–5): with an evaluator model, the long-short difference LSD(x_j) = log P(x_j | long) −
  log P(x_j | short) and the long-context likelihood LCL(x_j) = log P(x_j | long); x_j is key when LSD > α and
  LCL > β (α = 2, β = −2 as the paper's code). Short contexts are the authors' (their ``longppl`` package's
  ``find_key_token``: truncation length s, sliding window w): the last s … s + w − 1 tokens, windows of s + w − 1
  advancing w from the text's start, w = s / 4. LongPPL = exp(mean NLL over the key tokens).
- ``passkey_retrieved``: passkey retrieval (Mohtashami & Jaggi 2023, as PI §3.2 runs it), teacher-forced greedy.
- ``ruler_score``: a RULER-style task (harness/data/tasks/ruler.py), generated greedily and scored as RULER scores.

Notation: L context length, S stride, V vocabulary, j a label's index in the text (it predicts ids[j + 1]).
"""

from __future__ import annotations

import torch

from harness.data.windows import window_starts

NEEDLE = "The pass key is {key}. Remember it. {key} is the pass key. "
QUESTION = "What is the pass key? The pass key is "
LSD_ALPHA, LCL_BETA = 2.0, -2.0  # LongPPL's thresholds (nats), its code's defaults


@torch.no_grad()
def token_losses(model, ids: torch.Tensor, length: int, stride: int, budget: int) -> torch.Tensor:
    """NLL (nats, fp64) of each of the first ``budget`` labels of ``ids`` (1-D), windows of ``length`` tokens
    advancing ``stride``, each scoring the labels the previous one did not (harness/data/windows.py's rule).
    Shape (labels,), labels = min(budget, len(ids) − 1)."""
    labels = min(budget, len(ids) - 1)
    out = torch.empty(labels, dtype=torch.float64)
    for k, start in enumerate(window_starts(labels, length, stride)):
        window = ids[start : start + length + 1]
        logits = model(input_ids=window[None, :-1]).logits[0]  # (≤ L, V)
        first = 0 if k == 0 else length - stride  # the window's first label no earlier window scored
        stop = min(len(window) - 1, labels - start)
        # bf16 up to fp32; no fp64 (L, V) copy
        scores = logits[first:stop].to(torch.promote_types(logits.dtype, torch.float32))
        nll = torch.nn.functional.cross_entropy(scores, window[first + 1 : stop + 1], reduction="none")
        out[start + first : start + stop] = nll.double()
    return out


def key_tokens(
    long: torch.Tensor, short: torch.Tensor, alpha: float = LSD_ALPHA, beta: float = LCL_BETA
) -> torch.Tensor:
    """LongPPL's key-token mask from an evaluator's per-label NLL with the long and the short context
    (``token_losses`` at L and ``short_context_losses``): LSD = short − long > α and LCL = −long > β. Shape of
    ``long``, bool.
    A label whose long context is no longer than its short one has LSD = 0: never key."""
    return ((short - long) > alpha) & (-long > beta)


def short_context_losses(model, ids: torch.Tensor, short: int, budget: int) -> torch.Tensor:
    """The evaluator's NLL of each label given only the last ``short`` … ``short + w − 1`` tokens (w = short / 4):
    windows of short + w − 1 advancing w, so the token at position p sits at p − start ∈ [short, short + w) of its
    window, as ``longppl``'s (tests/unit/test_longppl_parity.py)."""
    step = max(1, short // 4)
    return token_losses(model, ids, short + step - 1, step, budget)


@torch.no_grad()
def passkey_retrieved(model, encode, filler: list[int], length: int, depth: float, key: int) -> bool | None:
    """Whether greedy decoding after a prompt of ``length`` tokens, the key at ``depth`` of the filler, gives the key
    (every key token the argmax given the ones before it); None: the needle and question do not fit in ``length``.
    The key's tokens are those ``encode(QUESTION + key)`` gives after the question's: a subword tokenizer joins the
    question's last space to the key (GPT-2's " 12345", SentencePiece's "▁" then digits), as in text."""
    needle, alone, asked = encode(NEEDLE.format(key=key)), encode(QUESTION), encode(QUESTION + str(key))
    shared = next((i for i, (a, b) in enumerate(zip(alone, asked, strict=False)) if a != b), len(alone))
    question, answer = asked[:shared], asked[shared:]
    room = length - len(needle) - len(question) - len(answer) + 1  # the last answer token is predicted, not input
    if room < 0:
        return None
    at = round(depth * room)
    prompt = filler[:at] + needle + filler[at:room] + question
    ids = torch.tensor(prompt + answer[:-1], device=next(model.parameters()).device)[None]  # (1, L)
    predicted = model(input_ids=ids).logits[0, len(prompt) - 1 :].argmax(-1)  # (len(answer),)
    return predicted.tolist() == answer


@torch.no_grad()
def greedy(model, prompt: list[int], new: int) -> list[int]:
    """``new`` tokens after ``prompt``, each the argmax given all before it (no cache: any ``forward`` will do)."""
    ids = torch.tensor(prompt, device=next(model.parameters()).device)[None]  # (1, T)
    for _ in range(new):
        ids = torch.cat([ids, model(input_ids=ids).logits[0, -1].argmax().view(1, 1)], dim=1)
    return ids[0, len(prompt) :].tolist()


def ruler_score(model, encode, decode, filler: list[int], variant: str, length: int, trials: int, seed: int):
    """RULER's ``string_match_all`` averaged over ``trials`` prompts of ``variant`` whose prompt and answer take
    ``length`` tokens, each answered by ``greedy`` with room for its answer and 8 tokens more; None when a prompt does
    not fit."""
    from harness.data.tasks.ruler import example, string_match_all

    scores = []
    for trial in range(trials):
        drawn = example(variant, length, encode, filler, torch.Generator().manual_seed(seed * 10_007 + trial))
        if drawn is None:
            return None
        prompt, answers, expected = drawn
        said = decode(greedy(model, prompt, sum(map(len, answers)) + 8))
        scores.append(string_match_all(said, expected))
    return sum(scores) / len(scores)
