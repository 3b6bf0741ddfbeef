"""fixedhead.diagnostics.analysis: per-head rank and entropy diagnostics of a checkpoint (``fixedhead analyze``),
on the shared tiny pretraining run and on a transformers BERT checkpoint."""

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from fixedhead import FixedHeadForMaskedLM
from fixedhead.cli import main
from fixedhead.diagnostics.analysis import AttentionAnalysis, analyze, attention_logits, head_statistics, numerical_rank


def test_head_statistics_on_known_heads():
    n = 12
    zero = head_statistics(torch.zeros(n, n))  # every query uniform: rank 0, entropy ln n, one dimension suffices
    assert zero["logit_rank"] == 0 and zero["min_head_dim"] == 1
    assert zero["entropy"] == pytest.approx(math.log(n))
    torch.manual_seed(1)
    q, k = torch.randn(n, 3, dtype=torch.float64), torch.randn(n, 3, dtype=torch.float64)
    low = head_statistics(q @ k.T)  # a head of size 3
    assert low["logit_rank"] == 3 and low["min_head_dim"] in (2, 3)
    assert 0 < low["entropy"] < math.log(n)
    shift = head_statistics(q @ k.T + torch.randn(n, 1, dtype=torch.float64))  # + per-query shift: same P
    assert shift["logit_rank"] == 4 and shift["min_head_dim"] == low["min_head_dim"]
    sharp = head_statistics(50.0 * torch.eye(n))  # each query attends to itself
    assert sharp["entropy"] < 1e-15
    with pytest.raises(ValueError, match="rtol must be in"):
        numerical_rank(torch.eye(3), rtol=0.0)


def test_the_summary_over_heads_counts_heads_at_their_ceiling():
    # 2 layers x 2 heads; layer 0 has d_p = 4, layer 1 d_p = 16 > n = 8 (its ceiling is n)
    a = AttentionAnalysis(
        model="m", model_type="fixedhead", num_layers=2, num_heads=2, head_dims=[4, 16], seq_len=8,
        num_sequences=3, rtol=1e-2,
        logit_rank=[[4.0, 3.4], [7.6, 2.0]], logit_rank_max=[[4, 4], [8, 3]],
        min_head_dim=[[3.0, None], [5.0, 1.0]], min_head_dim_max=[[3, None], [6, 1]],
        entropy=[[1.0, 1.0], [1.0, 1.0]],
    )  # fmt: skip
    s = a.summary()
    # at the ceiling: 4.0 of 4 and 7.6 of 8 (within 0.5); not 3.4 of 4 or 2.0 of 8
    assert s["at_ceiling"] == 0.5 and s["heads"] == 4 and s["windows"] == 3 and s["rtol"] == 1e-2
    assert s["logit_rank"] == pytest.approx((4.0 + 3.4 + 7.6 + 2.0) / 4) and s["logit_rank_max"] == 7.6
    assert s["pattern_rank"] == pytest.approx(3.0) and s["pattern_rank_max"] == 5.0  # the head without one skipped


def test_captured_logits_reproduce_fixedhead_attentions(tiny_pretrained_run):
    run, data, _ = tiny_pretrained_run
    model = FixedHeadForMaskedLM.from_pretrained(str(run)).eval()
    ids = data.heldout[:2]
    logits = attention_logits(model, ids)
    with torch.no_grad():
        probs = model(input_ids=ids, output_attentions=True).attentions
    assert len(logits) == len(probs) == 2
    for s, p in zip(logits, probs, strict=True):
        assert s.dtype == torch.float64 and s.shape == (2, 4, 32, 32)
        torch.testing.assert_close(torch.softmax(s, -1).float(), p, atol=1e-6, rtol=1e-5)


