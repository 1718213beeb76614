"""The learning runs' start: the addition tasks and their held-out split, init checkpoints (save, load,
refusals), the supervised phase's band/budget stop, and RL runs started from one init checkpoint."""

import json
import shutil

import pytest
import torch

from rlkit.bitwise import assert_bitwise_equal
from rlkit.cli import main
from rlkit.config import lab_default
from rlkit.data.arith import addition_problems, is_heldout
from rlkit.data.tasks import task
from rlkit.loop import run
from rlkit.model import build_model, preset
from rlkit.model.checkpoint import weights_checksum
from rlkit.model.init_checkpoint import InitCheckpointError, load_init_checkpoint, save_init_checkpoint
from rlkit.timeline.store import RunStore
from rlkit.warmstart import WarmStartConfig, supervised_phase


def _operands(problem):
    a, b = problem.user_message().split("What is ")[1].split("?")[0].split("+")
    return int(a), int(b)


def test_addition_splits_are_disjoint_seeded_and_carry():
    train = addition_problems(400, seed=3, digits=2)
    held = task("add2").heldout(100)
    assert train == addition_problems(400, seed=3, digits=2) and held == task("add2").heldout(100)
    assert not any(is_heldout(*_operands(p)) for p in train)
    assert all(is_heldout(*_operands(p)) for p in held)
    pairs = [_operands(p) for p in train]
    assert all(0 <= a <= 99 and 0 <= b <= 99 and p.answer == str(a + b) for (a, b), p in zip(pairs, train))
    carries = sum((a % 10 + b % 10) >= 10 for a, b in pairs) / len(pairs)
    assert 0.3 < carries < 0.6, carries  # about 45 % carry out of the units
    assert task("add2").problems(5, 8, seed=1) == addition_problems(8, seed=1 * 1_000_003 + 5, digits=2)


def _tiny(dtype="float32", seed=3):
    return build_model(preset("tiny").with_dtype(dtype), seed=seed)


def test_an_init_checkpoint_loads_bit_for_bit_and_refuses_what_is_not_it(tmp_path):
    model = _tiny()
    manifest = save_init_checkpoint(model, tmp_path / "ck", model_name="tiny", made_by={"by": "test"})
    other = _tiny(seed=4)
    assert load_init_checkpoint(other, tmp_path / "ck", model_name="tiny", dtype="float32") == manifest
    for name, t in model.state_dict().items():
        assert_bitwise_equal(other.state_dict()[name], t)
    assert manifest["weights_checksum"] == weights_checksum(other.state_dict())

    with pytest.raises(InitCheckpointError, match="no such folder"):
        load_init_checkpoint(_tiny(), tmp_path / "nope", model_name="tiny", dtype="float32")
    with pytest.raises(InitCheckpointError, match="float32 weights, the run is bfloat16"):
        load_init_checkpoint(_tiny("bfloat16"), tmp_path / "ck", model_name="tiny", dtype="bfloat16")
    with pytest.raises(InitCheckpointError, match="holds a tiny model, the run is qwen3-0.6b"):
        load_init_checkpoint(_tiny(), tmp_path / "ck", model_name="qwen3-0.6b", dtype="float32")
    with pytest.raises(InitCheckpointError, match="this run started from 0000"):
        load_init_checkpoint(_tiny(), tmp_path / "ck", model_name="tiny", dtype="float32",
                             expect_checksum="0000")
    with pytest.raises(InitCheckpointError, match="is not empty"):
        save_init_checkpoint(model, tmp_path / "ck", model_name="tiny", made_by={})
    weights = tmp_path / "ck" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1  # one bit of the last tensor
    weights.write_bytes(bytes(data))
    untouched = _tiny(seed=5)
    before = {k: v.clone() for k, v in untouched.state_dict().items()}
    with pytest.raises(InitCheckpointError, match="changed since it was written"):
        load_init_checkpoint(untouched, tmp_path / "ck", model_name="tiny", dtype="float32")
    for name, t in before.items():  # refused before the model was touched
        assert_bitwise_equal(untouched.state_dict()[name], t)
    (tmp_path / "ck" / "init_checkpoint.json").unlink()
    with pytest.raises(InitCheckpointError, match="no init_checkpoint.json"):
        load_init_checkpoint(_tiny(), tmp_path / "ck", model_name="tiny", dtype="float32")


