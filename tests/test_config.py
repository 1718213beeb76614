"""The config tree: run configs round-trip through the run store's JSON, are frozen all the way down, and
refuse bad values in one line; model presets and run presets are two registries named apart; the parity
settings take their shared fields from a RunConfig (one dtype spelling)."""

import dataclasses
import json

import pytest

from rlkit.config import RUN_PRESETS, RunConfig, lab_default, validation_0_6b
from rlkit.model import MODEL_PRESETS, Qwen3Config, preset
from rlkit.parity import ParitySettings, parity_settings
from rlkit.rollout.engine import EngineConfig
from rlkit.train.trainer import OptimConfig


@pytest.fixture(autouse=True)
def _data_folder(data_dir, monkeypatch):
    monkeypatch.setenv("RLKIT_DATA", str(data_dir))  # the real-size model presets read its config summary


CONFIGS = {
    "default": RunConfig(),
    "lab": lab_default(),
    "validation-0.6b": validation_0_6b(),
    "every field moved": RunConfig(model="qwen3-1.7b", dtype="float32", device="cuda:1", task="gsm8k", steps=7,
                                   path="native", ops={"linear": "strict", "attention": "strict"}, seed=3,
                                   prompts_per_step=3, samples_per_prompt=5, max_tokens=9, temperature=0.7,
                                   top_k=20, top_p=0.9, staleness=1, shaping=0.25, warm_start_steps=4,
                                   optim=OptimConfig(lr=3e-5, betas=(0.8, 0.95), kl_coef=0.01),
                                   engine=EngineConfig(page_size=8, num_pages=64, cuda_graphs=False),
                                   runner="ray", trainer="megatron", engines=2, rollout_tp=2, trainer_tp=2,
                                   trainer_pp=1, trainer_cp=2, checkpoint_every=0, locate_every=0, locate_records=2,
                                   threads=2),
}


@pytest.mark.parametrize("name", CONFIGS)
def test_run_config_round_trips_through_the_store_json(name):
    cfg = CONFIGS[name]
    stored = json.loads(json.dumps(cfg.to_dict()))  # what RunStore.create keeps
    back = RunConfig.from_dict(stored)
    assert back == cfg and back.to_dict() == cfg.to_dict()
    assert hash(back) == hash(cfg)


def test_to_dict_is_plain_json_with_ops_as_a_mapping():
    d = CONFIGS["every field moved"].to_dict()
    assert d["model"] == "qwen3-1.7b" and "preset" not in d
    assert d["ops"] == {"attention": "strict", "linear": "strict"}  # what the dashboard reads
    assert d["optim"]["betas"] == (0.8, 0.95) and d["engine"]["cuda_graphs"] is False


def test_a_store_written_before_the_rename_still_opens():
    old = {**lab_default().to_dict(), "ops": {"attention": "native"}}
    old["preset"] = old.pop("model")
    cfg = RunConfig.from_dict(old)
    assert cfg.model == "tiny" and cfg.ops == (("attention", "native"),)
    assert cfg.contract().op_paths()["attention"] == "native"


def test_frozen_all_the_way_down():
    cfg = RunConfig(ops={"rope": "native", "attention": "native"})
    assert cfg.ops == (("attention", "native"), ("rope", "native"))  # sorted pairs, whatever the given order
    assert cfg == RunConfig(ops=[("rope", "native"), ("attention", "native")])
    for obj, field in ((cfg, "steps"), (cfg.optim, "lr"), (cfg.engine, "page_size")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, field, 1)
    hash(cfg)  # every field is hashable: no dict or list left inside
    assert {cfg: 1}[RunConfig(ops={"attention": "native", "rope": "native"})] == 1


def test_contract_applies_path_then_ops():
    paths = RunConfig(path="native", ops={"linear": "strict"}).contract().op_paths()
    assert paths["linear"] == "strict" and paths["attention"] == "native"
    assert set(RunConfig().contract().op_paths().values()) == {"strict"}


