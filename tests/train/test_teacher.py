"""On-policy distillation's teacher (train/teacher.py): where it is read from, the
vocabulary it must share with the policy, its row of the memory plan, the config keys
that go with it, and a test-sized run that distils from a finished run's agent."""
import math
import os
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from agentjax import config as config_lib
from agentjax.config import presets
from agentjax.config.algorithms import algorithm_overrides
from agentjax.config.errors import ConfigError
from agentjax.core import parallel
from agentjax.models.hf import make_tiny_hf
from agentjax.models.tokenizer import build_tokenizer
from agentjax.rl.prepare import model_logprob_fn
from agentjax.sweep.plan import override_flags
from agentjax.train.memory import memory_plan
from agentjax.train.metrics import read_metrics
from agentjax.train.policy import teacher_config, teacher_folder
from agentjax.train.teacher import check_same_vocabulary, load_teacher
from tests.train.runs import train

TEXTS = ["the cat sat on the mat", "a dog ran in the park", "birds fly over the sea"] * 8


def tokenizer(texts=TEXTS):
    return build_tokenizer(texts, vocab_size=300)


def distill_config(teacher: str):
    config = presets.search_config("opd", "test")
    config.algo.teacher = teacher
    return config


def runtime():
    return types.SimpleNamespace(mesh=parallel.make_mesh({"data": 1}, devices=jax.devices()[:1]),
                                 rules=parallel.resolve_rules(None), log=lambda _: None)


def test_the_teacher_folder_is_a_runs_export_or_an_hf_folder(tmp_path):
    (tmp_path / "run" / "hf").mkdir(parents=True)
    (tmp_path / "run" / "hf" / "config.json").write_text("{}")
    assert teacher_folder(str(tmp_path / "run")) == str(tmp_path / "run" / "hf")
    assert teacher_folder(str(tmp_path / "run" / "hf")) == str(tmp_path / "run" / "hf")
    with pytest.raises(FileNotFoundError, match=r"holds no HF model: neither .*hf/config"):
        teacher_folder(str(tmp_path))


def test_a_teacher_of_another_tokenizer_fails_clearly_before_its_weights_load(tmp_path):
    student = tokenizer()
    other = tokenizer(["completely different words here, zebra quartz"] * 8)
    make_tiny_hf(tmp_path / "teacher", tokenizer=other)
    config = distill_config(str(tmp_path / "teacher"))
    with pytest.raises(ValueError, match=r"has another tokenizer than the policy .* with "
                                         r"another id, e\.g\. .*Distil from a teacher of the "
                                         r"policy's tokenizer"):
        load_teacher(config, runtime(), tokenizer=student, vocab_size=len(student))


def test_a_teacher_with_fewer_embedding_rows_fails_clearly():
    student = tokenizer()
    with pytest.raises(ValueError, match=r"has 300 embedding rows, the policy 320: the policy "
                                         r"can sample ids the teacher cannot score"):
        check_same_vocabulary(student, tokenizer(), teacher_vocab=300, student_vocab=320,
                              path="t")
    check_same_vocabulary(student, tokenizer(), teacher_vocab=320, student_vocab=300, path="t")


def test_a_teacher_of_another_shape_scores_the_policys_tokens(tmp_path):
    """A deeper, wider teacher of the policy's tokenizer loads in the compute dtype and
    gives finite log-probs (each <= 0) of the policy's token ids."""
    student = tokenizer()
    make_tiny_hf(tmp_path / "teacher", tokenizer=student, num_layers=3, hidden_size=96,
                 num_heads=6, head_dim=16)
    config = distill_config(str(tmp_path / "teacher"))
    teacher = load_teacher(config, runtime(), tokenizer=student, vocab_size=len(student))
    assert teacher.model_config.num_layers == 3 and teacher.path == str(tmp_path / "teacher")
    assert {x.dtype for x in jax.tree.leaves(teacher.params)} == {jnp.dtype(config.model.dtype)}
    ids = np.array([student.encode("the cat sat on the mat")], np.int32)
    batch = dict(inputs=ids[:, :-1], targets=ids[:, 1:],
                 positions=np.arange(ids.shape[1] - 1, dtype=np.int32)[None],
                 segment_ids=np.ones_like(ids[:, 1:]))
    logp, _ = model_logprob_fn(teacher.graphdef, chunk_size=8)(teacher.params, batch, 1.0)
    assert logp.shape == batch["targets"].shape
    assert np.all(np.isfinite(logp)) and np.all(np.asarray(logp) <= 0)


