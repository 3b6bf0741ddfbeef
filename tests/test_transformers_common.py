"""transformers' own common model tests on fixedhead, with transformers' BERT as the control.

``ModelTesterMixin``, ``ConfigTester`` and (causal LM) ``GenerationTesterMixin`` are the
conformance suite every model inside transformers passes; the upstream files live beside a checkout
in ``../shared/transformers-tests`` (its README says which commit; ``FIXEDHEAD_HF_TESTS`` points
elsewhere). Each fixedhead class runs them at four head settings (``head_dim=None``, a fixed size,
a per-layer list, queries and keys of one size with values of another), and the BERT class of the
same sizes (``BertModel``, ``BertForMaskedLM``, ``BertForSequenceClassification``,
``BertLMHeadModel``) runs the same tests in the same process.

The rule: every test the BERT control passes passes for fixedhead, or is skipped here with a
reason about fixedhead. A test that fails for the BERT control in the same run is the installed
transformers disagreeing with the test files (they come from one commit, the release installed may
be older or newer): it is reported as an expected failure, "fails for BERT too", for BERT and for the
fixedhead twin alike, whatever the release. No list of such tests is kept by hand: a fixedhead
failure runs the same test on its BERT control (once, the result kept) and is a real failure
unless the control fails it too.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import unittest
from pathlib import Path

import pytest

HF_TESTS = Path(
    os.environ.get("FIXEDHEAD_HF_TESTS", Path(__file__).resolve().parents[2] / "shared" / "transformers-tests")
)
if not (HF_TESTS / "tests" / "test_modeling_common.py").is_file():
    pytest.skip(f"transformers' common tests not found at {HF_TESTS}", allow_module_level=True)
pytest.importorskip("parameterized", reason="the transformers test files need `parameterized` (dev extras)")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
sys.path.insert(0, str(HF_TESTS))
# the upstream files are the package `tests`; this project's tests/ has no __init__.py, so a regular
# package of that name anywhere on the path is the one imported

from tests.generation.test_utils import GenerationTesterMixin  # noqa: E402
from tests.test_configuration_common import ConfigTester  # noqa: E402
from tests.test_modeling_common import ModelTesterMixin, ids_tensor, random_attention_mask  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForMaskedLM,
    BertForSequenceClassification,
    BertLMHeadModel,
    BertModel,
)
from transformers.models.auto import modeling_auto  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from fixedhead import (  # noqa: E402
    FixedHeadConfig,
    FixedHeadForCausalLM,
    FixedHeadForMaskedLM,
    FixedHeadForSequenceClassification,
    FixedHeadModel,
)

# The mixins decide what a class is (base model, masked LM, classifier, causal LM) by its name in
# transformers' static tables, where an in-tree model type would be listed.
_TABLES = {
    "MODEL_MAPPING_NAMES": FixedHeadModel,
    "MODEL_FOR_MASKED_LM_MAPPING_NAMES": FixedHeadForMaskedLM,
    "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES": FixedHeadForCausalLM,
    "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES": FixedHeadForSequenceClassification,
}


@pytest.fixture(autouse=True, scope="module")
def _listed_in_transformers_tables():
    for table, cls in _TABLES.items():
        getattr(modeling_auto, table)[FixedHeadConfig.model_type] = cls.__name__
    yield
    for table in _TABLES:
        getattr(modeling_auto, table).pop(FixedHeadConfig.model_type, None)


@pytest.fixture(autouse=True, scope="module")
def _transformers_default_verbosity():
    """Some tests read transformers' warnings (e.g. the load report), which an earlier test in the same
    process may have turned down."""
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    yield
    hf_logging.set_verbosity(verbosity)


# Head settings (config fields): BERT's tester has hidden_size 32 and 4 heads (d/h = 8), two layers.
HEAD_SETTINGS = {
    "standard": {"head_dim": None},
    "fixed16": {"head_dim": 16},
    "per_layer": {"head_dim": [None, 12]},
    "qk4_v12": {"qk_head_dim": 4, "v_head_dim": 12},
}

_CONTROL_FAILURES: dict[tuple[str, str], str | None] = {}  # (control class, test) -> its failure, or None


def _failure_line(error: BaseException) -> str:
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}"[:300]


@contextlib.contextmanager
def _inline_subtest(*args, **kwargs):
    """A ``subTest`` block run inline: a failure raises out of the test (where the drift check sees it,
    instead of pytest reporting the subtest on its own); a skip skips this block only, as in unittest."""
    try:
        yield
    except unittest.SkipTest:
        pass


def _run_inline(case: unittest.TestCase, method) -> None:
    """``method`` on ``case`` with its ``subTest`` blocks inline (:func:`_inline_subtest`)."""
    case.subTest = _inline_subtest
    method(case)


def _control_failure(control_cls, name: str) -> str | None:
    """The BERT control's failure of test ``name`` in this process (run once on demand), or None."""
    key = (control_cls.__name__, name)
    if name not in control_cls._raw_tests:
        return None
    if key not in _CONTROL_FAILURES:
        case = control_cls(name)
        failure = None
        try:
            case.setUp()
            try:
                _run_inline(case, control_cls._raw_tests[name])
            finally:
                case.tearDown()
        except unittest.SkipTest:
            pass
        except Exception as e:  # any failure of the control is the finding
            failure = _failure_line(e)
        _CONTROL_FAILURES[key] = failure
    return _CONTROL_FAILURES[key]


