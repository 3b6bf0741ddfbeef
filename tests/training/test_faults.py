"""Faults a user can meet while pretraining: two processes racing for one new folder, a rate
that diverges, a batch larger than the data, a resume after training had finished. Each ends in
one clear line or a correct record, and nothing saved is lost."""

from __future__ import annotations

import importlib
import json

import pytest

from _tiny_run import snapshot, tiny_config, tiny_settings
from fixedhead.runs import PRETRAIN_FILE
from fixedhead.training import pretrain

pytestmark = pytest.mark.usefixtures("one_thread")
pretrain_module = importlib.import_module("fixedhead.training.pretrain")  # the module, not the function


def test_two_pretrains_into_one_new_folder_one_is_refused_and_the_other_untouched(tiny_prepared, tmp_path, monkeypatch):
    run = tmp_path / "run"
    real_check = pretrain_module.check_run_dir

    def other_process_wins(run_dir, *args, **kw):
        # both processes found the folder new; the other one writes its settings first
        real_check(run_dir, *args, **kw)
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / PRETRAIN_FILE).write_text(json.dumps({"other": "run"}))
        (run_dir / "data_order.json").write_text("{}")

    monkeypatch.setattr(pretrain_module, "check_run_dir", other_process_wins)
    with pytest.raises(FileExistsError, match="claimed by another process"):
        pretrain(tiny_config(), tiny_prepared, run, tiny_settings(max_steps=2, save_steps=2, eval_steps=2))
    assert json.loads((run / PRETRAIN_FILE).read_text()) == {"other": "run"}
    assert sorted(snapshot(run)) == ["data_order.json", PRETRAIN_FILE]