def _bert_checkpoint(tiny_pretrained_run, directory: Path) -> Path:
    """A transformers BertForMaskedLM written by save_pretrained, with the tiny run's tokenizer."""
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    run, _, _ = tiny_pretrained_run
    tok = AutoTokenizer.from_pretrained(str(run))
    torch.manual_seed(0)
    bert = BertForMaskedLM(
        BertConfig(
            vocab_size=len(tok),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=8,
            intermediate_size=64,
            max_position_embeddings=32,
            initializer_range=0.5,
        )
    )
    bert.save_pretrained(str(directory))
    tok.save_pretrained(str(directory))
    return directory


def test_analyze_a_transformers_bert_checkpoint(tiny_pretrained_run, heldout_text, tmp_path):
    from transformers import BertModel

    bert_dir = _bert_checkpoint(tiny_pretrained_run, tmp_path / "bert")
    result = analyze(bert_dir, heldout_text, max_sequences=3)
    assert (result.model_type, result.num_layers, result.num_heads, result.head_dims) == ("bert", 2, 8, [4, 4])
    assert result.seq_len == 32 and result.num_sequences == 3
    for row in result.rows():
        # d_p = 32/8 = 4 < n = 32: the logits of every head have rank at most 4 (paper Section 3) and
        # generic weights reach it; softmax needs one dimension less or the same
        assert row["logit_rank_max"] == 4 and row["rank_cap"] == 4
        assert row["logit_rank"] - 1 <= row["min_head_dim"] <= row["logit_rank"]
        assert 0.0 <= row["entropy"] <= math.log(32) + 1e-9
    # the capture reads BERT's real logits: their softmax is BERT's own (eager) attention
    model = BertModel.from_pretrained(str(bert_dir), attn_implementation="eager").eval()
    ids = torch.randint(5, 400, (2, 16))
    with torch.no_grad():
        probs = model(input_ids=ids, output_attentions=True).attentions
    for s, p in zip(attention_logits(model, ids), probs, strict=True):
        torch.testing.assert_close(torch.softmax(s, -1).float(), p, atol=1e-6, rtol=1e-5)