@pytest.mark.parametrize("kw, needle", [
    ({"path": "fast"}, "path='fast' (strict | native)"),
    ({"ops": {"softmax": "native"}}, "ops softmax=native"),
    ({"ops": {"attention": "fast"}}, "ops attention=fast"),
    ({"ops": "attention"}, "ops='attention'"),
    ({"dtype": "bf16"}, "dtype='bf16' (bfloat16 | float32 | auto)"),  # one spelling: the CLI maps bf16 before
    ({"task": "mmlu"}, "task='mmlu'"),
    ({"runner": "slurm"}, "runner='slurm'"),
    ({"rollout_tp": 2}, "rollout_tp=2 needs runner='ray'"),
    ({"trainer_tp": 2, "runner": "ray"}, "needs trainer='megatron'"),
    ({"trainer_cp": 2, "trainer": "megatron"}, "trainer_tp=1 x trainer_cp=2 x trainer_pp=1 needs trainer='megatron' "
                                               "and runner='ray'"),
    ({"trainer_cp": 0}, "trainer_cp must be >= 1"),
    ({"steps": 0}, "steps must be >= 1"),
    ({"seed": -1}, "seed must be >= 0"),
    ({"init_checkpoint": "ckpt/warm", "warm_start_steps": 3}, "a run starts from one or the other"),
    ({"heldout_every": -1}, "heldout_every must be >= 0"),
    ({"heldout_every": 5, "heldout_prompts": 0}, "heldout_prompts must be >= 1"),
])
def test_bad_values_are_refused_in_one_message(kw, needle):
    with pytest.raises(ValueError) as exc:
        RunConfig(**kw)
    assert needle in str(exc.value) and str(exc.value).startswith("invalid run config: ")
    assert "\n" not in str(exc.value)


def test_model_presets_and_run_presets_are_named_apart():
    assert set(MODEL_PRESETS) == {"tiny", "qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b"}
    assert set(RUN_PRESETS) == {"lab", "validation-0.6b", "learning-0.6b"}
    for name, make in RUN_PRESETS.items():
        cfg = make()
        assert isinstance(cfg, RunConfig) and cfg.model in MODEL_PRESETS, name
        assert make(steps=2).steps == 2  # a run preset takes overrides
    for name, make in MODEL_PRESETS.items():
        cfg = make()
        assert isinstance(cfg, Qwen3Config) and cfg.name == name and preset(name) == cfg
    with pytest.raises(ValueError, match="unknown model preset 'lab'; choose one of tiny, qwen3-0.6b"):
        preset("lab")  # a run preset is not a model


@pytest.mark.parametrize("name", sorted(MODEL_PRESETS))
def test_model_config_round_trips_through_hf_config_json(name):
    cfg = preset(name)
    assert Qwen3Config.from_hf(json.loads(json.dumps(cfg.to_hf())), name=name) == cfg
    assert cfg.with_dtype("float32").torch_dtype.is_floating_point and cfg.with_dtype("float32").dtype == "float32"


def test_real_sizes_match_the_published_parameter_counts():
    # tied embeddings except 8B; counts in billions as the model cards round them
    assert {n: round(preset(n).num_parameters() / 1e9, 1) for n in ("qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b")} \
        == {"qwen3-0.6b": 0.6, "qwen3-1.7b": 1.7, "qwen3-4b": 4.0, "qwen3-8b": 8.2}


def test_parity_settings_take_their_shared_fields_from_a_run_config():
    s = parity_settings(model="tiny", dtype="float32", path="native", ops={"linear": "strict"}, seed=4,
                        max_tokens=8, temperature=0.5, prompts=2, locate=False)
    assert isinstance(s.run, RunConfig) and (s.prompts, s.locate, s.rollout) == (2, False, "embedded")
    assert (s.run.model, s.run.dtype, s.run.seed, s.run.max_tokens, s.run.temperature) == ("tiny", "float32", 4, 8, 0.5)
    paths = s.build_contract().op_paths()
    assert paths["linear"] == "strict" and paths["attention"] == "native"
    default = ParitySettings()
    assert (default.run.model, default.run.dtype, default.run.max_tokens, default.prompts) == ("tiny", "auto", 128, 16)
    with pytest.raises(ValueError, match=r"dtype='fp32' \(bfloat16 \| float32 \| auto\)"):
        parity_settings(dtype="fp32")  # one spelling
    with pytest.raises(ValueError, match="--rollout 'sglang'"):
        parity_settings(rollout="sglang")
    with pytest.raises(ValueError, match="--prompts and --max-tokens must be >= 1"):
        parity_settings(max_tokens=0)
    with pytest.raises(TypeError):
        parity_settings(tokens=3)  # neither a parity field nor a run field
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.prompts = 3
