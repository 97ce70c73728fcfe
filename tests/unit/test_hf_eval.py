"""``posbench hf-eval``: a pretrained causal LM under each RoPE scaling × factor, measured as the
PI / NTK / YaRN papers did — perplexity by length with sliding windows, passkey retrieval by depth × length — one
MLflow run per cell under a parent. The whole loop runs offline on a model posbench trained and exported itself."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from harness.errors import ConfigError
from harness.pretrained.hf_eval import EvalSpec, check, parse
from harness.pretrained.measures import key_tokens, passkey_retrieved, token_losses
from tests.helpers import tiny_llama

pytest.importorskip("transformers")


class Counting(torch.nn.Module):
    """A 'model' whose next-token distribution is uniform over V ids except that it puts probability p on the
    token equal to the current one + 1 (mod V): its loss on any text is known in closed form."""

    def __init__(self, vocab: int = 7, p: float = 0.5):
        super().__init__()
        self.vocab, self.p = vocab, p

    def forward(self, input_ids):
        probs = torch.full((*input_ids.shape, self.vocab), (1 - self.p) / (self.vocab - 1), dtype=torch.float64)
        probs.scatter_(-1, ((input_ids + 1) % self.vocab)[..., None], self.p)
        return type("Out", (), {"logits": probs.log()})


def test_sliding_windows_score_every_label_once_and_match_the_closed_form():
    ids = torch.tensor([(3 * i * i + i) % 7 for i in range(300)])
    model = Counting()
    hits = sum(int(ids[t + 1] == (ids[t] + 1) % 7) for t in range(200))
    expected = -(hits * math.log(0.5) + (200 - hits) * math.log(0.5 / 6)) / 200
    for length, stride in ((16, 8), (50, 50), (64, 1), (200, 100)):
        assert float(token_losses(model, ids, length, stride, budget=200).mean()) == pytest.approx(expected, abs=1e-12)


def test_passkey_is_retrieved_exactly_when_greedy_decoding_gives_the_key():
    """A model whose argmax at the answer's positions is the key's digits retrieves it; one digit off, it does not;
    a length the needle and question do not fit gives no figure."""
    encode = lambda text: list(text.encode())  # noqa: E731

    class Oracle(torch.nn.Module):
        def __init__(self, answer: list[int]):
            super().__init__()
            self.answer = answer
            self.weight = torch.nn.Parameter(torch.zeros(1))  # where the prompt goes

        def forward(self, input_ids):
            logits = torch.zeros(*input_ids.shape, 256)
            t = input_ids.shape[1]
            for i, tok in enumerate(self.answer):  # the positions that predict the answer's tokens
                logits[0, t - len(self.answer) + i, tok] = 1.0
            return type("Out", (), {"logits": logits})

    filler = encode("lorem ipsum " * 40)
    assert passkey_retrieved(Oracle(encode("12345")), encode, filler, 200, 0.5, 12345) is True
    assert passkey_retrieved(Oracle(encode("12346")), encode, filler, 200, 0.5, 12345) is False
    assert passkey_retrieved(Oracle(encode("12345")), encode, filler, 40, 0.5, 12345) is None  # does not fit


def test_the_key_is_scored_as_the_tokenizer_writes_it_after_the_question():
    """A subword tokenizer joins a space to the word after it (GPT-2's " 12345"; SentencePiece's "▁" before the
    digits): text reading "… The pass key is 12345" is "… ␣is", "␣12345". A model that predicts what such text holds
    retrieves the key, and it reads the question as that text has it, not ending in a space of its own."""
    import re

    vocab: dict[str, int] = {}
    encode = lambda text: [vocab.setdefault(p, len(vocab)) for p in re.findall(r" ?\w+| ?[^\w\s]+|\s+", text)]  # noqa: E731
    fed: list[list[int]] = []

    class Reader(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1))

        def forward(self, input_ids):
            fed.append(input_ids[0].tolist())
            logits = torch.zeros(*input_ids.shape, 256)
            logits[0, -1, encode(" 12345")[0]] = 1.0  # the text's next token after "… The pass key is"
            return type("Out", (), {"logits": logits})

    filler = encode("lorem ipsum " * 40)
    assert passkey_retrieved(Reader(), encode, filler, 60, 0.5, 12345) is True
    question = encode("What is the pass key? The pass key is")
    assert fed[0][-len(question) :] == question and len(fed[0]) == 60


def test_a_passkey_prompt_reaches_the_model_on_the_models_device():
    """hf-eval moves the model to the GPU where there is one, and an embedding there refuses ids on the CPU: the
    prompt goes where the weights are (here the meta device stands in for the GPU)."""

    class Elsewhere(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.zeros(1, device="meta"))

        def forward(self, input_ids):
            if input_ids.device != self.weight.device:  # as CUDA's embedding lookup
                raise RuntimeError(f"ids on {input_ids.device}, weights on {self.weight.device}")
            return type("Out", (), {"logits": torch.zeros(*input_ids.shape, 256)})

    encode = lambda text: list(text.encode())  # noqa: E731
    assert passkey_retrieved(Elsewhere(), encode, encode("lorem ipsum " * 40), 200, 0.5, 12345) is False


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--scalings", "none,foo"], "--scalings=none,foo: foo unknown"),
        (["--factors", "0.5"], "--factors=0.5: scaling factors are finite and ≥ 1"),
        (["--lengths", "1"], "--lengths=1: give context lengths of at least 2 tokens"),
        (["--lengths", "a,b"], "--lengths=a,b: give comma-separated integers"),
        (["--depths", "1.5"], "--depths=1.5: depths lie in [0, 1]"),
        (["--stride", "999"], "--stride=999 must lie in 1 … the shortest length"),
        (["--budget", "10"], "--budget=10 must cover the longest length"),
        (
            ["--budget", "99999999999999999999"],
            "--budget=99999999999999999999 is more than an evaluation takes; give at most 1,000,000,000",
        ),
        (["--passkey-trials", "100000"], "--passkey-trials=100000 is more than an evaluation takes"),
        (["--experiment", ""], "--experiment '' names no MLflow experiment; give a name"),
        (["--seed", "-1"], "--seed=-1 must lie in"),
        (["--tracking-uri", "abc"], "tracking URI 'abc' has scheme '', which MLflow cannot open"),
    ],
)
def test_a_bad_option_is_one_line_naming_the_fix(tmp_path, argv, needle):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')  # a folder: the options are what is wrong
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("[", r"\[").replace("+", r"\+")):
        parse([str(tmp_path), *argv])


def test_a_hub_name_is_refused_at_once_without_network():
    with pytest.raises(ConfigError, match="a Hub name\\? nothing is downloaded"):
        check(EvalSpec(Path("HuggingFaceTB/SmolLM-135M")))


def test_the_cells_are_the_model_as_trained_then_each_scaling_at_each_factor():
    spec = EvalSpec(Path("."), scalings=("none", "linear", "yarn"), factors=(2.0, 4.0))
    assert spec.cells() == [("none", 1.0), ("linear", 2.0), ("linear", 4.0), ("yarn", 2.0), ("yarn", 4.0)]


# ---------------------------------------------------------------- LongPPL's key tokens


class Repeater(torch.nn.Module):
    """Puts probability p on the token K positions back *within its input* (uniform over V otherwise): on a text
    of period K it is right exactly where its window reaches K − 1 tokens back, so the key tokens are known."""

    def __init__(self, period: int, vocab: int = 16, p: float = 0.9):
        super().__init__()
        self.period, self.vocab, self.p = period, vocab, p

    def forward(self, input_ids):
        t = input_ids.shape[1]
        probs = torch.full((*input_ids.shape, self.vocab), 1 / self.vocab, dtype=torch.float64)
        for i in range(self.period - 1, t):  # position i predicts token i + 1 = token i + 1 − K
            probs[0, i] = (1 - self.p) / (self.vocab - 1)
            probs[0, i, input_ids[0, i + 1 - self.period]] = self.p
        return type("Out", (), {"logits": probs.log()})


def test_key_tokens_follow_longppls_two_thresholds():
    long = torch.tensor([0.1, 0.1, 2.5, 0.1, 1.9])
    short = torch.tensor([2.2, 2.0, 5.0, 0.1, 4.0])  # LSD: 2.1, 1.9, 2.5, 0, 2.1; LCL: −0.1, −0.1, −2.5, −0.1, −1.9
    assert key_tokens(long, short).tolist() == [True, False, False, False, True]


def test_key_tokens_are_the_labels_only_the_long_context_predicts():
    """With period K beyond the short context (s + w < K − 1) and the long windows' scored labels at least K − 1
    into their window (stride L/2 ≥ K − 1), the key tokens are exactly labels K − 1 … ; LongPPL = 1/p."""
    from harness.pretrained.hf_eval import find_key_tokens, measure

    period, budget = 24, 300
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 16, (period,), generator=g).repeat(20)[: budget + 129]
    spec = EvalSpec(Path("."), lengths=(64, 128), budget=budget, key_short=8, passkey_trials=0)
    model = Repeater(period)
    apply = pytest.MonkeyPatch()
    apply.setattr("harness.pretrained.rotary.apply_scaling", lambda *a, **k: None)
    try:
        keys = find_key_tokens(model, ids, spec)
    finally:
        apply.undo()
    for n in (64, 128):
        assert keys[n].nonzero().flatten().tolist() == list(range(period - 1, budget))
    metrics, losses = measure(model, None, ids, spec, keys)
    assert metrics["key/ppl_at_128"] == pytest.approx(1 / 0.9, rel=1e-12)
    assert metrics["val/loss_at_64"] == pytest.approx(float(losses[64].mean()), rel=1e-12)
    assert metrics["cost/seconds_per_1k_tokens_at_64"] > 0


# ---------------------------------------------------------------- the claim: paired tests, Holm, a margin


def _losses(diffs: dict[str, float], noise: float = 0.01, labels: int = 8 * 1024):
    """Per-label losses at L = 64 for each scaling at factor 2: a common base + the scaling's shift + noise."""
    g = torch.Generator().manual_seed(1)
    base = torch.rand(labels, generator=g, dtype=torch.float64) * 3
    return {
        (m, 2.0): {64: base + shift + noise * torch.randn(labels, generator=g, dtype=torch.float64)}
        for m, shift in diffs.items()
    }


