"""fixedhead.training.pretrain: a seconds-long masked-LM run on real text, scored again from disk,
and which settings make a run the same run."""

import pytest
import torch

from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.training import DataSettings, TrainSettings, evaluate_run, prepare_data, pretrain


def test_tiny_pretrain_and_evaluate_on_real_text(small_real_corpus, tmp_path):
    data = prepare_data(
        DataSettings(
            corpus=str(small_real_corpus),
            vocab_size=400,
            max_seq_length=32,
            heldout_fraction=0.1,
            tokenizer_max_chars=None,
        ),
        cache_dir=tmp_path / "cache",
        progress=False,
    )
    assert data.train.shape[1] == 32 and data.heldout.shape[0] > 10
    config = FixedHeadConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        head_dim=16,
        intermediate_size=64,
        max_position_embeddings=32,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    settings = TrainSettings(
        batch_size=16,
        max_steps=40,
        learning_rate=5e-3,
        logging_steps=10,
        eval_steps=20,
        save_steps=20,
        report_to=[],
        progress=False,
    )
    run = tmp_path / "run"
    result = pretrain(config, data, run, settings)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "metrics.json", "checkpoint-40"):
        assert (run / name).exists(), name
    # learning happened: held-out loss fell well below the uniform-guess loss ln(vocab)
    import math

    assert result["heldout_loss"] < math.log(len(data.tokenizer)) - 0.4
    assert len(result["eval_curve"]) == 2 and result["eval_curve"][1][1] < result["eval_curve"][0][1]
    # scoring the saved run again gives the same numbers (same split, same fixed masking)
    again = evaluate_run(run)
    assert again["masked_tokens"] == result["heldout_masked_tokens"]
    assert again["loss"] == pytest.approx(result["heldout_loss"], abs=1e-5)
    # a second run into the same directory is refused, not silently overwritten
    with pytest.raises(FileExistsError, match="already holds a run"):
        pretrain(config, data, run, settings)


def test_resume_ignores_logging_options_but_not_training_ones():
    from fixedhead.training.identity import run_settings_record, settings_differences

    config = FixedHeadConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64)
    saved = run_settings_record(
        config, TrainSettings(progress=True, report_to=["tensorboard"]), DataSettings(corpus="c")
    )
    saved["train"]["progress"] = True  # the settings file keeps every field
    assert not settings_differences(
        saved, run_settings_record(config, TrainSettings(progress=False, report_to=[]), DataSettings(corpus="c"))
    )
    assert settings_differences(
        saved, run_settings_record(config, TrainSettings(learning_rate=0.5), DataSettings(corpus="c"))
    )
    assert settings_differences(saved, run_settings_record(config, TrainSettings(), DataSettings(corpus="other")))


def test_training_masking_rate_and_schedule_are_settings_that_reach_the_trainer(tmp_path):
    """--mlm-probability masks that fraction of training tokens (the held-out set keeps 0.15), and
    --lr-scheduler-type is the Trainer's schedule; both are refused with a message when they
    cannot apply, and runs saved before they existed keep their fingerprint."""
    import torch

    from fixedhead.data.lm import TrainOrFixedCollator
    from fixedhead.data.tokenizer import train_tokenizer
    from fixedhead.training.identity import run_settings_record, settings_differences

    tok = train_tokenizer(["the cat sat on the mat and the dog ran after it"] * 20, vocab_size=100)
    rows = torch.randint(len(tok.all_special_ids), len(tok), (64, 128))
    for rate in (0.15, 0.4):
        batch = TrainOrFixedCollator(tok, rate, seed=0)([{"input_ids": r} for r in rows])
        assert (batch["labels"] != -100).float().mean().item() == pytest.approx(rate, abs=0.02)
    args = TrainSettings(lr_scheduler_type="cosine", report_to=[]).training_arguments(tmp_path)
    assert args.lr_scheduler_type == "cosine"  # a str enum
    with pytest.raises(ValueError, match="mlm_probability must be in \\(0, 1\\), got 1.0"):
        TrainSettings(mlm_probability=1.0)
    with pytest.raises(ValueError, match="applies to the masked objective only"):
        TrainSettings(objective="clm", mlm_probability=0.4)
    with pytest.raises(ValueError, match="lr_scheduler_type must be one of linear, cosine"):
        TrainSettings(lr_scheduler_type="one_cycle")
    config = FixedHeadConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64)
    now = run_settings_record(config, TrainSettings(), None)
    assert "mlm_probability" not in now["train"] and "lr_scheduler_type" not in now["train"]
    masked40 = run_settings_record(config, TrainSettings(mlm_probability=0.4), None)
    assert settings_differences(now, masked40) == ["train.mlm_probability: 0.15 → 0.4"]
    # and the other way: a run saved at 0.4 is not resumed by a command at the default
    assert settings_differences(masked40, now) == ["train.mlm_probability: 0.4 → 0.15"]