TINY_PHASE = dict(model="tiny", dtype="float32", task="add2", batch_size=4, eval_prompts=4, threads=1)


def test_the_phase_stops_at_its_step_budget_and_saves_the_weights_it_measured_last(tmp_path):
    rows = []
    manifest = supervised_phase(WarmStartConfig(**TINY_PHASE, max_steps=2, eval_every=1, target_low=0.9,
                                                target_high=1.0), tmp_path / "ws", log=rows.append)
    made = manifest["made_by"]
    assert [r["step"] for r in made["history"]] == [0, 1, 2] and rows == made["history"]
    assert made["steps"] == 2 and made["stopped_because"] == "step budget" and not made["in_band"]
    assert made["heldout"] == made["history"][-1]
    model = _tiny(seed=99)
    load_init_checkpoint(model, tmp_path / "ws", model_name="tiny", dtype="float32")
    assert weights_checksum(model.state_dict()) != weights_checksum(_tiny(seed=0).state_dict())  # it trained


def test_the_phase_stops_inside_the_band_and_a_refused_call_leaves_nothing(tmp_path):
    manifest = supervised_phase(WarmStartConfig(**TINY_PHASE, max_steps=50, eval_every=1, target_low=0.0,
                                                target_high=1.0), tmp_path / "ws")
    assert manifest["made_by"]["steps"] == 0 and manifest["made_by"]["in_band"]
    assert manifest["made_by"]["stopped_because"] == "in the target band before training"
    with pytest.raises(ValueError, match="not an empty folder"):
        supervised_phase(WarmStartConfig(**TINY_PHASE, max_steps=1), tmp_path / "ws")
    with pytest.raises(ValueError, match="a synthetic task"):
        WarmStartConfig(task="dapo")
    with pytest.raises(InitCheckpointError, match="no such folder"):
        supervised_phase(WarmStartConfig(**TINY_PHASE, max_steps=1, init_from=str(tmp_path / "nope")),
                         tmp_path / "new")
    assert not (tmp_path / "new").exists()