@pytest.mark.parametrize(
    "diffs, decisions, verdict",
    [
        ({"yarn": 0.0, "ntk": 0.2, "linear": 0.5}, ["supports", "supports"], "supported"),
        ({"yarn": 0.0, "ntk": 0.2, "linear": 0.1}, ["supports", "contradicts"], "contradicted"),
        ({"yarn": 0.0, "ntk": 0.003, "linear": 0.5}, ["negligible (below 0.01 nats)", "supports"], "inconclusive"),
    ],
)
def test_the_claim_is_judged_pair_by_pair_with_holm(diffs, decisions, verdict):
    from harness.pretrained.report import judge
    from harness.pretrained.report import verdict as overall

    spec = EvalSpec(
        Path("."),
        scalings=("yarn", "ntk", "linear"),
        factors=(2.0,),
        lengths=(32, 64),
        stride=16,
        claim=("yarn", "ntk", "linear"),
        margin=0.01,
    )
    rows = judge(spec, 48, _losses(diffs, noise=0.001))
    assert [(r["length"], r["a"], r["b"], r["blocks"]) for r in rows] == [
        (64, "yarn", "ntk", 8),
        (64, "ntk", "linear", 8),
    ]
    assert [r["decision"] for r in rows] == decisions
    assert overall(rows) == verdict


