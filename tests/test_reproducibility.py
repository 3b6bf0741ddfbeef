"""Same command, same numbers: a run folder keeps its tokenizer from the first step, resume and
reuse refuse another tokenizer, and two runs of one seed agree in every recorded hash and in the
held-out loss (values compared run against run, never against numbers from this code)."""

import json
from dataclasses import replace

import pytest
import torch

from _tiny_run import tiny_config, tiny_settings
from fixedhead.data.tokenizer import tokenizer_sha256
from fixedhead.training import pretrain

pytestmark = pytest.mark.usefixtures("one_thread")


def test_same_seed_twice_gives_identical_hashes_and_heldout_loss(tiny_prepared, tmp_path):
    a = pretrain(tiny_config(), tiny_prepared, tmp_path / "a", tiny_settings(max_steps=6))
    b = pretrain(tiny_config(), tiny_prepared, tmp_path / "b", tiny_settings(max_steps=6))
    c = pretrain(tiny_config(), tiny_prepared, tmp_path / "c", tiny_settings(max_steps=6, seed=1))
    assert a["heldout_loss"] == b["heldout_loss"]
    ra, rb, rc = a["reproducibility"], b["reproducibility"], c["reproducibility"]
    for key in ("tokenizer_sha256", "init_weights_sha256", "first_batch_sha256", "corpus_sha256"):
        assert ra[key] and ra[key] == rb[key], key
    # another seed: same text and tokenizer, other starting weights and another first batch
    assert rc["tokenizer_sha256"] == ra["tokenizer_sha256"] and rc["corpus_sha256"] == ra["corpus_sha256"]
    assert rc["init_weights_sha256"] != ra["init_weights_sha256"]
    assert rc["first_batch_sha256"] != ra["first_batch_sha256"]
    assert ra["tokenizer_sha256"] == tokenizer_sha256(tiny_prepared.tokenizer)
    for package in ("tokenizers", "accelerate"):
        assert ra["other_versions"][package]
    assert ra["torch"] == torch.__version__
    saved = json.loads((tmp_path / "a" / "metrics.json").read_text())
    assert saved["reproducibility"] == ra
    settings = json.loads((tmp_path / "a" / "pretrain_settings.json").read_text())
    assert settings["data_info"]["tokenizer_sha256"] == ra["tokenizer_sha256"]


def _stop_after_first_step(run_dir):
    """A Trainer callback that looks into the run folder after step 1 and stops training there."""
    from transformers import TrainerCallback

    class Spy(TrainerCallback):
        seen = None

        def on_step_end(self, args, state, control, **kw):
            Spy.seen = sorted(p.name for p in run_dir.iterdir())
            control.should_training_stop = True
            return control

    return Spy()


def test_tokenizer_is_in_the_run_and_every_checkpoint_from_the_first_step(tiny_prepared, tmp_path):
    from transformers import BertTokenizerFast

    run = tmp_path / "run"
    spy = _stop_after_first_step(run)
    pretrain(tiny_config(), tiny_prepared, run, tiny_settings(max_steps=6), callbacks=[spy])
    assert spy.seen is not None and "tokenizer.json" in spy.seen and "data_order.json" in spy.seen
    assert tokenizer_sha256(BertTokenizerFast.from_pretrained(str(run))) == tokenizer_sha256(tiny_prepared.tokenizer)
    full = pretrain(tiny_config(), tiny_prepared, tmp_path / "full", tiny_settings(max_steps=4, save_steps=2))
    for ckpt in sorted((tmp_path / "full").glob("checkpoint-*")):
        assert (ckpt / "tokenizer.json").is_file(), ckpt
        kept = BertTokenizerFast.from_pretrained(str(ckpt))
        assert tokenizer_sha256(kept) == full["reproducibility"]["tokenizer_sha256"]
    assert not list((tmp_path / "full").glob(".staging-*"))


