"""scripts/evaluate.py refuses a folder that is not a run and a run whose saved config no
longer validates, in one line each, without a traceback."""
import json

from tests.scripts.test_train import run_script


def test_a_folder_without_a_run_is_a_flag_error(tmp_path):
    status, _, stderr, _ = run_script("evaluate.py", f"--workdir={tmp_path}")
    assert status == 1
    assert f"--workdir={tmp_path}: must be a run folder" in stderr
    assert "Traceback" not in stderr


def test_a_run_without_its_exported_policy_is_a_flag_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    status, _, stderr, _ = run_script("evaluate.py", f"--workdir={tmp_path}")
    assert status == 1
    assert "--model (default: <workdir>/hf" in stderr and "Traceback" not in stderr


def test_a_saved_config_that_no_longer_validates_is_one_error_line(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"log": {"every": 0}}))
    (tmp_path / "hf").mkdir()
    status, _, stderr, _ = run_script("evaluate.py", f"--workdir={tmp_path}")
    assert status == 2, stderr[-2000:]
    assert stderr.startswith("error: config key 'log.every' is 0; ") and \
        stderr.count("\n") == 1, stderr[-2000:]