def test_a_claim_reads_each_scaling_at_the_factor_it_ran_at():
    """none, own and DCA run once, at factor 1 (hf_eval.unscaled); a claim naming one compares that cell with the
    others' cell at each factor."""
    from harness.pretrained.report import judge

    losses = _losses({"yarn": 0.0, "dca": 0.2, "none": 0.5})
    losses = {(m, 1.0 if m in ("dca", "none") else f): by_length for (m, f), by_length in losses.items()}
    spec = EvalSpec(
        Path("."),
        scalings=("yarn", "dca", "none"),
        factors=(2.0,),
        lengths=(64,),
        stride=16,
        claim=("yarn", "dca", "none"),
    )
    rows = judge(spec, 48, losses)
    assert [(r["a"], r["b"], r["decision"]) for r in rows] == [("yarn", "dca", "supports"), ("dca", "none", "supports")]


def test_claim_p_values_are_paired_t_tests_on_block_means_and_holm_steps_down():
    """p of each comparison equals scipy's paired t test over the mean losses of blocks of 1,024 consecutive labels
    (a stride of 16 labels is shorter: adjacent blocks of consecutive text would be correlated); Holm rejects the
    smallest p at α/2 and the next at α, so a p between them is rejected only after the first is."""
    from scipy import stats

    from harness.pretrained.report import judge

    losses = _losses({"yarn": 0.0, "ntk": 0.004, "linear": 0.03}, noise=0.6)
    spec = EvalSpec(
        Path("."),
        scalings=("yarn", "ntk", "linear"),
        factors=(2.0,),
        lengths=(64,),
        stride=16,
        claim=("yarn", "ntk", "linear"),
        margin=0.0,
        level=0.05,
    )
    rows = judge(spec, 48, losses)
    assert [r["blocks"] for r in rows] == [8, 8]
    for row in rows:
        a = [float(b.mean()) for b in losses[row["a"], 2.0][64].split(1024)]
        b = [float(b.mean()) for b in losses[row["b"], 2.0][64].split(1024)]
        assert row["p"] == pytest.approx(stats.ttest_rel(a, b).pvalue, rel=1e-9)
    small, large = sorted(r["p"] for r in rows)
    assert [r["decision"] != "inconclusive" for r in rows] == [
        small <= 0.025 and (r["p"] == small or large <= 0.05) for r in rows
    ]