def test_warmstart_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    cases = [(["--out", str(tmp_path / "full")], "not an empty folder"),
             (["--out", str(tmp_path / "a"), "--target", "0.7", "0.2"], "target band"),
             (["--out", str(tmp_path / "a"), "--device", "tpu"], "device"),
             (["--out", str(tmp_path / "a"), "--init-from", str(tmp_path / "full")], "no init_checkpoint.json")]
    for argv, why in cases:
        assert main(["warmstart", "--preset", "tiny", "--no-progress", *argv]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err and "Traceback" not in err, err
    assert not (tmp_path / "a").exists()


def test_two_arms_start_from_the_same_bits_and_record_the_held_out_reward(tmp_path, capsys):
    supervised_phase(WarmStartConfig(**TINY_PHASE, max_steps=1, eval_every=1, target_low=1.0, target_high=1.0,
                                     backend="transformers"), tmp_path / "ws")
    manifest = json.loads((tmp_path / "ws" / "init_checkpoint.json").read_text())
    stores = {}
    for path in ("strict", "native"):
        cfg = lab_default(task="add2", steps=2, prompts_per_step=2, samples_per_prompt=2, path=path,
                          warm_start_steps=0, init_checkpoint=str(tmp_path / "ws"), dtype="float32",
                          heldout_every=2, heldout_prompts=4, locate_every=0)
        with run(tmp_path / path, cfg, progress=False) as store:
            stores[path] = (store.versions()[0], store.info("init_checkpoint"), store.steps())
            for s in store.steps():  # the entropy estimate is the sampled tokens' mean -log p (identity sampling)
                lps = [lp for r in store.records(s.step) for lp in r.rollout_logprobs]
                assert s.entropy_estimate == pytest.approx(-sum(lps) / len(lps), rel=1e-12)
    for version0, info, steps in stores.values():
        assert version0.checksum == manifest["weights_checksum"] == info["weights_checksum"]
        assert [s.heldout_reward is not None for s in steps] == [True, False]
        assert 0.0 <= steps[0].heldout_reward <= 1.0 and steps[0].timings["heldout_s"] > 0
        assert all(s.grad_norm is not None and s.response_tokens_mean >= 1 for s in steps)
    # a new run from a changed folder, or from a missing one, is one line and leaves no run directory
    shutil.copytree(tmp_path / "ws", tmp_path / "ws2")
    (tmp_path / "ws2" / "model.safetensors").write_bytes(b"x" + (tmp_path / "ws" / "model.safetensors").read_bytes())
    for src, why in ((tmp_path / "ws2", "changed since it was written"), (tmp_path / "nope", "no such folder")):
        argv = ["run", "--preset", "tiny", "--task", "add2", "--dtype", "fp32", "--init-from", str(src),
                "--steps", "1", "--run-dir", str(tmp_path / "refused"), "--no-progress"]
        assert main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and why in err, err
        assert not (tmp_path / "refused").exists()
    with pytest.raises(ValueError, match="one or the other"):
        lab_default(init_checkpoint="x")  # the lab preset's own warm start as well


def test_the_warm_start_trains_an_addition_task_with_warmup_and_tf32_and_stops_when_asked():
    from rlkit.train.warm_start import warm_start

    model = _tiny()
    seen = []
    losses = warm_start(model, 5, seed=1, task="add2", batch_size=4, warmup_steps=3, tf32=True,
                        until=lambda p: seen.append(p.step) or p.step == 2)
    assert len(losses) == 2 and seen == [1, 2] and all(torch.isfinite(torch.tensor(losses)))
    assert next(model.parameters()).dtype == torch.float32
    assert torch.get_float32_matmul_precision() == "highest"  # restored after every step


def test_the_transformers_backend_trains_the_models_own_parameters_with_the_same_forward():
    from rlkit import NumericsContract, ops
    from rlkit.model.qwen3 import ForwardBatch
    from rlkit.model.tokenizer import load_tokenizer
    from rlkit.train.warm_start import _batch, _padded, _transformers_twin, warm_start

    model = _tiny()
    twin = _transformers_twin(model)
    assert twin.model.embed_tokens.weight is model.model.embed_tokens.weight is twin.lm_head.weight
    problems, tok = addition_problems(6, seed=2, digits=2), load_tokenizer()
    with ops.use_contract(NumericsContract.native()), torch.no_grad():
        seqs, rows, labels = _batch(problems, tok)
        ours = model.logprobs(model(ForwardBatch.packed(seqs))[torch.tensor(rows)], torch.tensor(labels))
        ids, mask, where, answers = _padded(problems, tok, "cpu")
        hidden = twin.model(input_ids=ids, attention_mask=mask).last_hidden_state
        theirs = model.logprobs(hidden[where[:, 0], where[:, 1]].float(), answers)
    assert torch.equal(answers, torch.tensor(labels))
    torch.testing.assert_close(theirs, ours, rtol=0, atol=1e-4)  # one model, two fp32 forwards: close, not equal
    before = weights_checksum(model.state_dict())
    bf16 = _tiny("bfloat16")
    losses = warm_start(bf16, 2, seed=1, task="add2", batch_size=4, backend="transformers")
    assert len(losses) == 2 and next(bf16.parameters()).dtype == torch.bfloat16
    assert weights_checksum(bf16.state_dict()) != weights_checksum(_tiny("bfloat16").state_dict()) and before
    with pytest.raises(ValueError, match="backend 'jax'"):
        warm_start(model, 1, seed=1, backend="jax")
