"""The bad-input table: every way a user can hand fixedhead something wrong, and the message they get.

Each case is ``input -> (exception type, fragment of the message)``; the fragment always contains
the offending value (or the file/field that holds it). Cases that touch files also check that
nothing was left behind or changed. CLI cases check the one-line message and exit status 2.
"""

from __future__ import annotations

import gzip
import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from _tiny_run import snapshot, tiny_config, tiny_settings
from fixedhead.cli import main
from fixedhead.data import pack_sequences, read_corpus
from fixedhead.data.glue import glue_metrics, read_glue_tsv
from fixedhead.model.attention import MultiHeadAttention, padding_mask_to_bias
from fixedhead.model.configuration import FixedHeadConfig
from fixedhead.model.modeling import FixedHeadForMaskedLM, FixedHeadForSequenceClassification, FixedHeadModel
from fixedhead.training import TrainSettings, load_run, pretrain

pytestmark = pytest.mark.usefixtures("one_thread")


# ------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def finished_run(tiny_prepared, tmp_path_factory) -> Path:
    """A finished (10-step) pretraining run directory; tests copy it before damaging it."""
    run = tmp_path_factory.mktemp("finished") / "run"
    pretrain(tiny_config(), tiny_prepared, run, tiny_settings(max_steps=10, save_steps=10, eval_steps=10))
    return run


@dataclass
class Ctx:
    tmp: Path
    request: pytest.FixtureRequest

    def run_copy(self) -> Path:
        dst = self.tmp / "run"
        shutil.copytree(self.request.getfixturevalue("finished_run"), dst)
        return dst

    def edit_json(self, path: Path, **changes):
        d = json.loads(path.read_text())
        d.update(changes)
        path.write_text(json.dumps(d))


def tiny_cfg(**kw):
    base = dict(
        vocab_size=50,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=40,
    )
    return FixedHeadConfig(**{**base, **kw})


def model_call(**inputs):
    def call(ctx):
        FixedHeadForMaskedLM(tiny_cfg()).eval()(**inputs)

    return call


def positions16_call(**inputs):
    """The issue's model: 16 positions, sequences of 8."""

    def call(ctx):
        FixedHeadModel(tiny_cfg(max_position_embeddings=16)).eval()(
            **{"input_ids": torch.ones(1, 8, dtype=torch.long), **inputs}
        )

    return call


def classifier_call(problem_type=None, num_labels=2, **inputs):
    def call(ctx):
        cfg = tiny_cfg(num_labels=num_labels, problem_type=problem_type)
        FixedHeadForSequenceClassification(cfg).eval()(input_ids=torch.ones(2, 3, dtype=torch.long), **inputs)

    return call


STSB_HEADER = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"


def _stsb(*scores: str):
    def call(ctx):
        rows = [f"{i}\tmain\tf\t2012\t{i}\tnone\tnone\tA man.\tA dog.\t{s}" for i, s in enumerate(scores)]
        read_glue_tsv(write(ctx, "g.tsv", "\n".join([STSB_HEADER, *rows]) + "\n"), "stsb")

    return call


def write(ctx, name, content: bytes | str) -> Path:
    p = ctx.tmp / name
    p.parent.mkdir(parents=True, exist_ok=True)
    (p.write_bytes if isinstance(content, bytes) else p.write_text)(content)
    return p


def gz(ctx, name, text: str) -> Path:
    p = ctx.tmp / name
    with gzip.open(p, "wt", encoding="utf-8") as f:
        f.write(text)
    return p


def truncated_gz(ctx):
    p = gz(ctx, "cut.jsonl.gz", json.dumps({"text": " ".join(map(str, range(5000)))}) + "\n")
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    read_corpus(p)


def truncate_weights(ctx):
    run = ctx.run_copy()
    w = run / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    load_run(run)


def pickle_weights(ctx):
    run = ctx.run_copy()
    (run / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1)}, run / "pytorch_model.bin")
    load_run(run)


def config_edit(**changes):
    def call(ctx):
        run = ctx.run_copy()
        ctx.edit_json(run / "config.json", **changes)
        load_run(run)

    return call


def file_replace(name, content):
    def call(ctx):
        run = ctx.run_copy()
        (run / name).write_text(content)
        load_run(run)

    return call


