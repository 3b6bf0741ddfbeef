"""The paper's own sizes (Tables 1-3 and the LM1B-style models): each builds and trains one step.

Fast suite: real widths, vocabulary and positions, but 1 layer, batch 2 of 16 tokens. The
full-depth version (24 / 6 layers) is marked slow.
"""

import math

import pytest
import torch

from fixedhead.model.modeling import FixedHeadForMaskedLM
from fixedhead.model.paper_presets import LM1B_PRESETS, PAPER_PRESETS, PAPER_TRAINING_TOKENS
from fixedhead.model.sizes import count_parameters, gpu_hours, training_flops


@pytest.mark.parametrize("name", sorted(PAPER_PRESETS))
def test_paper_preset_builds_and_trains_one_step_at_one_layer(name):
    preset = PAPER_PRESETS[name]
    full = preset.build_config()
    one = preset.build_config(num_hidden_layers=1)
    model = FixedHeadForMaskedLM(one)
    assert count_parameters(one, pooler=False) == sum(p.numel() for p in model.parameters())
    # the full-depth count without building it: the built layer's own parameters, once per layer
    per_layer = sum(p.numel() for p in model.fixedhead.encoder["layer"][0].parameters())
    assert count_parameters(full) == count_parameters(one) + (full.num_hidden_layers - 1) * per_layer
    snapshot = {k: v.detach().clone() for k, v in model.named_parameters() if "attention" in k}
    assert snapshot, "attention parameters are named 'attention'"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, one.vocab_size, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    assert math.isfinite(loss.item()) and abs(loss.item() - math.log(one.vocab_size)) < 1.0
    loss.backward()
    opt.step()
    changed = [k for k, v in model.named_parameters() if k in snapshot and not torch.equal(v, snapshot[k])]
    assert len(changed) == len(snapshot), "every attention parameter moved after one AdamW step"


def test_lm1b_presets_follow_the_paper_setup():
    assert {p.config["num_hidden_layers"] for p in LM1B_PRESETS.values()} == {6}
    assert {p.config["intermediate_size"] for p in LM1B_PRESETS.values()} == {1024}
    assert {p.config["max_position_embeddings"] for p in LM1B_PRESETS.values()} == {256}
    fixed = [p for p in LM1B_PRESETS.values() if p.config["head_dim"] == 32]
    assert len(fixed) >= 4 and {p.config["hidden_size"] for p in fixed} == {256}
    assert {p.config["hidden_size"] for p in LM1B_PRESETS.values() if p.config["head_dim"] is None} >= {256, 512}
    assert all(p.paper_params is None for p in LM1B_PRESETS.values())


def test_cost_estimate_is_the_6nt_rule_plus_attention():
    # an independent count: 6·N·T over the parameters that take part in a matmul per token (not the
    # position and token-type tables), plus 12·l·n·h·d_p·T for the attention products
    cfg = PAPER_PRESETS["bert-large-h16"].build_config()
    flops = training_flops(cfg, PAPER_TRAINING_TOKENS["bert"], 128)
    n = count_parameters(cfg) - (512 + 2) * 1024
    rule = PAPER_TRAINING_TOKENS["bert"] * (6 * n + 12 * 24 * 128 * 1024)
    assert flops == pytest.approx(rule, rel=0.01)  # the rule also counts biases and LayerNorms
    assert flops < rule
    # hundreds of A100-hours for BERT-large, under one for the LM1B-style models
    assert 100 < gpu_hours(flops) < 1000
    assert (
        gpu_hours(
            training_flops(LM1B_PRESETS["lm1b-fixed-d256-h8-dp32"].build_config(), PAPER_TRAINING_TOKENS["lm1b"], 256)
        )
        < 1
    )


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PAPER_PRESETS))
def test_paper_preset_full_depth_one_step(name):
    config = PAPER_PRESETS[name].build_config()
    model = FixedHeadForMaskedLM(config)
    assert count_parameters(config, pooler=False) == sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ids = torch.randint(5, config.vocab_size, (1, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    assert math.isfinite(loss.item())


def test_cli_pretrain_with_a_paper_preset(small_real_corpus, tmp_path, monkeypatch, capsys):
    import json

    from fixedhead.cli import main

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    common = [
        "--corpus",
        str(small_real_corpus),
        "--vocab-size",
        "200",
        "--max-seq-length",
        "16",
        "--batch-size",
        "2",
        "--max-steps",
        "1",
        "--eval-steps",
        "1",
        "--save-steps",
        "1",
        "--report-to",
        "none",
    ]
    run = tmp_path / "run"
    assert main(["pretrain", "--preset", "lm1b-fixed-d256-h4-dp32", "--output-dir", str(run)] + common) == 0
    config = json.loads((run / "config.json").read_text())
    assert (
        config["hidden_size"],
        config["num_attention_heads"],
        config["head_dim"],
        config["num_hidden_layers"],
        config["intermediate_size"],
        config["hidden_dropout_prob"],
    ) == (256, 4, 32, 6, 1024, 0.1)
    capsys.readouterr()
    assert main(["pretrain", "--preset", "bert-huge", "--output-dir", str(tmp_path / "x")] + common) == 2
    assert "'bert-huge'" in capsys.readouterr().err
    bad = [a if a != "16" else "300" for a in common]
    assert main(["pretrain", "--preset", "lm1b-standard-d256-h8", "--output-dir", str(tmp_path / "y")] + bad) == 2
    assert "max_position_embeddings=256" in capsys.readouterr().err


def test_lm1b_presets_are_causal_and_bert_presets_masked():
    # the paper reports LM1B test perplexity (next-token LM); BERT is a masked LM
    assert {p.objective for p in LM1B_PRESETS.values()} == {"clm"}
    assert {p.objective for name, p in PAPER_PRESETS.items() if name not in LM1B_PRESETS} == {"mlm"}
