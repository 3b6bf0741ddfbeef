"""The model card (``README.md``) of every pretraining run: YAML front matter and sections for the
configuration, data, budget and held-out metrics, all from what the run recorded, never typed by hand."""

from __future__ import annotations

import os
from pathlib import Path

CARD_FILE = "README.md"


#: how the model card names each learning-rate schedule after the warm-up
_SCHEDULES = {"linear": "linear decay", "cosine": "cosine decay", "constant_with_warmup": "a constant rate"}


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _warmup(value) -> str:
    if isinstance(value, (int, float)) and 0 <= value < 1:
        return f"{value:.0%} of the steps"
    return f"{value} steps"


def _table(rows: list[tuple[str, object]]) -> str:
    return "\n".join(["| field | value |", "|---|---|"] + [f"| {k} | {_fmt(v)} |" for k, v in rows])


def model_card(result: dict, recorded: dict) -> str:
    """The Markdown card of a finished run from its ``metrics.json`` (``result``) and ``pretrain_settings.json``
    (``recorded``)."""
    config = dict(recorded.get("config", {}))
    train = recorded.get("train", {})
    data = recorded.get("data", {})
    info = recorded.get("data_info", {})
    d, h, dp = result["hidden_size"], result["num_attention_heads"], result["head_dim"]
    n = data.get("max_seq_length", config.get("max_position_embeddings"))
    kind = f"fixed head size d_p = {dp}" if result["fixed_head"] else f"standard head size d_p = d/h = {dp}"
    qk, v = result.get("qk_head_dim"), result.get("v_head_dim")
    if qk is not None or v is not None:  # the logits' rank is bounded by the queries' and keys' size
        kind += f"; queries and keys of size {qk or dp}, values of size {v or dp}"
        dp = qk or dp
    bottleneck = (
        f"d_p = {dp} < n = {n}: each head's logit matrix has rank at most {dp}, below the sequence length "
        "(the paper's low-rank bottleneck)"
        if n and (min(dp) if isinstance(dp, list) else dp) < n
        else f"d_p = {dp} >= n = {n}: heads are not rank-limited at this sequence length (paper Theorem 1)"
    )
    heldout = info.get("heldout_documents", [])
    causal = result.get("objective", train.get("objective", "mlm")) == "clm"
    llama = result.get("architecture") == "llama"  # absent in runs of fixedhead's model only
    family = (
        "pre-norm Llama-style (transformers' LlamaForCausalLM: RMSNorm, rotary positions, SwiGLU)"
        if llama
        else "post-LN BERT-style"
    )
    remote = "" if llama else ", trust_remote_code=True"  # a Llama run is transformers' own model
    train_curve = result.get("train_curve") or []
    eval_curve = result.get("eval_curve") or []
    lines = [
        "---",
        "library_name: transformers",
        f"pipeline_tag: {'text-generation' if causal else 'fill-mask'}",
        "tags:",
        "- fixedhead",
        f"- {'causal-lm' if causal else 'masked-lm'}",
        f"- {'llama' if llama else 'bert'}",
        "---",
        "",
        f"# {result['name']}",
        "",
        f"A {result['num_hidden_layers']}-layer {family} "
        f"{'causal (left-to-right)' if causal else 'masked'} language model with hidden size "
        f"d = {d}, h = {h} heads and {kind} ({result['parameters']:,} parameters), pretrained with "
        "[fixedhead](https://arxiv.org/abs/2002.07028), an implementation of Bhojanapalli et al., "
        '"Low-Rank Bottleneck in Multi-head Attention Models" (ICML 2020). '
        f"{bottleneck}.",
        "",
        "## Usage",
        "",
        *(
            []
            if llama
            else [
                "The directory holds its modeling code (`modeling.py` and the modules it imports, written by "
                "`save_pretrained`) and names it in `config.json`'s `auto_map`, so plain transformers opens it "
                "with `trust_remote_code=True`, no fixedhead needed. With fixedhead installed, `import fixedhead` "
                "instead registers the model with the Auto classes and `trust_remote_code` is not needed.",
                "",
            ]
        ),
        "```python",
        *(
            [
                "from transformers import AutoModelForCausalLM, pipeline",
                "",
                f'generate = pipeline("text-generation", model="PATH/TO/THIS/DIRECTORY"{remote})',
                'print(generate("the old man walked slowly to the", max_new_tokens=20))',
                f'model = AutoModelForCausalLM.from_pretrained("PATH/TO/THIS/DIRECTORY"{remote})',
            ]
            if causal
            else [
                "from transformers import AutoModelForMaskedLM, pipeline",
                "",
                f'fill = pipeline("fill-mask", model="PATH/TO/THIS/DIRECTORY"{remote})',
                'print(fill("the old man walked slowly to the [MASK]."))',
                f'model = AutoModelForMaskedLM.from_pretrained("PATH/TO/THIS/DIRECTORY"{remote})',
            ]
        ),
        "```",
        "",
        "Diagnostics of its heads: `fixedhead analyze PATH/TO/THIS/DIRECTORY --text FILE`.",
        "",
        "## Configuration",
        "",
        _table([(k, v) for k, v in sorted(config.items()) if not k.startswith("_")]),
        "",
        "## Data",
        "",
        _table(
            [
                ("corpus", info.get("corpus", data.get("corpus", ""))),
                (
                    "documents (train / held out)",
                    f"{info.get('train_documents', '?')} / {len(heldout)} "
                    f"(split by whole document, seed {data.get('split_seed', '?')})",
                ),
                ("held-out documents", "; ".join(heldout[:8]) + (" …" if len(heldout) > 8 else "")),
                ("sequence length n", n),
                ("training sequences", info.get("train_sequences", "?")),
                ("held-out sequences", info.get("heldout_sequences", "?")),
                (
                    "tokenizer",
                    f"WordPiece, {info.get('vocab_size', '?')} tokens, lowercase={data.get('lowercase', '?')}",
                ),
            ]
        ),
        "",
        "## Training budget",
        "",
        _table(
            [
                ("steps", train.get("max_steps")),
                ("batch size per process", train.get("batch_size")),
                ("processes (world size)", result.get("world_size", 1)),
                ("tokens per step", result["tokens_per_step"]),
                ("training tokens", result["training_tokens"]),
                (
                    "optimizer",
                    f"AdamW, lr {train.get('learning_rate')}, beta2 {train.get('adam_beta2')}, "
                    f"weight decay {train.get('weight_decay')}, "
                    f"linear warm-up ({_warmup(train.get('warmup_ratio'))}) "
                    f"then {_SCHEDULES.get(train.get('lr_scheduler_type', 'linear'), train.get('lr_scheduler_type'))}",
                ),
                (
                    "objective",
                    "causal LM: every token predicted from the ones before it"
                    if causal
                    else f"masked LM, {100 * train.get('mlm_probability', 0.15):g}% of tokens: 80% [MASK], 10% random, "
                    "10% kept (held-out scoring: 15%)",
                ),
                ("precision", "bf16 autocast (weights and optimizer in fp32)" if train.get("bf16") else "fp32"),
                ("seed", train.get("seed")),
                ("started from", (recorded.get("init_from") or {}).get("path", "a fresh initialisation")),
                ("wall time (s)", result["train_seconds"]),
            ]
        ),
        "",
        "## Metrics (held-out documents, " + ("every next token)" if causal else "one fixed seeded masking)"),
        "",
        _table(
            [
                ("causal-LM loss per token (nats)" if causal else "masked-LM loss (nats)", result["heldout_loss"]),
                ("perplexity (per WordPiece token)", result["heldout_perplexity"]),
                (
                    "bits per character" + ("" if causal else " (of the masked tokens' text)"),
                    result.get("heldout_bits_per_character") or "n/a",
                ),
                ("next-token accuracy" if causal else "masked-token accuracy", result["heldout_accuracy"]),
                ("tokens scored", result["heldout_masked_tokens"]),
                ("final training loss", train_curve[-1][1] if train_curve else "n/a"),
                ("held-out loss by step", ", ".join(f"{s}: {v:.3f}" for s, v in eval_curve) or "n/a"),
            ]
        ),
        "",
        "## Limitations",
        "",
        "A small research model trained briefly on the corpus above, for studying the head-size "
        "bottleneck; its predictions reflect that corpus and its biases, and it is not meant for "
        "downstream use as is.",
        "",
    ]
    return "\n".join(lines)


def write_model_card(run_dir: str | os.PathLike, result: dict, recorded: dict) -> Path:
    """Write :func:`model_card` to ``run_dir/README.md``; returns its path."""
    from ..runs import write_text_atomic

    path = Path(run_dir) / CARD_FILE
    write_text_atomic(path, model_card(result, recorded))
    return path