# ---------------------------------------------------------------- what it costs, before loading

LLAMA2_7B = {
    "model_type": "llama",
    "vocab_size": 32000,
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "intermediate_size": 11008,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}


@pytest.mark.parametrize(
    "family, extra",
    [
        ("llama", {}),
        ("llama", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
        ("mistral", {"head_dim": 24}),
        ("qwen2", {"tie_word_embeddings": True}),
        ("qwen3", {"head_dim": 24}),  # an RMSNorm on each head's q and k
        ("gpt_neox", {"rotary_pct": 0.25}),
        ("gemma2", {}),  # four norms a layer
        ("gemma3_text", {}),  # four, and q's and k's
        ("olmo2", {}),  # q's and k's norms over every head
        ("qwen3_moe", {}),  # 128 experts a layer
    ],
)
def test_the_parameter_count_from_config_json_is_transformers_exact(family, extra, tmp_path):
    import transformers

    from harness.pretrained.cost import parameters

    config = transformers.AutoConfig.for_model(
        family,
        vocab_size=97,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=96,
        **extra,
    )
    config.save_pretrained(tmp_path)
    model = transformers.AutoModelForCausalLM.from_config(config)
    assert parameters(tmp_path)[0] == sum(p.numel() for p in model.parameters())


def test_a_token_multiplies_the_experts_it_is_sent_to_and_no_input_embedding(tmp_path):
    """P' of a Mixtral (8 experts, 2 a token, each gate, up and down 64×96; untied): P less the input embedding
    V·d and 6 of 8 experts' three matrices in each of 2 layers; a tied Llama's P' is its P (the output matrix is the
    embedding)."""
    import transformers

    from harness.pretrained.cost import parameters

    sizes = dict(vocab_size=97, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96)
    transformers.AutoConfig.for_model("mixtral", num_local_experts=8, num_experts_per_tok=2, **sizes).save_pretrained(
        tmp_path / "mixtral"
    )
    every, multiplied = parameters(tmp_path / "mixtral")
    assert every - multiplied == 97 * 64 + 2 * 6 * 3 * 64 * 96
    transformers.AutoConfig.for_model("llama", tie_word_embeddings=True, **sizes).save_pretrained(tmp_path / "llama")
    every, multiplied = parameters(tmp_path / "llama")
    assert multiplied == every


def test_a_7b_model_at_32k_context_on_24_gib_is_refused_with_the_figure(tmp_path):
    import json

    from harness.pretrained.cost import parameters

    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B))
    assert parameters(tmp_path)[0] == 6_738_415_616  # Llama 2 7B's published count
    from tests.helpers import headers_only

    headers_only(tmp_path, LLAMA2_7B)
    figure = r"at L=32768 needs ≈ \d+\.\d GiB \(weights 25\.10, .*\) > 24\.0 GiB available"
    with pytest.raises(ConfigError, match=figure):
        parse([str(tmp_path), "--lengths", "4096,32768", "--budget", "32768", "--memory", "24"])
    spec = parse([str(tmp_path), "--lengths", "512", "--budget", "1024", "--memory", "80", "--check"])
    assert "6,738,415,616 parameters" in __import__("harness.pretrained.hf_eval", fromlist=["plan"]).plan(spec)