def test_analyze_cli_on_a_run_writes_table_json_and_heatmap(tiny_pretrained_run, heldout_text, tmp_path, capsys):
    run, _, _ = tiny_pretrained_run
    out = tmp_path / "analysis"
    rc = main(["analyze", str(run), "--text", str(heldout_text), "--max-sequences", "2", "--output-dir", str(out)])
    assert rc == 0
    text = capsys.readouterr().out
    lines = [line for line in text.splitlines() if line.split()[:1] and line.split()[0].isdigit()]
    assert len(lines) == 2 * 4  # one row per (layer, head)
    assert all(line.split()[2] == "16" for line in lines)  # d_p column
    saved = json.loads((out / "analysis.json").read_text())
    assert saved["num_heads"] == 4 and len(saved["table"]) == 8 and saved["rtol"] == 1e-5
    assert all(r["logit_rank_max"] <= 16 for r in saved["table"])
    ranks = [r["logit_rank"] for r in saved["table"]]
    assert saved["summary"]["logit_rank"] == pytest.approx(sum(ranks) / 8) and saved["summary"]["heads"] == 8
    png = (out / "attention_heatmap.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000


def test_analyze_errors_name_the_problem(tiny_pretrained_run, heldout_text, tmp_path, capsys):
    from transformers import BertConfig, BertForMaskedLM

    run, _, _ = tiny_pretrained_run
    no_tok = tmp_path / "no_tokenizer"
    BertForMaskedLM(
        BertConfig(
            vocab_size=400,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
        )
    ).save_pretrained(str(no_tok))
    assert main(["analyze", str(no_tok), "--text", str(heldout_text)]) == 2
    assert "holds no tokenizer" in capsys.readouterr().err
    assert main(["analyze", str(tmp_path / "nowhere"), "--text", str(heldout_text)]) == 2
    assert "nowhere' does not exist" in capsys.readouterr().err
    assert main(["analyze", str(run), "--text", str(tmp_path / "missing.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["analyze", str(run), "--text", str(heldout_text), "--max-seq-length", "64"]) == 2
    assert "exceeds the model's max_position_embeddings=32" in capsys.readouterr().err
    shutil.rmtree(no_tok)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--rtol", "0"], "--rtol must be in (0, 1), got 0.0"),
        (["--rtol", "2"], "--rtol must be in (0, 1), got 2.0"),
        (["--max-seq-length", "64"], "--max-seq-length 64 exceeds the model's max_position_embeddings=32"),
        (["--text", "{missing}"], "missing.txt' does not exist"),
        (["--text", "{blank}"], "blank.txt' is empty"),
    ],
    ids=["rtol 0", "rtol above 1", "n above the positions", "no text", "a blank text"],
)
def test_analyze_refuses_its_options_and_text_before_loading_the_weights(
    argv, message, tiny_pretrained_run, heldout_text, tmp_path, capfd
):
    """The one line comes alone: transformers' "Loading weights" bar would show the model was loaded first."""
    from fixedhead.training.settings import transformers_progress_bars

    run, _, _ = tiny_pretrained_run
    (tmp_path / "blank.txt").write_text(" \n")
    words = [w.format(missing=tmp_path / "missing.txt", blank=tmp_path / "blank.txt") for w in argv]
    out = tmp_path / "out"
    capfd.readouterr()
    with transformers_progress_bars(True):
        assert main(["analyze", str(run), "--text", str(heldout_text), *words, "--output-dir", str(out)]) == 2
    err = capfd.readouterr().err
    assert err.count("\n") == 1 and message in err and "Loading" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("head_dim", [4, 16])
def test_causal_heads_report_the_causal_threshold(head_dim):
    # theory (fixedhead.theory, causal=True): a causal head whose logits have rank d_p needs a head
    # of min(d_p, ceil((n - 1) / 2)); the encoder of the same weights needs min(d_p, n - 1)
    import math

    from fixedhead import FixedHeadConfig, FixedHeadForCausalLM, FixedHeadForMaskedLM
    from fixedhead.diagnostics.analysis import analyze_model, format_table

    torch.manual_seed(0)
    n = 20
    kw = dict(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        head_dim=head_dim,
        intermediate_size=64,
        max_position_embeddings=32,
        initializer_range=0.5,
    )
    ids = torch.randint(3, 60, (2, n))
    decoder = analyze_model(FixedHeadForCausalLM(FixedHeadConfig(**kw)).eval(), ids)
    assert decoder.causal and "causal threshold" in format_table(decoder)
    assert {v for row in decoder.min_head_dim_max for v in row} == {min(head_dim, math.ceil((n - 1) / 2))}
    encoder = analyze_model(FixedHeadForMaskedLM(FixedHeadConfig(**kw)).eval(), ids)
    assert not encoder.causal
    assert {v for row in encoder.min_head_dim_max for v in row} == {min(head_dim, n - 1)}


def _word_tokenizer(text_path: Path):
    """A word-level tokenizer with <s>/</s> and no [CLS]: how GPT-2 and Llama tokenizers frame text."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    words = sorted(set(Path(text_path).read_text().split()))[:500]
    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", *words])}
    tok = Tokenizer(WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _decoder_checkpoint(kind: str, tokenizer, directory: Path) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    if kind == "llama":  # grouped keys (4 query heads, 2 key heads) and d_p = 12 != d / h = 8
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=12,
            intermediate_size=64,
            max_position_embeddings=64,
            initializer_range=0.5,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        model = LlamaForCausalLM(config)
    else:
        config = GPT2Config(
            vocab_size=len(tokenizer),
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=64,
            initializer_range=0.5,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
        model = GPT2LMHeadModel(config)
    model.save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return directory


@pytest.mark.parametrize(("kind", "head_dim"), [("llama", 12), ("gpt2", 8)])
def test_analyze_transformers_decoders(kind, head_dim, heldout_text, tmp_path, capsys):
    from transformers import AutoModel

    tokenizer = _word_tokenizer(heldout_text)
    directory = _decoder_checkpoint(kind, tokenizer, tmp_path / kind)
    n = 30
    result = analyze(directory, heldout_text, max_sequences=2, max_seq_length=n)
    assert (result.model_type, result.num_layers, result.num_heads) == (kind, 2, 4)
    assert result.head_dims == [head_dim, head_dim] and result.causal
    for row in result.rows():
        # rank(S) <= d_p < n whatever the positions (rotary included): the cap is reached by generic weights
        assert row["rank_cap"] == head_dim and row["logit_rank_max"] == head_dim
        # a causal head needs at most min(d_p, ceil((n - 1) / 2)) (fixedhead.theory, causal threshold)
        assert row["min_head_dim_max"] <= min(head_dim, math.ceil((n - 1) / 2))
    # the captured logits are the model's own: with the causal mask their softmax is its eager attention
    model = AutoModel.from_pretrained(str(directory), attn_implementation="eager").eval()
    ids = torch.randint(3, len(tokenizer), (2, 16))
    with torch.no_grad():
        probs = model(input_ids=ids, output_attentions=True).attentions
    future = torch.ones(16, 16, dtype=torch.bool).triu(1)
    for s, p in zip(attention_logits(model, ids), probs, strict=True):
        torch.testing.assert_close(
            torch.softmax(s.masked_fill(future, -torch.inf), -1).float(), p, atol=1e-6, rtol=1e-5
        )
    assert model.config._attn_implementation == "eager"  # restored after the capture
    # and from the command line (the table, then the files)
    out = tmp_path / "analysis"
    assert (
        main(["analyze", str(directory), "--text", str(heldout_text), "--max-sequences", "1", "--output-dir", str(out)])
        == 0
    )
    assert "causal threshold" in capsys.readouterr().out
    assert json.loads((out / "analysis.json").read_text())["causal"] is True


def test_heads_with_values_of_their_own_size_are_read_at_the_query_and_key_size():
    """The logits' rank is bounded by qk_head_dim (Theorem 1), not by the values' size: the analysis
    reports d_p = qk, every head's logits at that rank (random weights), and the causal threshold of it."""
    import math

    from fixedhead import FixedHeadConfig, FixedHeadForCausalLM
    from fixedhead.diagnostics.analysis import analyze_model

    torch.manual_seed(0)
    n, qk = 20, 3
    config = FixedHeadConfig(
        vocab_size=60,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        qk_head_dim=qk,
        v_head_dim=24,
        intermediate_size=64,
        max_position_embeddings=32,
        initializer_range=0.5,
    )
    model = FixedHeadForCausalLM(config).eval()
    result = analyze_model(model, torch.randint(3, 60, (2, n)))
    assert result.head_dims == [qk, qk]
    assert {v for row in result.logit_rank_max for v in row} == {qk}
    assert {v for row in result.min_head_dim_max for v in row} == {min(qk, math.ceil((n - 1) / 2))}
    assert model.config._attn_implementation == "sdpa"  # restored


def test_captured_logits_of_a_padded_batch_are_those_of_its_real_tokens_alone():
    """Right padding in an encoder: the logits captured at layer 1 for the real tokens are those the same tokens
    give alone, so padding keys got no attention in layer 0 (they would change layer 1's inputs)."""
    from fixedhead import FixedHeadConfig

    torch.manual_seed(0)
    config = FixedHeadConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, head_dim=6, intermediate_size=37
    )
    model = FixedHeadForMaskedLM(config).eval()
    with torch.no_grad():  # sharper attention than at initialisation
        for layer in model.fixedhead.encoder["layer"]:
            layer.attention.qkv.weight.mul_(8)
    ids = torch.randint(1, 50, (2, 10))
    mask = torch.ones(2, 10, dtype=torch.long)
    mask[1, 6:] = 0
    padded = attention_logits(model, ids, mask)[1][1, :, :6, :6]
    alone = attention_logits(model, ids[1:, :6])[1][0]
    torch.testing.assert_close(padded, alone, atol=1e-5, rtol=1e-5)
