"""A Llama-style run (transformers' LlamaForCausalLM) through fixedhead's commands: pretrain,
evaluate (checked against transformers' own loss), generate, reuse and resume, continue, analyze,
and what is refused."""

import json
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM, pipeline

from _tiny_run import TINY, snapshot, tiny_data, tiny_settings
from fixedhead.cli import main
from fixedhead.data.lm import heldout_batches
from fixedhead.model.architectures import build_config
from fixedhead.training import evaluate_run, evaluate_text, pretrain
from fixedhead.training.identity import finished_metrics, run_settings_record
from fixedhead.training.pretrain import lm_config, train_or_reuse

pytestmark = pytest.mark.usefixtures("one_thread")


def llama_config(**kw):
    """The tiny recipe's model as a Llama-style decoder: d = 32, 4 heads of size 16."""
    return build_config(TINY.model_fields(architecture="llama", hidden_size=32, num_attention_heads=4, **kw))


def settings(**kw):
    return tiny_settings(**{**dict(max_steps=6, save_steps=6, eval_steps=3, objective="clm"), **kw})


@pytest.fixture(scope="module")
def llama_run(small_real_corpus, tmp_path_factory):
    data = tiny_data(small_real_corpus, tmp_path_factory.mktemp("tok"))
    run = tmp_path_factory.mktemp("llama") / "run"
    result = pretrain(llama_config(head_dim=16), data, run, settings())
    return run, data, result


def test_a_llama_run_is_saved_as_transformers_llama_and_scores_as_transformers_does(llama_run):
    run, data, result = llama_run
    saved = json.loads((run / "config.json").read_text())
    assert saved["model_type"] == "llama" and saved["architectures"] == ["LlamaForCausalLM"]
    assert (saved["head_dim"], saved["hidden_size"], saved["num_attention_heads"]) == (16, 32, 4)
    assert (saved["vocab_size"], saved["pad_token_id"]) == (len(data.tokenizer), data.tokenizer.pad_token_id)
    assert (saved["bos_token_id"], saved["eos_token_id"]) == (data.tokenizer.cls_token_id, data.tokenizer.sep_token_id)
    assert result["architecture"] == "llama" and result["objective"] == "clm"
    assert result["head_dim"] == 16 and result["fixed_head"] is True
    front_matter = (run / "README.md").read_text().split("---")[1].split()  # the model card's metadata
    assert "llama" in front_matter and "bert" not in front_matter and "text-generation" in front_matter
    model = AutoModelForCausalLM.from_pretrained(str(run))  # transformers alone, no fixedhead class
    assert isinstance(model, LlamaForCausalLM)
    assert result["parameters"] == sum(p.numel() for p in model.parameters())
    # transformers' own causal-LM loss over every held-out row in one batch (a mean over all
    # predicted tokens) is the held-out loss pretrain recorded and evaluate recomputes
    ids, labels = heldout_batches(data.heldout, data.tokenizer, "clm", 1234)
    with torch.no_grad():
        reference = float(model.eval()(input_ids=ids, labels=labels).loss)
    assert result["heldout_loss"] == pytest.approx(reference, rel=1e-5)
    again = evaluate_run(run)
    assert again["objective"] == "clm" and again["loss"] == pytest.approx(reference, rel=1e-5)
    assert again["masked_tokens"] == int((labels[:, 1:] != -100).sum())
    assert 0 < result["heldout_loss"] < math.log(len(data.tokenizer)) + 0.5


def test_a_llama_run_scores_new_text_and_generates(llama_run, tmp_path):
    run, _, _ = llama_run
    text = tmp_path / "new.txt"
    text.write_text("The river runs to the sea, and the sea is wide. " * 40)
    scored = evaluate_text(run, text)
    assert scored["objective"] == "clm" and scored["sequences"] >= 1 and math.isfinite(scored["loss"])
    generate = pipeline("text-generation", model=str(run), device="cpu")
    out = generate("the river", max_new_tokens=5, do_sample=False, return_full_text=False)
    assert out[0]["generated_text"].strip()
    from fixedhead.studies.compare import continuations

    samples = continuations(run)
    assert len(samples) == 2 and all(s for s in samples.values())


def test_a_finished_llama_run_is_reused_and_other_sizes_are_refused(llama_run):
    run, data, result = llama_run
    before, finished = snapshot(run), json.loads(json.dumps(result))  # curves as JSON keeps them: lists
    record = run_settings_record(lm_config(llama_config(head_dim=16), data.tokenizer, "clm"), settings(), data.settings)
    assert finished_metrics(run, record, data.info)["heldout_loss"] == result["heldout_loss"]
    assert pretrain(llama_config(head_dim=16), data, run, settings(), resume=True) == finished
    assert train_or_reuse(llama_config(head_dim=16), data, run, settings()) == finished
    assert snapshot(run) == before  # nothing retrained or rewritten
    with pytest.raises(FileExistsError, match=r"config.head_dim: 16 → 8"):
        pretrain(llama_config(head_dim=8), data, run, settings(), resume=True)