def test_more_lengths_and_a_finetune_cost_more_memory_and_flops(tmp_path):
    import json

    from harness.pretrained.hf_eval import costs

    (tmp_path / "config.json").write_text(json.dumps(LLAMA2_7B))
    spec = EvalSpec(tmp_path, lengths=(512,), budget=1024)
    peak, flops = costs(spec, LLAMA2_7B)
    longer_peak, longer = costs(EvalSpec(tmp_path, lengths=(512, 2048), budget=4096), LLAMA2_7B)
    tuned_peak, tuned = costs(EvalSpec(tmp_path, lengths=(512,), budget=1024, finetune_steps=10), LLAMA2_7B)
    assert sum(longer_peak.values()) > sum(peak.values()) and longer > flops
    assert sum(tuned_peak.values()) > 4 * sum(peak.values()) and tuned > flops  # 16 bytes per parameter + a copy


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--claim", "yarn<foo"], "--claim=yarn<foo: order two or more distinct scalings of --scalings"),
        (["--claim", "yarn"], "--claim=yarn: order two or more"),
        (
            ["--claim", "yarn<ntk", "--lengths", "16,32", "--budget", "2048"],
            "judged beyond the trained context (64 tokens",
        ),
        (
            ["--claim", "yarn<ntk", "--lengths", "128", "--budget", "1024"],
            "--claim at --budget=1024: its t test compares blocks of 1024 consecutive labels, two at least; give "
            "--budget ≥ 2048",
        ),
        (["--key-short", "5000"], "--key-short=5000: LongPPL's short context lies in 1"),
        (["--margin", "-1"], "--margin=-1.0: it is ≥ 0"),
        (["--finetune-lr", "0"], "--finetune-lr=0.0 > 0"),
        (["--finetune-length", "1"], "--finetune-length=1: at least 2 tokens"),
        (["--evaluator", "/nonexistent/model"], "--evaluator /nonexistent/model is not a model folder"),
        (["--memory", "abc"], "argument --memory: invalid float value: 'abc'; see posbench hf-eval --help"),
        (["--bogus"], "unrecognized arguments: --bogus; see posbench hf-eval --help"),
        (["--gflops", "0"], "--gflops=0.0: it is a positive rate"),
        (["--level", "nan"], "--level=nan: it lies in (0, 1"),
        (["--out", "/proc/posbench"], "--out: cannot write /proc/posbench ("),
    ],
)
def test_a_bad_claim_evaluator_or_finetune_option_is_one_line(tmp_path, argv, needle):
    import json

    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                **LLAMA2_7B,
                "hidden_size": 64,
                "num_hidden_layers": 1,
                "intermediate_size": 64,
                "max_position_embeddings": 64,
            }
        )
    )
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(").replace("+", r"\+")):
        parse([str(tmp_path), *argv])


def test_a_model_without_rope_sizes_is_named_with_its_type(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_embd": 32, "vocab_size": 50}))
    with pytest.raises(
        ConfigError,
        match=r"\(model_type 'gpt2'\) lacks hidden_size, num_hidden_layers, "
        "num_attention_heads: hf-eval reads RoPE decoders",
    ):
        parse([str(tmp_path)])


def test_a_deepseek_yarn_model_is_evaluated_only_under_its_own_scaling(tmp_path):
    """DeepSeek's attention multiplies its logits by YaRN's mscale(s, mscale_all_dim)² when transformers builds it
    (×1.874 at DeepSeek-V3's s = 40): under another scaling that factor would stay, a model neither the original
    nor the scaled one, so only the model's own scaling is evaluated."""
    import json

    from tests.helpers import headers_only

    yarn = {"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    config = {
        **LLAMA2_7B,
        "model_type": "deepseek_v3",
        "hidden_size": 64,
        "num_hidden_layers": 1,
        "intermediate_size": 64,
        "max_position_embeddings": 163840,
        "qk_rope_head_dim": 64,
        "rope_scaling": {**yarn, "original_max_position_embeddings": 4096},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    headers_only(tmp_path, config)
    with pytest.raises(ConfigError, match=r"--scalings=none,yarn: .*\(mscale_all_dim=1 at factor 40\) = 1\.874"):
        parse([str(tmp_path), "--scalings", "none,yarn", "--lengths", "64", "--budget", "64"])
    assert parse([str(tmp_path), "--scalings", "own", "--lengths", "64", "--budget", "64"]).scalings == ("own",)


# ---------------------------------------------------------------- a short fine-tune at the new length


@pytest.mark.parametrize("bf16", [False, True])
def test_pis_finetune_lowers_the_loss_at_the_new_length(bf16):
    """fp32 (a CPU's default) and bf16 autocast (a GPU's, run here on the CPU's bf16 kernels) both learn."""
    import transformers

    from harness.pretrained.finetune import finetune
    from harness.pretrained.rotary import apply_scaling

    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=32,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            intermediate_size=64,
            max_position_embeddings=32,
        )
    ).eval()
    apply_scaling(model, method="linear", factor=2.0)
    ids = torch.arange(32).repeat(20)  # a counting text: learnable at once
    before = float(token_losses(model, ids, 64, 32, 256).mean())
    curve = finetune(model, ids, 64, steps=40, lr=3e-3, bf16=bf16)
    assert len(curve) == 40 and not model.training and next(model.parameters()).dtype == torch.float32
    assert float(token_losses(model, ids, 64, 32, 256).mean()) < before - 0.5


def test_posbenchs_own_theta_is_a_scaling_suffix_and_hope_needs_a_turning_frequency(tmp_path):
    spec = parse(
        [
            str(tiny_llama(tmp_path / "m")),
            "--scalings",
            "none+hope,yarn+resonance+hope",
            "--factors",
            "2",
            "--lengths",
            "32",
            "--budget",
            "64",
        ]
    )
    assert spec.cells() == [("none+hope", 1.0), ("yarn+resonance+hope", 2.0)]
    with pytest.raises(ConfigError, match="--scalings=yarn\\+foo: yarn\\+foo unknown; use some of"):
        parse([str(tmp_path / "m"), "--scalings", "yarn+foo"])
    import transformers

    from harness.pretrained.rotary import apply_scaling

    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=16,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=4,
        )
    )  # no θ turns within 4 tokens: the fastest, θ_0 = 1, takes 2π ≈ 6.3
    with pytest.raises(ConfigError, match="\\+hope keeps the frequencies that turn within the trained context"):
        apply_scaling(model, method="none", hope=True)