def test_a_validation_split_is_scored_apart_from_the_heldout_set(small_real_corpus, tmp_path):
    from _tiny_run import tiny_config, tiny_settings
    from fixedhead import FixedHeadForCausalLM
    from fixedhead.data import DataSettings, prepare_data
    from fixedhead.data.lm import causal_labels
    from fixedhead.training import pretrain

    settings = DataSettings(
        corpus=str(small_real_corpus),
        vocab_size=400,
        max_seq_length=32,
        heldout_fraction=0.1,
        tokenizer_max_chars=None,
        max_eval_tokens=4000,
        validation_fraction=0.2,
    )
    data = prepare_data(settings, cache_dir=tmp_path / "tok", progress=False)
    result = pretrain(tiny_config(), data, tmp_path / "run", tiny_settings(objective="clm", max_steps=5))
    # the model's own (transformers) loss over the validation rows: mean cross-entropy of every scored next token
    model = FixedHeadForCausalLM.from_pretrained(str(tmp_path / "run")).eval()
    with torch.no_grad():
        expected = model(input_ids=data.validation, labels=causal_labels(data.validation)).loss.item()
    assert result["validation_loss"] == pytest.approx(expected, rel=1e-5)
    assert result["validation_loss"] != pytest.approx(result["heldout_loss"], rel=1e-6)
    assert result["validation_bits_per_character"] > 0


def test_a_corpus_in_another_folder_is_compared_by_its_text_not_its_path(tmp_path):
    """A checkout moved to another folder or machine records its corpus at another absolute path:
    the settings still match (the text is compared by digest on reuse, see the workflow tests);
    a corpus of another name does not."""
    from fixedhead.studies import widening
    from fixedhead.studies.kit.study import settings_sha256
    from fixedhead.training.identity import run_settings_record, settings_differences

    config = FixedHeadConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1, intermediate_size=64)

    def record(corpus):
        r = run_settings_record(config, TrainSettings(), None)
        return {**r, "data": {"corpus": corpus, "vocab_size": 100}}

    here, moved = record("/work/shared/data/books.jsonl.gz"), record("/check/shared/data/books.jsonl.gz")
    assert settings_differences(here, moved) == []
    other = record("/work/shared/data/wiki.jsonl.gz")
    assert settings_differences(here, other) == [
        "data.corpus: '/work/shared/data/books.jsonl.gz' → '/work/shared/data/wiki.jsonl.gz'"
    ]
    # a study folder's plan leaves the corpus path to each run's digest check: a moved corpus is the same study
    study = widening.WideningStudy()
    elsewhere = widening.WideningOptions(corpus="/elsewhere/books.jsonl.gz")
    assert settings_sha256(study, elsewhere) == settings_sha256(study, widening.WideningOptions())
    assert settings_sha256(study, widening.WideningOptions(head_dim=32)) != settings_sha256(study, elsewhere)


def test_the_command_trains_queries_and_keys_apart_from_values(small_real_corpus, tmp_path, monkeypatch):
    """``fixedhead pretrain --qk-head-dim K --v-head-dim V``: the options reach the saved run's config
    and weights, its metrics and card name both sizes, and the run scores again from disk."""
    import json

    from fixedhead.cli import main

    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"
    argv = ["pretrain", "--output-dir", str(run), "--objective", "clm", "--corpus", str(small_real_corpus)]
    argv += ["--vocab-size", "400", "--max-seq-length", "32", "--hidden-size", "32", "--num-hidden-layers", "1"]
    argv += ["--num-attention-heads", "4", "--qk-head-dim", "4", "--v-head-dim", "12", "--max-steps", "4"]
    argv += ["--batch-size", "8", "--eval-steps", "4", "--save-steps", "4", "--report-to", "none"]
    assert main(argv) == 0
    config = json.loads((run / "config.json").read_text())
    assert (config["qk_head_dim"], config["v_head_dim"]) == (4, 12)
    metrics = json.loads((run / "metrics.json").read_text())
    assert (metrics["qk_head_dim"], metrics["v_head_dim"]) == (4, 12)
    assert "queries and keys of size 4, values of size 12" in (run / "README.md").read_text()
    assert "rank at most 4" in (run / "README.md").read_text()
    attention = FixedHeadConfig.from_pretrained(run)
    assert attention.layer_qk_head_dims == [4] and attention.layer_v_head_dims == [12]
    assert evaluate_run(run)["loss"] == pytest.approx(metrics["heldout_loss"], abs=1e-5)