def test_the_memory_plan_counts_the_teacher(tmp_path):
    student = tokenizer()
    written = make_tiny_hf(tmp_path / "teacher", tokenizer=student, num_layers=3)
    config = distill_config(str(tmp_path / "teacher"))
    teacher = teacher_config(config)
    mesh = runtime().mesh
    rows = {row.name: row.bytes for row in memory_plan(config, teacher, mesh, teacher=teacher,
                                                       device_bytes=None).rows}
    d, f, v = written.hidden_size, written.intermediate_size, written.vocab_size
    q, kv = written.num_heads * written.head_dim, written.num_kv_heads * written.head_dim
    per_layer = d * (q + 2 * kv) + (q + 2 * kv) + q * d + 3 * d * f + 2 * d  # qkv bias, norms
    params = v * d + written.num_layers * per_layer + d  # tied embedding, final norm
    assert rows[f"distillation teacher ({config.model.dtype})"] == params * 4
    config.algo.distill_coef, config.algo.teacher = 0.0, ""
    assert teacher_config(config) is None
    assert not any("teacher" in row.name for row in memory_plan(
        config, teacher, mesh, device_bytes=None).rows)


def test_the_teacher_and_its_weight_come_together_in_the_rl_stage(tmp_path):
    config = presets.search_config("opd", "test")
    with pytest.raises(ConfigError, match=r"'algo.teacher' is ''; algo.distill_coef=1.0 "
                                          "needs the teacher"):
        config_lib.validate(config)
    config.algo.teacher = str(tmp_path)
    config_lib.validate(config)
    config.algo.distill_coef = 0.0
    with pytest.raises(ConfigError, match=r"'algo.distill_coef' is 0.0; algo.teacher=.* is "
                                          r"read only with a weight > 0"):
        config_lib.validate(config)
    config.algo.teacher = ""
    with pytest.raises(ConfigError, match=r"'algo.distill_task_weight' is 0.0; it weighs the "
                                          r"task advantage beside a teacher's signal"):
        config_lib.validate(config)
    config.algo.distill_coef, config.algo.teacher, config.stage = 1.0, str(tmp_path), "dpo"
    with pytest.raises(ConfigError, match=r"the teacher scores the RL stage's samples"):
        config_lib.validate(config)


@pytest.mark.slow  # the main job's test run as teacher (shared), then 2 distillation steps
def test_a_student_distils_from_a_finished_runs_agent(finished_run, tmp_path):
    """The student starts from the teacher run's pretrained policy (before its SFT: the
    test-sized GRPO stage leaves its SFT agent as it was, every reward being 0), so the
    teacher's signal is not zero, and it trains where the task reward gives no gradient."""
    teacher, _ = finished_run("grpo_search.py:test")
    out = train("grpo_search.py:test", tmp_path / "student",
                *override_flags({**algorithm_overrides("opd"), "algo.teacher": str(teacher),
                                 "init_from": str(teacher / "pretrain")}))
    assert f"teacher: {teacher / 'hf'}" in out and "distillation teacher (float32)" in out
    rows = read_metrics(str(tmp_path / "student"))
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["distill/scored_frac"] == 1.0
        assert row["distill/kl_k3"] >= 0 and math.isfinite(row["distill/kl_k1"])
        assert row["mask/leak"] == 0 and math.isfinite(row["grad_norm"])
        # One epoch at ratio 1, token-mean, distillation alone: the policy loss is
        # -mean(log pi_teacher - log pi_student), the k1 estimate itself.
        assert row["pg_loss"] == pytest.approx(row["distill/kl_k1"], abs=1e-6)
    # k1 is unbiased, not non-negative: on a finite batch it may fall either side of 0.
    assert rows[0]["distill/kl_k1"] != 0 and rows[0]["distill/kl_k3"] > 0
    assert rows[0]["grad_norm"] > 0
    assert os.path.exists(tmp_path / "student" / "hf" / "model.safetensors")