def test_the_own_cell_is_the_model_as_its_config_scales_it(tmp_path):
    """`own`: the model's own rope_parameters (a Llama 3.1's llama3, a YaRN-extended model's yarn) as transformers
    runs them, at factor 1 — the logits of the model as loaded; `none` is the plain θ under it."""
    import transformers

    spec = parse(
        [
            str(tiny_llama(tmp_path / "m")),
            "--scalings",
            "own,none,yarn",
            "--factors",
            "2",
            "--lengths",
            "32",
            "--budget",
            "64",
        ]
    )
    assert spec.cells() == [("own", 1.0), ("none", 1.0), ("yarn", 2.0)]
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 32},
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = (torch.arange(96) * 7 % 64)[None]

    def logits():
        with torch.no_grad():
            return model(input_ids=ids).logits

    from harness.pretrained.rotary import apply_scaling

    loaded = logits()  # transformers' own YaRN
    apply_scaling(model)  # what the `own` cell applies
    own = logits()
    apply_scaling(model, method="none")
    torch.testing.assert_close(own, loaded, rtol=0, atol=1e-5)
    assert (logits() - own).abs().max() > 1e-4  # the plain θ is another model (random weights: a small change)


@pytest.mark.parametrize(
    "n_labels, length, stride",
    [(1, 1, 1), (10, 4, 1), (10, 4, 3), (10, 10, 2), (3, 8, 4), (1000, 64, 32), (1001, 64, 32), (999, 64, 7)],
)
def test_the_window_count_of_the_cost_check_is_the_listed_one_in_closed_form(n_labels, length, stride):
    """The cost check counts windows without listing them: the same number as the windows the evaluation scores,
    so --budget 1000000000 --lengths 2 costs the check nothing (a list of 10⁹ starts grew past 6 GB)."""
    from harness.data.windows import window_count, window_starts

    assert window_count(n_labels, length, stride) == len(window_starts(n_labels, length, stride))
    assert window_count(10**9, 2, 1) == 10**9 - 1  # the count of a budget far past what a list could hold