def _transformers_version() -> str:
    import transformers

    return transformers.__version__


#: tests skipped for fixedhead: test name -> the fixedhead-specific reason
FIXEDHEAD_SKIPS: dict[str, str] = {
    "test_capture_outputs_decorator": "fixedhead's encoder collects hidden states and attention probabilities in "
    "its own layer loop (FixedHeadModel.forward), not through transformers' @capture_outputs hooks that this "
    "test inspects; the outputs themselves are checked by test_hidden_states_output and test_attention_outputs",
}


class ModelTester:
    """The sizes, inputs and labels of transformers' ``BertModelTester`` (tests/models/bert), building
    ``config_class`` (BertConfig for the control, FixedHeadConfig with ``config_kwargs``)."""

    batch_size, seq_length, is_training = 13, 7, True
    vocab_size, hidden_size, num_hidden_layers, num_attention_heads, intermediate_size = 99, 32, 2, 4, 37
    hidden_act, hidden_dropout_prob, attention_probs_dropout_prob = "gelu", 0.1, 0.1
    max_position_embeddings, type_vocab_size, type_sequence_label_size = 512, 16, 2
    initializer_range, num_labels, num_choices = 0.02, 3, 4

    def __init__(self, parent, config_class, **config_kwargs):
        self.parent = parent
        self.config_class = config_class
        self.config_kwargs = config_kwargs

    def get_config(self):
        return self.config_class(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            num_hidden_layers=self.num_hidden_layers,
            num_attention_heads=self.num_attention_heads,
            intermediate_size=self.intermediate_size,
            hidden_act=self.hidden_act,
            hidden_dropout_prob=self.hidden_dropout_prob,
            attention_probs_dropout_prob=self.attention_probs_dropout_prob,
            max_position_embeddings=self.max_position_embeddings,
            type_vocab_size=self.type_vocab_size,
            is_decoder=False,
            initializer_range=self.initializer_range,
            **self.config_kwargs,
        )

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size)
        attention_mask = random_attention_mask([self.batch_size, self.seq_length])
        token_type_ids = ids_tensor([self.batch_size, self.seq_length], self.type_vocab_size)
        inputs = {"input_ids": input_ids, "token_type_ids": token_type_ids, "attention_mask": attention_mask}
        return self.get_config(), inputs


class _CommonTests(ModelTesterMixin):
    """One model class under transformers' common tests; subclasses set ``all_model_classes`` and
    ``config`` = (config class, its extra arguments)."""

    model_split_percents = [0.5, 0.8, 0.9]  # BERT's

    def setUp(self):
        self.model_tester = ModelTester(self, self.config[0], **self.config[1])

    def prepare_config_and_inputs_for_generate(self, batch_size=2):
        config, inputs = super().prepare_config_and_inputs_for_generate(batch_size)
        config.is_decoder = True  # as transformers' BertModelTest
        return config, inputs

    def _get_attention_shape(self, batch_size, seq_length, config):
        """The mixin's cache shapes, with values at their own size where the layer config gives one
        (fixedhead's ``v_head_dim``; keys' size is its ``head_dim``): the mixin reads one head size for
        keys and values unless a model is MLA, and says models with distinct sizes override this."""
        k_shape, v_shape = super()._get_attention_shape(batch_size, seq_length, config)
        return k_shape, (*v_shape[:-1], getattr(config, "v_head_dim", None) or v_shape[-1])