def pretrain_into(prepare_dir, resume=False, overwrite=False, **config_changes):
    def call(ctx):
        out = prepare_dir(ctx)

        def state():
            return (snapshot(out) if out.is_dir() else out.read_bytes()) if out.exists() else None

        before = state()
        try:
            pretrain(
                tiny_config(**config_changes),
                ctx.request.getfixturevalue("tiny_prepared"),
                out,
                tiny_settings(max_steps=10, save_steps=10, eval_steps=10),
                resume=resume,
                overwrite=overwrite,
            )
        finally:  # refused without touching what was there
            assert state() == before

    return call


@dataclass
class Case:
    id: str
    call: Callable[[Ctx], None]
    exc: type
    message: str


def _glue(header: str, *rows: str):
    def call(ctx):
        task = "sst2" if "sentence\t" in header or header == "sentence" else "rte"
        read_glue_tsv(write(ctx, "g.tsv", "\n".join((header,) + rows) + "\n"), task)

    return call


CASES = [
    # --- configuration ------------------------------------------------------------------
    Case("head_dim=0", lambda c: tiny_cfg(head_dim=0), ValueError, "head_dim must be a positive int, got 0"),
    Case("head_dim=-8", lambda c: tiny_cfg(head_dim=-8), ValueError, "head_dim must be a positive int, got -8"),
    Case("head_dim=16.0", lambda c: tiny_cfg(head_dim=16.0), ValueError, "got 16.0 (float)"),
    Case("head_dim=True", lambda c: tiny_cfg(head_dim=True), ValueError, "got True (bool)"),
    Case(
        "num_attention_heads=0",
        lambda c: tiny_cfg(num_attention_heads=0),
        ValueError,
        "num_attention_heads must be a positive int, got 0",
    ),
    Case(
        "standard d=1024,h=12",
        lambda c: tiny_cfg(hidden_size=1024, num_attention_heads=12),
        ValueError,
        "got hidden_size=1024 and num_attention_heads=12",
    ),
    Case(
        "hidden_dropout_prob=1.0",
        lambda c: tiny_cfg(hidden_dropout_prob=1.0),
        ValueError,
        "hidden_dropout_prob must be a probability in [0, 1), got 1.0",
    ),
    Case(
        "max_position_embeddings=0",
        lambda c: tiny_cfg(max_position_embeddings=0),
        ValueError,
        "max_position_embeddings must be a positive int, got 0",
    ),
    Case("vocab_size=0", lambda c: tiny_cfg(vocab_size=0), ValueError, "vocab_size must be a positive int, got 0"),
    Case(
        "pad_token_id=500 with vocab 50",
        lambda c: tiny_cfg(pad_token_id=500),
        ValueError,
        "pad_token_id must be in [0, vocab_size=50), got 500",
    ),
    # the layer alone checks its sizes as the configuration does
    Case(
        "attention head_dim=0",
        lambda c: MultiHeadAttention(64, 4, head_dim=0),
        ValueError,
        "head_dim must be a positive int, got 0",
    ),
    Case(
        "attention d=1024,h=12",
        lambda c: MultiHeadAttention(1024, 12),
        ValueError,
        "got hidden_size=1024 and num_attention_heads=12",
    ),
    Case(
        "attention dropout=1.5",
        lambda c: MultiHeadAttention(64, 4, dropout=1.5),
        ValueError,
        "dropout must be a float in [0, 1), got 1.5",
    ),
    Case(
        "TrainSettings max_steps=0",
        lambda c: TrainSettings(max_steps=0),
        ValueError,
        "max_steps must be a positive int, got 0",
    ),
    Case(
        "TrainSettings learning_rate=nan",
        lambda c: TrainSettings(learning_rate=math.nan),
        ValueError,
        "learning_rate must be a positive finite number, got nan",
    ),
    # --- tensors ------------------------------------------------------------------------
    Case(
        "sequence 41 > max_position_embeddings 40",
        model_call(input_ids=torch.ones(1, 41, dtype=torch.long)),
        ValueError,
        "sequence length 41 exceeds max_position_embeddings=40",
    ),
    Case(
        "attention_mask shape (2,4) for (2,5)",
        model_call(input_ids=torch.ones(2, 5, dtype=torch.long), attention_mask=torch.ones(2, 4)),
        ValueError,
        "attention_mask must have shape [batch, seq] = (2, 5), got (2, 4)",
    ),
    Case(
        "attention_mask additive 0/-inf",
        model_call(input_ids=torch.ones(1, 3, dtype=torch.long), attention_mask=torch.tensor([[0.0, 0.0, -math.inf]])),
        ValueError,
        "must hold only 0 (padding) and 1 (token), got -inf",
    ),
    Case(
        "attention_mask complex dtype",
        lambda c: padding_mask_to_bias(torch.ones(1, 3, dtype=torch.complex64), torch.float32),
        ValueError,
        "got dtype torch.complex64",
    ),
    Case(
        "attention_mask [batch,1,seq] to the layer",
        lambda c: MultiHeadAttention(32, 4)(torch.randn(2, 5, 32), torch.ones(2, 1, 5)),
        ValueError,
        "attention_mask must have shape [batch, seq] = (2, 5), got (2, 1, 5)",
    ),
    Case(
        "input id 50 with vocab 50",
        model_call(input_ids=torch.tensor([[1, 50]])),
        ValueError,
        "token id 50, outside the vocabulary [0, 50)",
    ),
    Case("input id -3", model_call(input_ids=torch.tensor([[1, -3]])), ValueError, "token id -3, outside"),
    Case(
        "float input_ids",
        model_call(input_ids=torch.ones(1, 3)),
        ValueError,
        "input_ids must be an integer tensor of token ids, got dtype torch.float32",
    ),
    Case(
        "NaN in inputs_embeds",
        model_call(inputs_embeds=torch.tensor([[[0.0] * 31 + [math.nan]]])),
        ValueError,
        "inputs_embeds holds non-finite values (first at index (0, 0, 31): nan)",
    ),
    Case(
        "hidden_states width 32 into a 64-wide layer",
        lambda c: MultiHeadAttention(64, 4)(torch.randn(2, 3, 32)),
        ValueError,
        "hidden_states must be [batch, seq, 64], got (2, 3, 32)",
    ),
    Case(
        "labels shape (1,2) for (1,3)",
        model_call(input_ids=torch.ones(1, 3, dtype=torch.long), labels=torch.ones(1, 2, dtype=torch.long)),
        ValueError,
        "labels must have shape [batch, seq] = (1, 3), got (1, 2)",
    ),
    # every tensor argument of every forward: values and shapes (issue 12, item 5)
    Case(
        "position_ids 9..16 with 16 positions",
        positions16_call(position_ids=torch.arange(9, 17)[None]),
        ValueError,
        "position_ids hold 16, outside [0, max_position_embeddings=16) (at index (0, 7))",
    ),
    Case(
        "position_ids -1",
        positions16_call(position_ids=torch.tensor([[0, 1, 2, -1, 4, 5, 6, 7]])),
        ValueError,
        "position_ids hold -1, outside [0, max_position_embeddings=16)",
    ),
    Case(
        "position_ids of length 5 for 8 tokens",
        positions16_call(position_ids=torch.arange(5)[None]),
        ValueError,
        "position_ids must have shape [batch, seq] = (1, 8) (or [1, seq] / [seq] to share one row), got (1, 5)",
    ),
    Case(
        "float position_ids",
        positions16_call(position_ids=torch.arange(8.0)[None]),
        ValueError,
        "position_ids must be an integer tensor, got dtype torch.float32",
    ),
    Case(
        "token_type_ids 2 with 2 types",
        positions16_call(token_type_ids=torch.tensor([[0, 1, 2, 0, 0, 0, 0, 0]])),
        ValueError,
        "token_type_ids hold 2, outside [0, type_vocab_size=2) (at index (0, 2))",
    ),
    Case(
        "token_type_ids of length 3 for 8 tokens",
        positions16_call(token_type_ids=torch.zeros(1, 3, dtype=torch.long)),
        ValueError,
        "token_type_ids must have shape [batch, seq] = (1, 8)",
    ),
    Case(
        "bool token_type_ids",
        positions16_call(token_type_ids=torch.zeros(1, 8, dtype=torch.bool)),
        ValueError,
        "token_type_ids must be an integer tensor, got dtype torch.bool",
    ),
    Case(
        "input_ids as a list",
        model_call(input_ids=[[1, 2, 3]]),
        TypeError,
        "input_ids must be a torch.Tensor, got list",
    ),
    Case(
        "attention_mask as a list",
        model_call(input_ids=torch.ones(1, 3, dtype=torch.long), attention_mask=[[1, 1, 1]]),
        TypeError,
        "attention_mask must be a torch.Tensor, got list",
    ),
    Case(
        "attention_mask value 2",
        model_call(input_ids=torch.ones(1, 3, dtype=torch.long), attention_mask=torch.tensor([[1, 2, 0]])),
        ValueError,
        "must hold only 0 (padding) and 1 (token), got 2",
    ),
    Case(
        "inputs_embeds 31 wide for hidden 32",
        model_call(inputs_embeds=torch.randn(1, 4, 31)),
        ValueError,
        "inputs_embeds must be [batch, seq, hidden_size=32], got shape (1, 4, 31)",
    ),
    Case(
        "integer inputs_embeds",
        model_call(inputs_embeds=torch.ones(1, 4, 32, dtype=torch.long)),
        ValueError,
        "inputs_embeds must be a floating-point tensor, got dtype torch.int64",
    ),
    Case(
        "float MLM labels",
        model_call(input_ids=torch.ones(1, 3, dtype=torch.long), labels=torch.ones(1, 3)),
        ValueError,
        "labels must be an integer tensor of token ids (-100 = not scored), got dtype torch.float32",
    ),
    Case(
        "MLM label -1",
        model_call(input_ids=torch.ones(1, 3, dtype=torch.long), labels=torch.tensor([[-100, -1, 5]])),
        ValueError,
        "labels hold -1, outside the vocabulary [0, 50) (use -100 to skip a position; at index (0, 1))",
    ),
    Case(
        "class 2 with num_labels=2",
        classifier_call(labels=torch.tensor([0, 2])),
        ValueError,
        "labels hold class 2, outside [0, num_labels=2) (-100 = not scored; at index (1,))",
    ),
    Case(
        "multi-label labels [batch] for [batch, 3]",
        classifier_call("multi_label_classification", 3, labels=torch.ones(2)),
        ValueError,
        "multi_label_classification labels must be multi-hot [batch, num_labels] = (2, 3), got (2,)",
    ),
    Case(
        "regression label NaN",
        classifier_call("regression", 1, labels=torch.tensor([0.5, math.nan])),
        ValueError,
        "labels holds non-finite values (first at index (1,): nan)",
    ),
    Case(
        "regression labels [batch] for 2 outputs",
        classifier_call("regression", 2, labels=torch.ones(2)),
        ValueError,
        "regression labels must have shape (2, 2), got (2,)",
    ),
    Case(
        "problem_type misspelt",
        lambda c: tiny_cfg(num_labels=3, problem_type="multilabel"),
        ValueError,
        "problem_type must be one of ('regression', 'single_label_classification', 'multi_label_classification') "
        "or None, got 'multilabel'",
    ),
    Case(
        "attention_bias [batch,1,seq] to the layer",
        lambda c: MultiHeadAttention(32, 4)(torch.randn(2, 5, 32), attention_bias=torch.zeros(2, 1, 5)),
        ValueError,
        "attention_bias must broadcast to [batch, heads, query, key] = (2, 4, 5, 5) (e.g. [batch, 1, 1, keys]), "
        "got (2, 1, 5)",
    ),
    # --- data files ---------------------------------------------------------------------
    Case(
        "empty corpus",
        lambda c: read_corpus(write(c, "empty.txt", " \n\t\n")),
        ValueError,
        "is empty: no document with non-whitespace text",
    ),
    Case(
        "corpus not UTF-8",
        lambda c: read_corpus(write(c, "latin1.txt", "caf\xe9 au lait".encode("latin-1"))),
        ValueError,
        "latin1.txt: not UTF-8 text (invalid continuation byte at byte 3)",
    ),
    Case(
        "jsonl line without text",
        lambda c: read_corpus(write(c, "bad.jsonl", '{"text": "ok"}\n{"body": "no text"}\n')),
        ValueError,
        "bad.jsonl:2: JSON line has no 'text' field",
    ),
    Case(
        "jsonl line not JSON",
        lambda c: read_corpus(write(c, "bad.jsonl", '{"text": "ok"\n')),
        ValueError,
        "bad.jsonl:1: not valid JSON",
    ),
    Case("truncated .jsonl.gz", truncated_gz, ValueError, "cut.jsonl.gz: cannot read"),
    Case(
        "missing corpus file",
        lambda c: read_corpus(c.tmp / "nowhere.txt"),
        FileNotFoundError,
        "nowhere.txt' does not exist",
    ),
    Case(
        "directory without corpus files",
        lambda c: read_corpus(write(c, "books/notes.csv", "a,b\n").parent),
        ValueError,
        "books: directory holds no .txt/.jsonl/.txt.gz/.jsonl.gz files",
    ),
    Case(
        "too little text for one sequence",
        lambda c: pack_sequences([[5, 6]], 64, 2, 3),
        ValueError,
        "corpus too small: 3 tokens, fewer than one sequence of 64",
    ),
    Case(
        "GLUE TSV missing label column",
        _glue("sentence", "a fine film"),
        ValueError,
        "header lacks column 'label' needed by GLUE sst2",
    ),
    Case(
        "GLUE TSV row missing a field",
        _glue("index\tsentence1\tsentence2\tlabel", "0\tA man.\tentailment"),
        ValueError,
        "g.tsv:2: expected 4 tab-separated fields for GLUE rte, got 3",
    ),
    Case(
        "GLUE TSV unknown label",
        _glue("index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tmaybe"),
        ValueError,
        "g.tsv:2: label 'maybe' is not one of ['entailment', 'not_entailment']",
    ),
    Case("STS-B score nan", _stsb("3.2", "nan"), ValueError, "g.tsv:3: score 'nan' is not a finite number"),
    Case("STS-B score inf", _stsb("inf"), ValueError, "g.tsv:2: score 'inf' is not a finite number"),
    Case("STS-B score 7.5", _stsb("7.5"), ValueError, "g.tsv:2: score '7.5' is outside GLUE stsb's [0, 5]"),
    Case(
        "GLUE metrics of a NaN prediction",
        lambda c: glue_metrics("stsb", [1.0, math.nan, 2.0], [1.0, 2.0, 3.0]),
        ValueError,
        "GLUE stsb: predictions hold nan at index (1,)",
    ),
    Case(
        "GLUE metrics of NaN logits",
        lambda c: glue_metrics("sst2", [[0.1, 0.2], [math.nan, 0.0]], [0, 1]),
        ValueError,
        "GLUE sst2: predictions hold nan at index (1, 0)",
    ),
    Case(
        "unknown GLUE task",
        lambda c: read_glue_tsv(write(c, "x.tsv", "a\tb\n"), "mnli2"),
        ValueError,
        "unknown GLUE task 'mnli2'; known: cola, mrpc, rte, sst2, stsb",
    ),
    # --- checkpoints and run directories -------------------------------------------------
    Case("truncated model.safetensors", truncate_weights, ValueError, "model.safetensors is truncated or corrupt"),
    Case(
        "pickle pytorch_model.bin",
        pickle_weights,
        ValueError,
        "holds pickle weights (pytorch_model.bin), which can execute code when loaded; refusing",
    ),
    Case("missing run directory", lambda c: load_run(c.tmp / "no-run"), FileNotFoundError, "no-run' does not exist"),
    Case(
        "a file as run directory",
        lambda c: (c.tmp / "file.txt").write_text("text") and load_run(c.tmp / "file.txt"),
        FileNotFoundError,
        "file.txt' is a file, not a directory",
    ),
    Case(
        "config.json not JSON",
        file_replace("config.json", "{hidden_size: 32"),
        ValueError,
        "run/config.json is not valid JSON",
    ),
    Case(
        "config.json head_dim 0",
        config_edit(head_dim=0),
        ValueError,
        "run/config.json: head_dim must be a positive int, got 0",
    ),
    Case(
        "config.json model_type bert",
        config_edit(model_type="bert"),
        ValueError,
        "model_type is 'bert', expected 'fixedhead'",
    ),
    Case(
        "config.json vocab smaller than tokenizer", config_edit(vocab_size=100), ValueError, "but config.vocab_size=100"
    ),
    Case(
        "tokenizer.json not JSON",
        file_replace("tokenizer.json", '{"model": '),
        ValueError,
        "run/tokenizer.json is not valid JSON",
    ),
    Case(
        "tokenizer.json not a tokenizer",
        file_replace("tokenizer.json", '{"version": "1.0"}'),
        ValueError,
        "tokenizer.json: not a tokenizers file",
    ),
    Case(
        "output dir holds a different run",
        pretrain_into(Ctx.run_copy, head_dim=8),
        FileExistsError,
        "already holds a run; pass --resume to continue it or --overwrite to replace it",
    ),
    Case(
        "--resume into a different run",
        pretrain_into(Ctx.run_copy, resume=True, head_dim=8),
        FileExistsError,
        "holds a run with different settings (config.head_dim: 16 → 8",
    ),
    Case(
        "output dir is a file",
        pretrain_into(lambda c: write(c, "out", "x")),
        FileExistsError,
        "is an existing file, not a directory",
    ),
    Case(
        "output dir holds something else",
        pretrain_into(lambda c: write(c, "out/notes.txt", "x").parent),
        FileExistsError,
        "exists and is not a fixedhead run directory",
    ),
    Case(
        "--overwrite of a folder that is not a run",
        pretrain_into(lambda c: write(c, "out/README.md", "x").parent, overwrite=True),
        FileExistsError,
        "--overwrite only replaces fixedhead runs",
    ),
    Case(
        "--resume of nothing",
        pretrain_into(lambda c: c.tmp / "empty-out", resume=True),
        FileNotFoundError,
        "nothing to resume",
    ),
    Case(
        "--resume with --overwrite", pretrain_into(Ctx.run_copy, resume=True, overwrite=True), ValueError, "contradict"
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_refused_with_a_message_naming_it(case, tmp_path, request):
    ctx = Ctx(tmp_path, request)
    with pytest.raises(case.exc) as info:
        case.call(ctx)
    assert case.message in str(info.value), f"message was: {info.value}"


# ------------------------------------------------------------------------------------ CLI
@pytest.fixture
def cli_env(small_real_corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("FIXEDHEAD_CACHE", str(tmp_path / "cache"))
    return [
        "--corpus",
        str(small_real_corpus),
        "--vocab-size",
        "400",
        "--max-seq-length",
        "32",
        "--hidden-size",
        "32",
        "--num-hidden-layers",
        "1",
        "--num-attention-heads",
        "4",
        "--report-to",
        "none",
    ]


CLI_CASES = [
    ("pretrain --head-dim 0", ["pretrain", "--head-dim", "0"], "--head-dim must be a positive int, got 0"),
    (
        "pretrain --num-attention-heads 0",
        ["pretrain", "--num-attention-heads", "0"],
        "--num-attention-heads must be a positive int, got 0",
    ),
    ("pretrain --max-steps 0", ["pretrain", "--max-steps", "0"], "--max-steps must be a positive int, got 0"),
    ("pretrain --qk-head-dim 0", ["pretrain", "--qk-head-dim", "0"], "--qk-head-dim must be a positive int, got 0"),
    (
        "pretrain --architecture llama --v-head-dim 16",
        ["pretrain", "--architecture", "llama", "--objective", "clm", "--v-head-dim", "16"],
        "(transformers' LlamaForCausalLM) has one head size for queries, keys and values; give",
    ),
    (
        "pretrain --hidden-size 30 (standard heads)",
        ["pretrain", "--hidden-size", "30"],
        "standard attention (no --head-dim) needs --hidden-size divisible by --num-attention-heads, got "
        "--hidden-size 30 and --num-attention-heads 4; pass an explicit --head-dim",
    ),
    (
        "pretrain --head-dim per layer, too many",
        ["pretrain", "--head-dim", "8,none"],
        "--head-dim as a list needs one entry per layer (--num-hidden-layers 1), got 2 (--head-dim 8,none)",
    ),
    ("pretrain --dropout 1.5", ["pretrain", "--dropout", "1.5"], "--dropout must be in [0, 1), got 1.5"),
    (
        "pretrain --parametrization mup",
        ["pretrain", "--parametrization", "mup"],
        "--parametrization mup needs --mup-base-head-dim: the head size",
    ),
    (
        "pretrain clm --mlm-probability",
        ["pretrain", "--objective", "clm", "--mlm-probability", "0.3"],
        "--mlm-probability 0.3 applies to the masked objective only",
    ),
    (
        "pretrain --corpus missing",
        ["pretrain", "--corpus", "missing/corpus.txt"],
        "'missing/corpus.txt' does not exist",
    ),
    (
        "pretrain --preset with a size",
        ["pretrain", "--preset", "lm1b-fixed-d256-h4-dp32", "--hidden-size", "64", "--head-dim", "16"],
        "--preset lm1b-fixed-d256-h4-dp32 fixes the model size; drop --head-dim, --hidden-size",
    ),
]


@pytest.mark.parametrize("argv,message", [c[1:] for c in CLI_CASES], ids=[c[0] for c in CLI_CASES])
def test_cli_bad_values_exit_2_with_one_line_and_leave_nothing(argv, message, cli_env, tmp_path, capsys):
    out = tmp_path / "out"
    rc = main(argv[:1] + ["--output-dir", str(out)] + cli_env + argv[1:])
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    assert not out.exists()


@pytest.mark.parametrize(
    "argv,message",
    [
        (["pretrain", "--output-dir", "x", "--head-dim", "abc"], "invalid int value: 'abc'"),
        (["compare", "--preset", "nope"], "invalid choice: 'nope'"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["compare", "--nosuch"], "compare: error: unrecognized arguments: --nosuch (see fixedhead compare --help)"),
        (["--nosuch"], "fixedhead: error: unrecognized arguments: --nosuch (see fixedhead --help)"),
    ],
    ids=["--head-dim abc", "compare --preset nope", "unknown command", "unknown option of a command", "no command"],
)
def test_cli_unparsable_arguments_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_names_a_presets_dropout_as_the_option(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["pretrain", "--output-dir", str(out), "--preset", "lm1b-fixed-d256-h4-dp32", "--dropout", "1.5"]
    assert main([*argv, "--corpus", str(tmp_path / "no-corpus")]) == 2  # refused before the corpus is looked for
    err = capsys.readouterr().err
    assert "--dropout must be in [0, 1), got 1.5" in err and err.count("\n") == 1, err
    assert not out.exists()


def test_cli_refuses_a_different_run_and_a_pickle(finished_run, cli_env, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(finished_run, run)
    before = snapshot(run)
    rc = main(["pretrain", "--output-dir", str(run), "--head-dim", "8", "--max-steps", "10"] + cli_env)
    err = capsys.readouterr().err
    assert rc == 2 and "already holds a run" in err and "--overwrite" in err and "Traceback" not in err
    assert snapshot(run) == before

    (run / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1)}, run / "pytorch_model.bin")
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    assert "pytorch_model.bin" in err and "--allow-pickle" in err and "Traceback" not in err
    assert main(["evaluate", str(tmp_path / "gone")]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv",
    [
        ["evaluate", "{run}"],
        ["shrink", "{run}", "--qk-head-dim", "4", "--output-dir", "{out}"],
        ["rank-intervention", "{run}", "--output-dir", "{out}"],
    ],
    ids=["evaluate", "shrink", "rank-intervention"],
)
def test_a_missing_corpus_is_refused_before_the_weights_load(argv, finished_run, tmp_path, capfd):
    """The one line comes alone: transformers' "Loading weights" bar would show the model was loaded first."""
    from fixedhead.training.settings import transformers_progress_bars

    out, missing = tmp_path / "out", tmp_path / "moved.txt"
    capfd.readouterr()
    with transformers_progress_bars(True):
        rc = main([w.format(run=finished_run, out=out) for w in argv] + ["--corpus", str(missing)])
    err = capfd.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "moved.txt' does not exist" in err and "Loading" not in err, err
    assert not out.exists()


# --------------------------------------------------------------- non-errors that must hold
def test_all_padding_row_gives_finite_output():
    model = FixedHeadModel(tiny_cfg()).eval()
    mask = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0]])
    for impl in ("sdpa", "eager"):
        model.config._attn_implementation = impl
        out = model(
            input_ids=torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]]), attention_mask=mask, output_attentions=impl == "eager"
        )
        assert torch.isfinite(out.last_hidden_state).all()
        if impl == "eager":  # padding keys get no weight; an all-padding row attends uniformly
            probs = out.attentions[0]
            assert torch.all(probs[0, :, :, 2:] == 0)
            torch.testing.assert_close(probs[1], torch.full_like(probs[1], 0.25))