def test_an_interrupted_llama_run_resumes_from_its_checkpoint(small_real_corpus, tmp_path):
    import shutil

    data = tiny_data(small_real_corpus, tmp_path / "tok")
    whole = pretrain(llama_config(head_dim=16), data, tmp_path / "whole", settings(save_steps=3))
    # as if killed after the step-3 checkpoint: its settings, tokenizer and that checkpoint only
    part = tmp_path / "part"
    shutil.copytree(tmp_path / "whole" / "checkpoint-3", part / "checkpoint-3")
    for f in ("pretrain_settings.json", "tokenizer.json", "tokenizer_config.json", "data_order.json"):
        shutil.copy(tmp_path / "whole" / f, part / f)
    resumed = pretrain(llama_config(head_dim=16), data, part, settings(save_steps=3), resume=True)
    assert resumed["heldout_loss"] == pytest.approx(whole["heldout_loss"], rel=1e-5)
    assert resumed["eval_curve"][-1] == pytest.approx(whole["eval_curve"][-1], rel=1e-5)


def test_a_llama_run_is_continued_with_init_from_and_refused_where_it_cannot_go(llama_run, tmp_path):
    run, data, result = llama_run
    more = pretrain(None, data, tmp_path / "more", settings(max_steps=2, save_steps=2, eval_steps=2), init_from=run)
    assert more["architecture"] == "llama" and more["init_from"]["path"] == str(run.resolve())
    with pytest.raises(ValueError, match="holds a causal LM; continue it with objective='clm', not 'mlm'"):
        pretrain(None, data, tmp_path / "m", settings(objective="mlm"), init_from=run)
    from fixedhead.training.finetune import finetune
    from fixedhead.training.widen import widen_run

    with pytest.raises(ValueError, match="is a causal LM"):
        finetune(run, "sst2", tmp_path / "ft")
    with pytest.raises(ValueError, match="holds a llama model; `fixedhead widen` grows fixedhead's attention"):
        widen_run(run, 32, tmp_path / "wide")


def test_analyze_reads_a_llama_run(llama_run, tmp_path, capsys):
    run, _, _ = llama_run
    text = tmp_path / "t.txt"
    text.write_text("The river runs to the sea, and the sea is wide and deep and old. " * 30)
    assert (
        main(["analyze", str(run), "--text", str(text), "--max-sequences", "2", "--output-dir", str(tmp_path / "a")])
        == 0
    )
    saved = json.loads((tmp_path / "a" / "analysis.json").read_text())
    assert saved["model_type"] == "llama" and saved["num_layers"] == 1 and saved["num_heads"] == 4
    # the run's head size, and its heads read as causal ones (Llama's attention says it is)
    assert saved["head_dims"] == [16] and saved["causal"] is True
    # a head of size 16 over n = 32 positions: its logits' numerical rank cannot exceed 16
    assert max(max(layer) for layer in saved["logit_rank_max"]) <= 16


@pytest.mark.parametrize(
    "options, message",
    [
        (["--objective", "mlm"], "architecture 'llama' trains causal LMs only; got objective 'mlm'"),
        (["--objective", "clm", "--head-dim", "8,16"], "one head size for every layer; got per-layer --head-dim"),
        (["--objective", "clm", "--parametrization", "mup", "--mup-base-head-dim", "8"], "--parametrization mup"),
        (["--objective", "clm", "--query-init", "zero"], "--query-init zero"),
        (["--objective", "clm", "--attention-scale", "0.5"], "--attention-scale 0.5"),
    ],
)
def test_pretrain_refuses_fixedhead_only_options_for_llama_before_any_work(options, message, tmp_path, capsys):
    out, nowhere = tmp_path / "run", tmp_path / "no-corpus"  # refused before the corpus is looked for
    rc = main(
        ["pretrain", "--architecture", "llama", "--num-hidden-layers", "2", "--corpus", str(nowhere)]
        + ["--output-dir", str(out), *options]
    )
    assert rc == 2 and message in capsys.readouterr().err
    assert not out.exists()


def test_shrink_refuses_a_llama_run_by_name_and_writes_nothing(llama_run, tmp_path, capsys):
    from fixedhead.cli import main

    run, _, _ = llama_run
    out = tmp_path / "small"
    assert main(["shrink", str(run), "--qk-head-dim", "4", "--output-dir", str(out)]) == 2
    assert "holds a llama model; `fixedhead shrink` cuts fixedhead's attention layers only" in capsys.readouterr().err
    assert not out.exists()