def _classify_drift(cls, control_cls, skips: dict[str, str]):
    """Return ``cls`` with every test wrapped: a failure of the BERT control itself is an expected
    failure ("fails for BERT"); a fixedhead failure is one only when its control fails the same test
    in this run ("fails for BERT too"), and stays a failure otherwise. ``skips``: fixedhead-specific skips."""
    cls._raw_tests = {}
    for name in [n for n in dir(cls) if n.startswith("test")]:
        method = getattr(cls, name)
        if not callable(method):
            continue
        cls._raw_tests[name] = method
        if name in skips:
            wrapped = functools.update_wrapper(lambda self: None, method)
            wrapped = pytest.mark.skip(reason=skips[name])(wrapped)
        else:

            def wrapped(self, _name=name, _method=method):
                try:
                    _run_inline(self, _method)
                    if control_cls is None:
                        _CONTROL_FAILURES[(type(self).__name__, _name)] = None
                except unittest.SkipTest:
                    raise
                except Exception as e:
                    if control_cls is None:  # this is the control
                        _CONTROL_FAILURES[(type(self).__name__, _name)] = _failure_line(e)
                        pytest.xfail(f"fails for BERT with transformers {_transformers_version()}: {_failure_line(e)}")
                    bert = _control_failure(control_cls, _name)
                    if bert is None:
                        raise
                    pytest.xfail(f"fails for BERT too ({control_cls.__name__}: {bert})")

            functools.update_wrapper(wrapped, method)  # keeps its marks and unittest skip flags
        setattr(cls, name, wrapped)
    return cls


def _make_class(name, model_class, config, control_cls, slow):
    bases = (_CommonTests,)
    if model_class.can_generate():
        bases += (GenerationTesterMixin,)
    attrs = {"all_model_classes": (model_class,), "config": config}
    if slow:
        attrs["pytestmark"] = [pytest.mark.slow]
    cls = type(name, (*bases, unittest.TestCase), attrs)
    return _classify_drift(cls, control_cls, FIXEDHEAD_SKIPS if control_cls is not None else {})


_PAIRS = [
    (BertModel, FixedHeadModel),
    (BertForMaskedLM, FixedHeadForMaskedLM),
    (BertForSequenceClassification, FixedHeadForSequenceClassification),
    (BertLMHeadModel, FixedHeadForCausalLM),
]

# `make test` runs the causal LM at every head setting with its BERT control, and the other classes
# at the paper's fixed head size; the rest is marked slow (`make test-slow`; about two minutes more)
for _bert_cls, _fh_cls in _PAIRS:
    _causal = _fh_cls is FixedHeadForCausalLM
    _control_name = f"Test{_bert_cls.__name__}Control"
    _control = globals()[_control_name] = _make_class(
        _control_name, _bert_cls, (BertConfig, {}), control_cls=None, slow=not _causal
    )
    for _setting, _fields in HEAD_SETTINGS.items():
        _name = f"Test{_fh_cls.__name__}_{_setting}"
        _config = (FixedHeadConfig, dict(_fields))
        _slow = not _causal and _setting != "fixed16"
        globals()[_name] = _make_class(_name, _fh_cls, _config, control_cls=_control, slow=_slow)
del _bert_cls, _fh_cls, _name, _control_name, _control, _setting, _fields, _config, _causal, _slow


# ConfigTester, one test per check so that a check BERT fails does not hide the others
_CONFIG_CHECKS = [
    "create_and_test_config_common_properties",
    "create_and_test_config_to_json_string",
    "create_and_test_config_to_json_file",
    "create_and_test_config_from_and_save_pretrained",
    "create_and_test_config_from_and_save_pretrained_subfolder",
    "create_and_test_config_from_and_save_pretrained_composite",
    "create_and_test_config_with_num_labels",
    "check_config_can_be_init_without_params",
    "check_config_arguments_init",
    "create_and_test_config_from_pretrained_custom_kwargs",
]
_CONFIGS = {"bert": (BertConfig, {})} | {
    f"fixedhead_{setting}": (FixedHeadConfig, dict(fields)) for setting, fields in HEAD_SETTINGS.items()
}


def _config_check_failure(config: str, check: str) -> str | None:
    config_class, kwargs = _CONFIGS[config]
    case = unittest.TestCase()
    case.model_tester = None
    tester = ConfigTester(
        case, config_class=config_class, hidden_size=32, num_attention_heads=4, num_hidden_layers=2, **kwargs
    )
    try:
        getattr(tester, check)()
    except Exception as e:  # the failure is the finding
        return _failure_line(e)
    return None


@pytest.mark.parametrize("check", _CONFIG_CHECKS)
@pytest.mark.parametrize("config", list(_CONFIGS))
def test_config_tester(config, check):
    """transformers' ConfigTester on the tester's sizes (BERT's ConfigTester passes only
    hidden_size=32; fixedhead checks d, h and a per-layer list against each other when the config
    is built, where BertConfig waits for the model, so all three sizes are given to both). A check
    BertConfig fails too in this run is an expected failure, as for the model tests."""
    failure = _config_check_failure(config, check)
    if failure is None:
        return
    bert = failure if config == "bert" else _config_check_failure("bert", check)
    if bert is None:
        pytest.fail(failure)
    pytest.xfail(f"fails for BertConfig too with transformers {_transformers_version()}: {bert}")