def test_nan_inputs_embeds_is_refused_but_finite_ones_pass():
    """Documented choice: NaN/inf in inputs_embeds raise ValueError rather than propagate."""
    model = FixedHeadModel(tiny_cfg()).eval()
    x = torch.randn(1, 4, 32)
    assert torch.isfinite(model(inputs_embeds=x).last_hidden_state).all()
    x[0, 2, 5] = math.inf
    with pytest.raises(ValueError, match=r"first at index \(0, 2, 5\): inf"):
        model(inputs_embeds=x)


@pytest.mark.parametrize(
    "argv,message",
    [
        (["compare", "--preset", "tiny", "--corpus", "{empty}"], "directory holds no .txt/.jsonl"),
        (["compare", "--preset", "tiny", "--corpus", "{notes}"], "unsupported file type"),
        (["seq-len", "--lengths", "1"], "--lengths must be >= 3, got 1"),
        (
            ["compare", "--preset", "tiny", "--ray-address", "notahost"],
            "--ray-address notahost: give auto or HOST:PORT",
        ),
        (["compare", "--preset", "tiny", "--ray-address", "127.0.0.1:"], "--ray-address 127.0.0.1:: give auto or"),
        (
            ["compare", "--preset", "tiny", "--learning-rates", "-1", "0.1"],
            "--learning-rates must be a positive finite number, got -1.0",
        ),
        (
            ["compare", "--quick", "--learning-rates", "0.001"],
            "--learning-rates needs at least 2 rates (a grid), got 0.001",
        ),
        (
            ["compare", "--quick", "--hidden-size", "30"],
            "needs --hidden-size divisible by --num-attention-heads, got --hidden-size 30 and --num-attention-heads 8",
        ),
        (["coordcheck", "--quick", "--head-dims", "8"], "--head-dims needs at least two widths to compare, got 8"),
        (["widen-experiment", "--quick", "--head-dim", "2"], "--head-dim 2 must be larger than the base's head size 4"),
        (
            ["seq-len", "--quick", "--head-dims", "7"],
            "at least two --head-dims, got --lengths 32 64, --seeds 0 1, --head-dims 7",
        ),
        (["bottleneck", "--quick", "--seeds", "1", "1"], "--seeds must be distinct, got 1 1"),
        (["bottleneck", "--quick", "--n", "4", "4"], "--n must be distinct, got 4 4"),
        (["seq-len", "--quick", "--seeds", "1", "1"], "--seeds must be distinct, got 1 1"),
        (["seq-len", "--quick", "--lengths", "32", "32"], "--lengths must be distinct, got 32 32"),
        (["seq-len", "--quick", "--head-dims", "8", "8"], "--head-dims must be distinct, got 8 8"),
        (["seq-len", "--quick", "--ranks", "2", "2"], "--ranks must be distinct, got 2 2"),
        (["qk-v", "--quick", "--seeds", "1", "1"], "--seeds must be distinct, got 1 1"),
        (["known-rank", "--quick", "--seeds", "1", "1"], "--seeds must be distinct, got 1 1"),
        (["known-rank", "--quick", "--head-dims", "4", "4"], "--head-dims must be distinct, got 4 4"),
        (["coordcheck", "--quick", "--seeds", "1", "1"], "--seeds must be distinct, got 1 1"),
        (["coordcheck", "--quick", "--num-heads", "2", "2"], "--num-heads must be distinct, got 2 2"),
        (
            ["coordcheck", "--quick", "--parametrizations", "mup", "standard", "mup"],
            "--parametrizations must be distinct, got mup standard mup",
        ),
        (["coordcheck", "--quick", "--axes", "head_dim", "head_dim"], "--axes must be distinct, got head_dim head_dim"),
        (
            ["seq-len", "--quick", "--architectures", "llama", "llama"],
            "--architectures must be distinct, got llama llama",
        ),
        (["farthest-point", "--quick", "--ranks", "4", "4"], "--ranks must be distinct, got 4 4"),
        (["compare", "--quick", "--corpus", "{one_txt}"], "one.txt' holds 1 distinct document(s); training needs"),
        (["compare", "--quick", "--corpus", "{twice}"], "twice.jsonl' holds 1 distinct document(s); training needs"),
        (
            ["compare", "--quick", "--corpus", "nosuchdataset"],
            "'nosuchdataset' is neither a local corpus path nor a loadable Hugging Face dataset",
        ),
    ],
    ids=[
        "empty corpus folder",
        "corpus of another type",
        "seq-len n < 3",
        "address no HOST:PORT",
        "address no port",
        "a negative rate in the grid",
        "a grid of one rate",
        "standard heads that do not divide",
        "coordcheck one width",
        "widen-experiment a narrower head",
        "seq-len one head size",
        "bottleneck a seed twice",
        "bottleneck an n twice",
        "seq-len a seed twice",
        "seq-len a length twice",
        "seq-len a head size twice",
        "seq-len a rank twice",
        "qk-v a seed twice",
        "known-rank a seed twice",
        "known-rank a head size twice",
        "coordcheck a seed twice",
        "coordcheck a head count twice",
        "coordcheck a parametrization twice",
        "coordcheck an axis twice",
        "seq-len an architecture twice",
        "farthest-point a rank twice",
        "a one-document corpus",
        "one document twice",
        "a dataset name that does not load",
    ],
)
def test_a_study_refuses_bad_input_before_its_folder_exists(argv, message, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.pdf").write_text("text")
    (tmp_path / "one.txt").write_text("A whole corpus in one document.\n\nA .txt file is one document.\n")
    (tmp_path / "twice.jsonl").write_text('{"text": "the same text"}\n{"text": "the same text"}\n{"text": " "}\n')
    out = tmp_path / "out"
    files = {name: tmp_path / f for name, f in [("empty", "empty"), ("notes", "notes.pdf"), ("one_txt", "one.txt")]}
    words = [w.format(twice=tmp_path / "twice.jsonl", **files) for w in argv]
    rc = main([*words, "--output-dir", str(out), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and message in err and err.count("\n") == 1, err
    assert not out.exists()