def test_a_posbench_export_without_its_seals_is_said_to_be_unverified(tmp_path):
    """Its bytes are not known to be the export's: the command says so (a third-party folder carries no seals by
    design, and a sealed export is verified)."""
    import json

    from harness import integrity
    from harness.pretrained import folder as model_folder

    path = tiny_llama(tmp_path / "export")  # saved as a byte-level posbench export, without its seals
    note = model_folder.unverified(model_folder.read(path))
    assert note is not None and note.startswith(f"note: {path} is a posbench export without its .sha256 seals")
    for name in ("config.json", "model.safetensors"):
        integrity.seal_file(path / name)
    assert model_folder.unverified(model_folder.read(path)) is not None  # its tokenizer.json is not sealed yet
    integrity.seal_file(path / "tokenizer.json")
    assert model_folder.unverified(model_folder.read(path)) is None
    config = json.loads((path / "config.json").read_text())
    del config["posbench_tokenizer"]  # another project's folder: no seals to expect
    (path / "config.json").write_text(json.dumps(config))
    (path / "config.json.sha256").unlink()
    (path / "model.safetensors.sha256").unlink()
    (path / "tokenizer.json.sha256").unlink()
    (path / "tokenizer.json").write_text(json.dumps({"version": "1.0", "model": {"type": "WordLevel", "vocab": {}}}))
    assert model_folder.unverified(model_folder.read(path, contents=False)) is None


def test_score_tables_list_each_tasks_lengths_in_order():
    """--tasks' and --lm-eval's tables: columns by task, then length as a number (256 before 1024)."""
    from harness.pretrained.report import _score_table

    cells = {("none", 1.0): {f"ruler/{t}_at_{n}": 0.5 for t in ("vt", "cwe") for n in (1024, 256, 512)}}
    head = _score_table("ruler/", "RULER-style tasks", cells)[3]
    assert head == "| scaling | factor | cwe at 256 | cwe at 512 | cwe at 1024 | vt at 256 | vt at 512 | vt at 1024 |"


def test_a_ruler_task_whose_prompt_does_not_fit_a_length_is_named_in_the_report():
    """--tasks at a length too short for the task's prompt give no figure (measures.ruler_score: None), in every
    cell alike: the report says which (task, length) and why, rather than a column that is not there."""
    from harness.pretrained.report import table

    spec = EvalSpec(Path("m"), scalings=("none",), lengths=(128, 256), tasks=("niah_single", "vt", "cwe"))
    scores = {"ruler/niah_single_at_128": 0.0, **{f"ruler/{t}_at_256": 0.0 for t in spec.tasks}}
    text = table(spec, {("none", 1.0): scores})
    assert "No RULER-style figure for vt at 128, cwe at 128: the task's prompt does not fit" in text
    assert "No RULER-style figure" not in table(
        spec, {("none", 1.0): {**scores, "ruler/vt_at_128": 0.0, "ruler/cwe_at_128": 0.0}}
    )
    # a passkey prompt that does not fit: its "—" is said, not left to LongPPL's legend
    text = table(spec, {("none", 1.0): {**scores, "passkey/acc_at_256": 0.4}})
    assert "| none | 1 | — | — | — | — | — | 0.40 |" in text
    assert "No passkey figure at 128 (— in its columns): the needle, question and answer do not fit" in text
    assert "No passkey figure" not in table(spec, {("none", 1.0): {"passkey/acc_at_128": 0.2, "passkey/acc_at_256": 0}})