def test_resume_and_reuse_refuse_another_tokenizer(tiny_prepared, small_real_corpus, tmp_path):
    from _tiny_run import tiny_data
    from fixedhead.training import train_or_reuse

    run = tmp_path / "run"
    settings = tiny_settings(max_steps=4, save_steps=2)
    pretrain(tiny_config(), tiny_prepared, run, settings)
    # the same text with a tokenizer of other ids: the vocabulary learnt one piece larger
    other = tiny_data(small_real_corpus, tmp_path / "other-cache")
    other = replace(other, tokenizer=_with_extra_piece(other.tokenizer, tmp_path / "extra"))
    other.info = {**other.info, "tokenizer_sha256": tokenizer_sha256(other.tokenizer)}
    assert other.info["tokenizer_sha256"] != tiny_prepared.info["tokenizer_sha256"]
    with pytest.raises(FileExistsError, match="another tokenizer"):
        pretrain(tiny_config(), other, run, settings, resume=True)
    with pytest.raises(FileExistsError, match="another tokenizer"):  # reuse: not reused, and resume refuses
        train_or_reuse(tiny_config(), other, run, settings)
    # with its own tokenizer, the finished run is reused as it is
    assert train_or_reuse(tiny_config(), tiny_prepared, run, settings)


def _with_extra_piece(tokenizer, folder):
    from transformers import BertTokenizerFast

    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    folder.mkdir()
    pieces = [*(t for t, _ in vocab[:5]), "zzzq", *(t for t, _ in vocab[5:])]  # every id from 5 on moves by one
    (folder / "vocab.txt").write_text("\n".join(pieces) + "\n")
    return BertTokenizerFast(vocab_file=str(folder / "vocab.txt"))


def test_sweep_refuses_to_merge_runs_of_another_tokenizer(tmp_path):
    from fixedhead.studies.sweep import check_same_tokenizer

    runs = [{"reproducibility": {"tokenizer_sha256": "a" * 64}}, {"key": "a result from before the record"}]
    check_same_tokenizer(runs, "a" * 64, tmp_path)
    check_same_tokenizer([], "a" * 64, tmp_path)  # a new sweep
    with pytest.raises(FileExistsError, match="another tokenizer \\(aaaaaaaaaaaa\\).*another --output-dir"):
        check_same_tokenizer(runs, "b" * 64, tmp_path)


_TINY_RUN_IN_SUBPROCESS = """
import json, sys
import torch
sys.path.insert(0, sys.argv[3])
from _tiny_run import tiny_config, tiny_data, tiny_settings
from fixedhead.training import pretrain
torch.set_num_threads(int(sys.argv[4]))
data = tiny_data(sys.argv[1], sys.argv[2] + "/cache")
result = pretrain(tiny_config(), data, sys.argv[2] + "/run", tiny_settings(max_steps=2, save_steps=2, eval_steps=2))
print(json.dumps(result["reproducibility"]))
"""


def test_one_and_two_threads_learn_the_same_tokenizer_weights_and_data_order(small_real_corpus, tmp_path):
    """Fresh processes with fresh tokenizer caches, on one torch thread and on two: the same tokenizer,
    initial weights and first batch (the loss may differ by float rounding). A third with torch's
    portable kernels (ATEN_CPU_CAPABILITY=default, as on a CPU of another instruction set) learns the
    same tokenizer and first batch, and its record names the kernels (its initial weights may differ:
    torch draws normal samples with vectorised code where the CPU allows it)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    records = []
    for threads, env in ((1, {}), (2, {}), (1, {"ATEN_CPU_CAPABILITY": "default"})):
        folder = tmp_path / f"t{len(records)}"
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                _TINY_RUN_IN_SUBPROCESS,
                str(small_real_corpus),
                str(folder),
                str(Path(__file__).parent),
                str(threads),
            ],
            check=True,
            capture_output=True,
            text=True,
            env={k: v for k, v in os.environ.items() if k != "ATEN_CPU_CAPABILITY"} | env,
        ).stdout
        records.append(json.loads(out.strip().splitlines()[-1]))
    one, two, portable = records
    assert one["torch_threads"] == 1 and two["torch_threads"] == 2
    for key in ("corpus_sha256", "tokenizer_sha256", "init_weights_sha256", "first_batch_sha256"):
        assert one[key] and one[key] == two[key], key
    assert portable["cpu_capability"] == "DEFAULT" and one["cpu_capability"] and one["cpu"] == portable["cpu"]
    for key in ("corpus_sha256", "tokenizer_sha256", "first_batch_sha256"):
        assert portable[key] == one[key], key