def test_the_trained_context_of_a_config_json_is_the_one_transformers_and_the_rotary_swap_read(tmp_path):
    """Phi-3 keeps its pretraining length beside rope_scaling, as a top-level original_max_position_embeddings,
    which transformers puts in the rope parameters of a llama3, yarn or longrope model: the context --claim checks
    against (read from config.json before loading) is the one the loaded model's cells and scalings use."""
    import copy
    import json
    from types import SimpleNamespace

    from transformers import Gemma3TextConfig, Phi3Config

    from harness.pretrained import folder
    from harness.pretrained.hf_eval import trained_context
    from harness.pretrained.rotary import scaling_of

    phi3 = {
        "model_type": "phi3",
        "hidden_size": 64,
        "num_attention_heads": 2,
        "num_hidden_layers": 2,
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 128,
        "rope_theta": 1e4,
        "rope_scaling": {"type": "longrope", "factor": 32.0, "short_factor": [1.0] * 16, "long_factor": [2.0] * 16},
    }
    (tmp_path / "config.json").write_text(json.dumps(phi3))
    theirs = Phi3Config.from_dict(copy.deepcopy(phi3))  # transformers sets the rope parameters' dict in place
    assert theirs.rope_parameters["original_max_position_embeddings"] == 128
    assert trained_context(theirs.to_dict()) == 128
    assert trained_context(folder.read_config(tmp_path / "config.json").as_dict()) == 128
    assert scaling_of(SimpleNamespace(**copy.deepcopy(phi3))).original_max_len == 128
    # Gemma 3's scaling is its full-attention layers' (rope_scaling in v4, rope_parameters["full_attention"] in v5)
    gemma = {
        "model_type": "gemma3_text",
        "max_position_embeddings": 4096,
        "rope_theta": 1e6,
        "rope_local_base_freq": 1e4,
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 128},
    }
    theirs = Gemma3TextConfig.from_dict(copy.deepcopy(gemma))
    assert theirs.rope_parameters["full_attention"]["original_max_position_embeddings"] == 128
    assert trained_context(theirs.to_dict()) == trained_context(gemma) == 128


def test_check_hashes_a_sealed_export_once_and_notes_an_unsealed_evaluator(tmp_path, monkeypatch, capsys):
    """A sealed folder's weights are read whole to verify them: `--check` reads them once (twice cost a second pass
    over a large model's file), and the unverified-export note covers --evaluator's folder as well as the model's."""
    from harness import integrity
    from harness.pretrained import hf_eval

    model = tiny_llama(tmp_path / "model")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        integrity.seal_file(model / name)
    evaluator = tiny_llama(tmp_path / "evaluator")  # a posbench export without its seals
    hashed: list[str] = []
    digest = integrity.file_digest

    def counted(path):
        hashed.append(path.name)
        return digest(path)

    monkeypatch.setattr(integrity, "file_digest", counted)
    argv = [str(model), "--evaluator", str(evaluator), "--lengths", "32", "--budget", "256", "--check"]
    assert hf_eval.main(argv) == 0
    assert hashed.count("model.safetensors") == 1
    err = capsys.readouterr().err
    assert f"note: {evaluator} is a posbench export without its .sha256 seals" in err
    assert f"note: {model} " not in err


def test_a_config_transformers_cannot_build_is_refused_at_check_in_one_line(tmp_path, capsys):
    """--check builds the model on the meta device to count its parameters: a config.json whose fields posbench's
    subset accepts but transformers cannot build from (an activation it does not know) is one line, exit 2, before a
    weight is loaded."""
    import json

    from harness.pretrained import hf_eval

    path = tiny_llama(tmp_path / "model")
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "hidden_act": "no_such_activation"}))
    capsys.readouterr()  # the save's progress bars
    assert hf_eval.main([str(path), "--lengths", "32", "--budget", "256", "--check"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"error: {path}/config.json: transformers builds no model from it (KeyError: "
    )


def test_the_parameter_count_without_transformers_names_the_extra(tmp_path, monkeypatch):
    """--check builds the model with transformers: where it is not installed, the refusal is extras.require's line,
    the one every optional package gets."""
    import sys

    from harness.pretrained.cost import parameters

    monkeypatch.setitem(sys.modules, "transformers", None)  # an import of it fails, as where it is not installed
    with pytest.raises(ConfigError, match=r"posbench hf-eval needs transformers, which is not installed here; pip "):
        parameters.__wrapped__(tmp_path)


def test_lm_eval_without_lm_evaluation_harness_names_the_extra(tmp_path, monkeypatch):
    """--lm-eval's tasks come from lm-evaluation-harness: where it is not installed, the refusal is extras.require's
    line, naming the extra that brings it."""
    import sys

    from harness.pretrained.lm_eval_tasks import build

    monkeypatch.setitem(sys.modules, "lm_eval", None)  # an import of it fails, as where it is not installed
    with pytest.raises(ConfigError, match=r"--lm-eval needs lm_eval, which is not installed here; pip install "):
        build.__wrapped__(tmp_path, ("niah_single_1",), (64,))
